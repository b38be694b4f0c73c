/* Per-tensor checksums and finite values in safetensors files:
 *  - the writer records XXH3-64 of each tensor's bytes (checked here against
 *    libxxhash called directly on the bytes, and on the raw header text);
 *  - a flipped data byte is refused by tensor name, the other tensors load;
 *  - NaN / Inf in F32, BF16 and F16 tensors are refused by name and element,
 *    with or without checksums;
 *  - files without checksums (other tools') load; a malformed checksum or
 *    one for a tensor the file lacks is refused at open;
 *  - streaming hands the sink exactly the tensor's bytes, piece by piece
 *    (a tensor over the 4 MiB piece size), and copies stale checksums from
 *    another file's metadata never reach a new file. */
#include "io/io.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static char dir[] = "/tmp/memfit-sum-XXXXXX";

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

/* offset of the data section and the raw header of a file */
static size_t read_file(const char *p, unsigned char **buf) {
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(n + 1);
    size_t got = fread(*buf, 1, n, f);
    fclose(f);
    (*buf)[got] = 0;
    return got;
}

static void write_file(const char *p, const unsigned char *buf, size_t n) {
    FILE *f = fopen(p, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

static size_t data_start(const unsigned char *buf) {
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)buf[i] << (8 * i);
    return 8 + (size_t)h;
}

typedef struct { unsigned char *dst; size_t calls; } sink_ctx;
static void sink(void *ctx, size_t off, const void *src, size_t len) {
    sink_ctx *c = ctx;
    memcpy(c->dst + off, src, len);
    c->calls++;
}

/* A hand-made file with no checksums (as other tools write them): one F32
 * tensor "w" of 4 elements. */
static void write_foreign(const char *p, const float *w, const char *meta) {
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{%s\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", meta);
    while (n % 8) hdr[n++] = ' ';
    unsigned char buf[512];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, (size_t)n);
    memcpy(buf + 8 + n, w, 16);
    write_file(p, buf, 8 + (size_t)n + 16);
}

int main(void) {
    if (!mkdtemp(dir)) { fprintf(stderr, "mkdtemp failed\n"); return 1; }
    char p[512], q[512];
    path_of(p, sizeof p, "a.safetensors");

    /* a: F32 (5 MiB: two pieces), BF16, U8; with metadata that includes a
     * stale checksum key copied from "another file" */
    size_t nbig = (5u << 20) / 4;
    float *big = malloc(nbig * sizeof *big);
    for (size_t i = 0; i < nbig; i++) big[i] = (float)(i % 1000) * 0.001f - 0.5f;
    uint16_t h16[6] = {0x3F80, 0xBF80, 0x0000, 0x4000, 0x3E80, 0x7F7F};  /* bf16 1, -1, 0, 2, 0.25, max */
    uint8_t u8[3] = {0xFF, 0x80, 0x00};  /* U8: no values are "non-finite" */
    mf_st_entry e[3] = {
        {.name = "big", .dtype = MF_DTYPE_F32, .ndim = 1, .shape = {(int64_t)nbig}, .data = big, .nbytes = nbig * 4},
        {.name = "h", .dtype = MF_DTYPE_BF16, .ndim = 2, .shape = {2, 3}, .data = h16, .nbytes = sizeof h16},
        {.name = "u", .dtype = MF_DTYPE_U8, .ndim = 1, .shape = {3}, .data = u8, .nbytes = 3},
    };
    const char *mk[] = {"format", "xxh3_64:big"}, *mv[] = {"test", "0123456789abcdef"};
    CHECK(mf_st_write(p, e, 3, mk, mv, 2) == 0, "%s", mf_error());

    mf_st_file f;
    CHECK(mf_st_open(&f, p) == 0, "%s", mf_error());
    CHECK(f.n_meta == 1 && strcmp(mf_st_meta(&f, "format"), "test") == 0, "checksums are not in the metadata callers see");
    for (int i = 0; i < 3; i++) {
        const mf_st_tensor *t = mf_st_find(&f, e[i].name);
        uint64_t want = XXH3_64bits(e[i].data, e[i].nbytes);  /* the library, on the bytes we gave */
        CHECK(t && t->has_sum && t->sum == want, "%s: sum %016llx, XXH3_64bits %016llx", e[i].name,
              t ? (unsigned long long)t->sum : 0ull, (unsigned long long)want);
    }
    CHECK(mf_st_verify_all(&f) == 0, "%s", mf_error());
    /* the sink gets every byte, in pieces */
    unsigned char *copy = calloc(1, nbig * 4);
    sink_ctx c = {copy, 0};
    CHECK(mf_st_stream(&f, mf_st_find(&f, "big"), sink, &c) == 0 && c.calls == 2 && memcmp(copy, big, nbig * 4) == 0,
          "stream: %zu pieces", c.calls);
    mf_st_close(&f);

    /* the header text itself holds the sums (what other readers would see) */
    unsigned char *raw;
    size_t nraw = read_file(p, &raw);
    char want[64];
    snprintf(want, sizeof want, "\"xxh3_64:h\":\"%016llx\"", (unsigned long long)XXH3_64bits(h16, sizeof h16));
    size_t ds = data_start(raw);
    CHECK(ds < nraw && strstr((char *)raw + 8, want) != NULL, "header lacks %s", want);
    CHECK(strstr((char *)raw + 8, "0123456789abcdef") == NULL, "a stale checksum from the caller's metadata was written");

    /* a flipped byte in "h": refused by name; "big" and "u" still verify */
    path_of(q, sizeof q, "flip.safetensors");
    unsigned char *mod = malloc(nraw);
    memcpy(mod, raw, nraw);
    mod[ds + nbig * 4 + 1] ^= 0x01;  /* h starts right after big: 0x3F80 -> 0x3E80, still finite */
    write_file(q, mod, nraw);
    CHECK(mf_st_open(&f, q) == 0, "%s", mf_error());
    CHECK(mf_st_stream(&f, mf_st_find(&f, "h"), NULL, NULL) < 0 && strstr(mf_error(), "tensor 'h' is corrupt"),
          "flipped byte: %s", mf_error());
    CHECK(mf_st_stream(&f, mf_st_find(&f, "big"), NULL, NULL) == 0 && mf_st_stream(&f, mf_st_find(&f, "u"), NULL, NULL) == 0,
          "untouched tensors: %s", mf_error());
    CHECK(mf_st_verify_all(&f) < 0 && strstr(mf_error(), "'h'"), "verify_all: %s", mf_error());
    mf_st_close(&f);
    /* a flipped byte in the U8 tensor (no finite check applies): the checksum alone catches it */
    memcpy(mod, raw, nraw);
    mod[ds + nbig * 4 + sizeof h16 + 2] ^= 0x40;
    write_file(q, mod, nraw);
    CHECK(mf_st_open(&f, q) == 0 && mf_st_verify_all(&f) < 0 && strstr(mf_error(), "tensor 'u' is corrupt"), "%s", mf_error());
    mf_st_close(&f);

    /* non-finite values written by memfit itself (valid checksums): refused by name and element */
    big[123456] = NAN;
    CHECK(mf_st_write(p, e, 1, NULL, NULL, 0) == 0, "%s", mf_error());
    CHECK(mf_st_open(&f, p) == 0, "%s", mf_error());
    CHECK(mf_st_verify_all(&f) < 0 && strstr(mf_error(), "tensor 'big' holds a non-finite value (NaN) at element 123456"),
          "NaN: %s", mf_error());
    mf_st_close(&f);
    big[123456] = 0.0f;
    big[nbig - 1] = -INFINITY;  /* in the second piece */
    CHECK(mf_st_write(p, e, 1, NULL, NULL, 0) == 0 && mf_st_open(&f, p) == 0, "%s", mf_error());
    CHECK(mf_st_verify_all(&f) < 0 && strstr(mf_error(), "(Inf) at element 1310719"), "Inf: %s", mf_error());
    mf_st_close(&f);
    uint16_t bad16[2] = {0x3F80, 0x7FC0};  /* bf16 NaN */
    mf_st_entry eb = {.name = "b16", .dtype = MF_DTYPE_BF16, .ndim = 1, .shape = {2}, .data = bad16, .nbytes = 4};
    CHECK(mf_st_write(p, &eb, 1, NULL, NULL, 0) == 0 && mf_st_open(&f, p) == 0, "%s", mf_error());
    CHECK(mf_st_verify_all(&f) < 0 && strstr(mf_error(), "'b16' holds a non-finite value (NaN) at element 1"), "%s", mf_error());
    mf_st_close(&f);
    uint16_t badh[3] = {0x3C00, 0x0000, 0x7C00};  /* fp16 1, 0, +Inf */
    mf_st_entry eh = {.name = "f16", .dtype = MF_DTYPE_F16, .ndim = 1, .shape = {3}, .data = badh, .nbytes = 6};
    CHECK(mf_st_write(p, &eh, 1, NULL, NULL, 0) == 0 && mf_st_open(&f, p) == 0, "%s", mf_error());
    CHECK(mf_st_verify_all(&f) < 0 && strstr(mf_error(), "'f16' holds a non-finite value (Inf) at element 2"), "%s", mf_error());
    mf_st_close(&f);

    /* other tools' files: no checksums, still load; NaN still refused */
    float w[4] = {1, 2, 3, 4};
    path_of(q, sizeof q, "foreign.safetensors");
    write_foreign(q, w, "");
    CHECK(mf_st_open(&f, q) == 0 && !f.tensors[0].has_sum && mf_st_verify_all(&f) == 0, "foreign: %s", mf_error());
    mf_st_close(&f);
    w[2] = NAN;
    write_foreign(q, w, "");
    CHECK(mf_st_open(&f, q) == 0 && mf_st_verify_all(&f) < 0 && strstr(mf_error(), "'w' holds a non-finite value"), "%s", mf_error());
    mf_st_close(&f);
    w[2] = 3;
    /* malformed checksum entries are refused at open */
    write_foreign(q, w, "\"__metadata__\":{\"xxh3_64:w\":\"12345\"},");
    CHECK(mf_st_open(&f, q) < 0 && strstr(mf_error(), "checksum of tensor 'w' is not 16 hex digits"), "%s", mf_error());
    write_foreign(q, w, "\"__metadata__\":{\"xxh3_64:nope\":\"0123456789abcdef\"},");
    CHECK(mf_st_open(&f, q) < 0 && strstr(mf_error(), "checksum for tensor 'nope'"), "%s", mf_error());
    /* a right checksum written by hand verifies; a wrong one is refused */
    char meta[128];
    snprintf(meta, sizeof meta, "\"__metadata__\":{\"xxh3_64:w\":\"%016llx\"},", (unsigned long long)XXH3_64bits(w, 16));
    write_foreign(q, w, meta);
    CHECK(mf_st_open(&f, q) == 0 && f.tensors[0].has_sum && mf_st_verify_all(&f) == 0, "hand-made sum: %s", mf_error());
    mf_st_close(&f);
    w[0] = 1.5f;
    write_foreign(q, w, meta);
    CHECK(mf_st_open(&f, q) == 0 && mf_st_verify_all(&f) < 0 && strstr(mf_error(), "'w' is corrupt"), "%s", mf_error());
    mf_st_close(&f);

    free(big);
    free(copy);
    free(raw);
    free(mod);
    const char *names[] = {"a.safetensors", "flip.safetensors", "foreign.safetensors"};
    for (int i = 0; i < 3; i++) { path_of(p, sizeof p, names[i]); unlink(p); }
    rmdir(dir);
    return mf_test_done("test_safetensors_checksums");
}
