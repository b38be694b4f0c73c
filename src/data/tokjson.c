/* Hugging Face tokenizer.json: BPE models as the `tokenizers` library (and
 * transformers.js, our reference) run them.
 *
 * Supported: model BPE (merges as "a b" strings or ["a","b"] pairs,
 * byte_fallback, unk_token, ignore_merges); normalizers Sequence, Prepend,
 * Replace (String pattern), NFC; pre-tokenizers Sequence, Split (Regex or
 * String pattern; Isolated or Removed, or invert) and ByteLevel (with or
 * without GPT-2's regex); decoders ByteLevel, Sequence, Replace,
 * ByteFallback, Fuse, Strip. That covers byte-level BPE files (Llama 3,
 * Qwen2/2.5/3, SmolLM2, GPT-2) and SentencePiece-style BPE files with a
 * "▁" metaspace and byte fallback (Llama 2, TinyLlama, Mistral). Any other
 * model or component is refused at load with one line naming the file.
 *
 * Encoding, as transformers.js's _encode_text: the text is first cut at
 * added tokens (longest match at the leftmost position; lstrip/rstrip trim
 * the neighbouring text), each piece between them is normalized and
 * pre-tokenized, and each pre-token is BPE-merged: repeatedly merge the
 * adjacent pair with the lowest rank, leftmost first. Byte-level models
 * work on raw bytes: the vocabulary's GPT-2 byte alphabet is undone at load,
 * as tokenizer.c does for encoder.json, so the hot path sees bytes and
 * integer ids. Other models start from one symbol per UTF-8 character;
 * characters not in the vocabulary become <0xXX> byte tokens (byte_fallback)
 * or unk_token.
 *
 * A loaded tokenizer is immutable; each encode call owns its regex match
 * data and a cache of pre-token -> ids (corpora repeat words).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "memfit/core.h"
#include "memfit/data.h"
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t key;   /* left id << 32 | right id */
    uint32_t rank;
    int32_t merged;
} mf_hfmerge;

#define MF_HF_EMPTY UINT64_MAX

enum { MF_NORM_PREPEND, MF_NORM_REPLACE, MF_NORM_NFC };
typedef struct {
    int type;
    char *a, *b;     /* PREPEND: a; REPLACE: a -> b */
    size_t alen, blen;
} mf_hfnorm;

enum { MF_PRE_SPLIT, MF_PRE_BYTELEVEL };
enum { MF_SPLIT_ISOLATED, MF_SPLIT_REMOVED };
typedef struct {
    int type;
    pcre2_code *re;  /* SPLIT: the pattern; BYTELEVEL: GPT-2's, or NULL without use_regex */
    int behavior;    /* SPLIT */
    int invert;      /* SPLIT: keep only the matches */
    int prefix;      /* BYTELEVEL: add_prefix_space */
} mf_hfpre;

typedef struct {
    char *text;      /* raw content, matched verbatim */
    size_t len;
    int32_t id;
    int lstrip, rstrip;
} mf_hfadded;

struct mf_hftok {
    char *path;
    uint64_t hash;          /* FNV-1a 64 of the file's bytes */
    int vocab;              /* max id + 1 over model.vocab and added_tokens */
    int byte_level;         /* vocab spelled in GPT-2's byte alphabet */
    /* every id's bytes as the model sees them (raw bytes for byte-level) */
    char *blob;
    uint32_t *tok_off, *tok_len; /* [vocab]; len 0 for an unused id */
    unsigned char *has_tok;      /* [vocab]: id is in model.vocab */
    /* every id's decoded bytes (decoder applied token by token) */
    char *dblob;
    uint32_t *dec_off, *dec_len; /* [vocab] */
    int32_t *vslot;              /* vocab hash: bytes -> id, open addressing */
    uint64_t vmask;
    mf_hfmerge *merges;
    uint64_t mmask;
    int32_t byte_id[256];        /* byte-level: id of each byte; else -1 */
    int32_t fallback_id[256];    /* byte_fallback: id of "<0xXX>", or -1 */
    int byte_fallback, ignore_merges;
    int32_t unk_id;              /* -1: none */
    mf_hfnorm *norm;
    int n_norm;
    mf_hfpre *pre;
    int n_pre;
    mf_hfadded *added;
    int n_added;
    int32_t *added_first[256];   /* per first byte: indices into added, longest first, -1 ended */
    /* Strip applied to the joined text (decoder Strip after Fuse) */
    char strip_ch[8];
    size_t strip_len;
    int strip_start, strip_stop;
};

/* ---- small helpers ------------------------------------------------------ */

static uint64_t mf_hf_hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t mf_hf_hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

static int32_t mf_hf_find(const mf_hftok *h, const char *s, size_t n) {
    for (uint64_t i = mf_hf_hash_bytes(s, n) & h->vmask;; i = (i + 1) & h->vmask) {
        int32_t id = h->vslot[i];
        if (id < 0) return -1;
        if (h->tok_len[id] == n && memcmp(h->blob + h->tok_off[id], s, n) == 0) return id;
    }
}

static const mf_hfmerge *mf_hf_merge(const mf_hftok *h, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = mf_hf_hash_pair(key) & h->mmask;; i = (i + 1) & h->mmask) {
        const mf_hfmerge *m = &h->merges[i];
        if (m->key == key) return m;
        if (m->key == MF_HF_EMPTY) return NULL;
    }
}

/* Length of the UTF-8 sequence starting at s[0] (1 for an invalid byte). */
static size_t mf_hf_charlen(const unsigned char *s, size_t n) {
    size_t k = mf_utf8_valid_len(s, n < 4 ? n : 4);
    if (k == 0) return 1;
    unsigned c = s[0];
    size_t want = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return want <= k ? want : 1;
}

static const char *mf_hf_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int mf_hf_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static pcre2_code *mf_hf_compile(const char *path, const char *pat, size_t len, int literal) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0),
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        mf_fail("%s: cannot compile the pre-tokenizer pattern (at offset %zu): %s", path, (size_t)off,
                (const char *)msg);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* only a speed-up */
    return re;
}

