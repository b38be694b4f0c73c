/* Chat data: JSONL conversations, chat templates, loss spans, and
 * tokenization with a per-id loss mask.
 *
 * A conversation is rendered by one of four template families, written
 * here in C from each family's published Jinja chat_template (we do not
 * run Jinja). Each renders the text as apply_chat_template(messages,
 * tokenize=False, add_generation_prompt=False) does, and records the byte
 * ranges that count for the loss: every assistant turn's content plus the
 * end-of-turn token that follows it (what TRL's assistant_only_loss masks
 * through the template's {% generation %} blocks).
 *
 * "strip" below is Python's str.strip() / Jinja's `trim`, applied to ASCII
 * whitespace (space, \t, \n, \v, \f, \r and \x1c-\x1f, which Python also
 * strips); Unicode whitespace such as U+00A0 or U+3000 is not stripped
 * (a difference from the reference for content that begins or ends so).
 *
 * llama3 — meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json
 *   (the chat_template stored in $MEMFIT_CACHE/hf/llama3/):
 *     {% set content = '<|start_header_id|>' + message['role'] +
 *        '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}
 *     {% if loop.index0 == 0 %}{% set content = bos_token + content %}
 *   i.e. "<|begin_of_text|>" then, per message,
 *     "<|start_header_id|>{role}<|end_header_id|>\n\n{strip(content)}<|eot_id|>"
 *   Loss span: strip(content) + "<|eot_id|>". (Llama 3.1+ templates add a
 *   "Cutting Knowledge Date" system preamble; that is not rendered here.)
 *
 * chatml — Qwen2 / Qwen2.5 / Qwen3 (the <|im_start|> format):
 *     "<|im_start|>{role}\n{content}<|im_end|>\n" per message.
 *   Loss span: content + "<|im_end|>" (the "\n" after it is not in the
 *   loss). Qwen2/2.5's templates insert a default system turn ("You are a
 *   helpful assistant." / "You are Qwen, created by Alibaba Cloud. ...")
 *   when none is given, and Qwen3's strips <think> blocks from earlier
 *   turns; neither is done here: plain ChatML.
 *
 * smollm2 — HuggingFaceTB/SmolLM2-*-Instruct tokenizer_config.json:
 *     {% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou
 *     are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}
 *     {% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] +
 *     '<|im_end|>' + '\n'}}
 *   i.e. ChatML, with that default system turn when the first message is
 *   not a system one. Loss span: content + "<|im_end|>".
 *
 * llama2 — meta-llama/Llama-2-7b-chat-hf tokenizer_config.json:
 *     system (only as the first message) is folded into the first user turn:
 *       content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + user
 *     user:      bos_token + '[INST] ' + content.strip() + ' [/INST]'
 *     assistant: ' ' + content.strip() + ' ' + eos_token
 *     roles must alternate user/assistant/user/... (raise_exception otherwise)
 *   i.e. "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>"
 *        "<s>[INST] {user2} [/INST] {assistant2} </s>"
 *   Loss span: strip(assistant) + " </s>" (the space before the EOS lies
 *   between the content and the end token, so it is inside the span).
 */
#include "memfit/core.h"
#include "memfit/data.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ----------------------------------------------------------- */

const char *mf_chat_role_name(mf_chat_role r) {
    switch (r) {
    case MF_CHAT_SYSTEM: return "system";
    case MF_CHAT_USER: return "user";
    case MF_CHAT_ASSISTANT: return "assistant";
    }
    return "?";
}

static int mf_chat_ws(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* [*b, *e) narrowed to the stripped range of s[0..n). */
static void mf_chat_strip(const char *s, size_t n, size_t *b, size_t *e) {
    size_t i = 0, j = n;
    while (i < j && mf_chat_ws((unsigned char)s[i])) i++;
    while (j > i && mf_chat_ws((unsigned char)s[j - 1])) j--;
    *b = i;
    *e = j;
}

/* A value quoted for a one-line message: printable ASCII kept, anything
 * else as \xNN, at most ~40 characters. */
static const char *mf_chat_quote(const char *s, char *buf, size_t n) {
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 8 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 40) { o += (size_t)snprintf(buf + o, n - o, "..."); break; }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}

