/* Tokenizers: bytes (id = byte value) and GPT-2 byte-level BPE.
 *
 * GPT-2 BPE works on bytes: text is split into pre-tokens by GPT-2's regex,
 * each pre-token's UTF-8 bytes start as one id per byte, and adjacent pairs
 * are merged in order of their rank in vocab.bpe, exactly as encoder.py
 * does. encoder.json and vocab.bpe spell bytes through GPT-2's
 * bytes_to_unicode() table (printable code points stand for raw bytes); we
 * undo that mapping once at load so the hot path only ever sees raw bytes
 * and integer ids: a pair of ids -> (rank, merged id) hash table.
 *
 * A loaded tokenizer is immutable, so encode and decode are reentrant; each
 * encode call owns its PCRE2 match data and scratch buffer.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "memfit/core.h"
#include "memfit/data.h"
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* GPT-2's pre-tokenisation pattern (encoder.py). PCRE2_UCP makes \s, \p{L}
 * and \p{N} Unicode-aware like Python's `regex`. Text is bytes, not always
 * valid UTF-8: the encoder matches the pattern only on maximal runs of valid
 * UTF-8 (checked once by mf_utf8_valid_len, then PCRE2_NO_UTF_CHECK) and
 * makes each run of invalid bytes a pre-token of its own. That is what
 * PCRE2_MATCH_INVALID_UTF would do, without its interpreter re-scanning the
 * rest of the subject on every call (quadratic when the JIT is missing). */
const char mf_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char mf_eot_text[] = "<|endoftext|>";
#define MF_EOT_LEN (sizeof mf_eot_text - 1)

/* One slot of the merge table: key = left id << 32 | right id. */
typedef struct {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
} mf_merge;

#define MF_MERGE_EMPTY UINT64_MAX

struct mf_tokenizer {
    mf_tok_kind kind;
    int vocab;
    /* gpt2 only: */
    char *blob;           /* raw bytes of every token, back to back */
    uint32_t *tok_off;    /* per id: offset into blob */
    uint32_t *tok_len;    /* per id: length in bytes */
    int32_t byte_id[256]; /* id of each single-byte token */
    mf_merge *merges;     /* open addressing, power-of-two size */
    uint64_t merge_mask;
    int heap_ok;          /* merge ranks allow the O(n log n) BPE (mf_bpe_heap) */
    pcre2_code *re;
    mf_hftok *hf;         /* tokenizer.json only */
};

/* ---- the byte tokenizer ---------------------------------------------- */

#define MF_B4(n) (n), (n) + 1, (n) + 2, (n) + 3
#define MF_B16(n) MF_B4(n), MF_B4((n) + 4), MF_B4((n) + 8), MF_B4((n) + 12)
#define MF_B64(n) MF_B16(n), MF_B16((n) + 16), MF_B16((n) + 32), MF_B16((n) + 48)
static const unsigned char mf_all_bytes[256] = {
    MF_B64(0), MF_B64(64), MF_B64(128), MF_B64(192)
};

/* One shared immutable instance: nothing to allocate, so it cannot fail. */
static const struct mf_tokenizer mf_bytes_tok = { .kind = MF_TOK_BYTES, .vocab = 256 };

mf_tokenizer *mf_tokenizer_bytes(void) { return (mf_tokenizer *)&mf_bytes_tok; }

mf_tok_kind mf_tokenizer_kind(const mf_tokenizer *t) { return t->kind; }
int mf_tokenizer_vocab(const mf_tokenizer *t) { return t->vocab; }

void mf_tokenizer_free(mf_tokenizer *t) {
    if (!t || t == &mf_bytes_tok) return;
    free(t->blob);
    free(t->tok_off);
    free(t->tok_len);
    free(t->merges);
    pcre2_code_free(t->re);
    mf_hftok_free(t->hf);
    free(t);
}

mf_tokenizer *mf_tokenizer_hf(const char *tokenizer_json) {
    mf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { mf_fail("out of memory loading %s", tokenizer_json); return NULL; }
    t->kind = MF_TOK_HF;
    t->hf = mf_hftok_load(tokenizer_json);
    if (!t->hf) { free(t); return NULL; }
    t->vocab = mf_hftok_vocab(t->hf);
    return t;
}

int mf_tokenizer_spec_is_json(const char *spec) { return strcmp(spec, "bytes") != 0 && strcmp(spec, "gpt2") != 0; }