void mf_hftok_free(mf_hftok *h) {
    if (!h) return;
    free(h->path);
    free(h->blob);
    free(h->tok_off);
    free(h->tok_len);
    free(h->has_tok);
    free(h->dblob);
    free(h->dec_off);
    free(h->dec_len);
    free(h->vslot);
    free(h->merges);
    for (int i = 0; i < h->n_norm; i++) { free(h->norm[i].a); free(h->norm[i].b); }
    free(h->norm);
    for (int i = 0; i < h->n_pre; i++) pcre2_code_free(h->pre[i].re);
    free(h->pre);
    for (int i = 0; i < h->n_added; i++) free(h->added[i].text);
    free(h->added);
    for (int i = 0; i < 256; i++) free(h->added_first[i]);
    free(h);
}

int mf_hftok_vocab(const mf_hftok *h) { return h->vocab; }
uint64_t mf_hftok_hash(const mf_hftok *h) { return h->hash; }

int mf_hftok_decode(const mf_hftok *h, int32_t id, const char **bytes) {
    if (id < 0 || id >= h->vocab) return -1;
    if (bytes) *bytes = h->dblob + h->dec_off[id];
    return (int)h->dec_len[id];
}

void mf_hftok_finish_text(const mf_hftok *h, const char **s, size_t *n) {
    if (!h->strip_len) return;
    for (int i = 0; i < h->strip_start && *n >= h->strip_len && memcmp(*s, h->strip_ch, h->strip_len) == 0; i++) {
        *s += h->strip_len;
        *n -= h->strip_len;
    }
    for (int i = 0; i < h->strip_stop && *n >= h->strip_len &&
                    memcmp(*s + *n - h->strip_len, h->strip_ch, h->strip_len) == 0; i++)
        *n -= h->strip_len;
}

/* ---- loading ------------------------------------------------------------- */

static int mf_hf_load_normalizer(mf_hftok *h, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = mf_hf_str(n, "type");
    if (!type) return mf_fail("%s: normalizer has no type", h->path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return mf_fail("%s: Sequence normalizer has no normalizers list", h->path);
        for (const cJSON *e = list->child; e; e = e->next)
            if (mf_hf_load_normalizer(h, e)) return -1;
        return 0;
    }
    mf_hfnorm s = { 0 };
    if (strcmp(type, "NFC") == 0) {
        s.type = MF_NORM_NFC;
    } else if (strcmp(type, "Prepend") == 0) {
        const char *p = mf_hf_str(n, "prepend");
        if (!p) return mf_fail("%s: Prepend normalizer has no prepend string", h->path);
        s.type = MF_NORM_PREPEND;
        s.a = strdup(p);
        s.alen = strlen(p);
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = pat ? mf_hf_str(pat, "String") : NULL, *to = mf_hf_str(n, "content");
        if (!from || !to || !from[0])
            return mf_fail("%s: Replace normalizer: only a non-empty String pattern is supported", h->path);
        s.type = MF_NORM_REPLACE;
        s.a = strdup(from);
        s.alen = strlen(from);
        s.b = strdup(to);
        s.blen = strlen(to);
        if (!s.b) { free(s.a); s.a = NULL; }
    } else {
        return mf_fail("%s: normalizer type '%s' is not supported (Sequence, Prepend, Replace, NFC are)", h->path,
                       type);
    }
    if (s.type != MF_NORM_NFC && !s.a) return mf_fail("out of memory loading %s", h->path);
    mf_hfnorm *nn = realloc(h->norm, (size_t)(h->n_norm + 1) * sizeof *nn);
    if (!nn) { free(s.a); free(s.b); return mf_fail("out of memory loading %s", h->path); }
    h->norm = nn;
    h->norm[h->n_norm++] = s;
    return 0;
}

static int mf_hf_load_pre(mf_hftok *h, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = mf_hf_str(p, "type");
    if (!type) return mf_fail("%s: pre_tokenizer has no type", h->path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return mf_fail("%s: Sequence pre_tokenizer has no pretokenizers list", h->path);
        for (const cJSON *e = list->child; e; e = e->next)
            if (mf_hf_load_pre(h, e)) return -1;
        return 0;
    }
    mf_hfpre s = { 0 };
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = pat ? mf_hf_str(pat, "Regex") : NULL, *lit = pat ? mf_hf_str(pat, "String") : NULL;
        const char *beh = mf_hf_str(p, "behavior");
        if (!rx && !lit) return mf_fail("%s: Split pre_tokenizer has no Regex or String pattern", h->path);
        s.type = MF_PRE_SPLIT;
        s.invert = mf_hf_bool(p, "invert", 0);
        if (!beh || strcmp(beh, "Isolated") == 0) s.behavior = MF_SPLIT_ISOLATED;
        else if (strcmp(beh, "Removed") == 0) s.behavior = MF_SPLIT_REMOVED;
        else return mf_fail("%s: Split behavior '%s' is not supported (Isolated, Removed are)", h->path, beh);
        s.re = mf_hf_compile(h->path, rx ? rx : lit, strlen(rx ? rx : lit), !rx);
        if (!s.re) return -1;
    } else if (strcmp(type, "ByteLevel") == 0) {
        s.type = MF_PRE_BYTELEVEL;
        s.prefix = mf_hf_bool(p, "add_prefix_space", 0);
        if (mf_hf_bool(p, "use_regex", 1)) {
            s.re = mf_hf_compile(h->path, mf_gpt2_pattern, strlen(mf_gpt2_pattern), 0);
            if (!s.re) return -1;
        }
        h->byte_level = 1;
    } else {
        return mf_fail("%s: pre_tokenizer type '%s' is not supported (Sequence, Split, ByteLevel are)", h->path, type);
    }
    mf_hfpre *np = realloc(h->pre, (size_t)(h->n_pre + 1) * sizeof *np);
    if (!np) { pcre2_code_free(s.re); return mf_fail("out of memory loading %s", h->path); }
    h->pre = np;
    h->pre[h->n_pre++] = s;
    return 0;
}

/* The decoder, flattened: what happens to each token's string, and whether
 * a Strip acts on the joined text. */
typedef struct {
    int byte_level, byte_fallback, fused;
    struct { char *from, *to; } rep[8];
    int n_rep;
    char strip_tok[8];           /* Strip before any Fuse: per token */
    int strip_tok_start, strip_tok_stop;
} mf_hfdec;