void mf_chat_free(mf_chat *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->msgs[i].content);
    free(c->msgs);
    c->msgs = NULL;
    c->n = 0;
}

static int mf_chat_add(mf_chat *c, mf_chat_role role, const char *s, long lineno) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (!d) return mf_fail("line %ld: out of memory", lineno);
    memcpy(d, s, n + 1);
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = d;
    c->msgs[c->n].len = n;
    c->n++;
    return 0;
}

static int mf_chat_check_assistant(const char *s, long lineno, const char *where) {
    size_t b, e;
    mf_chat_strip(s, strlen(s), &b, &e);
    if (b == e) return mf_fail("line %ld: %s: empty assistant turn", lineno, where);
    return 0;
}

int mf_chat_parse_line(const char *line, size_t len, long lineno, mf_chat *out) {
    memset(out, 0, sizeof *out);
    out->line = lineno;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!root) {
        size_t at = end && end >= line ? (size_t)(end - line) : 0;
        return mf_fail("line %ld: malformed JSON (near byte %zu)", lineno, at + 1);
    }
    int rc = -1;
    char q[128];
    if (!cJSON_IsObject(root)) {
        mf_fail("line %ld: expected a JSON object with \"messages\" or \"prompt\"/\"completion\"", lineno);
        goto done;
    }
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    cJSON *completion = cJSON_GetObjectItemCaseSensitive(root, "completion");
    if (msgs && (prompt || completion)) {
        mf_fail("line %ld: has both \"messages\" and \"prompt\"/\"completion\"", lineno);
        goto done;
    }
    if (msgs) {
        if (!cJSON_IsArray(msgs)) {
            mf_fail("line %ld: \"messages\" is not an array", lineno);
            goto done;
        }
        int n = cJSON_GetArraySize(msgs);
        out->msgs = calloc(n > 0 ? (size_t)n : 1, sizeof *out->msgs);
        if (!out->msgs) { mf_fail("line %ld: out of memory", lineno); goto done; }
        int i = 0, n_assist = 0;
        cJSON *m;
        cJSON_ArrayForEach(m, msgs) {
            char where[48];
            snprintf(where, sizeof where, "messages[%d]", i);
            if (!cJSON_IsObject(m)) { mf_fail("line %ld: %s is not an object", lineno, where); goto done; }
            cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!role) { mf_fail("line %ld: %s has no \"role\"", lineno, where); goto done; }
            if (!cJSON_IsString(role)) { mf_fail("line %ld: %s: \"role\" is not a string", lineno, where); goto done; }
            mf_chat_role r;
            if (!strcmp(role->valuestring, "system")) r = MF_CHAT_SYSTEM;
            else if (!strcmp(role->valuestring, "user")) r = MF_CHAT_USER;
            else if (!strcmp(role->valuestring, "assistant")) r = MF_CHAT_ASSISTANT;
            else {
                mf_fail("line %ld: %s: unknown role \"%s\" (expected system, user or assistant)", lineno, where,
                        mf_chat_quote(role->valuestring, q, sizeof q));
                goto done;
            }
            if (!content) { mf_fail("line %ld: %s has no \"content\"", lineno, where); goto done; }
            if (!cJSON_IsString(content)) {
                mf_fail("line %ld: %s: \"content\" is not a string", lineno, where);
                goto done;
            }
            if (r == MF_CHAT_ASSISTANT) {
                if (mf_chat_check_assistant(content->valuestring, lineno, where)) goto done;
                n_assist++;
            }
            if (mf_chat_add(out, r, content->valuestring, lineno)) goto done;
            i++;
        }
        if (!n_assist) { mf_fail("line %ld: no assistant turn", lineno); goto done; }
    } else if (prompt || completion) {
        if (!prompt) { mf_fail("line %ld: has \"completion\" but no \"prompt\"", lineno); goto done; }
        if (!completion) { mf_fail("line %ld: has \"prompt\" but no \"completion\" (no assistant turn)", lineno); goto done; }
        if (!cJSON_IsString(prompt)) { mf_fail("line %ld: \"prompt\": content is not a string", lineno); goto done; }
        if (!cJSON_IsString(completion)) { mf_fail("line %ld: \"completion\": content is not a string", lineno); goto done; }
        if (mf_chat_check_assistant(completion->valuestring, lineno, "\"completion\"")) goto done;
        out->msgs = calloc(2, sizeof *out->msgs);
        if (!out->msgs) { mf_fail("line %ld: out of memory", lineno); goto done; }
        if (mf_chat_add(out, MF_CHAT_USER, prompt->valuestring, lineno)) goto done;
        if (mf_chat_add(out, MF_CHAT_ASSISTANT, completion->valuestring, lineno)) goto done;
    } else {
        mf_fail("line %ld: no \"messages\" array and no \"prompt\"/\"completion\" pair", lineno);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) mf_chat_free(out);
    return rc;
}

