/* safetensors reader and writer.
 *
 * The reader maps the file read-only and validates the whole header before
 * handing anything out, because tensor pointers go straight into the map:
 * one unchecked offset would be an out-of-bounds read later, far from the
 * cause. cJSON does the parsing; a second, lexical pass over the raw header
 * rejects what cJSON tolerates but JSON and safetensors do not (invalid
 * UTF-8, raw control characters, numbers such as 1.0, 1e3 or 007).
 *
 * The writer lays tensors out contiguously in the caller's order, pads the
 * header with spaces to a multiple of 8 bytes (as the reference
 * implementation does, so the data section starts 8-byte aligned) and goes
 * through mf_atomic_* so the destination is never half-written. */
#include "io/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* The reference implementation's limit is 100 MB; 100 MiB is a little more
 * generous and still keeps a hostile header from exhausting memory. */
#define MF_ST_MAX_HEADER ((uint64_t)100 << 20)
/* __metadata__ key prefix of a tensor's checksum: "xxh3_64:<name>" ->
 * 16 lowercase hex digits of XXH3-64 over the tensor's bytes. */
#define MF_ST_SUM_PREFIX "xxh3_64:"
#define MF_ST_SUM_PLEN (sizeof MF_ST_SUM_PREFIX - 1)
/* Largest integer a JSON number (parsed as a double) holds exactly. */
#define MF_ST_MAX_INT 9007199254740992.0

/* ---- small helpers ---------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid.
 * Strict: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t mf_st_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static int mf_st_utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t l = mf_st_utf8_len(p + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

/* Copies s into out for an error message: control characters and invalid
 * UTF-8 become \xNN so the message stays one printable line whatever bytes
 * a (possibly hostile) file contains; long strings are cut with "...". */
static const char *mf_st_esc(char *out, size_t cap, const char *s, size_t maxlen) {
    const unsigned char *p = (const unsigned char *)(s ? s : "(null)");
    size_t n = strlen((const char *)p), o = 0;
    for (size_t i = 0; i < n;) {
        if (i >= maxlen || o + 8 >= cap) {
            if (o + 4 <= cap) { memcpy(out + o, "...", 3); o += 3; }
            break;
        }
        size_t l = mf_st_utf8_len(p + i, n - i);
        if (l == 1 && p[i] >= 0x20 && p[i] != 0x7F) {
            out[o++] = (char)p[i++];
        } else if (l > 1) {
            memcpy(out + o, p + i, l);
            o += l;
            i += l;
        } else {
            snprintf(out + o, cap - o, "\\x%02X", p[i]);
            o += 4;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

static const char *mf_st_shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
    return out;
}

/* numel of a shape and its size in bytes for `esize`-byte elements; -1 if
 * either does not fit in int64. A zero dimension anywhere makes numel 0
 * however large the others are. */
static int mf_st_numel(int ndim, const int64_t *shape, size_t esize, int64_t *numel, uint64_t *bytes) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) { *numel = 0; *bytes = 0; return 0; }
    uint64_t lim = (uint64_t)INT64_MAX / (esize ? esize : 1), n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (n > lim / (uint64_t)shape[i]) return -1;
        n *= (uint64_t)shape[i];
    }
    *numel = (int64_t)n;
    *bytes = n * esize;
    return 0;
}

/* ---- reader ----------------------------------------------------------- */

typedef struct {
    const char *name;
    uint64_t begin, end;
} mf_st_span;

static int mf_st_cmp_name(const void *a, const void *b) {
    return strcmp(((const mf_st_span *)a)->name, ((const mf_st_span *)b)->name);
}

