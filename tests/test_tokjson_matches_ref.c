/* tokenizer.json support gives the reference ids: for Llama 3 (byte-level
 * BPE, Split regex, ignore_merges), Qwen3 (NFC, merges as pairs, added
 * tokens that are not special) and Llama 2 (SentencePiece-style BPE with
 * byte fallback), memfit's ids equal transformers.js's
 * (encode(s, add_special_tokens=false), run by tests/ref/tokjson_ref.js)
 * on every string of tests/data/tokjson_strings.json and on lines and
 * paragraphs of Moby Dick (and, for the two byte-level files, on the whole
 * book as one text); memfit's decode of those ids equals the
 * reference decoder's text, which is the string itself except for what
 * the reference decoder changes (Llama 2's SentencePiece prefix space
 * around added tokens). A tokenizer.json of another model type is refused
 * with one line naming the file and the type.
 *
 * Needs node and $MEMFIT_CACHE filled by scripts/fetch_data.sh: hf/js,
 * hf/{llama3,qwen3,llama2}/, moby-dick.txt. Missing data fails the test.
 */
#include "memfit/core.h"
#include "memfit/data.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int32_t *v;
    size_t n, cap;
    int oom;
} mf_ids;

static void mf_ids_push(int32_t id, void *ctx) {
    mf_ids *l = ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) { l->oom = 1; return; }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = id;
}

static char *mf_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap + 1);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = realloc(b, (cap *= 2) + 1);
            if (!nb) { free(b); b = NULL; }
            else b = nb;
        }
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = n;
    return b;
}

/* Prints a string with its non-printable bytes escaped (for failures). */
static void mf_show(const char *what, const char *s, size_t n) {
    fprintf(stderr, "  %s: \"", what);
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != 0x7f && c != '"' && c != '\\') fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "%s\"\n", n > 200 ? "..." : "");
}

/* The strings: the committed list, then Moby Dick's lines (every 37th
 * non-empty one) and 40 paragraphs of 4 kB at fixed offsets. (Not the
 * whole book: without a pre-tokenizer Llama 2's is one 1.2 MB word, which
 * the reference takes 15 s over.) */
static cJSON *mf_build_strings(const char *list_path, const char *moby, size_t moby_n) {
    size_t n;
    char *text = mf_slurp(list_path, &n);
    CHECK(text != NULL, "cannot read %s", list_path);
    if (!text) return NULL;
    cJSON *arr = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_IsArray(arr), "%s is not a JSON array", list_path);
    if (!cJSON_IsArray(arr)) { cJSON_Delete(arr); return NULL; }
    char *line = malloc(moby_n + 1);
    size_t k = 0;
    for (size_t i = 0; i < moby_n && line;) {
        const char *nl = memchr(moby + i, '\n', moby_n - i);
        size_t e = nl ? (size_t)(nl - moby) : moby_n;
        if (e > i && k++ % 37 == 0) {
            memcpy(line, moby + i, e - i);
            line[e - i] = 0;
            cJSON_AddItemToArray(arr, cJSON_CreateString(line));
        }
        i = e + 1;
    }
    for (int p = 0; p < 40 && line; p++) {
        size_t a = moby_n / 41 * (size_t)(p + 1), b = a + 4000 < moby_n ? a + 4000 : moby_n;
        while (a < b && ((unsigned char)moby[a] & 0xC0) == 0x80) a++;
        while (b > a && b < moby_n && ((unsigned char)moby[b] & 0xC0) == 0x80) b--;
        memcpy(line, moby + a, b - a);
        line[b - a] = 0;
        cJSON_AddItemToArray(arr, cJSON_CreateString(line));
    }
    free(line);
    return arr;
}

/* Encodes every string with memfit and compares with the reference's ids
 * and decoded text; returns the number of strings that differ. */
