/* mf_st_open refuses every kind of malformed file with one specific line
 * naming the file, never crashes on random header damage (mini-fuzzer),
 * and failed writes leave the destination as it was and no temp files. */
#include "io/io.h"
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[] = "/tmp/mf_st_bad_XXXXXX";

static int write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(buf, 1, n, fp) : 0;
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

/* A file whose 8-byte length field says `hlen`, followed by `json` and
 * `data_bytes` bytes of data. */
static void write_st(const char *path, uint64_t hlen, const char *json, size_t data_bytes) {
    size_t jn = strlen(json);
    size_t n = 8 + jn + data_bytes;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, json, jn);
    if (write_bytes(path, b, n) != 0) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    free(b);
}

static int read_all(const char *path, unsigned char **out, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    *out = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(*out, 1, (size_t)sz, fp);
    fclose(fp);
    return *n == (size_t)sz ? 0 : -1;
}

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

static void expect_reject_at(int line, const char *label, const char *path, const char *want) {
    mf_st_file f;
    memset(&f, 0x5A, sizeof f); /* garbage in: open must not trust it */
    int rc = mf_st_open(&f, path);
    const char *m = mf_error();
    if (getenv("MF_TEST_VERBOSE")) printf("%-40s %s\n", label, m);
    if (rc != -1) {
        mf_test_failures++;
        fprintf(stderr, "line %d: %s: open succeeded\n", line, label);
        mf_st_close(&f);
        return;
    }
    CHECK(f.map == NULL && f.tensors == NULL && f.n == 0 && f.n_meta == 0, "%s: struct zeroed after failure", label);
    mf_st_close(&f); /* must be safe after a failed open */
    CHECK(strchr(m, '\n') == NULL, "%s: message has a newline: %s", label, m);
    CHECK(strstr(m, path) != NULL, "%s: message does not name the file: %s", label, m);
    if (!strstr(m, want)) {
        mf_test_failures++;
        fprintf(stderr, "line %d: %s: message lacks '%s': %s\n", line, label, want, m);
    }
}
#define expect_reject(label, path, want) expect_reject_at(__LINE__, label, path, want)

/* Header text padded with spaces as a writer would; data_bytes of data. */
static void reject_json(const char *label, const char *json, size_t data_bytes, const char *want) {
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", g_dir);
    write_st(path, strlen(json), json, data_bytes);
    expect_reject(label, path, want);
    unlink(path);
}