static int mf_st_cmp_span(const void *a, const void *b) {
    const mf_st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* A JSON number that is a non-negative integer exactly representable as a
 * double. cJSON stores numbers as doubles; the lexical pass later rejects
 * spellings like 1.0 that land here as integers. */
static int mf_st_get_uint(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return -1;
    double v = it->valuedouble;
    if (!(v >= 0.0) || v > MF_ST_MAX_INT) return -1;
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return -1;
    *out = u;
    return 0;
}

/* How a bad JSON value is shown in a message. */
static const char *mf_st_json_desc(const cJSON *it, char *out, size_t cap) {
    if (!it) snprintf(out, cap, "missing");
    else if (cJSON_IsNumber(it)) snprintf(out, cap, "%.17g", it->valuedouble);
    else if (cJSON_IsString(it)) snprintf(out, cap, "a string");
    else if (cJSON_IsArray(it)) snprintf(out, cap, "an array");
    else if (cJSON_IsObject(it)) snprintf(out, cap, "an object");
    else if (cJSON_IsBool(it)) snprintf(out, cap, "a boolean");
    else snprintf(out, cap, "null");
    return out;
}

static int mf_st_attach_sums(mf_st_file *f, const char *file);

/* Rejects what cJSON accepts but strict JSON or safetensors do not. */
static int mf_st_lex(const char *file, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c == '"') {
            i++;
            for (;;) {
                if (i >= n) return mf_fail("%s: header string starting before byte %zu is not terminated", file, i);
                c = s[i];
                if (c == '"') { i++; break; }
                if (c == '\\') {
                    /* cJSON would silently cut a string at \u0000, so two
                     * different names could compare equal. */
                    if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                        return mf_fail("%s: header byte %zu: \\u0000 inside a string", file, i);
                    i += 2;
                    continue;
                }
                if (c < 0x20) return mf_fail("%s: header byte %zu: raw control character 0x%02X inside a string", file, i, c);
                size_t l = mf_st_utf8_len(s + i, n - i);
                if (!l) return mf_fail("%s: header byte %zu: invalid UTF-8", file, i);
                i += l;
            }
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            int plain = 1;
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '-' || s[j] == '+' ||
                             s[j] == '.' || s[j] == 'e' || s[j] == 'E')) {
                if (s[j] < '0' || s[j] > '9') plain = 0;
                j++;
            }
            if (!plain || (s[i] == '0' && j - i > 1)) {
                char tok[32];
                size_t l = j - i < sizeof tok - 1 ? j - i : sizeof tok - 1;
                memcpy(tok, s + i, l);
                tok[l] = '\0';
                return mf_fail("%s: header byte %zu: number '%s' is not a plain non-negative integer", file, i, tok);
            }
            i = j;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '{' || c == '}' ||
                   c == '[' || c == ']' || c == ':' || c == ',' || (c >= 'a' && c <= 'z')) {
            /* structure, whitespace, or letters of true/false/null (which
             * cJSON has already checked) */
            i++;
        } else {
            return mf_fail("%s: header byte %zu: unexpected byte 0x%02X outside a string", file, i, c);
        }
    }
    return 0;
}

static int mf_st_parse_meta(mf_st_file *f, const char *file, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) return mf_fail("%s: __metadata__ is not an object", file);
    int n = cJSON_GetArraySize(meta);
    if (n == 0) return 0;
    f->meta_keys = calloc((size_t)n, sizeof *f->meta_keys);
    f->meta_vals = calloc((size_t)n, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return mf_fail("%s: out of memory reading __metadata__", file);
    char e1[128];
    for (const cJSON *it = meta->child; it && f->n_meta < n; it = it->next) {
        if (!it->string) return mf_fail("%s: __metadata__ entry without a key", file);
        if (!cJSON_IsString(it) || !it->valuestring)
            return mf_fail("%s: __metadata__ value for '%s' is not a string", file,
                           mf_st_esc(e1, sizeof e1, it->string, 80));
        f->meta_keys[f->n_meta] = strdup(it->string);
        f->meta_vals[f->n_meta] = strdup(it->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_vals[f->n_meta - 1])
            return mf_fail("%s: out of memory reading __metadata__", file);
    }
    mf_st_span *s = calloc((size_t)f->n_meta, sizeof *s);
    if (!s) return mf_fail("%s: out of memory reading __metadata__", file);
    for (int i = 0; i < f->n_meta; i++) s[i].name = f->meta_keys[i];
    qsort(s, (size_t)f->n_meta, sizeof *s, mf_st_cmp_name);
    for (int i = 1; i < f->n_meta; i++) {
        if (strcmp(s[i - 1].name, s[i].name) == 0) {
            mf_fail("%s: __metadata__ has duplicate key '%s'", file, mf_st_esc(e1, sizeof e1, s[i].name, 80));
            free(s);
            return -1;
        }
    }
    free(s);
    return 0;
}