static int mf_check_one(const char *name, const char *tokdir, const char *hfjs, const char *ref_js,
                        const char *in_json, const cJSON *strings, int want_vocab) {
    char tj[4200], out_json[256], cmd[16384];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
    double t0 = mf_time_now();
    mf_tokenizer *t = mf_tokenizer_hf(tj);
    CHECK(t != NULL, "%s: load: %s", name, mf_error());
    if (!t) return 1;
    double tload = mf_time_now() - t0;
    CHECK(mf_tokenizer_kind(t) == MF_TOK_HF, "%s: kind", name);
    CHECK(mf_tokenizer_vocab(t) == want_vocab, "%s: vocab %d, want %d", name, mf_tokenizer_vocab(t), want_vocab);
    CHECK(mf_tokenizer_hash(t) != 0 && mf_tokenizer_hash(t) != MF_GPT2_HASH, "%s: hash", name);

    snprintf(out_json, sizeof out_json, "%s.%s.out.json", in_json, name);
    /* node prints a minified source line with any error: keep the last lines only */
    snprintf(cmd, sizeof cmd, "node '%s' '%s' '%s' '%s' '%s' 2> '%s.err' || { tail -c 1500 '%s.err' >&2; exit 1; }",
             ref_js, hfjs, tokdir, in_json, out_json, out_json, out_json);
    t0 = mf_time_now();
    int rc = system(cmd);
    double tref = mf_time_now() - t0;
    CHECK(rc == 0, "%s: the reference failed (%s)", name, cmd);
    size_t n;
    char *text = rc == 0 ? mf_slurp(out_json, &n) : NULL;
    cJSON *ref = text ? cJSON_Parse(text) : NULL;
    free(text);
    unlink(out_json);
    snprintf(cmd, sizeof cmd, "%s.err", out_json);
    unlink(cmd);
    const cJSON *rids = cJSON_GetObjectItemCaseSensitive(ref, "ids");
    const cJSON *rdec = cJSON_GetObjectItemCaseSensitive(ref, "decoded");
    CHECK(cJSON_IsArray(rids) && cJSON_IsArray(rdec) && cJSON_GetArraySize(rids) == cJSON_GetArraySize(strings),
          "%s: reference output is not {ids, decoded} for every string", name);
    if (!cJSON_IsArray(rids) || !cJSON_IsArray(rdec) || cJSON_GetArraySize(rids) != cJSON_GetArraySize(strings)) {
        cJSON_Delete(ref);
        mf_tokenizer_free(t);
        return 1;
    }
    int bad_ids = 0, bad_dec = 0, count = 0, same_text = 0;
    size_t total_ids = 0, total_bytes = 0;
    double tenc = 0;
    const cJSON *s = strings->child, *ri = rids->child, *rd = rdec->child;
    for (; s; s = s->next, ri = ri->next, rd = rd->next, count++) {
        const char *str = s->valuestring;
        size_t len = strlen(str);
        mf_ids l = { 0 };
        t0 = mf_time_now();
        int erc = mf_tokenizer_encode(t, str, len, mf_ids_push, &l);
        tenc += mf_time_now() - t0;
        CHECK(erc == 0 && !l.oom, "%s: encode string %d: %s", name, count, mf_error());
        total_ids += l.n;
        total_bytes += len;
        int same = (size_t)cJSON_GetArraySize(ri) == l.n;
        size_t at = 0;
        const cJSON *x = ri->child;
        for (; same && x; x = x->next, at++) same = (int32_t)x->valuedouble == l.v[at];
        if (!same) {
            if (bad_ids++ < 5) {
                fprintf(stderr, "%s: string %d: ids differ (memfit %zu ids, reference %d)\n", name, count, l.n,
                        cJSON_GetArraySize(ri));
                mf_show("text", str, len);
                x = ri->child;
                for (size_t i = 0; i < l.n || x; i++, x = x ? x->next : NULL) {
                    int32_t w = x ? (int32_t)x->valuedouble : -1, g = i < l.n ? l.v[i] : -1;
                    if (g != w) { fprintf(stderr, "  first difference at %zu: memfit %d, reference %d\n", i, g, w); break; }
                }
            }
        }
        /* decode the reference's ids, so a decode check does not hang on encode */
        size_t nr = (size_t)cJSON_GetArraySize(ri);
        int32_t *want = malloc((nr + 1) * sizeof *want);
        at = 0;
        for (x = ri->child; want && x; x = x->next) want[at++] = (int32_t)x->valuedouble;
        char *dec = NULL;
        size_t dlen = 0;
        int drc = want ? mf_tokenizer_decode_text(t, want, nr, &dec, &dlen) : -1;
        int dsame = drc == 0 && dlen == strlen(rd->valuestring) && memcmp(dec, rd->valuestring, dlen) == 0;
        if (!dsame && bad_dec++ < 5) {
            fprintf(stderr, "%s: string %d: decoded text differs from the reference decoder's\n", name, count);
            mf_show("text     ", str, len);
            if (drc == 0) mf_show("memfit   ", dec, dlen);
            mf_show("reference", rd->valuestring, strlen(rd->valuestring));
        }
        same_text += drc == 0 && dlen == len && memcmp(dec, str, len) == 0;
        free(dec);
        free(want);
        free(l.v);
    }
    CHECK(bad_ids == 0, "%s: %d of %d strings encode to other ids than the reference's", name, bad_ids, count);
    CHECK(bad_dec == 0, "%s: %d of %d decodes differ from the reference decoder's", name, bad_dec, count);
    printf("%-7s vocab %6d  load %.2f s  %d strings, %zu ids (%zu bytes): ids equal %d/%d, decode equal %d/%d, "
           "decode(encode(s)) == s for %d/%d; memfit encode %.3f s, reference run %.2f s\n",
           name, mf_tokenizer_vocab(t), tload, count, total_ids, total_bytes, count - bad_ids, count,
           count - bad_dec, count, same_text, count, tenc, tref);
    cJSON_Delete(ref);
    mf_tokenizer_free(t);
    return bad_ids + bad_dec;
}