static void test_corruptions(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", g_dir);

    /* Framing: too short, empty, length field lies. */
    write_bytes(path, "\x10\x00\x00", 3);
    expect_reject("truncated file", path, "too short");
    write_bytes(path, "", 0);
    expect_reject("empty file", path, "too short");
    write_st(path, 0, "{}      ", 0);
    expect_reject("header length 0", path, "header length is 0");
    write_st(path, 4096, "{}      ", 16);
    expect_reject("header length larger than file", path, "larger than the file");
    write_st(path, UINT64_MAX, "{}      ", 16);
    expect_reject("absurd header length", path, "100 MiB limit");
    write_st(path, (uint64_t)1 << 62, "{}      ", 16);
    expect_reject("huge header length", path, "100 MiB limit");
    {
        /* the JSON is cut short by the length field */
        const char *j = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
        write_st(path, 20, j, 4);
        expect_reject("length cuts the JSON", path, "not valid JSON");
    }
    unlink(path);
    expect_reject("missing file", path, "cannot open");
    expect_reject("directory", g_dir, "not a regular file");

    /* JSON syntax and shape of the header. */
    reject_json("invalid JSON", "{\"a\": {\"dtype\": \"F32\",,}}    ", 0, "not valid JSON");
    reject_json("not an object", "[1, 2, 3]       ", 0, "not a JSON object");
    reject_json("string header", "\"hello\"         ", 0, "not a JSON object");
    reject_json("leading space", "  {}    ", 0, "not a JSON object");
    reject_json("trailing garbage", "{} {}   ", 0, "after the JSON object");
    reject_json("trailing control byte", "{}\x01     ", 0, "after the JSON object");
    reject_json("entry not an object", "{\"a\": 5}", 0, "tensor 'a' entry is not an object");

    /* dtype */
    reject_json("unknown dtype",
                "{\"w\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unsupported dtype 'F99'");
    reject_json("unsupported dtype F64",
                "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "unsupported dtype 'F64'");
    reject_json("dtype not a string",
                "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is 4, not a string");

    /* shape */
    reject_json("negative shape",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,0]}}", 0, "shape[0] is -2");
    reject_json("float shape",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", 10, "shape[0] is 2.5");
    reject_json("integral float shape 1.0",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "number '1.0'");
    reject_json("exponent shape 1e0",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, "number '1e0'");
    reject_json("leading zero",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "number '01'");
    reject_json("negative zero",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, "number '-0'");
    reject_json("huge shape value",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "shape[0] is 1");
    reject_json("shape not an array",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "shape is 4, not an array");
    reject_json("shape element a string",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", 16, "shape[0] is a string");
    reject_json("too many dims",
                "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "more than 4 dimensions");
    reject_json("shape product overflows",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, "too large");

    /* data_offsets */
    reject_json("shape/offset mismatch",
                "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[10,20],\"data_offsets\":[0,100]}}", 800,
                "tensor 'wte.weight' data_offsets [0, 100] do not match F32 shape [10, 20] (800 bytes)");
    reject_json("offsets beyond data",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16, "extend past the data section (16 bytes)");
    reject_json("begin after end",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16, "begin after end");
    reject_json("offsets not integers",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", 8, "data_offsets must be");
    reject_json("offsets strings",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 8, "data_offsets must be");
    reject_json("offsets three elements",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets must be");
    reject_json("offsets one element",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 8, "data_offsets must be");
    reject_json("overlapping tensors",
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 24,
                "tensors 'a' [0, 16] and 'b' [12, 20] overlap");
    reject_json("tensor inside another",
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[32],\"data_offsets\":[0,32]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]},"
                "\"c\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[20,24]}}", 32, "overlap");

    /* names and fields */
    reject_json("duplicate names",
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate tensor name 'a'");
    reject_json("names equal after \\u0000",
                "{\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\\u0000");
    reject_json("missing dtype",
                "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w' has no 'dtype'");
    reject_json("missing shape",
                "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w' has no 'shape'");
    reject_json("missing data_offsets",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w' has no 'data_offsets'");
    reject_json("two dtype fields",
                "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "two 'dtype' fields");
    reject_json("newline in a name is escaped in the message",
                "{\"a\\nb\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a\\x0Ab'");
    reject_json("raw control character in a string",
                "{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "control character");
    reject_json("invalid UTF-8 name",
                "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "invalid UTF-8");

    /* __metadata__ */
    reject_json("metadata not string values",
                "{\"__metadata__\":{\"k\":5},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                "__metadata__ value for 'k' is not a string");
    reject_json("metadata not an object", "{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is not an object");
    reject_json("metadata duplicate keys", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate key 'k'");
    reject_json("two metadata entries", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "two __metadata__");
}

static int is_dup_or_overlap(const mf_st_file *f) {
    for (int i = 0; i < f->n; i++)
        for (int j = i + 1; j < f->n; j++) {
            const mf_st_tensor *a = &f->tensors[i], *b = &f->tensors[j];
            if (strcmp(a->name, b->name) == 0) return 1;
            const uint8_t *a0 = a->data, *b0 = b->data;
            if (a->nbytes && b->nbytes && a0 < b0 + b->nbytes && b0 < a0 + a->nbytes) return 1;
        }
    return 0;
}

/* Random damage to a valid file's framing and header: open must either
 * fail with one line or succeed with a header that honours every promise. */
static void test_fuzz(void) {
    char path[256], fz[256];
    snprintf(path, sizeof path, "%s/valid.safetensors", g_dir);
    snprintf(fz, sizeof fz, "%s/fuzz.safetensors", g_dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {1, 2, 3};
    uint8_t c[5] = {9, 8, 7, 6, 5};
    int64_t d[2] = {-1, 1};
    const mf_st_entry e[] = {
        {"layer.0.w", MF_DTYPE_F32, 2, {2, 3}, a, sizeof a, NULL, NULL},
        {"layer.0.b", MF_DTYPE_BF16, 1, {3}, b, sizeof b, NULL, NULL},
        {"bytes", MF_DTYPE_U8, 1, {5}, c, sizeof c, NULL, NULL},
        {"s", MF_DTYPE_I64, 1, {2}, d, sizeof d, NULL, NULL},
        {"scalar", MF_DTYPE_F32, 0, {0}, a, 4, NULL, NULL},
        {"empty", MF_DTYPE_F16, 2, {3, 0}, NULL, 0, NULL, NULL},
    };
    const char *mk[] = {"format", "k"}, *mv[] = {"pt", "v"};
    CHECK(mf_st_write(path, e, 6, mk, mv, 2) == 0, "fuzz seed write: %s", mf_error());
    unsigned char *orig;
    size_t n;
    if (read_all(path, &orig, &n) != 0) { CHECK(0, "read seed"); return; }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | orig[i];
    size_t hend = 8 + (size_t)hlen;
    static const unsigned char interesting[] = "{}[]\":,-.0123456789eE \\ufx\x00\xff\x80\n";
    unsigned char *buf = malloc(n);
    mf_rng rng;
    mf_rng_seed(&rng, 12345);
    int ok = 0, bad = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, orig, n);
        size_t len = n;
        int kind = (int)(mf_rng_u32(&rng) % 6);
        int muts = kind == 3 ? 2 + (int)(mf_rng_u32(&rng) % 3) : 1;
        for (int k = 0; k < muts; k++) {
            size_t pos = mf_rng_u32(&rng) % hend;
            if (kind == 0) buf[pos] = (unsigned char)mf_rng_u32(&rng);
            else if (kind == 1 || kind == 3)
                buf[pos] = interesting[mf_rng_u32(&rng) % (sizeof interesting - 1)];
            else if (kind == 2) len = mf_rng_u32(&rng) % n;
            else if (kind == 4) buf[mf_rng_u32(&rng) % 8] = (unsigned char)mf_rng_u32(&rng);
            else { /* digit change: offsets and shapes drift */
                size_t p2 = pos;
                while (p2 < hend && (buf[p2] < '0' || buf[p2] > '9')) p2++;
                if (p2 < hend) buf[p2] = (unsigned char)('0' + mf_rng_u32(&rng) % 10);
            }
        }
        if (write_bytes(fz, buf, len) != 0) { CHECK(0, "write fuzz file"); break; }
        mf_st_file f;
        if (mf_st_open(&f, fz) == 0) {
            ok++;
            const uint8_t *m = f.map;
            uint64_t h = 0;
            for (int i = 7; i >= 0; i--) h = h << 8 | m[i];
            for (int i = 0; i < f.n; i++) {
                const mf_st_tensor *t = &f.tensors[i];
                int64_t numel = 1;
                CHECK(t->name != NULL, "iter %d: NULL name", it);
                CHECK(t->ndim >= 0 && t->ndim <= MF_MAX_DIMS, "iter %d: ndim %d", it, t->ndim);
                for (int dd = 0; dd < t->ndim; dd++) {
                    CHECK(t->shape[dd] >= 0, "iter %d: negative dim", it);
                    numel *= t->shape[dd];
                }
                CHECK(t->nbytes == (size_t)numel * mf_dtype_size(t->dtype), "iter %d: %s nbytes", it, t->name);
                const uint8_t *p = t->data;
                CHECK(p >= m + 8 + h && p + t->nbytes <= m + f.map_size, "iter %d: %s outside data", it, t->name);
                CHECK(mf_st_find(&f, t->name) == t, "iter %d: find %s", it, t->name);
                /* touch every byte so ASan would see a bad range */
                volatile unsigned sum = 0;
                for (size_t q = 0; q < t->nbytes; q++) sum += p[q];
                (void)sum;
            }
            CHECK(!is_dup_or_overlap(&f), "iter %d: duplicate or overlap accepted", it);
            for (int i = 0; i < f.n_meta; i++) CHECK(f.meta_keys[i] && f.meta_vals[i], "iter %d: NULL meta", it);
            mf_st_close(&f);
        } else {
            bad++;
            const char *m = mf_error();
            CHECK(*m && strchr(m, '\n') == NULL, "iter %d: bad message '%s'", it, m);
            CHECK(f.map == NULL && f.n == 0, "iter %d: struct not zeroed", it);
        }
    }
    printf("fuzz: %d accepted, %d rejected\n", ok, bad);
    CHECK(bad > 1000, "most mutations should be rejected (%d)", bad);
    CHECK(ok > 10, "some mutations (inside strings or padding) should be accepted (%d)", ok);
    free(buf);
    free(orig);
    unlink(fz);
    unlink(path);
}

static int file_equals(const char *path, const unsigned char *want, size_t n) {
    unsigned char *got;
    size_t gn;
    if (read_all(path, &got, &gn) != 0) return 0;
    int eq = gn == n && memcmp(got, want, n) == 0;
    free(got);
    return eq;
}

static void test_failed_writes(void) {
    char path[256], nodir[256];
    snprintf(path, sizeof path, "%s/keep.safetensors", g_dir);
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", g_dir);
    float a[4] = {1, 2, 3, 4};
    mf_st_entry good = {"a", MF_DTYPE_F32, 1, {4}, a, sizeof a, NULL, NULL};
    int before = count_entries(g_dir);

    /* Destination directory missing: fails at the temp file, nothing left. */
    CHECK(mf_st_write(nodir, &good, 1, NULL, NULL, 0) == -1, "write into a missing directory succeeded");
    CHECK(strstr(mf_error(), "cannot write") && strstr(mf_error(), "No such file"), "message: %s", mf_error());
    CHECK(count_entries(g_dir) == before, "entries left behind");

    CHECK(mf_st_write(path, &good, 1, NULL, NULL, 0) == 0, "write: %s", mf_error());
    unsigned char *old;
    size_t oldn;
    CHECK(read_all(path, &old, &oldn) == 0, "read back");
    before = count_entries(g_dir);

    /* Invalid entries: refused before anything touches the disk. */
    struct { mf_st_entry e[2]; int n; const char *mk[2], *mv[2]; int nm; const char *want; } cases[] = {
        {{{"a", MF_DTYPE_F32, 1, {4}, a, 12, NULL, NULL}}, 1, {0}, {0}, 0, "has 12 bytes but F32 shape [4] needs 16"},
        {{{"a", MF_DTYPE_F32, 1, {2}, a, 8, NULL, NULL}, {"a", MF_DTYPE_F32, 1, {2}, a, 8, NULL, NULL}}, 2, {0}, {0}, 0, "duplicate tensor name 'a'"},
        {{{"a", MF_DTYPE_F32, 1, {-4}, a, 16, NULL, NULL}}, 1, {0}, {0}, 0, "negative"},
        {{{"a", MF_DTYPE_F32, 5, {1, 1, 1, 1}, a, 4, NULL, NULL}}, 1, {0}, {0}, 0, "dimensions"},
        {{{"a", MF_DTYPE_COUNT, 1, {4}, a, 16, NULL, NULL}}, 1, {0}, {0}, 0, "invalid dtype"},
        {{{"__metadata__", MF_DTYPE_F32, 1, {4}, a, 16, NULL, NULL}}, 1, {0}, {0}, 0, "reserved"},
        {{{NULL, MF_DTYPE_F32, 1, {4}, a, 16, NULL, NULL}}, 1, {0}, {0}, 0, "no name"},
        {{{"a", MF_DTYPE_F32, 1, {4}, NULL, 16, NULL, NULL}}, 1, {0}, {0}, 0, "no data"},
        {{{"a\xc3", MF_DTYPE_F32, 1, {4}, a, 16, NULL, NULL}}, 1, {0}, {0}, 0, "not valid UTF-8"},
        {{{"a", MF_DTYPE_F32, 1, {4}, a, 16, NULL, NULL}}, 1, {"k", "k"}, {"1", "2"}, 2, "duplicate metadata key 'k'"},
        {{{"a", MF_DTYPE_F32, 1, {4}, a, 16, NULL, NULL}}, 1, {"k", NULL}, {"1", "2"}, 2, "metadata entry 1 is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = mf_st_write(path, cases[i].e, cases[i].n, cases[i].mk, cases[i].mv, cases[i].nm);
        CHECK(rc == -1, "case %zu: invalid write succeeded", i);
        if (getenv("MF_TEST_VERBOSE")) printf("write case %-29zu %s\n", i, mf_error());
        CHECK(strstr(mf_error(), cases[i].want) && !strchr(mf_error(), '\n'), "case %zu: message: %s", i, mf_error());
        CHECK(file_equals(path, old, oldn), "case %zu: old file changed", i);
        CHECK(count_entries(g_dir) == before, "case %zu: temp file left", i);
    }

    /* A write that fails midway (file size limit) through the atomic path:
     * the old file stays byte-identical and the temp file is removed. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0) {
        struct rlimit small = rl;
        small.rlim_cur = 4096;
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        size_t big_n = 1 << 20;
        uint8_t *big = calloc(1, big_n);
        mf_st_entry be = {"big", MF_DTYPE_U8, 1, {(int64_t)big_n}, big, big_n, NULL, NULL};
        if (setrlimit(RLIMIT_FSIZE, &small) == 0) {
            int rc = mf_st_write(path, &be, 1, NULL, NULL, 0);
            setrlimit(RLIMIT_FSIZE, &rl);
            if (getenv("MF_TEST_VERBOSE")) printf("%-40s %s\n", "write past RLIMIT_FSIZE", mf_error());
            CHECK(rc == -1, "write past RLIMIT_FSIZE succeeded");
            CHECK(strstr(mf_error(), "cannot write") && !strchr(mf_error(), '\n'), "message: %s", mf_error());
            CHECK(file_equals(path, old, oldn), "old file changed by a failed write");
            CHECK(count_entries(g_dir) == before, "temp file left after a failed write");
        }
        signal(SIGXFSZ, prev);
        free(big);
    }
    free(old);

    /* Atomic helpers directly: abort leaves nothing; commit onto a
     * directory fails and removes the temp file. */
    mf_atomic_file af;
    memset(&af, 0, sizeof af);
    mf_atomic_abort(&af); /* zeroed struct: harmless */
    char p2[256];
    snprintf(p2, sizeof p2, "%s/aborted.bin", g_dir);
    CHECK(mf_atomic_open(&af, p2) == 0, "atomic open: %s", mf_error());
    fputs("partial", af.fp);
    mf_atomic_abort(&af);
    CHECK(access(p2, F_OK) != 0 && count_entries(g_dir) == before, "abort left files");
    snprintf(p2, sizeof p2, "%s/subdir", g_dir);
    mkdir(p2, 0700);
    CHECK(mf_atomic_open(&af, p2) == 0, "atomic open: %s", mf_error());
    fputs("x", af.fp);
    CHECK(mf_atomic_commit(&af) == -1, "commit over a directory succeeded");
    CHECK(strstr(mf_error(), "cannot write") && strstr(mf_error(), p2), "message: %s", mf_error());
    CHECK(count_entries(g_dir) == before + 1, "temp file left after failed commit");
    rmdir(p2);
    unlink(path);
}

int main(void) {
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    test_corruptions();
    test_fuzz();
    test_failed_writes();
    CHECK(count_entries(g_dir) == 0, "test left %d files in %s", count_entries(g_dir), g_dir);
    rmdir(g_dir);
    return mf_test_done("test_safetensors_rejects_corrupt");
}