static int mf_hf_load_decoder(mf_hftok *h, const cJSON *d, mf_hfdec *out) {
    if (!d || cJSON_IsNull(d)) return 0;
    const char *type = mf_hf_str(d, "type");
    if (!type) return mf_fail("%s: decoder has no type", h->path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(list)) return mf_fail("%s: Sequence decoder has no decoders list", h->path);
        for (const cJSON *e = list->child; e; e = e->next)
            if (mf_hf_load_decoder(h, e, out)) return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) out->byte_level = 1;
    else if (strcmp(type, "ByteFallback") == 0) out->byte_fallback = 1;
    else if (strcmp(type, "Fuse") == 0) out->fused = 1;
    else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(d, "pattern");
        const char *from = pat ? mf_hf_str(pat, "String") : NULL, *to = mf_hf_str(d, "content");
        if (!from || !to || !from[0]) return mf_fail("%s: Replace decoder: only a String pattern is supported", h->path);
        if (out->n_rep == 8) return mf_fail("%s: more than 8 Replace decoders", h->path);
        out->rep[out->n_rep].from = (char *)from;
        out->rep[out->n_rep++].to = (char *)to;
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = mf_hf_str(d, "content");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, "start"), *b = cJSON_GetObjectItemCaseSensitive(d, "stop");
        if (!c || strlen(c) >= 8 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b))
            return mf_fail("%s: Strip decoder needs content, start and stop", h->path);
        if (out->fused) {
            snprintf(h->strip_ch, sizeof h->strip_ch, "%s", c);
            h->strip_len = strlen(c);
            h->strip_start = a->valueint;
            h->strip_stop = b->valueint;
        } else {
            snprintf(out->strip_tok, sizeof out->strip_tok, "%s", c);
            out->strip_tok_start = a->valueint;
            out->strip_tok_stop = b->valueint;
        }
    } else {
        return mf_fail("%s: decoder type '%s' is not supported (ByteLevel, Sequence, Replace, ByteFallback, Fuse, "
                       "Strip are)", h->path, type);
    }
    return 0;
}