/* A tokenizer.json whose model is not BPE: one line naming file and type. */
static void mf_check_unsupported(void) {
    char dir[] = "/tmp/memfit_tokjson_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    const char *types[] = { "WordPiece", "Unigram", "WordLevel" };
    for (int i = 0; i < 3; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s.json", dir, types[i]);
        FILE *f = fopen(p, "w");
        CHECK(f != NULL, "cannot create %s", p);
        if (!f) continue;
        fprintf(f, "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,"
                   "\"decoder\":null,\"model\":{\"type\":\"%s\",\"vocab\":{\"a\":0,\"[UNK]\":1}}}", types[i]);
        fclose(f);
        mf_tokenizer *t = mf_tokenizer_hf(p);
        CHECK(!t && strstr(mf_error(), p) && strstr(mf_error(), types[i]) && !strchr(mf_error(), '\n'),
              "%s model: got '%s'", types[i], t ? "a tokenizer" : mf_error());
        if (i == 0) printf("unsupported model, e.g.: %s\n", mf_error());
        mf_tokenizer_free(t);
        unlink(p);
    }
    rmdir(dir);
    mf_tokenizer *t = mf_tokenizer_hf("/nonexistent/tokenizer.json");
    CHECK(!t && strstr(mf_error(), "/nonexistent/tokenizer.json"), "missing file: %s", mf_error());
}

int main(void) {
    char hfjs[4096], l3[4096], q3[4096], l2[4096], moby[4096];
    const char *pj = mf_test_cache_path("hf/js/dist/main.js", hfjs, sizeof hfjs);
    const char *p3 = mf_test_cache_path("hf/llama3/tokenizer.json", l3, sizeof l3);
    const char *pq = mf_test_cache_path("hf/qwen3/tokenizer.json", q3, sizeof q3);
    const char *p2 = mf_test_cache_path("hf/llama2/tokenizer.json", l2, sizeof l2);
    const char *pm = mf_test_cache_path("moby-dick.txt", moby, sizeof moby);
    CHECK(pj && p3 && pq && p2 && pm, "%s is missing: run scripts/fetch_data.sh to fill the cache",
          !pj ? hfjs : !p3 ? l3 : !pq ? q3 : !p2 ? l2 : moby);
    const char *src = getenv("MEMFIT_SRC");
    CHECK(src && *src, "MEMFIT_SRC is not set (ctest sets it to the source folder)");
    CHECK(system("node --version > /dev/null") == 0, "node is not installed (the reference runs on Node.js)");
    mf_check_unsupported();
    if (!pj || !p3 || !pq || !p2 || !pm || !src || !*src) return mf_test_done("test_tokjson_matches_ref");
    *strrchr(hfjs, '/') = 0;
    *strrchr(hfjs, '/') = 0; /* hf/js */
    *strrchr(l3, '/') = 0;
    *strrchr(q3, '/') = 0;
    *strrchr(l2, '/') = 0;

    char list[4200], ref_js[4200], in_json[64];
    snprintf(list, sizeof list, "%s/tests/data/tokjson_strings.json", src);
    snprintf(ref_js, sizeof ref_js, "%s/tests/ref/tokjson_ref.js", src);
    size_t mn;
    char *mtext = mf_slurp(moby, &mn);
    CHECK(mtext != NULL, "cannot read %s", moby);
    cJSON *strings = mtext ? mf_build_strings(list, mtext, mn) : NULL;
    free(mtext);
    if (!strings) return mf_test_done("test_tokjson_matches_ref");
    snprintf(in_json, sizeof in_json, "/tmp/memfit_tokjson_%ld.json", (long)getpid());
    char *js = cJSON_PrintUnformatted(strings);
    FILE *f = fopen(in_json, "w");
    CHECK(f && js, "cannot write %s", in_json);
    if (f && js) fputs(js, f);
    if (f) fclose(f);
    free(js);
    printf("%d strings (%s, Moby Dick lines and paragraphs)\n", cJSON_GetArraySize(strings), list);

    mf_check_one("llama3", l3, hfjs, ref_js, in_json, strings, 128256);
    mf_check_one("qwen3", q3, hfjs, ref_js, in_json, strings, 151669);
    mf_check_one("llama2", l2, hfjs, ref_js, in_json, strings, 32000);
    unlink(in_json);
    cJSON_Delete(strings);

    /* the whole book as one text (pre-token cache, long runs), for the two
     * byte-level files; Llama 2's reference would take 15 s over it */
    mtext = mf_slurp(moby, &mn);
    cJSON *book = cJSON_CreateArray();
    if (mtext && book) cJSON_AddItemToArray(book, cJSON_CreateString(mtext));
    free(mtext);
    js = book ? cJSON_PrintUnformatted(book) : NULL;
    f = js ? fopen(in_json, "w") : NULL;
    CHECK(f != NULL, "cannot write %s", in_json);
    if (f) { fputs(js, f); fclose(f); }
    free(js);
    if (f) {
        printf("the whole of Moby Dick as one text:\n");
        mf_check_one("llama3", l3, hfjs, ref_js, in_json, book, 128256);
        mf_check_one("qwen3", q3, hfjs, ref_js, in_json, book, 151669);
    }
    unlink(in_json);
    cJSON_Delete(book);
    return mf_test_done("test_tokjson_matches_ref");
}