/* ---- templates --------------------------------------------------------- */

static const char *const mf_chat_names[] = {"llama3", "chatml", "llama2", "smollm2"};

int mf_chat_template_by_name(const char *name, mf_chat_template *out) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, mf_chat_names[i])) { *out = (mf_chat_template)i; return 0; }
    if (!strcmp(name, "qwen")) { *out = MF_CHAT_CHATML; return 0; }
    char q[128];
    return mf_fail("unknown chat template \"%s\" (expected llama3, chatml, llama2 or smollm2)",
                   mf_chat_quote(name, q, sizeof q));
}

const char *mf_chat_template_name(mf_chat_template t) {
    return (unsigned)t < 4 ? mf_chat_names[t] : "?";
}

int mf_chat_template_detect(const char *tpl, const char *path, mf_chat_template *out) {
    if (strstr(tpl, "<|start_header_id|>")) { *out = MF_CHAT_LLAMA3; return 0; }
    if (strstr(tpl, "<|im_start|>")) {
        *out = strstr(tpl, "named SmolLM") ? MF_CHAT_SMOLLM2 : MF_CHAT_CHATML;
        return 0;
    }
    if (strstr(tpl, "[INST]")) {
        if (strstr(tpl, "<<SYS>>")) { *out = MF_CHAT_LLAMA2; return 0; }
        return mf_fail("%s: chat_template uses [INST] without <<SYS>> (a Mistral-style template; "
                       "known: llama3, chatml, llama2, smollm2)", path);
    }
    return mf_fail("%s: unknown chat_template family (no <|start_header_id|>, <|im_start|> or "
                   "[INST] ... <<SYS>>; known: llama3, chatml, llama2, smollm2)", path);
}

int mf_chat_template_from_config(const char *path, mf_chat_template *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return mf_fail("%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 > cap) {
            cap = cap ? 2 * cap : 131072;
            char *b = realloc(buf, cap);
            if (!b) { free(buf); fclose(f); return mf_fail("%s: out of memory", path); }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return mf_fail("%s: read error", path); }
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!root) return mf_fail("%s: malformed JSON", path);
    int rc;
    cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(t)) {
        cJSON *e, *pick = NULL;
        cJSON_ArrayForEach(e, t) {
            cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))
                pick = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        t = pick;
    }
    if (!t) rc = mf_fail("%s: no chat_template", path);
    else if (!cJSON_IsString(t)) rc = mf_fail("%s: chat_template is not a string", path);
    else rc = mf_chat_template_detect(t->valuestring, path, out);
    cJSON_Delete(root);
    return rc;
}