/* Appends the bytes of `s` to the growing blob; returns its offset. */
typedef struct { char *p; size_t n, cap; } mf_hfbuf;
static int mf_hf_put(mf_hfbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* The decoded bytes of one token string (not an added token under a
 * ByteLevel decoder): Replace steps, then <0xXX> -> byte, then a per-token
 * Strip. */
static int mf_hf_decode_one(const mf_hfdec *d, const char *s, size_t n, mf_hfbuf *out) {
    char *cur = malloc(n + 1);
    if (!cur) return -1;
    memcpy(cur, s, n);
    size_t m = n;
    for (int r = 0; r < d->n_rep; r++) {
        size_t fl = strlen(d->rep[r].from), tl = strlen(d->rep[r].to);
        mf_hfbuf b = { 0 };
        size_t i = 0;
        while (i < m) {
            if (i + fl <= m && memcmp(cur + i, d->rep[r].from, fl) == 0) {
                if (mf_hf_put(&b, d->rep[r].to, tl)) { free(b.p); free(cur); return -1; }
                i += fl;
            } else {
                if (mf_hf_put(&b, cur + i, 1)) { free(b.p); free(cur); return -1; }
                i++;
            }
        }
        free(cur);
        cur = b.p ? b.p : malloc(1);
        if (!cur) return -1;
        m = b.n;
    }
    if (d->byte_fallback && m == 6 && memcmp(cur, "<0x", 3) == 0 && cur[5] == '>') {
        unsigned v;
        char hex[3] = { cur[3], cur[4], 0 };
        char *end;
        v = (unsigned)strtoul(hex, &end, 16);
        if (end == hex + 2) { cur[0] = (char)v; m = 1; }
    }
    size_t a = 0, z = m, sl = strlen(d->strip_tok);
    if (sl) {
        for (int i = 0; i < d->strip_tok_start && z - a >= sl && memcmp(cur + a, d->strip_tok, sl) == 0; i++) a += sl;
        for (int i = 0; i < d->strip_tok_stop && z - a >= sl && memcmp(cur + z - sl, d->strip_tok, sl) == 0; i++) z -= sl;
    }
    int rc = mf_hf_put(out, cur + a, z - a);
    free(cur);
    return rc;
}

static int mf_hf_add_merge(mf_hftok *h, const char *a, const char *b, uint32_t rank, char *buf, const int inv[324]) {
    size_t la = strlen(a), lb = strlen(b);
    int ka, kb;
    if (h->byte_level) {
        ka = mf_unmap(inv, a, la, buf);
        kb = ka > 0 ? mf_unmap(inv, b, lb, buf + ka) : -1;
    } else {
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        ka = (int)la;
        kb = (int)lb;
    }
    if (ka <= 0 || kb <= 0)
        return mf_fail("%s: merge %u ('%.40s' '%.40s') is not spelled in the byte-level alphabet", h->path, rank, a, b);
    int32_t ia = mf_hf_find(h, buf, (size_t)ka), ib = mf_hf_find(h, buf + ka, (size_t)kb);
    int32_t im = mf_hf_find(h, buf, (size_t)(ka + kb));
    if (ia < 0 || ib < 0)
        return mf_fail("%s: merge %u ('%.40s' '%.40s') has a part that is not in the vocab", h->path, rank, a, b);
    if (im < 0) return 0; /* its result is no token: the merge can never produce an id; skip it */
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint64_t i = mf_hf_hash_pair(key) & h->mmask;
    while (h->merges[i].key != MF_HF_EMPTY && h->merges[i].key != key) i = (i + 1) & h->mmask;
    /* a repeated pair keeps its later rank, as a Map built from the list does */
    h->merges[i] = (mf_hfmerge){ key, rank, im };
    return 0;
}

static int mf_hf_cmp_added(const void *x, const void *y, void *ctx) {
    const mf_hfadded *a = ctx;
    int32_t i = *(const int32_t *)x, j = *(const int32_t *)y;
    if (a[i].len != a[j].len) return a[i].len > a[j].len ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* qsort_r is a GNU extension; a small insertion sort keeps this portable. */
static void mf_hf_sort_added(int32_t *v, int n, const mf_hfadded *a) {
    for (int i = 1; i < n; i++) {
        int32_t x = v[i];
        int j = i - 1;
        while (j >= 0 && mf_hf_cmp_added(&v[j], &x, (void *)a) > 0) { v[j + 1] = v[j]; j--; }
        v[j + 1] = x;
    }
}

static int mf_hf_load_model(mf_hftok *h, const cJSON *root, const cJSON *model) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return mf_fail("%s: model.vocab is not an object of token -> id", h->path);
    if (!cJSON_IsArray(merges)) return mf_fail("%s: model.merges is not a list", h->path);
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) return mf_fail("%s: added_tokens is not a list", h->path);
    const char *cs = mf_hf_str(model, "continuing_subword_prefix"), *ew = mf_hf_str(model, "end_of_word_suffix");
    if ((cs && cs[0]) || (ew && ew[0]))
        return mf_fail("%s: BPE with continuing_subword_prefix or end_of_word_suffix is not supported", h->path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return mf_fail("%s: BPE dropout is not supported", h->path);
    h->byte_fallback = mf_hf_bool(model, "byte_fallback", 0);
    h->ignore_merges = mf_hf_bool(model, "ignore_merges", 0);

    /* ids and sizes */
    int maxid = -1, nv = 0;
    size_t bytes = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, nv++) {
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(v >= 0 && v < (1 << 30)) || v != (double)(int)v)
            return mf_fail("%s: vocab token \"%.40s\" has an id that is not a non-negative integer", h->path, e->string);
        if ((int)v > maxid) maxid = (int)v;
        bytes += strlen(e->string) + 1;
    }
    int na = added ? cJSON_GetArraySize(added) : 0;
    h->added = calloc((size_t)na + 1, sizeof *h->added);
    if (!h->added) return mf_fail("out of memory loading %s", h->path);
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const char *c = mf_hf_str(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!c || !c[0] || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 30) ||
            id->valuedouble != (double)id->valueint)
            return mf_fail("%s: added_tokens entry %d needs a non-empty content and an integer id", h->path, h->n_added);
        mf_hfadded *a = &h->added[h->n_added++];
        a->text = strdup(c);
        a->len = strlen(c);
        a->id = id->valueint;
        a->lstrip = mf_hf_bool(e, "lstrip", 0);
        a->rstrip = mf_hf_bool(e, "rstrip", 0);
        if (!a->text) return mf_fail("out of memory loading %s", h->path);
        if (a->id > maxid) maxid = a->id;
        bytes += a->len + 1;
    }
    if (maxid < 0) return mf_fail("%s: the vocabulary is empty", h->path);
    /* ids index dense tables: real vocabularies number their tokens 0..n-1
     * (the largest have ~2^18); a sparse or huge id would make a small file
     * allocate gigabytes (found by the fuzzer) */
    if (maxid >= (1 << 22) || (int64_t)maxid + 1 > 2 * ((int64_t)nv + na) + 1024)
        return mf_fail("%s: token id %d is too large for a vocabulary of %d tokens and %d added tokens (ids must "
                       "number the tokens from 0, at most %d)", h->path, maxid, nv, na, (1 << 22) - 1);
    h->vocab = maxid + 1;
    size_t V = (size_t)h->vocab;
    h->tok_off = calloc(V, sizeof *h->tok_off);
    h->tok_len = calloc(V, sizeof *h->tok_len);
    h->has_tok = calloc(V, 1);
    h->dec_off = calloc(V, sizeof *h->dec_off);
    h->dec_len = calloc(V, sizeof *h->dec_len);
    h->blob = malloc(bytes + 1);
    uint64_t cap = 1;
    while (cap < (uint64_t)(nv + na) * 2 + 2) cap <<= 1;
    h->vslot = malloc(cap * sizeof *h->vslot);
    h->vmask = cap - 1;
    if (!h->tok_off || !h->tok_len || !h->has_tok || !h->dec_off || !h->dec_len || !h->blob || !h->vslot)
        return mf_fail("out of memory loading %s", h->path);
    for (uint64_t i = 0; i < cap; i++) h->vslot[i] = -1;
    int inv[324];
    mf_unicode_to_bytes(inv);
    size_t used = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id = e->valueint;
        size_t sl = strlen(e->string);
        int k;
        if (h->byte_level) {
            k = mf_unmap(inv, e->string, sl, h->blob + used);
            if (k <= 0)
                return mf_fail("%s: token \"%.40s\" (id %d) is not spelled in the byte-level alphabet", h->path,
                               e->string, id);
        } else {
            memcpy(h->blob + used, e->string, sl);
            k = (int)sl;
        }
        if (h->has_tok[id]) return mf_fail("%s: id %d is used twice in model.vocab", h->path, id);
        if (mf_hf_find(h, h->blob + used, (size_t)k) >= 0)
            return mf_fail("%s: token \"%.40s\" appears twice in model.vocab", h->path, e->string);
        h->has_tok[id] = 1;
        h->tok_off[id] = (uint32_t)used;
        h->tok_len[id] = (uint32_t)k;
        uint64_t i = mf_hf_hash_bytes(h->blob + used, (size_t)k) & h->vmask;
        while (h->vslot[i] >= 0) i = (i + 1) & h->vmask;
        h->vslot[i] = id;
        used += (size_t)k;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b, hex[8];
        h->byte_id[b] = h->byte_level ? mf_hf_find(h, &c, 1) : -1;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        h->fallback_id[b] = h->byte_fallback && !h->byte_level ? mf_hf_find(h, hex, 6) : -1;
    }
    const char *unk = mf_hf_str(model, "unk_token");
    h->unk_id = unk ? mf_hf_find(h, unk, strlen(unk)) : -1;
    if (unk && h->unk_id < 0)
        for (int i = 0; i < h->n_added; i++)
            if (strcmp(h->added[i].text, unk) == 0) h->unk_id = h->added[i].id;

    /* merges */
    int nm = cJSON_GetArraySize(merges);
    uint64_t mcap = 1;
    while (mcap < (uint64_t)nm * 2 + 2) mcap <<= 1;
    h->merges = malloc(mcap * sizeof *h->merges);
    h->mmask = mcap - 1;
    if (!h->merges) return mf_fail("out of memory loading %s", h->path);
    for (uint64_t i = 0; i < mcap; i++) h->merges[i].key = MF_HF_EMPTY;
    uint32_t rank = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        const char *a, *b;
        char *two = NULL;
        if (cJSON_IsString(e)) {
            /* "a b": split at the first space, as split(" ", 2) does */
            two = strdup(e->valuestring);
            if (!two) { free(buf); return mf_fail("out of memory loading %s", h->path); }
            char *sp = strchr(two, ' ');
            if (!sp) { free(two); free(buf); return mf_fail("%s: merge %u \"%.40s\" has no space", h->path, rank, e->valuestring); }
            *sp = 0;
            char *sp2 = strchr(sp + 1, ' ');
            if (sp2) *sp2 = 0;
            a = two;
            b = sp + 1;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            b = e->child->next->valuestring;
        } else {
            free(buf);
            return mf_fail("%s: merge %u is neither \"a b\" nor [\"a\", \"b\"]", h->path, rank);
        }
        size_t need = strlen(a) + strlen(b) + 1;
        if (need > bufcap) {
            bufcap = need * 2;
            char *nb = realloc(buf, bufcap);
            if (!nb) { free(two); free(buf); return mf_fail("out of memory loading %s", h->path); }
            buf = nb;
        }
        int rc = mf_hf_add_merge(h, a, b, rank, buf, inv);
        free(two);
        if (rc) { free(buf); return -1; }
    }
    free(buf);

    /* added tokens: matched verbatim, so the vocab lookups must not see them
     * as model tokens, but decoding does */
    for (int i = 0; i < h->n_added; i++) {
        const mf_hfadded *a = &h->added[i];
        unsigned char f = (unsigned char)a->text[0];
        int n = 0;
        if (h->added_first[f]) while (h->added_first[f][n] >= 0) n++;
        int32_t *l = realloc(h->added_first[f], (size_t)(n + 2) * sizeof *l);
        if (!l) return mf_fail("out of memory loading %s", h->path);
        l[n] = i;
        l[n + 1] = -1;
        h->added_first[f] = l;
        mf_hf_sort_added(l, n + 1, h->added);
    }
    return 0;
}

