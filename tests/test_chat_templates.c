/* Chat data renders as each family's chat template does and masks exactly
 * the assistant turns: for llama3, chatml, llama2 and smollm2, a 3-turn
 * conversation (system, user, assistant, user, assistant) and a
 * prompt/completion pair render to the strings written out below from the
 * families' documented formats (see src/data/chat.c), and the loss spans
 * cover exactly each assistant content plus its end-of-turn token. Every
 * malformed JSONL line is refused with one line naming the line number.
 * Templates are recognised from tokenizer_config.json chat_template
 * strings (unknown -> an error naming the file). With the Llama 3
 * tokenizer.json (and Qwen3's for chatml) the masked ids decode back to
 * exactly the assistant contents plus <|eot_id|> (<|im_end|>), and the
 * piecewise ids equal the whole-text encoding for these conversations; the
 * same holds with Llama 2's tokenizer.json for llama2 (content + " </s>").
 *
 * Needs $MEMFIT_CACHE/hf/{llama3,qwen3,llama2}/ from scripts/fetch_data.sh;
 * missing data fails the test.
 */
#include "memfit/core.h"
#include "memfit/data.h"
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The second assistant turn has surrounding whitespace: llama3 and llama2
 * strip it (Jinja trim / .strip()), chatml and smollm2 keep it. */