/* Validates one tensor entry and appends it to f->tensors. */
static int mf_st_parse_tensor(mf_st_file *f, const char *file, const cJSON *ent,
                              const uint8_t *data, uint64_t data_size) {
    char nm[128], d1[64], sh[160];
    const char *name = mf_st_esc(nm, sizeof nm, ent->string, 80);
    if (!cJSON_IsObject(ent)) return mf_fail("%s: tensor '%s' entry is not an object", file, name);
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *it = ent->child; it; it = it->next) {
        const cJSON **slot = NULL;
        if (!it->string) continue;
        if (strcmp(it->string, "dtype") == 0) slot = &jd;
        else if (strcmp(it->string, "shape") == 0) slot = &js;
        else if (strcmp(it->string, "data_offsets") == 0) slot = &jo;
        else continue; /* unknown fields are ignored, as the reference does */
        if (*slot) return mf_fail("%s: tensor '%s' has two '%s' fields", file, name, it->string);
        *slot = it;
    }
    if (!jd) return mf_fail("%s: tensor '%s' has no 'dtype'", file, name);
    if (!js) return mf_fail("%s: tensor '%s' has no 'shape'", file, name);
    if (!jo) return mf_fail("%s: tensor '%s' has no 'data_offsets'", file, name);

    mf_st_tensor *t = &f->tensors[f->n];
    memset(t, 0, sizeof *t);
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return mf_fail("%s: tensor '%s' dtype is %s, not a string", file, name, mf_st_json_desc(jd, d1, sizeof d1));
    if (mf_dtype_parse(jd->valuestring, &t->dtype) != 0)
        return mf_fail("%s: tensor '%s' has unsupported dtype '%s' (memfit reads F32, BF16, F16, I32, U16, U8, I64)",
                       file, name, mf_st_esc(d1, sizeof d1, jd->valuestring, 24));

    if (!cJSON_IsArray(js))
        return mf_fail("%s: tensor '%s' shape is %s, not an array", file, name, mf_st_json_desc(js, d1, sizeof d1));
    int ndim = 0;
    for (const cJSON *it = js->child; it; it = it->next) {
        if (ndim == MF_MAX_DIMS)
            return mf_fail("%s: tensor '%s' has more than %d dimensions", file, name, MF_MAX_DIMS);
        uint64_t v;
        if (mf_st_get_uint(it, &v) != 0)
            return mf_fail("%s: tensor '%s' shape[%d] is %s, not a non-negative integer", file, name, ndim,
                           mf_st_json_desc(it, d1, sizeof d1));
        t->shape[ndim++] = (int64_t)v;
    }
    t->ndim = ndim;
    mf_st_shape_str(sh, sizeof sh, ndim, t->shape);
    int64_t numel;
    uint64_t bytes;
    size_t esize = mf_dtype_size(t->dtype);
    if (mf_st_numel(ndim, t->shape, esize, &numel, &bytes) != 0)
        return mf_fail("%s: tensor '%s' shape %s is too large", file, name, sh);

    uint64_t off[2];
    int k = 0;
    if (cJSON_IsArray(jo)) {
        for (const cJSON *it = jo->child; it; it = it->next, k++)
            if (k >= 2 || mf_st_get_uint(it, &off[k]) != 0) { k = -1; break; }
    }
    if (k != 2)
        return mf_fail("%s: tensor '%s' data_offsets must be [begin, end] with non-negative integers", file, name);
    if (off[0] > off[1])
        return mf_fail("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] have begin after end",
                       file, name, off[0], off[1]);
    if (off[1] > data_size)
        return mf_fail("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] extend past the data section (%" PRIu64 " bytes)",
                       file, name, off[0], off[1], data_size);
    if (off[1] - off[0] != bytes)
        return mf_fail("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] do not match %s shape %s (%" PRIu64 " bytes)",
                       file, name, off[0], off[1], mf_dtype_name(t->dtype), sh, bytes);
    t->name = strdup(ent->string);
    if (!t->name) return mf_fail("%s: out of memory", file);
    t->data = data + off[0];
    t->nbytes = (size_t)bytes;
    f->n++;
    return 0;
}

/* Duplicate names and overlapping byte ranges, both found by sorting so a
 * header with many tensors stays O(n log n). */
static int mf_st_check_set(const mf_st_file *f, const char *file, const uint8_t *data) {
    if (f->n < 2) return 0;
    mf_st_span *s = calloc((size_t)f->n, sizeof *s);
    if (!s) return mf_fail("%s: out of memory", file);
    char e1[128], e2[128];
    int rc = 0;
    for (int i = 0; i < f->n; i++) {
        s[i].name = f->tensors[i].name;
        s[i].begin = (uint64_t)((const uint8_t *)f->tensors[i].data - data);
        s[i].end = s[i].begin + f->tensors[i].nbytes;
    }
    qsort(s, (size_t)f->n, sizeof *s, mf_st_cmp_name);
    for (int i = 1; i < f->n && rc == 0; i++)
        if (strcmp(s[i - 1].name, s[i].name) == 0)
            rc = mf_fail("%s: duplicate tensor name '%s'", file, mf_st_esc(e1, sizeof e1, s[i].name, 80));
    if (rc == 0) {
        qsort(s, (size_t)f->n, sizeof *s, mf_st_cmp_span);
        /* Empty tensors occupy no bytes and overlap nothing. */
        int last = -1;
        for (int i = 0; i < f->n && rc == 0; i++) {
            if (s[i].begin == s[i].end) continue;
            if (last >= 0 && s[i].begin < s[last].end)
                rc = mf_fail("%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap",
                             file, mf_st_esc(e1, sizeof e1, s[last].name, 60), s[last].begin, s[last].end,
                             mf_st_esc(e2, sizeof e2, s[i].name, 60), s[i].begin, s[i].end);
            if (last < 0 || s[i].end > s[last].end) last = i;
        }
    }
    free(s);
    return rc;
}