/* Decoded bytes for every id. */
static int mf_hf_build_decode(mf_hftok *h, const mf_hfdec *d) {
    mf_hfbuf out = { 0 };
    int inv[324];
    mf_unicode_to_bytes(inv);
    int byte_level = d->byte_level || h->byte_level;
    int32_t *added_of = malloc((size_t)h->vocab * sizeof *added_of); /* id -> index in added, or -1 */
    if (!added_of) return mf_fail("out of memory loading %s", h->path);
    for (int id = 0; id < h->vocab; id++) added_of[id] = -1;
    for (int i = 0; i < h->n_added; i++)
        if (added_of[h->added[i].id] < 0) added_of[h->added[i].id] = i;
    for (int id = 0; id < h->vocab; id++) {
        const char *added = added_of[id] >= 0 ? h->added[added_of[id]].text : NULL;
        h->dec_off[id] = (uint32_t)out.n;
        int rc = 0;
        if (added) {
            /* a ByteLevel decoder passes added tokens through as they are */
            rc = byte_level ? mf_hf_put(&out, added, strlen(added)) : mf_hf_decode_one(d, added, strlen(added), &out);
        } else if (h->has_tok[id]) {
            /* h->blob already holds raw bytes for a byte-level model */
            rc = byte_level ? mf_hf_put(&out, h->blob + h->tok_off[id], h->tok_len[id])
                            : mf_hf_decode_one(d, h->blob + h->tok_off[id], h->tok_len[id], &out);
        }
        if (rc) { free(out.p); free(added_of); return mf_fail("out of memory loading %s", h->path); }
        h->dec_len[id] = (uint32_t)(out.n - h->dec_off[id]);
    }
    free(added_of);
    h->dblob = out.p ? out.p : calloc(1, 1);
    return h->dblob ? 0 : mf_fail("out of memory loading %s", h->path);
}