int mf_tokenizer_spec_info(const char *spec, int *vocab, uint64_t *hash) {
    /* the last tokenizer.json asked for: mf_model_dims runs once per plan
     * the planner tries, and loading Llama 3's takes a fifth of a second */
    static char memo_path[4096];
    static int memo_vocab;
    static uint64_t memo_hash;
    int v = 256;
    uint64_t h = 0;
    if (strcmp(spec, "gpt2") == 0) v = MF_GPT2_VOCAB, h = MF_GPT2_HASH;
    else if (mf_tokenizer_spec_is_json(spec)) {
        if (!memo_path[0] || strcmp(memo_path, spec) != 0) {
            mf_tokenizer *t = mf_tokenizer_hf(spec);
            if (!t) return -1;
            memo_vocab = t->vocab;
            memo_hash = mf_tokenizer_hash(t);
            mf_tokenizer_free(t);
            snprintf(memo_path, sizeof memo_path, "%s", strlen(spec) < sizeof memo_path ? spec : "");
        }
        v = memo_vocab, h = memo_hash;
    }
    if (vocab) *vocab = v;
    if (hash) *hash = h;
    return 0;
}

const char *mf_tokenizer_describe(mf_tok_kind kind, uint64_t hash, char *buf, size_t n) {
    if (kind == MF_TOK_HF) snprintf(buf, n, "a tokenizer.json (hash 0x%016llx)", (unsigned long long)hash);
    else snprintf(buf, n, "the %s tokenizer", kind == MF_TOK_GPT2 ? "gpt2" : "bytes");
    return buf;
}

uint64_t mf_tokenizer_hash(const mf_tokenizer *t) {
    return t->kind == MF_TOK_HF ? mf_hftok_hash(t->hf) : t->kind == MF_TOK_GPT2 ? MF_GPT2_HASH : 0;
}

int mf_tokenizer_decode_text(const mf_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int k = mf_tokenizer_decode(t, ids[i], NULL);
        if (k < 0) return mf_fail("cannot decode id %d: not in [0, %d)", ids[i], t->vocab);
        total += (size_t)k;
    }
    char *buf = malloc(total + 1), *p = buf;
    if (!buf) return mf_fail("out of memory decoding %zu ids", n);
    for (size_t i = 0; i < n; i++) {
        const char *b;
        int k = mf_tokenizer_decode(t, ids[i], &b);
        memcpy(p, b, (size_t)k);
        p += k;
    }
    const char *s = buf;
    size_t m = total;
    if (t->kind == MF_TOK_HF) mf_hftok_finish_text(t->hf, &s, &m);
    memmove(buf, s, m);
    buf[m] = 0;
    *out = buf;
    if (len) *len = m;
    return 0;
}

int mf_tokenizer_decode(const mf_tokenizer *t, int32_t id, const char **bytes) {
    if (id < 0 || id >= t->vocab) return -1;
    if (t->kind == MF_TOK_BYTES) {
        if (bytes) *bytes = (const char *)&mf_all_bytes[id];
        return 1;
    }
    if (t->kind == MF_TOK_HF) return mf_hftok_decode(t->hf, id, bytes);
    if (bytes) *bytes = t->blob + t->tok_off[id];
    return (int)t->tok_len[id];
}

/* ---- loading --------------------------------------------------------- */