/* ---- rendering --------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    mf_chat_span *sp;
    int nsp, capsp;
    int oom;
} mf_chat_buf;

static __attribute__((noinline)) void mf_chat_put(mf_chat_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (n > (SIZE_MAX >> 2) || b->n > (SIZE_MAX >> 2)) { b->oom = 1; return; }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *d = realloc(b->s, cap);
        if (!d) { b->oom = 1; return; }
        b->s = d;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void mf_chat_puts(mf_chat_buf *b, const char *s) { mf_chat_put(b, s, strlen(s)); }

static void mf_chat_span_add(mf_chat_buf *b, size_t begin, size_t end) {
    if (b->oom) return;
    if (b->nsp == b->capsp) {
        int cap = b->capsp ? 2 * b->capsp : 8;
        mf_chat_span *d = realloc(b->sp, (size_t)cap * sizeof *d);
        if (!d) { b->oom = 1; return; }
        b->sp = d;
        b->capsp = cap;
    }
    b->sp[b->nsp].begin = begin;
    b->sp[b->nsp].end = end;
    b->nsp++;
}

/* ChatML-style: "<|im_start|>{role}\n{content}<|im_end|>\n". */
static void mf_chat_render_chatml(mf_chat_buf *b, const mf_chat *c, int smollm2) {
    if (smollm2 && c->n > 0 && c->msgs[0].role != MF_CHAT_SYSTEM)
        mf_chat_puts(b, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                        "Face<|im_end|>\n");
    for (int i = 0; i < c->n; i++) {
        const mf_chat_msg *m = &c->msgs[i];
        mf_chat_puts(b, "<|im_start|>");
        mf_chat_puts(b, mf_chat_role_name(m->role));
        mf_chat_puts(b, "\n");
        size_t begin = b->n;
        mf_chat_put(b, m->content, m->len);
        mf_chat_puts(b, "<|im_end|>");
        if (m->role == MF_CHAT_ASSISTANT) mf_chat_span_add(b, begin, b->n);
        mf_chat_puts(b, "\n");
    }
}

static void mf_chat_render_llama3(mf_chat_buf *b, const mf_chat *c) {
    mf_chat_puts(b, "<|begin_of_text|>");
    for (int i = 0; i < c->n; i++) {
        const mf_chat_msg *m = &c->msgs[i];
        size_t sb, se;
        mf_chat_strip(m->content, m->len, &sb, &se);
        mf_chat_puts(b, "<|start_header_id|>");
        mf_chat_puts(b, mf_chat_role_name(m->role));
        mf_chat_puts(b, "<|end_header_id|>\n\n");
        size_t begin = b->n;
        mf_chat_put(b, m->content + sb, se - sb);
        mf_chat_puts(b, "<|eot_id|>");
        if (m->role == MF_CHAT_ASSISTANT) mf_chat_span_add(b, begin, b->n);
    }
}

static int mf_chat_render_llama2(mf_chat_buf *b, const mf_chat *c) {
    int first = 0;
    const mf_chat_msg *sys = NULL;
    if (c->n > 0 && c->msgs[0].role == MF_CHAT_SYSTEM) { sys = &c->msgs[0]; first = 1; }
    for (int i = first; i < c->n; i++) {
        const mf_chat_msg *m = &c->msgs[i];
        int k = i - first;
        mf_chat_role want = (k % 2 == 0) ? MF_CHAT_USER : MF_CHAT_ASSISTANT;
        if (m->role != want)
            return mf_fail("line %ld: messages[%d] is %s: the llama2 template needs an optional first system "
                           "turn, then user/assistant turns alternating from user",
                           c->line, i, mf_chat_role_name(m->role));
        if (m->role == MF_CHAT_USER) {
            mf_chat_puts(b, "<s>[INST] ");
            /* content = ('<<SYS>>\n' + system + '\n<</SYS>>\n\n' if first) + user; then strip */
            mf_chat_buf t = {0};
            if (k == 0 && sys) {
                mf_chat_puts(&t, "<<SYS>>\n");
                mf_chat_put(&t, sys->content, sys->len);
                mf_chat_puts(&t, "\n<</SYS>>\n\n");
            }
            mf_chat_put(&t, m->content, m->len);
            if (t.oom || !t.s) { free(t.s); b->oom = 1; return 0; }
            size_t sb, se;
            mf_chat_strip(t.s, t.n, &sb, &se);
            if (se > sb) mf_chat_put(b, t.s + sb, se - sb);
            free(t.s);
            mf_chat_puts(b, " [/INST]");
        } else {
            size_t sb, se;
            mf_chat_strip(m->content, m->len, &sb, &se);
            mf_chat_puts(b, " ");
            size_t begin = b->n;
            mf_chat_put(b, m->content + sb, se - sb);
            mf_chat_puts(b, " </s>");
            mf_chat_span_add(b, begin, b->n);
        }
    }
    return 0;
}