static int mf_st_parse(mf_st_file *f, const char *file) {
    const uint8_t *p = f->map;
    size_t size = f->map_size;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen == 0) return mf_fail("%s: header length is 0", file);
    if (hlen >= MF_ST_MAX_HEADER)
        return mf_fail("%s: header length %" PRIu64 " exceeds the 100 MiB limit", file, hlen);
    if (hlen > size - 8)
        return mf_fail("%s: header length %" PRIu64 " is larger than the file (%zu bytes)", file, hlen, size);
    const char *hdr = (const char *)p + 8;
    size_t n = (size_t)hlen;
    const uint8_t *data = p + 8 + n;
    uint64_t data_size = size - 8 - n;
    if (hdr[0] != '{')
        return mf_fail("%s: header is not a JSON object (first byte is 0x%02X, expected '{')", file, (unsigned char)hdr[0]);

    /* cJSON wants a terminated string; the map has none after the header. */
    char *copy = malloc(n + 1);
    if (!copy) return mf_fail("%s: out of memory for a %zu-byte header", file, n);
    memcpy(copy, hdr, n);
    copy[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, n, &end, 0);
    if (!root) {
        size_t at = end && end >= copy && end <= copy + n ? (size_t)(end - copy) : 0;
        free(copy);
        return mf_fail("%s: header is not valid JSON (error near byte %zu)", file, at);
    }
    int rc = 0;
    for (const char *q = end; q && q < copy + n; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            rc = mf_fail("%s: header has unexpected byte 0x%02X after the JSON object at byte %zu",
                         file, (unsigned char)*q, (size_t)(q - copy));
            break;
        }
    }
    free(copy);
    if (rc == 0 && !cJSON_IsObject(root)) rc = mf_fail("%s: header is not a JSON object", file);

    int n_items = rc == 0 ? cJSON_GetArraySize(root) : 0;
    if (rc == 0 && n_items > 0) {
        f->tensors = calloc((size_t)n_items, sizeof *f->tensors);
        if (!f->tensors) rc = mf_fail("%s: out of memory for %d tensors", file, n_items);
    }
    int seen_meta = 0;
    for (const cJSON *it = root->child; rc == 0 && it; it = it->next) {
        if (!it->string) { rc = mf_fail("%s: header object member without a name", file); break; }
        if (strcmp(it->string, "__metadata__") == 0) {
            if (seen_meta) rc = mf_fail("%s: header has two __metadata__ entries", file);
            else rc = mf_st_parse_meta(f, file, it);
            seen_meta = 1;
        } else if (f->n < n_items) {
            rc = mf_st_parse_tensor(f, file, it, data, data_size);
        }
    }
    cJSON_Delete(root);
    if (rc == 0) rc = mf_st_check_set(f, file, data);
    /* Last, so the structural messages above (which name the tensor) win
     * over the generic lexical ones for the same defect. */
    if (rc == 0) rc = mf_st_lex(file, (const unsigned char *)hdr, n);
    if (rc == 0) rc = mf_st_attach_sums(f, file);
    return rc;
}

/* 16 lowercase hex digits -> v; -1 otherwise. */
static int mf_st_hex64(const char *s, uint64_t *v) {
    uint64_t x = 0;
    int i = 0;
    for (; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        x = x << 4 | (uint64_t)d;
    }
    if (s[i]) return -1;
    *v = x;
    return 0;
}

/* The checksum entries of __metadata__ onto their tensors; an entry that is
 * malformed or names no tensor of the file is refused (it was written by
 * something that is not memfit, or damaged). */