/* Reads a whole file, NUL-terminated. */
int mf_read_file(const char *path, const char *what, char **out, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail("cannot open %s %s: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mf_fail("%s %s is not a regular file", what, path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) { close(fd); return mf_fail("out of memory reading %s %s", what, path); }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            return mf_fail("cannot read %s %s: %s", what, path, e ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves,
 * the other 68 bytes get code points 256.. in byte order. Fills the inverse:
 * code point (< 324) -> byte, or -1. */
void mf_unicode_to_bytes(int inv[324]) {
    for (int i = 0; i < 324; i++) inv[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        inv[printable ? b : 256 + n++] = b;
    }
}

/* Turns a token's spelling (UTF-8 of mapped code points) into raw bytes;
 * out needs room for len bytes. Returns the raw length or -1. */
int mf_unmap(const int inv[324], const char *s, size_t len, char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    int k = 0;
    while (i < len) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < len && (p[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* every mapped code point is < 0x800: two bytes at most */
        }
        if (cp >= 324 || inv[cp] < 0) return -1;
        out[k++] = (char)inv[cp];
    }
    return k;
}

static uint64_t mf_hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t mf_hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

/* Raw bytes -> id, used only while loading. */
typedef struct {
    int32_t *slot;   /* id or -1 */
    uint64_t mask;
    const mf_tokenizer *t;
} mf_vocab_index;

static int32_t mf_vocab_find(const mf_vocab_index *v, const char *s, size_t n) {
    for (uint64_t h = mf_hash_bytes(s, n) & v->mask;; h = (h + 1) & v->mask) {
        int32_t id = v->slot[h];
        if (id < 0) return -1;
        if (v->t->tok_len[id] == n && memcmp(v->t->blob + v->t->tok_off[id], s, n) == 0) return id;
    }
}

static const mf_merge *mf_merge_find(const mf_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = mf_hash_pair(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const mf_merge *m = &t->merges[h];
        if (m->key == key) return m;
        if (m->key == MF_MERGE_EMPTY) return NULL;
    }
}

/* Parses encoder.json into t->blob/tok_off/tok_len and builds the index. */
static int mf_load_encoder(mf_tokenizer *t, const char *path, const int inv[324], mf_vocab_index *vi) {
    char *text;
    size_t len;
    if (mf_read_file(path, "GPT-2 encoder.json", &text, &len) != 0) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        long at = end && end >= text && end <= text + len ? (long)(end - text) : -1;
        free(text);
        return mf_fail("%s: invalid JSON (near byte %ld)", path, at);
    }
    int rc = -1;
    if (!cJSON_IsObject(root)) { mf_fail("%s: expected a JSON object of token -> id", path); goto out; }
    int n = cJSON_GetArraySize(root);
    if (n != MF_GPT2_VOCAB) {
        mf_fail("%s: has %d tokens, expected %d (GPT-2)", path, n, MF_GPT2_VOCAB);
        goto out;
    }
    t->vocab = n;
    t->tok_off = malloc((size_t)n * sizeof *t->tok_off);
    t->tok_len = calloc((size_t)n, sizeof *t->tok_len);
    t->blob = malloc(len + 1); /* raw spelling is never longer than the JSON */
    uint64_t cap = 1;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    vi->slot = malloc(cap * sizeof *vi->slot);
    vi->mask = cap - 1;
    vi->t = t;
    if (!t->tok_off || !t->tok_len || !t->blob || !vi->slot) { mf_fail("out of memory loading %s", path); goto out; }
    for (uint64_t i = 0; i < cap; i++) vi->slot[i] = -1;
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) { mf_fail("out of memory loading %s", path); goto out; }
    size_t used = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(v >= 0 && v < n) || v != (double)(int)v) {
            mf_fail("%s: token \"%.40s\" has id that is not an integer in [0, %d)", path, e->string, n);
            free(seen);
            goto out;
        }
        int id = (int)v;
        if (seen[id]) { mf_fail("%s: id %d is used twice (\"%.40s\")", path, id, e->string); free(seen); goto out; }
        seen[id] = 1;
        int k = mf_unmap(inv, e->string, strlen(e->string), t->blob + used);
        if (k <= 0) {
            mf_fail("%s: token \"%.40s\" (id %d) is not spelled in GPT-2's byte alphabet", path, e->string, id);
            free(seen);
            goto out;
        }
        t->tok_off[id] = (uint32_t)used;
        t->tok_len[id] = (uint32_t)k;
        if (mf_vocab_find(vi, t->blob + used, (size_t)k) >= 0) {
            mf_fail("%s: token \"%.40s\" (id %d) appears twice", path, e->string, id);
            free(seen);
            goto out;
        }
        uint64_t h = mf_hash_bytes(t->blob + used, (size_t)k) & vi->mask;
        while (vi->slot[h] >= 0) h = (h + 1) & vi->mask;
        vi->slot[h] = id;
        used += (size_t)k;
    }
    free(seen);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = mf_vocab_find(vi, &c, 1);
        if (t->byte_id[b] < 0) { mf_fail("%s: has no token for byte 0x%02x", path, b); goto out; }
    }
    if (t->tok_len[MF_GPT2_EOT] != MF_EOT_LEN ||
        memcmp(t->blob + t->tok_off[MF_GPT2_EOT], mf_eot_text, MF_EOT_LEN) != 0) {
        mf_fail("%s: id %d is not \"%s\"", path, MF_GPT2_EOT, mf_eot_text);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* Parses vocab.bpe ("#version" line, then one "left right" merge a line,
 * rank = line order) into the merge table. */
static int mf_load_merges(mf_tokenizer *t, const char *path, const int inv[324], const mf_vocab_index *vi) {
    char *text;
    size_t len;
    if (mf_read_file(path, "GPT-2 vocab.bpe", &text, &len) != 0) return -1;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    uint64_t cap = 1;
    while (cap < lines * 2) cap <<= 1;
    t->merges = malloc(cap * sizeof *t->merges);
    t->merge_mask = cap - 1;
    char *buf = malloc(len + 1);
    int64_t *made_by = malloc((size_t)t->vocab * sizeof *made_by);  /* id -> rank of the merge making it */
    int32_t *part_a = malloc(lines * sizeof *part_a), *part_b = malloc(lines * sizeof *part_b);
    if (!t->merges || !buf || !made_by || !part_a || !part_b) {
        free(text); free(buf); free(made_by); free(part_a); free(part_b);
        return mf_fail("out of memory loading %s", path);
    }
    for (uint64_t i = 0; i < cap; i++) t->merges[i].key = MF_MERGE_EMPTY;
    for (int i = 0; i < t->vocab; i++) made_by[i] = -1;
    t->heap_ok = 1;
    int rc = -1;
    uint32_t rank = 0;
    size_t lineno = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        lineno++;
        char *line = p;
        p = nl ? nl + 1 : end;
        if (le > line && le[-1] == '\r') le--;
        if (lineno == 1 && (size_t)(le - line) >= 8 && memcmp(line, "#version", 8) == 0) continue;
        if (le == line) continue;
        char *sp = memchr(line, ' ', (size_t)(le - line));
        if (!sp || sp == line || sp + 1 == le || memchr(sp + 1, ' ', (size_t)(le - sp - 1))) {
            mf_fail("%s line %zu: expected two tokens separated by one space", path, lineno);
            goto out;
        }
        int32_t ids[2];
        const char *part[2] = { line, sp + 1 };
        size_t plen[2] = { (size_t)(sp - line), (size_t)(le - sp - 1) };
        int raw_len[2];
        for (int k = 0; k < 2; k++) {
            raw_len[k] = mf_unmap(inv, part[k], plen[k], buf + (k ? raw_len[0] : 0));
            ids[k] = raw_len[k] > 0 ? mf_vocab_find(vi, buf + (k ? raw_len[0] : 0), (size_t)raw_len[k]) : -1;
            if (ids[k] < 0) {
                mf_fail("%s line %zu: merge part '%.*s' is not in encoder.json", path, lineno,
                        (int)(plen[k] > 60 ? 60 : plen[k]), part[k]);
                goto out;
            }
        }
        int32_t merged = mf_vocab_find(vi, buf, (size_t)(raw_len[0] + raw_len[1]));
        if (merged < 0) {
            mf_fail("%s line %zu: merge result '%.*s%.*s' is not in encoder.json", path, lineno,
                    (int)(plen[0] > 60 ? 60 : plen[0]), part[0], (int)(plen[1] > 60 ? 60 : plen[1]), part[1]);
            goto out;
        }
        /* A repeated pair takes its later rank, as dict(zip(merges, ranks)) does. */
        uint64_t key = (uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1];
        uint64_t h = mf_hash_pair(key) & t->merge_mask;
        while (t->merges[h].key != MF_MERGE_EMPTY && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
        if (t->merges[h].key == key) t->heap_ok = 0;
        t->merges[h] = (mf_merge){ key, rank, merged };
        /* Ordering check for mf_bpe_heap: every token is made by one merge,
         * and a merge's parts are made by lower-ranked merges (or are bytes). */
        if (made_by[merged] >= 0) t->heap_ok = 0;
        made_by[merged] = (int64_t)rank;
        part_a[rank] = ids[0];
        part_b[rank] = ids[1];
        rank++;
    }
    for (uint32_t r = 0; r < rank && t->heap_ok; r++)
        if (made_by[part_a[r]] >= (int64_t)r || made_by[part_b[r]] >= (int64_t)r) t->heap_ok = 0;
    rc = 0;
out:
    free(made_by);
    free(part_a);
    free(part_b);
    free(buf);
    free(text);
    return rc;
}

mf_tokenizer *mf_tokenizer_gpt2(const char *encoder_json, const char *vocab_bpe) {
    mf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { mf_fail("out of memory loading the GPT-2 tokenizer"); return NULL; }
    t->kind = MF_TOK_GPT2;
    int inv[324];
    mf_unicode_to_bytes(inv);
    mf_vocab_index vi = { 0 };
    int rc = mf_load_encoder(t, encoder_json, inv, &vi);
    if (rc == 0) rc = mf_load_merges(t, vocab_bpe, inv, &vi);
    free(vi.slot);
    if (rc == 0) {
        int err;
        PCRE2_SIZE erroff;
        t->re = pcre2_compile((PCRE2_SPTR)mf_gpt2_pattern, PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
        if (!t->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            rc = mf_fail("cannot compile the GPT-2 pre-tokenizer regex: %s", (const char *)msg);
        } else {
            /* JIT is only a speed-up; the interpreter gives the same matches. */
            (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
        }
    }
    if (rc != 0) {
        mf_tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- encoding -------------------------------------------------------- */

typedef struct {
    const mf_tokenizer *t;
    pcre2_match_data *md;
    int32_t *w;      /* scratch: the ids of the pre-token being merged */
    size_t cap;
    void (*emit)(int32_t, void *);
    void *ctx;
} mf_enc;

/* Pre-tokens at least this long use mf_bpe_heap (when the merge table
 * allows it); shorter ones the plain loop, which is faster for words. */
#ifndef MF_BPE_HEAP_MIN
#define MF_BPE_HEAP_MIN 64
#endif

void mf_tok_heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = v;
}

uint64_t mf_tok_heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* The same merges as the loop in mf_bpe in O(n log n), for long pre-tokens
 * (a 200 kB run of letters takes seconds with the loop). A min-heap of
 * (rank, position) over a linked list of parts: when each merge's parts are
 * made by lower-ranked merges (checked at load: heap_ok), ranks are taken in
 * increasing order and each rank's occurrences left to right, which is what
 * encoder.py's "merge every occurrence of the best pair" does. */
static int mf_bpe_heap(mf_enc *e, int32_t *w, size_t n) {
    const mf_tokenizer *t = e->t;
    int32_t *nx = malloc(n * sizeof *nx), *pv = malloc(n * sizeof *pv);
    uint64_t *heap = malloc(3 * n * sizeof *heap);
    if (!nx || !pv || !heap) {
        free(nx); free(pv); free(heap);
        return mf_fail("out of memory encoding a %zu-byte pre-token", n);
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nx[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        pv[i] = (int32_t)i - 1;
        const mf_merge *g = i + 1 < n ? mf_merge_find(t, w[i], w[i + 1]) : NULL;
        if (g) mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | i);
    }
    while (hn > 0) {
        uint64_t k = mf_tok_heap_pop(heap, &hn);
        int32_t i = (int32_t)(k & 0xffffffffu), j;
        if (w[i] < 0 || (j = nx[i]) < 0) continue;
        const mf_merge *g = mf_merge_find(t, w[i], w[j]);
        if (!g || g->rank != (uint32_t)(k >> 32)) continue; /* stale entry */
        w[i] = g->merged;
        w[j] = -1;
        nx[i] = nx[j];
        if (nx[j] >= 0) pv[nx[j]] = i;
        if (pv[i] >= 0 && (g = mf_merge_find(t, w[pv[i]], w[i])))
            mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | (uint32_t)pv[i]);
        if (nx[i] >= 0 && (g = mf_merge_find(t, w[i], w[nx[i]])))
            mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | (uint32_t)i);
    }
    for (int32_t i = 0; i >= 0; i = nx[i]) e->emit(w[i], e->ctx);
    free(nx);
    free(pv);
    free(heap);
    return 0;
}

/* BPE of one pre-token, as encoder.py's bpe(): repeatedly take the adjacent
 * pair with the lowest merge rank and merge all its occurrences left to
 * right, until no adjacent pair has a rank. */
static int mf_bpe(mf_enc *e, const unsigned char *p, size_t n) {
    const mf_tokenizer *t = e->t;
    if (n == 1) { e->emit(t->byte_id[p[0]], e->ctx); return 0; }
    if (n >= INT32_MAX / 4) return mf_fail("pre-token of %zu bytes is too long to encode", n);
    if (n > e->cap) {
        size_t cap = e->cap ? e->cap : 64;
        while (cap < n) cap *= 2;
        int32_t *w = realloc(e->w, cap * sizeof *w);
        if (!w) return mf_fail("out of memory encoding a %zu-byte pre-token", n);
        e->w = w;
        e->cap = cap;
    }
    int32_t *w = e->w;
    for (size_t i = 0; i < n; i++) w[i] = t->byte_id[p[i]];
    if (n >= MF_BPE_HEAP_MIN && t->heap_ok) return mf_bpe_heap(e, w, n);
    size_t m = n;
    while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        int32_t merged = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            const mf_merge *g = mf_merge_find(t, w[i], w[i + 1]);
            if (g && g->rank < best) { best = g->rank; bi = i; merged = g->merged; }
        }
        if (merged < 0) break;
        int32_t a = w[bi], b = w[bi + 1];
        size_t j = bi, i = bi; /* bi is the pair's first occurrence */
        while (i < m) {
            if (i + 1 < m && w[i] == a && w[i + 1] == b) { w[j++] = merged; i += 2; }
            else w[j++] = w[i++];
        }
        m = j;
    }
    for (size_t i = 0; i < m; i++) e->emit(w[i], e->ctx);
    return 0;
}

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no
 * overlongs, surrogates or code points above U+10FFFF; as strict as PCRE2). */