mf_hftok *mf_hftok_load(const char *path) {
    mf_hftok *h = calloc(1, sizeof *h);
    if (!h || !(h->path = strdup(path))) { free(h); mf_fail("out of memory loading %s", path); return NULL; }
    char *text;
    size_t len;
    if (mf_read_file(path, "tokenizer.json", &text, &len) != 0) { mf_hftok_free(h); return NULL; }
    uint64_t fnv = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) fnv = (fnv ^ (unsigned char)text[i]) * 1099511628211ull;
    h->hash = fnv;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = -1;
    if (!root) {
        long at = end && end >= text && end <= text + len ? (long)(end - text) : -1;
        mf_fail("%s: invalid JSON (near byte %ld)", path, at);
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) { mf_fail("%s: no \"model\" object; is this a tokenizer.json?", path); goto out; }
    const char *type = mf_hf_str(model, "type");
    if (!type && !cJSON_GetObjectItemCaseSensitive(model, "merges")) {
        mf_fail("%s: model has no type and no merges; only BPE is supported", path);
        goto out;
    }
    if (type && strcmp(type, "BPE") != 0) {
        mf_fail("%s: tokenizer model type '%s' is not supported (only BPE)", path, type);
        goto out;
    }
    if (mf_hf_load_normalizer(h, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) goto out;
    if (mf_hf_load_pre(h, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) goto out;
    mf_hfdec dec;
    memset(&dec, 0, sizeof dec);
    if (mf_hf_load_decoder(h, cJSON_GetObjectItemCaseSensitive(root, "decoder"), &dec)) goto out;
    if (dec.byte_level) h->byte_level = 1;
    if (mf_hf_load_model(h, root, model)) goto out;
    if (h->byte_level)
        for (int b = 0; b < 256; b++)
            if (h->byte_id[b] < 0) { mf_fail("%s: byte-level vocab has no token for byte 0x%02x", path, b); goto out; }
    if (mf_hf_build_decode(h, &dec)) goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    free(text);
    if (rc) { mf_hftok_free(h); return NULL; }
    return h;
}

/* ---- encoding ------------------------------------------------------------ */

/* One cached pre-token: key bytes and ids live in the cache's arenas. */
typedef struct {
    uint64_t hash;
    uint32_t koff, klen, ioff, nids;
} mf_hfcent;

#define MF_HF_CACHE_SLOTS (1u << 17)  /* entries kept before the cache starts over */
#define MF_HF_CACHE_MAXLEN 128        /* longer pre-tokens are not cached */
#define MF_HF_CACHE_MIN_TEXT 16384    /* shorter texts are encoded without a cache */

typedef struct {
    const mf_hftok *h;
    void (*emit)(int32_t, void *);
    void *ctx;
    pcre2_match_data *md[16];
    /* BPE scratch: per symbol id, start, next/prev links */
    int32_t *sym;
    uint32_t *start, *len;
    int32_t *nx, *pv;
    uint64_t *heap;
    size_t cap;
    /* normalization scratch */
    char *nbuf[2];
    size_t ncap[2];
    /* pre-token cache */
    mf_hfcent *cent;
    uint32_t n_cent;
    char *ckeys;
    size_t ckn, ckcap;
    int32_t *cids;
    size_t cin, cicap;
    int32_t *out;    /* ids of the pre-token being encoded (for the cache) */
    size_t nout, outcap;
    int err;
} mf_hfenc;

static void mf_hf_out(mf_hfenc *e, int32_t id) {
    if (e->nout == e->outcap) {
        size_t cap = e->outcap ? e->outcap * 2 : 256;
        int32_t *o = realloc(e->out, cap * sizeof *o);
        if (!o) { e->err = 1; return; }
        e->out = o;
        e->outcap = cap;
    }
    e->out[e->nout++] = id;
}

static int mf_hf_grow(mf_hfenc *e, size_t n) {
    if (n <= e->cap) return 0;
    size_t cap = e->cap ? e->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *sym = realloc(e->sym, cap * sizeof *sym);
    if (sym) e->sym = sym;
    uint32_t *st = realloc(e->start, cap * sizeof *st);
    if (st) e->start = st;
    uint32_t *ln = realloc(e->len, cap * sizeof *ln);
    if (ln) e->len = ln;
    int32_t *nx = realloc(e->nx, cap * sizeof *nx);
    if (nx) e->nx = nx;
    int32_t *pv = realloc(e->pv, cap * sizeof *pv);
    if (pv) e->pv = pv;
    uint64_t *hp = realloc(e->heap, 3 * cap * sizeof *hp);
    if (hp) e->heap = hp;
    if (!sym || !st || !ln || !nx || !pv || !hp) return mf_fail("out of memory encoding a %zu-byte pre-token", n);
    e->cap = cap;
    return 0;
}

/* Emits one final symbol: its id, or its bytes as <0xXX> tokens, or unk. */
static int mf_hf_out_sym(mf_hfenc *e, const unsigned char *p, int32_t id, uint32_t start, uint32_t len) {
    const mf_hftok *h = e->h;
    if (id >= 0) { mf_hf_out(e, id); return 0; }
    int all = h->byte_fallback;
    for (uint32_t k = 0; all && k < len; k++) all = h->fallback_id[p[start + k]] >= 0;
    if (all) {
        for (uint32_t k = 0; k < len; k++) mf_hf_out(e, h->fallback_id[p[start + k]]);
        return 0;
    }
    if (h->unk_id >= 0) { mf_hf_out(e, h->unk_id); return 0; }
    return mf_fail("%s: text has a character (%u bytes) that is not in the vocabulary, and there is no unk_token or "
                   "byte fallback", h->path, len);
}

/* BPE of one pre-token into e->out: symbols are bytes (byte-level) or UTF-8
 * characters; the adjacent pair with the lowest rank is merged, leftmost
 * first, until no pair has a rank. A heap over (rank, position) does it in
 * O(n log n); a merged pair keeps the left symbol's index, so indices stay
 * in text order and the heap's tie-break is "leftmost". */
static int mf_hf_bpe(mf_hfenc *e, const unsigned char *p, size_t n) {
    const mf_hftok *h = e->h;
    if (h->ignore_merges) {
        int32_t id = mf_hf_find(h, (const char *)p, n);
        if (id >= 0) { mf_hf_out(e, id); return 0; }
    }
    if (n >= INT32_MAX / 4) return mf_fail("pre-token of %zu bytes is too long to encode", n);
    if (mf_hf_grow(e, n)) return -1;
    int32_t *w = e->sym, *nx = e->nx, *pv = e->pv;
    uint32_t *st = e->start, *ln = e->len;
    size_t m = 0;
    if (h->byte_level) {
        for (size_t i = 0; i < n; i++) { w[m] = h->byte_id[p[i]]; st[m] = (uint32_t)i; ln[m++] = 1; }
    } else {
        for (size_t i = 0; i < n;) {
            size_t k = mf_hf_charlen(p + i, n - i);
            w[m] = mf_hf_find(h, (const char *)p + i, k);
            st[m] = (uint32_t)i;
            ln[m++] = (uint32_t)k;
            i += k;
        }
    }
    if (m < 64) {
        /* short: scan for the best pair each round */
        while (m > 1) {
            uint32_t best = UINT32_MAX;
            size_t bi = 0;
            int32_t merged = -1;
            for (size_t i = 0; i + 1 < m; i++) {
                if (w[i] < 0 || w[i + 1] < 0) continue;
                const mf_hfmerge *g = mf_hf_merge(h, w[i], w[i + 1]);
                if (g && g->rank < best) { best = g->rank; bi = i; merged = g->merged; }
            }
            if (merged < 0) break;
            w[bi] = merged;
            ln[bi] += ln[bi + 1];
            memmove(w + bi + 1, w + bi + 2, (m - bi - 2) * sizeof *w);
            memmove(st + bi + 1, st + bi + 2, (m - bi - 2) * sizeof *st);
            memmove(ln + bi + 1, ln + bi + 2, (m - bi - 2) * sizeof *ln);
            m--;
        }
        for (size_t i = 0; i < m; i++)
            if (mf_hf_out_sym(e, p, w[i], st[i], ln[i])) return -1;
        return 0;
    }
    uint64_t *heap = e->heap;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        nx[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
        pv[i] = (int32_t)i - 1;
        const mf_hfmerge *g = i + 1 < m && w[i] >= 0 && w[i + 1] >= 0 ? mf_hf_merge(h, w[i], w[i + 1]) : NULL;
        if (g) mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | i);
    }
    while (hn > 0) {
        uint64_t k = mf_tok_heap_pop(heap, &hn);
        int32_t i = (int32_t)(k & 0xffffffffu), j;
        if (ln[i] == 0 || (j = nx[i]) < 0 || w[i] < 0 || w[j] < 0) continue;
        const mf_hfmerge *g = mf_hf_merge(h, w[i], w[j]);
        if (!g || g->rank != (uint32_t)(k >> 32)) continue; /* stale entry */
        w[i] = g->merged;
        ln[i] += ln[j];
        ln[j] = 0;
        nx[i] = nx[j];
        if (nx[j] >= 0) pv[nx[j]] = i;
        if (pv[i] >= 0 && w[pv[i]] >= 0 && (g = mf_hf_merge(h, w[pv[i]], w[i])))
            mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | (uint32_t)pv[i]);
        if (nx[i] >= 0 && w[nx[i]] >= 0 && (g = mf_hf_merge(h, w[i], w[nx[i]])))
            mf_tok_heap_push(heap, &hn, (uint64_t)g->rank << 32 | (uint32_t)i);
    }
    for (int32_t i = 0; i >= 0; i = nx[i])
        if (mf_hf_out_sym(e, p, w[i], st[i], ln[i])) return -1;
    return 0;
}