void mf_chat_rendered_free(mf_chat_rendered *r) {
    if (!r) return;
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

int mf_chat_render(mf_chat_template t, const mf_chat *c, mf_chat_rendered *out) {
    memset(out, 0, sizeof *out);
    mf_chat_buf b = {0};
    mf_chat_puts(&b, ""); /* text is never NULL */
    int rc = 0;
    switch (t) {
    case MF_CHAT_LLAMA3: mf_chat_render_llama3(&b, c); break;
    case MF_CHAT_CHATML: mf_chat_render_chatml(&b, c, 0); break;
    case MF_CHAT_SMOLLM2: mf_chat_render_chatml(&b, c, 1); break;
    case MF_CHAT_LLAMA2: rc = mf_chat_render_llama2(&b, c); break;
    default: rc = mf_fail("line %ld: unknown chat template %d", c->line, (int)t); break;
    }
    if (!rc && b.oom) rc = mf_fail("line %ld: out of memory rendering the conversation", c->line);
    if (rc) {
        free(b.s);
        free(b.sp);
        return -1;
    }
    out->text = b.s;
    out->len = b.n;
    out->spans = b.sp;
    out->n_spans = b.nsp;
    return 0;
}

/* ---- tokenization ------------------------------------------------------ */

/* Piecewise: the text is cut at every span boundary and each piece is
 * encoded on its own (add_special_tokens=False; added tokens such as
 * <|eot_id|> and <|im_end|> are matched inside a piece), the ids
 * concatenated, and a piece's ids are all masked 1 (a loss span) or all 0.
 * Why: no token can then straddle a boundary, so "a token is in the loss
 * when its bytes lie in a loss span" holds exactly, without offsets from
 * the encoder. The cost is that ids can differ from encoding the whole
 * text where a pre-token or merge would have crossed a boundary. With the
 * templates above every span begins right after "\n", "\n\n" or " " and
 * ends with an added token (or, for llama2, "</s>"), and for the
 * byte-level tokenizers (Llama 3, Qwen) those are pre-token boundaries
 * already when the content starts with a non-space character (checked
 * against the whole-text encoding in tests/test_chat_templates.c). For a
 * SentencePiece-style tokenizer.json with a Prepend("▁") normalizer
 * (Llama 2) every piece gets its own "▁" prefix; where a loss span follows
 * a space (llama2's "[/INST] {assistant}"), that space is left out of the
 * gap before it and the span's prepended "▁" stands for it, which gives
 * the whole-text ids ("▁Hello" rather than "▁" + "▁Hello") — the token
 * whose "▁" came from the space is in the loss, as HF's offsets (which map
 * a prepended "▁" to the next character) would put it. Detected by
 * behaviour, not by reading the normalizer: encoding "x" decodes to " x",
 * and the span's first token decodes with a leading space its text lacks.
 * A piece that starts elsewhere (not after a space) still gets an extra
 * "▁" with such a tokenizer. */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap;
    uint8_t cur;
    int oom;
} mf_chat_ids;

