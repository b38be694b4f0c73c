/* Writing tensors of every dtype and shape kind (scalar, empty, 1-4 dims)
 * plus metadata, then reading them back, gives the same names, dtypes,
 * shapes, bytes and metadata; the file layout follows the format (8-byte
 * aligned data section, space-padded header, contiguous data). */
#include "io/io.h"
#include "testutil.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

int main(void) {
    char dir[] = "/tmp/mf_st_rt_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);

    float f32[2 * 3];
    uint16_t bf16[5], f16[4 * 1 * 2 * 3], u16[3];
    int32_t i32[7];
    uint8_t u8[3];
    int64_t i64[2 * 2];
    float scalar = 3.25f;
    for (int i = 0; i < 6; i++) f32[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 5; i++) bf16[i] = (uint16_t)(0x3F80 + i);
    for (int i = 0; i < 24; i++) f16[i] = (uint16_t)(0x3C00 + 7 * i);
    for (int i = 0; i < 3; i++) u16[i] = (uint16_t)(60000 + i);
    for (int i = 0; i < 7; i++) i32[i] = -1000 * i;
    for (int i = 0; i < 3; i++) u8[i] = (uint8_t)(250 + i);
    for (int i = 0; i < 4; i++) i64[i] = (int64_t)1 << (40 + i);

    /* u8 of 3 bytes first so later tensors start at odd offsets: the
     * writer must not reorder or pad. */
    const mf_st_entry e[] = {
        {"tok.u8", MF_DTYPE_U8, 1, {3}, u8, sizeof u8, NULL, NULL},
        {"w.f32", MF_DTYPE_F32, 2, {2, 3}, f32, sizeof f32, NULL, NULL},
        {"b.bf16", MF_DTYPE_BF16, 1, {5}, bf16, sizeof bf16, NULL, NULL},
        {"h.f16.4d", MF_DTYPE_F16, 4, {4, 1, 2, 3}, f16, sizeof f16, NULL, NULL},
        {"scalar", MF_DTYPE_F32, 0, {0}, &scalar, sizeof scalar, NULL, NULL},
        {"empty", MF_DTYPE_F32, 2, {0, 5}, NULL, 0, NULL, NULL},
        {"idx.i32", MF_DTYPE_I32, 1, {7}, i32, sizeof i32, NULL, NULL},
        {"u16", MF_DTYPE_U16, 1, {3}, u16, sizeof u16, NULL, NULL},
        {"pos.i64", MF_DTYPE_I64, 2, {2, 2}, i64, sizeof i64, NULL, NULL},
        {"name with \"quotes\" \\ and \xc3\xa9", MF_DTYPE_U8, 1, {1}, u8, 1, NULL, NULL},
    };
    const int n = (int)(sizeof e / sizeof e[0]);
    const char *mk[] = {"format", "step", "note"};
    const char *mv[] = {"pt", "1200", "line1\nline2 \"q\" \xe2\x82\xac"};

    CHECK(mf_st_write(path, e, n, mk, mv, 3) == 0, "write: %s", mf_error());
    CHECK(count_entries(dir) == 1, "only the destination remains, no temp file (%d entries)", count_entries(dir));

    mf_st_file f;
    CHECK(mf_st_open(&f, path) == 0, "open: %s", mf_error());
    CHECK(f.n == n, "tensor count %d", f.n);
    for (int i = 0; i < n && i < f.n; i++) {
        const mf_st_tensor *t = &f.tensors[i];
        CHECK(strcmp(t->name, e[i].name) == 0, "order/name %d: %s", i, t->name);
        CHECK(mf_st_find(&f, e[i].name) == t, "find %s", e[i].name);
        CHECK(t->dtype == e[i].dtype, "%s dtype", e[i].name);
        CHECK(t->ndim == e[i].ndim, "%s ndim %d", e[i].name, t->ndim);
        for (int d = 0; d < e[i].ndim && d < t->ndim; d++)
            CHECK(t->shape[d] == e[i].shape[d], "%s shape[%d]", e[i].name, d);
        CHECK(t->nbytes == e[i].nbytes, "%s nbytes %zu", e[i].name, t->nbytes);
        if (t->nbytes == e[i].nbytes && t->nbytes)
            CHECK(memcmp(t->data, e[i].data, t->nbytes) == 0, "%s bytes differ", e[i].name);
        /* data stays inside the map's data section */
        const uint8_t *base = f.map;
        CHECK((const uint8_t *)t->data >= base + 8 && (const uint8_t *)t->data + t->nbytes <= base + f.map_size,
              "%s data outside the map", e[i].name);
    }
    CHECK(mf_st_find(&f, "missing") == NULL, "find of a missing name");
    CHECK(f.n_meta == 3, "n_meta %d", f.n_meta);
    for (int i = 0; i < 3; i++) {
        const char *v = mf_st_meta(&f, mk[i]);
        CHECK(v && strcmp(v, mv[i]) == 0, "meta %s = %s", mk[i], v ? v : "(null)");
    }
    CHECK(mf_st_meta(&f, "absent") == NULL, "absent meta");

    /* Layout: header length multiple of 8, space padded, data contiguous. */
    const uint8_t *m = f.map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | m[i];
    CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    CHECK(m[8] == '{', "header starts with {");
    size_t last = 8 + (size_t)hlen - 1;
    while (last > 8 && m[last] == ' ') last--;
    CHECK(m[last] == '}', "header padded with spaces only");
    size_t total = 0;
    for (int i = 0; i < n; i++) total += e[i].nbytes;
    CHECK(f.map_size == 8 + hlen + total, "file size %zu", f.map_size);
    size_t off = 0;
    for (int i = 0; i < n && i < f.n; i++) {
        CHECK((const uint8_t *)f.tensors[i].data == m + 8 + hlen + off, "%s contiguous", e[i].name);
        off += e[i].nbytes;
    }
    mf_st_close(&f);
    CHECK(f.map == NULL && f.tensors == NULL && f.n == 0, "close zeroes the struct");
    mf_st_close(&f); /* twice is harmless */

    /* No tensors, no metadata: "{}" padded to 8 bytes. */
    CHECK(mf_st_write(path, NULL, 0, NULL, NULL, 0) == 0, "empty write: %s", mf_error());
    CHECK(mf_st_open(&f, path) == 0, "open empty: %s", mf_error());
    CHECK(f.n == 0 && f.n_meta == 0 && f.map_size == 16, "empty file: n=%d size=%zu", f.n, f.map_size);
    mf_st_close(&f);

    /* Overwrite with different content replaces the file atomically. */
    CHECK(mf_st_write(path, e + 1, 1, NULL, NULL, 0) == 0, "overwrite: %s", mf_error());
    CHECK(mf_st_open(&f, path) == 0, "open overwritten: %s", mf_error());
    CHECK(f.n == 1 && mf_st_find(&f, "w.f32") && f.n_meta == 0, "overwritten content");
    mf_st_close(&f);
    CHECK(count_entries(dir) == 1, "no temp files after overwrite");

    unlink(path);
    rmdir(dir);
    return mf_test_done("test_safetensors_roundtrip");
}