static const char conv3[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are terse.\"},"
    " {\"role\": \"user\", \"content\": \"Hi there\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello! How can I help? \\u00c7a va \\u65e5\\u672c\"},"
    " {\"role\": \"user\", \"content\": \"What is 2+2?\"},"
    " {\"role\": \"assistant\", \"content\": \"  4, of course.\\n\"}]}";
static const char pc[] = "{\"prompt\": \"Name a colour.\", \"completion\": \"Blue.\"}";

#define A1 "Hello! How can I help? \xc3\x87" "a va \xe6\x97\xa5\xe6\x9c\xac"

typedef struct {
    const char *name;
    const char *conv_text;
    const char *conv_spans[3];
    const char *pc_text;
    const char *pc_spans[2];
} expect;

static const expect expects[] = {
    {"llama3",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n" A1 "<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n4, of course.<|eot_id|>",
     {A1 "<|eot_id|>", "4, of course.<|eot_id|>", NULL},
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|>",
     {"Blue.<|eot_id|>", NULL}},
    {"chatml",
     "<|im_start|>system\nYou are terse.<|im_end|>\n"
     "<|im_start|>user\nHi there<|im_end|>\n"
     "<|im_start|>assistant\n" A1 "<|im_end|>\n"
     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n  4, of course.\n<|im_end|>\n",
     {A1 "<|im_end|>", "  4, of course.\n<|im_end|>", NULL},
     "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n",
     {"Blue.<|im_end|>", NULL}},
    {"llama2",
     "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] " A1 " </s>"
     "<s>[INST] What is 2+2? [/INST] 4, of course. </s>",
     {A1 " </s>", "4, of course. </s>", NULL},
     "<s>[INST] Name a colour. [/INST] Blue. </s>",
     {"Blue. </s>", NULL}},
    {"smollm2",
     "<|im_start|>system\nYou are terse.<|im_end|>\n"
     "<|im_start|>user\nHi there<|im_end|>\n"
     "<|im_start|>assistant\n" A1 "<|im_end|>\n"
     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n  4, of course.\n<|im_end|>\n",
     {A1 "<|im_end|>", "  4, of course.\n<|im_end|>", NULL},
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
     "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n",
     {"Blue.<|im_end|>", NULL}},
};

static void check_render(const char *fam, const char *line, const char *want, const char *const *spans) {
    mf_chat_template t;
    CHECK(mf_chat_template_by_name(fam, &t) == 0, "%s: %s", fam, mf_error());
    CHECK(!strcmp(mf_chat_template_name(t), fam), "%s: name %s", fam, mf_chat_template_name(t));
    mf_chat c;
    if (mf_chat_parse_line(line, strlen(line), 3, &c)) {
        CHECK(0, "%s: parse: %s", fam, mf_error());
        return;
    }
    mf_chat_rendered r;
    if (mf_chat_render(t, &c, &r)) {
        CHECK(0, "%s: render: %s", fam, mf_error());
        mf_chat_free(&c);
        return;
    }
    CHECK(r.len == strlen(r.text) && !strcmp(r.text, want), "%s: rendered\n[%s]\nwant\n[%s]", fam, r.text, want);
    int ns = 0;
    while (spans[ns]) ns++;
    CHECK(r.n_spans == ns, "%s: %d spans, want %d", fam, r.n_spans, ns);
    for (int i = 0; i < r.n_spans && i < ns; i++) {
        size_t n = r.spans[i].end - r.spans[i].begin;
        CHECK(r.spans[i].end <= r.len && n == strlen(spans[i]) && !memcmp(r.text + r.spans[i].begin, spans[i], n),
              "%s: span %d is [%.*s], want [%s]", fam, i, (int)n, r.text + r.spans[i].begin, spans[i]);
        if (i > 0) CHECK(r.spans[i].begin >= r.spans[i - 1].end, "%s: spans overlap", fam);
    }
    mf_chat_rendered_free(&r);
    mf_chat_free(&c);
}

static void check_error(const char *line, long lineno, const char *want) {
    mf_chat c;
    int rc = mf_chat_parse_line(line, strlen(line), lineno, &c);
    CHECK(rc == -1, "accepted: %s", line);
    if (rc == 0) { mf_chat_free(&c); return; }
    const char *e = mf_error();
    char ln[32];
    snprintf(ln, sizeof ln, "line %ld", lineno);
    CHECK(strstr(e, ln) != NULL, "%s: error does not name %s: %s", line, ln, e);
    CHECK(strstr(e, want) != NULL, "%s: error does not say \"%s\": %s", line, want, e);
    CHECK(strchr(e, '\n') == NULL, "%s: error is not one line: %s", line, e);
    CHECK(c.n == 0 && c.msgs == NULL, "%s: *out not left empty", line);
}

/* Renders `line` with `fam`, tokenizes it with tok, and checks: each run of
 * masked ids decodes to exactly its span's text, all ids decode to the
 * whole text, and the piecewise ids equal the whole-text encoding. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} idlist;
static void push(int32_t id, void *ctx) {
    idlist *l = ctx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) abort();
    }
    l->v[l->n++] = id;
}

static void check_tokens(const mf_tokenizer *tok, const char *fam, const char *line, const char *const *spans,
                         int want_whole_equal, int want_text_back) {
    mf_chat_template t;
    mf_chat c;
    mf_chat_rendered r;
    if (mf_chat_template_by_name(fam, &t) || mf_chat_parse_line(line, strlen(line), 1, &c)) {
        CHECK(0, "%s: %s", fam, mf_error());
        return;
    }
    if (mf_chat_render(t, &c, &r)) {
        CHECK(0, "%s: %s", fam, mf_error());
        mf_chat_free(&c);
        return;
    }
    int32_t *ids;
    uint8_t *mask;
    size_t n;
    if (mf_chat_tokenize(tok, &r, &ids, &mask, &n)) {
        CHECK(0, "%s: tokenize: %s", fam, mf_error());
    } else {
        int run = 0;
        size_t i = 0;
        while (i < n) {
            if (!mask[i]) { i++; continue; }
            size_t j = i;
            while (j < n && mask[j]) j++;
            char *s = NULL;
            size_t len = 0;
            CHECK(mf_tokenizer_decode_text(tok, ids + i, j - i, &s, &len) == 0, "%s: decode", fam);
            CHECK(spans[run] != NULL, "%s: more masked runs than assistant turns", fam);
            if (s && spans[run])
                CHECK(len == strlen(spans[run]) && !memcmp(s, spans[run], len), "%s: masked run %d decodes to [%s], want [%s]",
                      fam, run, s, spans[run]);
            free(s);
            if (spans[run]) run++;
            i = j;
        }
        CHECK(spans[run] == NULL, "%s: %d masked runs, fewer than the assistant turns", fam, run);
        char *all = NULL;
        size_t alen = 0;
        CHECK(mf_tokenizer_decode_text(tok, ids, n, &all, &alen) == 0, "%s: decode all", fam);
        if (all && want_text_back) CHECK(alen == r.len && !memcmp(all, r.text, alen), "%s: ids decode to [%s]", fam, all);
        free(all);
        if (want_whole_equal) {
            idlist w = {0};
            CHECK(mf_tokenizer_encode(tok, r.text, r.len, push, &w) == 0, "%s: encode", fam);
            int same = w.n == n && !memcmp(w.v, ids, n * sizeof *ids);
            CHECK(same, "%s: piecewise ids (%zu) differ from the whole-text encoding (%zu)", fam, n, w.n);
            free(w.v);
        }
        free(ids);
        free(mask);
    }
    mf_chat_rendered_free(&r);
    mf_chat_free(&c);
}

int main(void) {
    /* 1. rendering and loss spans, every family */
    for (size_t i = 0; i < sizeof expects / sizeof expects[0]; i++) {
        const expect *e = &expects[i];
        check_render(e->name, conv3, e->conv_text, e->conv_spans);
        check_render(e->name, pc, e->pc_text, e->pc_spans);
    }
    mf_chat_template t;
    CHECK(mf_chat_template_by_name("vicuna", &t) == -1 && strstr(mf_error(), "vicuna"), "unknown name: %s", mf_error());

    /* the parser keeps the contents as given */
    {
        mf_chat c;
        CHECK(mf_chat_parse_line(conv3, strlen(conv3), 1, &c) == 0, "%s", mf_error());
        CHECK(c.n == 5 && c.msgs[0].role == MF_CHAT_SYSTEM && c.msgs[4].role == MF_CHAT_ASSISTANT &&
                  !strcmp(c.msgs[4].content, "  4, of course.\n") && c.msgs[4].len == 16,
              "parsed %d messages", c.n);
        mf_chat_free(&c);
        CHECK(mf_chat_parse_line(pc, strlen(pc), 1, &c) == 0, "%s", mf_error());
        CHECK(c.n == 2 && c.msgs[0].role == MF_CHAT_USER && c.msgs[1].role == MF_CHAT_ASSISTANT &&
                  !strcmp(c.msgs[1].content, "Blue."),
              "prompt/completion parsed to %d messages", c.n);
        mf_chat_free(&c);
    }
    /* llama2 needs alternating user/assistant after an optional system turn */
    {
        const char *bad = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"},"
                          " {\"role\": \"assistant\", \"content\": \"c\"}]}";
        mf_chat c;
        mf_chat_rendered r;
        CHECK(mf_chat_parse_line(bad, strlen(bad), 12, &c) == 0, "%s", mf_error());
        CHECK(mf_chat_render(MF_CHAT_LLAMA2, &c, &r) == -1 && strstr(mf_error(), "line 12") &&
                  !strchr(mf_error(), '\n'),
              "llama2 non-alternating: %s", mf_error());
        CHECK(mf_chat_render(MF_CHAT_CHATML, &c, &r) == 0, "chatml renders it: %s", mf_error());
        mf_chat_rendered_free(&r);
        mf_chat_free(&c);
    }

    /* 2. errors: one line, naming the line number */
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}", 7, "malformed JSON");
    check_error("not json at all", 8, "malformed JSON");
    check_error("[1, 2]", 9, "expected a JSON object");
    check_error("{\"messages\": {\"role\": \"user\"}}", 10, "\"messages\" is not an array");
    check_error("{\"messages\": [{\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"x\"}]}", 11,
                "messages[0] has no \"role\"");
    check_error("{\"messages\": [{\"role\": \"bot\\n\", \"content\": \"hi\"}]}", 12, "unknown role \"bot\\x0a\"");
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 13, "\"content\" is not a string");
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": [\"a\"]}]}", 14, "\"content\" is not a string");
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"\"}]}", 15,
                "messages[1]: empty assistant turn");
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \" \\n\"}]}", 16,
                "empty assistant turn");
    check_error("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi\"}]}", 17,
                "no assistant turn");
    check_error("{\"messages\": []}", 18, "no assistant turn");
    check_error("{\"prompt\": \"hi\", \"completion\": \"\"}", 19, "empty assistant turn");
    check_error("{\"prompt\": \"hi\"}", 20, "no assistant turn");
    check_error("{\"prompt\": 3, \"completion\": \"x\"}", 21, "not a string");
    check_error("{\"prompt\": \"hi\", \"completion\": null}", 22, "not a string");
    check_error("{\"text\": \"hi\"}", 23, "no \"messages\"");
    check_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"prompt\": \"x\"}", 24, "both");
    check_error("{\"messages\": [{\"role\": \"user\"}]}", 25, "has no \"content\"");

    /* 3. templates recognised from chat_template strings and tokenizer_config.json */
    {
        static const struct { const char *tpl; mf_chat_template want; } det[] = {
            {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>' + '\\n'}}{% endfor %}", MF_CHAT_CHATML},
            {"{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI "
             "assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}", MF_CHAT_SMOLLM2},
            {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' }}", MF_CHAT_LLAMA2},
            {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", MF_CHAT_LLAMA3},
        };
        for (size_t i = 0; i < sizeof det / sizeof det[0]; i++) {
            mf_chat_template got = (mf_chat_template)-1;
            CHECK(mf_chat_template_detect(det[i].tpl, "x.json", &got) == 0 && got == det[i].want,
                  "detect %zu: got %d (%s)", i, (int)got, mf_error());
        }
        CHECK(mf_chat_template_detect("{{ messages }}", "some/tokenizer_config.json", &t) == -1 &&
                  strstr(mf_error(), "some/tokenizer_config.json") && !strchr(mf_error(), '\n'),
              "unknown template: %s", mf_error());
        CHECK(mf_chat_template_detect("{{ '[INST] ' + m + ' [/INST]' }}", "mistral.json", &t) == -1 &&
                  strstr(mf_error(), "mistral.json"),
              "[INST] without <<SYS>>: %s", mf_error());
        char p[1024];
        if (mf_test_cache_path("hf/llama3/tokenizer_config.json", p, sizeof p)) {
            CHECK(mf_chat_template_from_config(p, &t) == 0 && t == MF_CHAT_LLAMA3, "llama3 config: %s", mf_error());
        } else CHECK(0, "missing %s (run scripts/fetch_data.sh)", "hf/llama3/tokenizer_config.json");
        if (mf_test_cache_path("hf/qwen3/tokenizer_config.json", p, sizeof p)) {
            CHECK(mf_chat_template_from_config(p, &t) == 0 && t == MF_CHAT_CHATML, "qwen3 config: %s", mf_error());
        } else CHECK(0, "missing %s (run scripts/fetch_data.sh)", "hf/qwen3/tokenizer_config.json");
        if (mf_test_cache_path("hf/llama2/tokenizer_config.json", p, sizeof p)) {
            /* this copy has no chat_template: refused, naming the file */
            CHECK(mf_chat_template_from_config(p, &t) == -1 && strstr(mf_error(), p), "llama2 config: %s",
                  mf_error());
        } else CHECK(0, "missing %s (run scripts/fetch_data.sh)", "hf/llama2/tokenizer_config.json");
        CHECK(mf_chat_template_from_config("/nonexistent/tokenizer_config.json", &t) == -1 &&
                  strstr(mf_error(), "/nonexistent/tokenizer_config.json"),
              "missing file: %s", mf_error());
    }

    /* 4. tokenization: masked ids decode to exactly the assistant contents + end token */
    {
        char p[1024];
        if (!mf_test_cache_path("hf/llama3/tokenizer.json", p, sizeof p)) {
            CHECK(0, "missing $MEMFIT_CACHE/hf/llama3/tokenizer.json (run scripts/fetch_data.sh)");
        } else {
            mf_tokenizer *tok = mf_tokenizer_hf(p);
            CHECK(tok != NULL, "%s", mf_error());
            if (tok) {
                check_tokens(tok, "llama3", conv3, expects[0].conv_spans, 1, 1);
                check_tokens(tok, "llama3", pc, expects[0].pc_spans, 1, 1);
                /* <|eot_id|> is one added token in each masked run, and it is masked */
                mf_chat c;
                mf_chat_rendered r;
                int32_t *ids;
                uint8_t *mask;
                size_t n;
                if (!mf_chat_parse_line(pc, strlen(pc), 1, &c) && !mf_chat_render(MF_CHAT_LLAMA3, &c, &r)) {
                    if (!mf_chat_tokenize(tok, &r, &ids, &mask, &n)) {
                        CHECK(n >= 2 && ids[0] == 128000 && ids[n - 1] == 128009 && mask[n - 1] == 1 && mask[0] == 0,
                              "llama3 ids: first %d last %d", n ? ids[0] : -1, n ? ids[n - 1] : -1);
                        int masked = 0;
                        for (size_t i = 0; i < n; i++) masked += mask[i];
                        CHECK(masked == 3, "llama3 pc: %d masked ids, want 3 (Blue . <|eot_id|>)", masked);
                        free(ids);
                        free(mask);
                    } else CHECK(0, "%s", mf_error());
                    mf_chat_rendered_free(&r);
                    mf_chat_free(&c);
                } else CHECK(0, "%s", mf_error());
                mf_tokenizer_free(tok);
            }
        }
        if (!mf_test_cache_path("hf/qwen3/tokenizer.json", p, sizeof p)) {
            CHECK(0, "missing $MEMFIT_CACHE/hf/qwen3/tokenizer.json (run scripts/fetch_data.sh)");
        } else {
            mf_tokenizer *tok = mf_tokenizer_hf(p);
            CHECK(tok != NULL, "%s", mf_error());
            if (tok) {
                check_tokens(tok, "chatml", conv3, expects[1].conv_spans, 1, 1);
                check_tokens(tok, "chatml", pc, expects[1].pc_spans, 1, 1);
                mf_tokenizer_free(tok);
            }
        }
    }
    /* Llama 2's SentencePiece tokenizer.json prepends "▁" to every piece:
     * the space before each assistant span is carried by that "▁", so the
     * ids still equal the whole-text encoding and each masked run decodes
     * (the decoder strips one leading space) to the content + " </s>". The
     * whole sequence does not decode back to the text (the reference
     * decoder keeps the prefix space after <s>), so that is not checked. */
    {
        char p[1024];
        if (!mf_test_cache_path("hf/llama2/tokenizer.json", p, sizeof p)) {
            CHECK(0, "missing $MEMFIT_CACHE/hf/llama2/tokenizer.json (run scripts/fetch_data.sh)");
        } else {
            mf_tokenizer *tok = mf_tokenizer_hf(p);
            CHECK(tok != NULL, "%s", mf_error());
            if (tok) {
                check_tokens(tok, "llama2", conv3, expects[2].conv_spans, 1, 0);
                check_tokens(tok, "llama2", pc, expects[2].pc_spans, 1, 0);
                mf_tokenizer_free(tok);
            }
        }
    }
    return mf_test_done("test_chat_templates");
}