static int mf_st_attach_sums(mf_st_file *f, const char *file) {
    char e1[128];
    for (int i = 0; i < f->n_meta; i++) {
        const char *k = f->meta_keys[i];
        if (strncmp(k, MF_ST_SUM_PREFIX, MF_ST_SUM_PLEN) != 0) continue;
        mf_st_tensor *t = (mf_st_tensor *)mf_st_find(f, k + MF_ST_SUM_PLEN);
        if (!t) return mf_fail("%s: __metadata__ has a checksum for tensor '%s', which the file does not hold", file,
                               mf_st_esc(e1, sizeof e1, k + MF_ST_SUM_PLEN, 80));
        if (mf_st_hex64(f->meta_vals[i], &t->sum))
            return mf_fail("%s: checksum of tensor '%s' is not 16 hex digits", file, mf_st_esc(e1, sizeof e1, t->name, 80));
        t->has_sum = 1;
    }
    /* Callers see the metadata they wrote: the checksums now live on the
     * tensors (a writer that copies metadata must not copy stale ones). */
    int m = 0;
    for (int i = 0; i < f->n_meta; i++) {
        if (strncmp(f->meta_keys[i], MF_ST_SUM_PREFIX, MF_ST_SUM_PLEN) == 0) {
            free(f->meta_keys[i]);
            free(f->meta_vals[i]);
            continue;
        }
        f->meta_keys[m] = f->meta_keys[i];
        f->meta_vals[m++] = f->meta_vals[i];
    }
    f->n_meta = m;
    return 0;
}

/* First non-finite element of n elements of dtype dt at p, or -1. */
static int64_t mf_st_first_nonfinite(mf_dtype dt, const void *p, size_t n, const char **what) {
    if (dt == MF_DTYPE_F32) {
        const uint32_t *u = p;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = u[i];  /* exponent all ones: Inf or NaN; memcpy-free read of an aligned map */
            if ((x & 0x7F800000u) == 0x7F800000u) { *what = x & 0x007FFFFFu ? "NaN" : "Inf"; return (int64_t)i; }
        }
    } else if (dt == MF_DTYPE_BF16 || dt == MF_DTYPE_F16) {
        const uint16_t *u = p;
        uint16_t e = dt == MF_DTYPE_BF16 ? 0x7F80u : 0x7C00u, m = dt == MF_DTYPE_BF16 ? 0x007Fu : 0x03FFu;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & e) == e) { *what = u[i] & m ? "NaN" : "Inf"; return (int64_t)i; }
    }
    return -1;
}

int mf_st_stream(const mf_st_file *f, const mf_st_tensor *t, mf_st_sink_fn sink, void *ctx) {
    const char *file = f->path ? f->path : "safetensors file";
    char e1[128];
    const size_t step = 4u << 20;  /* a multiple of every element size */
    size_t esize = mf_dtype_size(t->dtype);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    XXH3_state_t *st = t->has_sum ? XXH3_createState() : NULL;
    if (t->has_sum && (!st || XXH3_64bits_reset(st) == XXH_ERROR)) {
        XXH3_freeState(st);
        return mf_fail("%s: out of memory checking tensor '%s'", file, mf_st_esc(e1, sizeof e1, t->name, 80));
    }
    for (size_t off = 0; off < t->nbytes; off += step) {
        size_t len = t->nbytes - off < step ? t->nbytes - off : step;
        const char *src = (const char *)t->data + off;
        if (st) XXH3_64bits_update(st, src, len);
        const char *what = "";
        /* data offsets are not always element-aligned in other tools' files:
         * read elements through an aligned copy then */
        int64_t bad = -1;
        if (((uintptr_t)src % esize) == 0) bad = mf_st_first_nonfinite(t->dtype, src, len / esize, &what);
        else {
            unsigned char tmp[4096];
            for (size_t o = 0; o < len && bad < 0; o += sizeof tmp) {
                size_t l = len - o < sizeof tmp ? len - o : sizeof tmp;
                memcpy(tmp, src + o, l);
                int64_t b = mf_st_first_nonfinite(t->dtype, tmp, l / esize, &what);
                if (b >= 0) bad = b + (int64_t)(o / esize);
            }
        }
        if (bad >= 0) {
            XXH3_freeState(st);
            return mf_fail("%s: tensor '%s' holds a non-finite value (%s) at element %lld; refusing to load it", file,
                           mf_st_esc(e1, sizeof e1, t->name, 80), what, (long long)(bad + (int64_t)(off / esize)));
        }
        if (sink) sink(ctx, off, src, len);
        uintptr_t lo = (uintptr_t)src & ~(page - 1), hi = ((uintptr_t)src + len + page - 1) & ~(page - 1);
        madvise((void *)lo, hi - lo, MADV_DONTNEED);  /* file-backed: re-read if touched again */
    }
    if (st) {
        uint64_t got = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        if (got != t->sum)
            return mf_fail("%s: tensor '%s' is corrupt: its bytes hash to %016llx, the file records %016llx", file,
                           mf_st_esc(e1, sizeof e1, t->name, 80), (unsigned long long)got, (unsigned long long)t->sum);
    }
    return 0;
}