/* A pre-token: from the cache, or BPE (then cached). */
static int mf_hf_word(mf_hfenc *e, const char *s, size_t n) {
    if (n == 0) return 0;
    uint64_t hash = 0;
    uint32_t slot = 0;
    int cacheable = n <= MF_HF_CACHE_MAXLEN && e->cent;
    if (cacheable) {
        hash = mf_hf_hash_bytes(s, n);
        for (slot = (uint32_t)hash & (2 * MF_HF_CACHE_SLOTS - 1);; slot = (slot + 1) & (2 * MF_HF_CACHE_SLOTS - 1)) {
            const mf_hfcent *c = &e->cent[slot];
            if (c->klen == 0) break;
            if (c->hash == hash && c->klen == n && memcmp(e->ckeys + c->koff, s, n) == 0) {
                for (uint32_t i = 0; i < c->nids; i++) e->emit(e->cids[c->ioff + i], e->ctx);
                return 0;
            }
        }
    }
    e->nout = 0;
    if (mf_hf_bpe(e, (const unsigned char *)s, n)) return -1;
    if (e->err) return mf_fail("out of memory encoding");
    for (size_t i = 0; i < e->nout; i++) e->emit(e->out[i], e->ctx);
    if (!cacheable) return 0;
    if (e->n_cent >= MF_HF_CACHE_SLOTS) { /* full: start over */
        memset(e->cent, 0, 2 * (size_t)MF_HF_CACHE_SLOTS * sizeof *e->cent);
        e->n_cent = 0;
        e->ckn = e->cin = 0;
        for (slot = (uint32_t)hash & (2 * MF_HF_CACHE_SLOTS - 1); e->cent[slot].klen;
             slot = (slot + 1) & (2 * MF_HF_CACHE_SLOTS - 1)) {}
    }
    if (e->ckn + n > e->ckcap) {
        size_t cap = e->ckcap ? e->ckcap * 2 : 1 << 20;
        while (cap < e->ckn + n) cap *= 2;
        char *k = realloc(e->ckeys, cap);
        if (!k) return 0; /* the cache is only a speed-up */
        e->ckeys = k;
        e->ckcap = cap;
    }
    if (e->cin + e->nout > e->cicap) {
        size_t cap = e->cicap ? e->cicap * 2 : 1 << 18;
        while (cap < e->cin + e->nout) cap *= 2;
        int32_t *v = realloc(e->cids, cap * sizeof *v);
        if (!v) return 0;
        e->cids = v;
        e->cicap = cap;
    }
    memcpy(e->ckeys + e->ckn, s, n);
    memcpy(e->cids + e->cin, e->out, e->nout * sizeof *e->out);
    e->cent[slot] = (mf_hfcent){ hash, (uint32_t)e->ckn, (uint32_t)n, (uint32_t)e->cin, (uint32_t)e->nout };
    e->ckn += n;
    e->cin += e->nout;
    e->n_cent++;
    return 0;
}

static int mf_hf_pre(mf_hfenc *e, int step, const char *s, size_t n);

/* Cuts valid UTF-8 s[0..n) with step's regex and passes the pieces on. */
static int mf_hf_split_valid(mf_hfenc *e, int step, const char *s, size_t n) {
    const mf_hfpre *p = &e->h->pre[step];
    pcre2_match_data *md = e->md[step];
    size_t off = 0, prev = 0;
    while (off < n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mf_fail("%s: pre-tokenizer regex failed at byte %zu: %s", e->h->path, off, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a < off || a > n || b > n || b < a) return mf_fail("%s: pre-tokenizer regex returned a bad match", e->h->path);
        if (b == a) { /* an empty match splits nothing; step one character on */
            off = a + mf_hf_charlen((const unsigned char *)s + a, n - a);
            continue;
        }
        if (a > prev && !(p->type == MF_PRE_SPLIT && p->invert))
            if (mf_hf_pre(e, step + 1, s + prev, a - prev)) return -1;
        if (!(p->type == MF_PRE_SPLIT && p->behavior == MF_SPLIT_REMOVED && !p->invert))
            if (mf_hf_pre(e, step + 1, s + a, b - a)) return -1;
        off = prev = b;
    }
    /* the text after the last match (ByteLevel's regex leaves none) */
    if (prev < n && !(p->type == MF_PRE_SPLIT && p->invert))
        if (mf_hf_pre(e, step + 1, s + prev, n - prev)) return -1;
    return 0;
}

/* Runs pre-tokenizer step `step` on s[0..n), then the later steps, then BPE. */
static int mf_hf_pre(mf_hfenc *e, int step, const char *s, size_t n) {
    if (n == 0) return 0;
    if (step == e->h->n_pre) return mf_hf_word(e, s, n);
    const mf_hfpre *p = &e->h->pre[step];
    if (p->type == MF_PRE_BYTELEVEL && p->prefix && s[0] != ' ') {
        char *t = malloc(n + 1);
        if (!t) return mf_fail("out of memory encoding");
        t[0] = ' ';
        memcpy(t + 1, s, n);
        /* run this step again on the prefixed text; it starts with a space now */
        int rc = mf_hf_pre(e, step, t, n + 1);
        free(t);
        return rc;
    }
    if (!p->re) return mf_hf_pre(e, step + 1, s, n);
    /* the regex sees maximal runs of valid UTF-8; each run of invalid bytes
     * is a piece of its own (tokenizer.c does the same for GPT-2) */
    const unsigned char *u = (const unsigned char *)s;
    size_t off = 0;
    while (off < n) {
        size_t v = mf_utf8_valid_len(u + off, n - off);
        if (v > 0 && mf_hf_split_valid(e, step, s + off, v)) return -1;
        off += v;
        size_t bad = off;
        while (bad < n && mf_utf8_valid_len(u + bad, n - bad < 4 ? n - bad : 4) == 0) bad++;
        if (bad > off && mf_hf_pre(e, step + 1, s + off, bad - off)) return -1;
        off = bad;
    }
    return 0;
}

