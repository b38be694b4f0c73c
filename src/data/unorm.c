/* Unicode NFC (UAX #15), for tokenizer.json normalizers (Qwen's "NFC").
 *
 * Canonical decomposition (tables + Hangul arithmetic), canonical ordering
 * of combining marks, then canonical composition, as the reference
 * algorithm in UAX #15 does. Text made only of code points below U+0300
 * cannot change and is copied as it is (the common case for English).
 * The tables come from scripts/gen_unorm_tables.py (unorm_tables.h).
 */
#include "tok_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "unorm_tables.h"

#define MF_SBASE 0xAC00u
#define MF_LBASE 0x1100u
#define MF_VBASE 0x1161u
#define MF_TBASE 0x11A7u
#define MF_LCOUNT 19u
#define MF_VCOUNT 21u
#define MF_TCOUNT 28u
#define MF_NCOUNT (MF_VCOUNT * MF_TCOUNT)
#define MF_SCOUNT (MF_LCOUNT * MF_NCOUNT)
#define MF_RAW 0x80000000u /* an invalid UTF-8 byte, kept as it is */

static int mf_ccc_of(uint32_t cp) {
    if (cp < 0x300 || (cp & MF_RAW)) return 0;
    size_t lo = 0, hi = sizeof mf_ccc / sizeof mf_ccc[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t c = mf_ccc[mid] >> 8;
        if (c == cp) return (int)(mf_ccc[mid] & 0xff);
        if (c < cp) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

static const uint32_t *mf_decomp_of(uint32_t cp, int *n) {
    size_t lo = 0, hi = sizeof mf_decomp / sizeof mf_decomp[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (mf_decomp[mid][0] == cp) { *n = (int)mf_decomp[mid][2]; return &mf_decomp_cps[mf_decomp[mid][1]]; }
        if (mf_decomp[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t mf_compose_pair(uint32_t a, uint32_t b) {
    if (a >= MF_LBASE && a < MF_LBASE + MF_LCOUNT && b >= MF_VBASE && b < MF_VBASE + MF_VCOUNT)
        return MF_SBASE + ((a - MF_LBASE) * MF_VCOUNT + (b - MF_VBASE)) * MF_TCOUNT;
    if (a >= MF_SBASE && a < MF_SBASE + MF_SCOUNT && (a - MF_SBASE) % MF_TCOUNT == 0 && b > MF_TBASE &&
        b < MF_TBASE + MF_TCOUNT)
        return a + (b - MF_TBASE);
    if ((a | b) & MF_RAW) return 0;
    size_t lo = 0, hi = sizeof mf_compose / sizeof mf_compose[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *r = mf_compose[mid];
        if (r[0] == a && r[1] == b) return r[2];
        if (r[0] < a || (r[0] == a && r[1] < b)) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

/* Next code point of s[0..n) (MF_RAW | byte for an invalid byte). */
static uint32_t mf_next_cp(const unsigned char *s, size_t n, size_t *k) {
    size_t v = mf_utf8_valid_len(s, n < 4 ? n : 4);
    unsigned c = s[0];
    size_t want = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (v == 0 || want > v) { *k = 1; return MF_RAW | c; }
    *k = want;
    if (want == 1) return c;
    if (want == 2) return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
    if (want == 3) return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

static size_t mf_put_cp(char *o, uint32_t cp) {
    if (cp & MF_RAW) { o[0] = (char)(cp & 0xff); return 1; }
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int mf_reserve(char **out, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    char *p = realloc(*out, need);
    if (!p) return -1;
    *out = p;
    *cap = need;
    return 0;
}

size_t mf_nfc(const char *s, size_t n, char **out, size_t *cap) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    /* below U+0300 nothing decomposes, combines or reorders */
    while (i < n && (u[i] < 0xC0 || (u[i] < 0xCC && u[i] >= 0xC2))) i++;
    if (i == n) {
        if (mf_reserve(out, cap, n + 1)) return (size_t)-1;
        memcpy(*out, s, n);
        return n;
    }
    /* decompose everything into a code point array (at most 4 per byte: the
     * longest canonical decomposition is 4 code points, of a 2+ byte char) */
    uint32_t *d = malloc((2 * n + 4) * sizeof *d);
    if (!d) return (size_t)-1;
    size_t m = 0, dcap = 2 * n + 4;
    for (size_t j = 0; j < n;) {
        size_t k;
        uint32_t cp = mf_next_cp(u + j, n - j, &k);
        j += k;
        if (m + 4 > dcap) {
            uint32_t *nd = realloc(d, (dcap *= 2) * sizeof *nd);
            if (!nd) { free(d); return (size_t)-1; }
            d = nd;
        }
        int dn;
        const uint32_t *dec;
        if (cp >= MF_SBASE && cp < MF_SBASE + MF_SCOUNT) {
            uint32_t si = cp - MF_SBASE;
            d[m++] = MF_LBASE + si / MF_NCOUNT;
            d[m++] = MF_VBASE + (si % MF_NCOUNT) / MF_TCOUNT;
            if (si % MF_TCOUNT) d[m++] = MF_TBASE + si % MF_TCOUNT;
        } else if (!(cp & MF_RAW) && cp >= 0xC0 && (dec = mf_decomp_of(cp, &dn))) {
            for (int q = 0; q < dn; q++) d[m++] = dec[q];
        } else {
            d[m++] = cp;
        }
    }
    /* canonical ordering: stable sort of each run of non-starters by class */
    for (size_t j = 1; j < m; j++) {
        int c = mf_ccc_of(d[j]);
        if (c == 0) continue;
        size_t q = j;
        while (q > 0 && mf_ccc_of(d[q - 1]) > c) {
            uint32_t t = d[q];
            d[q] = d[q - 1];
            d[q - 1] = t;
            q--;
        }
    }
    /* canonical composition (UAX #15's reference algorithm) */
    size_t w = m ? 1 : 0, starter = 0;
    int last = m ? mf_ccc_of(d[0]) : 0;
    if (last != 0) last = 256; /* text starting with a non-starter: nothing to compose onto */
    for (size_t j = 1; j < m; j++) {
        uint32_t ch = d[j];
        int c = mf_ccc_of(ch);
        uint32_t comp = mf_compose_pair(d[starter], ch);
        if (comp && (last < c || last == 0)) {
            d[starter] = comp;
        } else {
            if (c == 0) starter = w;
            last = c;
            d[w++] = ch;
        }
    }
    if (mf_reserve(out, cap, 4 * w + 1)) { free(d); return (size_t)-1; }
    size_t o = 0;
    for (size_t j = 0; j < w; j++) o += mf_put_cp(*out + o, d[j]);
    free(d);
    return o;
}