int mf_st_verify_all(const mf_st_file *f) {
    for (int i = 0; i < f->n; i++)
        if (mf_st_stream(f, &f->tensors[i], NULL, NULL)) return -1;
    return 0;
}

int mf_st_open(mf_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    char file[320];
    mf_st_esc(file, sizeof file, path, 256);
    if (!path) return mf_fail("cannot open safetensors file: no path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail("%s: cannot open: %s", file, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mf_fail("%s: cannot stat: %s", file, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mf_fail("%s: not a regular file", file);
    }
    if (st.st_size < 8) {
        close(fd);
        return mf_fail("%s: file is %lld bytes, too short for the 8-byte header length", file, (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return mf_fail("%s: file is too large to map", file);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return mf_fail("%s: cannot map: %s", file, strerror(e));
    f->map = map;
    f->map_size = (size_t)st.st_size;
    f->path = strdup(file);
    if (!f->path) {
        mf_st_close(f);
        return mf_fail("%s: out of memory", file);
    }
    if (mf_st_parse(f, file) != 0) {
        mf_st_close(f); /* keeps the message: close never calls mf_fail */
        return -1;
    }
    return 0;
}

void mf_st_close(mf_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    /* Metadata arrays may be partly filled after a failed open: free every
     * slot that was set (n_meta counts them, NULLs are fine). */
    for (int i = 0; i < f->n_meta; i++) {
        if (f->meta_keys) free(f->meta_keys[i]);
        if (f->meta_vals) free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const mf_st_tensor *mf_st_find(const mf_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *mf_st_meta(const mf_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

/* ---- writer ----------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} mf_st_sb;

static void mf_st_put(mf_st_sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) { b->oom = 1; return; }
            cap *= 2;
        }
        char *nb = realloc(b->buf, cap);
        if (!nb) { b->oom = 1; return; }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void mf_st_puts(mf_st_sb *b, const char *s) { mf_st_put(b, s, strlen(s)); }

/* JSON string literal; s is already known to be valid UTF-8. */
static void mf_st_put_json_str(mf_st_sb *b, const char *s) {
    mf_st_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"') mf_st_put(b, "\\\"", 2);
        else if (*p == '\\') mf_st_put(b, "\\\\", 2);
        else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            mf_st_put(b, esc, 6);
        } else mf_st_put(b, (const char *)p, 1);
    }
    mf_st_put(b, "\"", 1);
}

static int mf_st_check_unique(const char *file, const char *what, const char *const *names,
                              const mf_st_entry *entries, int n) {
    if (n < 2) return 0;
    mf_st_span *s = calloc((size_t)n, sizeof *s);
    if (!s) return mf_fail("cannot write %s: out of memory", file);
    for (int i = 0; i < n; i++) s[i].name = names ? names[i] : entries[i].name;
    qsort(s, (size_t)n, sizeof *s, mf_st_cmp_name);
    int rc = 0;
    char e1[128];
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(s[i - 1].name, s[i].name) == 0)
            rc = mf_fail("cannot write %s: duplicate %s '%s'", file, what, mf_st_esc(e1, sizeof e1, s[i].name, 80));
    free(s);
    return rc;
}

/* The JSON header: __metadata__ first, then tensors in the given order, as
 * the reference serializer does; padded with spaces to a multiple of 8. */
static int mf_st_header(mf_st_sb *bp, const char *file, const mf_st_entry *entries, int n,
                        const char *const *meta_keys, const char *const *meta_vals, int n_meta) {
    mf_st_sb b = {0};
    char num[64];
    mf_st_puts(&b, "{");
    if (n_meta > 0) {
        mf_st_puts(&b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) mf_st_puts(&b, ",");
            mf_st_put_json_str(&b, meta_keys[i]);
            mf_st_puts(&b, ":");
            mf_st_put_json_str(&b, meta_vals[i]);
        }
        mf_st_puts(&b, "}");
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const mf_st_entry *e = &entries[i];
        if (i || n_meta > 0) mf_st_puts(&b, ",");
        mf_st_put_json_str(&b, e->name);
        mf_st_puts(&b, ":{\"dtype\":\"");
        mf_st_puts(&b, mf_dtype_name(e->dtype));
        mf_st_puts(&b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", e->shape[d]);
            mf_st_puts(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + (uint64_t)e->nbytes);
        mf_st_puts(&b, num);
        off += e->nbytes;
    }
    mf_st_puts(&b, "}");
    /* Spaces up to a multiple of 8 so the data section is 8-byte aligned. */
    while (!b.oom && b.len % 8 != 0) mf_st_puts(&b, " ");
    if (b.oom) {
        free(b.buf);
        return mf_fail("cannot write %s: out of memory building the header", file);
    }
    if ((uint64_t)b.len >= MF_ST_MAX_HEADER) {
        free(b.buf);
        return mf_fail("cannot write %s: header would be %zu bytes, over the 100 MiB limit readers accept", file, b.len);
    }

    *bp = b;
    return 0;
}

static int mf_st_write_sums(const char *path, const mf_st_entry *entries, int n,
                            const char *const *meta_keys, char **meta_vals, int n_meta, int n_sum) {
    char file[320], e1[128], sh[160];
    mf_st_esc(file, sizeof file, path, 256);
    if (!path || !*path) return mf_fail("cannot write safetensors file: empty path");
    if (n < 0 || n_meta < 0) return mf_fail("cannot write %s: negative tensor or metadata count", file);
    if (n > 0 && !entries) return mf_fail("cannot write %s: no tensor entries given", file);
    if (n_meta > 0 && (!meta_keys || !meta_vals)) return mf_fail("cannot write %s: no metadata arrays given", file);

    /* Validate everything before touching the filesystem, so a bad call
     * leaves not even a temp file behind. */
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const mf_st_entry *e = &entries[i];
        if (!e->name) return mf_fail("cannot write %s: tensor %d has no name", file, i);
        const char *name = mf_st_esc(e1, sizeof e1, e->name, 80);
        if (!mf_st_utf8_valid(e->name)) return mf_fail("cannot write %s: tensor name '%s' is not valid UTF-8", file, name);
        if (strcmp(e->name, "__metadata__") == 0)
            return mf_fail("cannot write %s: '__metadata__' is reserved and cannot name a tensor", file);
        if ((unsigned)e->dtype >= MF_DTYPE_COUNT)
            return mf_fail("cannot write %s: tensor '%s' has invalid dtype %d", file, name, (int)e->dtype);
        if (e->ndim < 0 || e->ndim > MF_MAX_DIMS)
            return mf_fail("cannot write %s: tensor '%s' has %d dimensions (0..%d allowed)", file, name, e->ndim, MF_MAX_DIMS);
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0)
                return mf_fail("cannot write %s: tensor '%s' shape[%d] is negative (%" PRId64 ")", file, name, d, e->shape[d]);
        mf_st_shape_str(sh, sizeof sh, e->ndim, e->shape);
        int64_t numel;
        uint64_t bytes;
        if (mf_st_numel(e->ndim, e->shape, mf_dtype_size(e->dtype), &numel, &bytes) != 0)
            return mf_fail("cannot write %s: tensor '%s' shape %s is too large", file, name, sh);
        if ((uint64_t)e->nbytes != bytes)
            return mf_fail("cannot write %s: tensor '%s' has %zu bytes but %s shape %s needs %" PRIu64,
                           file, name, e->nbytes, mf_dtype_name(e->dtype), sh, bytes);
        if (e->nbytes > 0 && !e->data && !e->read) return mf_fail("cannot write %s: tensor '%s' has no data", file, name);
        /* Offsets must stay exact when a reader parses them as doubles. */
        if (bytes > (uint64_t)MF_ST_MAX_INT - total)
            return mf_fail("cannot write %s: tensors total more than 2^53 bytes", file);
        total += bytes;
    }
    if (mf_st_check_unique(file, "tensor name", NULL, entries, n) != 0) return -1;
    for (int i = 0; i < n_meta; i++) {
        if (!meta_keys[i] || !meta_vals[i]) return mf_fail("cannot write %s: metadata entry %d is NULL", file, i);
        if (!mf_st_utf8_valid(meta_keys[i]) || !mf_st_utf8_valid(meta_vals[i]))
            return mf_fail("cannot write %s: metadata '%s' is not valid UTF-8", file, mf_st_esc(e1, sizeof e1, meta_keys[i], 80));
    }
    if (mf_st_check_unique(file, "metadata key", meta_keys, NULL, n_meta) != 0) return -1;

    mf_st_sb b = {0};
    if (mf_st_header(&b, file, entries, n, meta_keys, (const char *const *)meta_vals, n_meta)) return -1;
    mf_atomic_file af;
    if (mf_atomic_open(&af, path) != 0) { free(b.buf); return -1; }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, af.fp) == 8 && fwrite(b.buf, 1, b.len, af.fp) == b.len;
    int rerr = 0;
    XXH3_state_t *hs = XXH3_createState();
    if (!hs) ok = 0;
    for (int i = 0; ok && !rerr && i < n; i++) {
        const mf_st_entry *e = &entries[i];
        XXH3_64bits_reset(hs);
        if (e->nbytes > 0 && e->data) {
            XXH3_64bits_update(hs, e->data, e->nbytes);
            ok = fwrite(e->data, 1, e->nbytes, af.fp) == e->nbytes;
        }
        /* streamed through one small buffer: the bytes never exist at once */
        unsigned char piece[1 << 16];
        for (size_t o = 0; !e->data && ok && !rerr && o < e->nbytes; o += sizeof piece) {
            size_t len = e->nbytes - o < sizeof piece ? e->nbytes - o : sizeof piece;
            if (e->read(e->read_ctx, o, piece, len)) rerr = 1;
            else {
                XXH3_64bits_update(hs, piece, len);
                ok = fwrite(piece, 1, len, af.fp) == len;
            }
        }
        /* the checksum entries are the last n_sum of the metadata, one per tensor in order */
        snprintf(meta_vals[n_meta - n_sum + i], 17, "%016llx", (unsigned long long)XXH3_64bits_digest(hs));
    }
    XXH3_freeState(hs);
    if (ok && !rerr) {
        /* the header again, now with the checksums: same length, so it
         * overwrites the placeholder header in place */
        mf_st_sb b2 = {0};
        size_t len0 = b.len;
        ok = mf_st_header(&b2, file, entries, n, meta_keys, (const char *const *)meta_vals, n_meta) == 0 &&
             b2.len == len0 && fflush(af.fp) == 0 && fseek(af.fp, 8, SEEK_SET) == 0 &&
             fwrite(b2.buf, 1, b2.len, af.fp) == b2.len;
        free(b2.buf);
    }
    int err = errno;
    free(b.buf);
    if (rerr) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mf_error());
        mf_atomic_abort(&af);
        return mf_fail("cannot write %s: %s", file, msg);
    }
    if (!ok) {
        mf_atomic_abort(&af);
        return mf_fail("cannot write %s: %s", file, strerror(err ? err : EIO));
    }
    return mf_atomic_commit(&af);
}