size_t mf_utf8_valid_len(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return i;
        if (n - i <= k || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        i += k + 1;
    }
    return n;
}

/* Pre-tokenises valid UTF-8 with the GPT-2 pattern and BPE-encodes each piece. */
static int mf_encode_valid(mf_enc *e, const char *s, size_t n) {
    size_t off = 0;
    while (off < n) {
        int rc = pcre2_match(e->t->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(e->t->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return mf_bpe(e, (const unsigned char *)s + off, n - off);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mf_fail("GPT-2 pre-tokenizer failed at byte %zu: %s", off, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t a = ov[0], b = ov[1];
        if (a < off || a > n || b > n) return mf_fail("GPT-2 pre-tokenizer returned a bad match");
        if (b <= a) { /* no item matches empty text; never loop, keep whole characters */
            b = a + 1;
            while (b < n && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
        }
        if (a > off && mf_bpe(e, (const unsigned char *)s + off, a - off) != 0) return -1;
        if (mf_bpe(e, (const unsigned char *)s + a, b - a) != 0) return -1;
        off = b;
    }
    return 0;
}

/* Encodes text without "<|endoftext|>": valid UTF-8 runs through the
 * pattern, each run of invalid bytes as one pre-token. Lookahead at the end
 * of a valid run sees "no character", as invalid bytes match nothing. */
static int mf_encode_segment(mf_enc *e, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t off = 0;
    while (off < n) {
        size_t v = mf_utf8_valid_len(u + off, n - off);
        if (v > 0 && mf_encode_valid(e, s + off, v) != 0) return -1;
        off += v;
        size_t bad = off;
        while (bad < n && mf_utf8_valid_len(u + bad, n - bad < 4 ? n - bad : 4) == 0) bad++;
        if (bad > off && mf_bpe(e, u + off, bad - off) != 0) return -1;
        off = bad;
    }
    return 0;
}

int mf_tokenizer_encode(const mf_tokenizer *t, const char *text, size_t n,
                        void (*emit)(int32_t id, void *ctx), void *ctx) {
    if (!t || !emit || (!text && n)) return mf_fail("mf_tokenizer_encode: null argument");
    if (t->kind == MF_TOK_BYTES) {
        for (size_t i = 0; i < n; i++) emit((unsigned char)text[i], ctx);
        return 0;
    }
    if (t->kind == MF_TOK_HF) return mf_hftok_encode(t->hf, text, n, emit, ctx);
    mf_enc e = { .t = t, .emit = emit, .ctx = ctx };
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!e.md) return mf_fail("out of memory creating regex match data");
    int rc = 0;
    size_t off = 0;
    while (rc == 0 && off < n) {
        const char *hit = memmem(text + off, n - off, mf_eot_text, MF_EOT_LEN);
        size_t stop = hit ? (size_t)(hit - text) : n;
        if (stop > off) rc = mf_encode_segment(&e, text + off, stop - off);
        if (rc == 0 && hit) emit(MF_GPT2_EOT, ctx);
        off = hit ? stop + MF_EOT_LEN : n;
    }
    free(e.w);
    pcre2_match_data_free(e.md);
    return rc;
}