/* Normalizes one section (between added tokens) and pre-tokenizes it. */
static int mf_hf_section(mf_hfenc *e, const char *s, size_t n) {
    const mf_hftok *h = e->h;
    const char *cur = s;
    size_t m = n;
    int which = 0;
    for (int k = 0; k < h->n_norm; k++) {
        const mf_hfnorm *z = &h->norm[k];
        size_t need = z->type == MF_NORM_PREPEND ? m + z->alen
                    : z->type == MF_NORM_REPLACE ? (z->blen > z->alen ? m / z->alen * z->blen + m : m)
                    : 0;
        char **dst = &e->nbuf[which];
        size_t *cap = &e->ncap[which];
        if (z->type != MF_NORM_NFC && need + 1 > *cap) {
            char *nb = realloc(*dst, need + 1);
            if (!nb) return mf_fail("out of memory normalizing");
            *dst = nb;
            *cap = need + 1;
        }
        size_t out = 0;
        if (z->type == MF_NORM_PREPEND) {
            memcpy(*dst, z->a, z->alen);
            memcpy(*dst + z->alen, cur, m);
            out = m + z->alen;
        } else if (z->type == MF_NORM_REPLACE) {
            for (size_t i = 0; i < m;) {
                if (cur[i] == z->a[0] && i + z->alen <= m && memcmp(cur + i, z->a, z->alen) == 0) {
                    memcpy(*dst + out, z->b, z->blen);
                    out += z->blen;
                    i += z->alen;
                } else {
                    (*dst)[out++] = cur[i++];
                }
            }
        } else {
            out = mf_nfc(cur, m, dst, cap);
            if (out == (size_t)-1) return mf_fail("out of memory normalizing");
        }
        cur = *dst;
        m = out;
        which ^= 1;
    }
    return mf_hf_pre(e, 0, cur, m);
}

/* JavaScript's String.prototype.trim whitespace (trimStart/trimEnd). */
static int mf_hf_js_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

static uint32_t mf_hf_cp(const unsigned char *p, size_t k) {
    if (k == 1) return p[0];
    if (k == 2) return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    if (k == 3) return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

static size_t mf_hf_trim_start(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = mf_hf_charlen((const unsigned char *)s + i, n - i);
        if (!mf_hf_js_space(mf_hf_cp((const unsigned char *)s + i, k))) break;
        i += k;
    }
    return i;
}

static size_t mf_hf_trim_end(const char *s, size_t n) {
    while (n > 0) {
        size_t b = n - 1;
        while (b > 0 && n - b < 4 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        size_t k = mf_hf_charlen((const unsigned char *)s + b, n - b);
        if (b + k != n) k = 1, b = n - 1;
        if (!mf_hf_js_space(mf_hf_cp((const unsigned char *)s + b, k))) break;
        n = b;
    }
    return n;
}

/* The added token starting at s[0], longest first; -1 if none. */
static int mf_hf_added_at(const mf_hftok *h, const char *s, size_t n) {
    const int32_t *l = h->added_first[(unsigned char)s[0]];
    if (!l) return -1;
    for (; *l >= 0; l++) {
        const mf_hfadded *a = &h->added[*l];
        if (a->len <= n && memcmp(s, a->text, a->len) == 0) return *l;
    }
    return -1;
}

int mf_hftok_encode(const mf_hftok *h, const char *text, size_t n, void (*emit)(int32_t, void *), void *ctx) {
    mf_hfenc e = { .h = h, .emit = emit, .ctx = ctx };
    int rc = 0;
    for (int i = 0; i < h->n_pre && i < 16; i++)
        if (h->pre[i].re && !(e.md[i] = pcre2_match_data_create_from_pattern(h->pre[i].re, NULL))) rc = -1;
    if (h->n_pre > 16) rc = mf_fail("%s: more than 16 pre-tokenizer steps", h->path);
    else if (rc) rc = mf_fail("out of memory creating regex match data");
    /* the pre-token cache pays off on corpora, not on a line (NULL: no cache, still correct) */
    if (n >= MF_HF_CACHE_MIN_TEXT) e.cent = calloc(2 * (size_t)MF_HF_CACHE_SLOTS, sizeof *e.cent);
    /* Walk the text: sections between added tokens. A section's end may be
     * trimmed by the next token's lstrip, its start by the last one's rstrip. */
    size_t sec = 0, i = 0;
    int prev_rstrip = 0;
    while (rc == 0 && i <= n) {
        int a = i < n ? mf_hf_added_at(h, text + i, n - i) : -1;
        if (a < 0 && i < n) { i++; continue; }
        /* text[sec..i) is a section; then added token a (or the end) */
        size_t s0 = sec, s1 = i;
        if (prev_rstrip) s0 += mf_hf_trim_start(text + s0, s1 - s0);
        if (a >= 0 && h->added[a].lstrip) s1 = s0 + mf_hf_trim_end(text + s0, s1 - s0);
        if (s1 > s0) rc = mf_hf_section(&e, text + s0, s1 - s0);
        if (rc || a < 0) break;
        emit(h->added[a].id, ctx);
        prev_rstrip = h->added[a].rstrip;
        i += h->added[a].len;
        sec = i;
    }
    for (int k = 0; k < 16; k++) pcre2_match_data_free(e.md[k]);
    free(e.sym);
    free(e.start);
    free(e.len);
    free(e.nx);
    free(e.pv);
    free(e.heap);
    free(e.nbuf[0]);
    free(e.nbuf[1]);
    free(e.cent);
    free(e.ckeys);
    free(e.cids);
    free(e.out);
    return rc;
}