int mf_st_write(const char *path, const mf_st_entry *entries, int n,
                const char *const *meta_keys, const char *const *meta_vals, int n_meta) {
    char file[320];
    mf_st_esc(file, sizeof file, path, 256);
    if (n < 0 || n_meta < 0) return mf_fail("cannot write %s: negative tensor or metadata count", file);
    if (n > 0 && !entries) return mf_fail("cannot write %s: no tensor entries given", file);
    if (n_meta > 0 && (!meta_keys || !meta_vals)) return mf_fail("cannot write %s: no metadata arrays given", file);
    /* the caller's metadata, less any checksums it copied from another file
     * (they are recomputed), then one checksum per tensor, filled in as the
     * tensor is written */
    const char **keys = calloc((size_t)(n_meta + n) + 1, sizeof *keys);
    char **vals = calloc((size_t)(n_meta + n) + 1, sizeof *vals);
    char **own = calloc((size_t)n + 1, sizeof *own);
    int m = 0, rc = 0;
    if (!keys || !vals || !own) rc = mf_fail("cannot write %s: out of memory", file);
    for (int i = 0; !rc && i < n_meta; i++) {
        if (meta_keys[i] && strncmp(meta_keys[i], MF_ST_SUM_PREFIX, MF_ST_SUM_PLEN) == 0) continue;
        keys[m] = meta_keys[i];
        vals[m++] = (char *)meta_vals[i];
    }
    int n_user = m;
    for (int i = 0; !rc && i < n; i++) {
        const char *nm = entries[i].name ? entries[i].name : "";
        own[i] = malloc(MF_ST_SUM_PLEN + strlen(nm) + 1 + 17);
        if (!own[i]) { rc = mf_fail("cannot write %s: out of memory", file); break; }
        sprintf(own[i], "%s%s", MF_ST_SUM_PREFIX, nm);
        keys[m] = own[i];
        vals[m] = own[i] + MF_ST_SUM_PLEN + strlen(nm) + 1;  /* 17 bytes after the key's NUL */
        snprintf(vals[m++], 17, "%016d", 0);
    }
    if (!rc) rc = mf_st_write_sums(path, entries, n, keys, vals, m, m - n_user);
    for (int i = 0; own && i < n; i++) free(own[i]);
    free(own);
    free(keys);
    free(vals);
    return rc;
}