static void mf_chat_emit(int32_t id, void *ctx) {
    mf_chat_ids *l = ctx;
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        int32_t *a = realloc(l->ids, cap * sizeof *a);
        if (!a) { l->oom = 1; return; }
        l->ids = a;
        uint8_t *m = realloc(l->mask, cap);
        if (!m) { l->oom = 1; return; }
        l->mask = m;
        l->cap = cap;
    }
    l->ids[l->n] = id;
    l->mask[l->n] = l->cur;
    l->n++;
}

static int mf_chat_piece(const mf_tokenizer *t, const char *s, size_t n, uint8_t m, mf_chat_ids *l) {
    if (n == 0) return 0;
    l->cur = m;
    if (mf_tokenizer_encode(t, s, n, mf_chat_emit, l)) return -1;
    if (l->oom) return mf_fail("out of memory tokenizing a conversation");
    return 0;
}

/* 1 if the id's bytes begin with a space. */
static int mf_chat_id_spaced(const mf_tokenizer *t, int32_t id) {
    const char *b;
    int k = mf_tokenizer_decode(t, id, &b);
    return k > 0 && b[0] == ' ';
}

/* 1 if the tokenizer prefixes every encoded piece with a space ("▁"). */
static int mf_chat_prepends_space(const mf_tokenizer *t) {
    mf_chat_ids p = {0};
    int yes = 0;
    if (mf_tokenizer_encode(t, "x", 1, mf_chat_emit, &p) == 0 && !p.oom && p.n > 0) {
        char buf[8];
        size_t o = 0;
        for (size_t i = 0; i < p.n && o < sizeof buf; i++) {
            const char *b;
            int k = mf_tokenizer_decode(t, p.ids[i], &b);
            for (int j = 0; j < k && o < sizeof buf; j++) buf[o++] = b[j];
        }
        yes = o == 2 && buf[0] == ' ' && buf[1] == 'x';
    }
    free(p.ids);
    free(p.mask);
    return yes;
}

static int mf_chat_append(mf_chat_ids *l, const mf_chat_ids *src, uint8_t m) {
    l->cur = m;
    for (size_t i = 0; i < src->n; i++) mf_chat_emit(src->ids[i], l);
    if (l->oom) return mf_fail("out of memory tokenizing a conversation");
    return 0;
}

int mf_chat_tokenize(const mf_tokenizer *t, const mf_chat_rendered *r, int32_t **ids, uint8_t **mask,
                     size_t *n) {
    *ids = NULL;
    *mask = NULL;
    *n = 0;
    mf_chat_ids l = {0}, sp = {0};
    size_t pos = 0;
    int rc = 0;
    int prepends = mf_chat_prepends_space(t);
    for (int i = 0; i < r->n_spans && !rc; i++) {
        const mf_chat_span *s = &r->spans[i];
        if (s->begin < pos || s->end < s->begin || s->end > r->len) {
            rc = mf_fail("loss span %d [%zu, %zu) is out of order or outside the text (%zu bytes)", i, s->begin,
                         s->end, r->len);
            break;
        }
        sp.n = 0;
        rc = mf_chat_piece(t, r->text + s->begin, s->end - s->begin, 1, &sp);
        if (rc) break;
        size_t gap_end = s->begin;
        if (prepends && s->begin > pos && s->end > s->begin && r->text[s->begin - 1] == ' ' &&
            r->text[s->begin] != ' ' && sp.n > 0 && mf_chat_id_spaced(t, sp.ids[0]))
            gap_end--; /* the span's prepended "▁" stands for this space */
        rc = mf_chat_piece(t, r->text + pos, gap_end - pos, 0, &l);
        if (!rc) rc = mf_chat_append(&l, &sp, 1);
        pos = s->end;
    }
    free(sp.ids);
    free(sp.mask);
    if (!rc) rc = mf_chat_piece(t, r->text + pos, r->len - pos, 0, &l);
    if (rc) {
        free(l.ids);
        free(l.mask);
        return -1;
    }
    *ids = l.ids;
    *mask = l.mask;
    *n = l.n;
    return 0;
}
