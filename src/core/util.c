/* Errors, dtypes, categories, sizes, time and RNG: the small facts every
 * module shares. */
#include "memfit/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static _Thread_local char mf_errbuf[1024];

int mf_fail(const char *fmt, ...) {
    /* format into a copy first: callers often wrap mf_error() itself */
    char tmp[sizeof mf_errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(mf_errbuf, tmp, sizeof tmp);
    return -1;
}

const char *mf_error(void) { return mf_errbuf; }

void mf_panic(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "memfit: internal error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static const struct { const char *name; size_t size; } dtypes[MF_DTYPE_COUNT] = {
    [MF_DTYPE_F32] = {"F32", 4},  [MF_DTYPE_BF16] = {"BF16", 2},
    [MF_DTYPE_F16] = {"F16", 2},  [MF_DTYPE_I32] = {"I32", 4},
    [MF_DTYPE_U16] = {"U16", 2},  [MF_DTYPE_U8] = {"U8", 1},
    [MF_DTYPE_I64] = {"I64", 8},
};

size_t mf_dtype_size(mf_dtype t) { return t < MF_DTYPE_COUNT ? dtypes[t].size : 0; }
const char *mf_dtype_name(mf_dtype t) { return t < MF_DTYPE_COUNT ? dtypes[t].name : "?"; }

int mf_dtype_parse(const char *s, mf_dtype *out) {
    for (int i = 0; i < MF_DTYPE_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) { *out = (mf_dtype)i; return 0; }
    return -1;
}

static const char *cat_names[MF_CAT_COUNT] = {
    [MF_CAT_PARAMS] = "params", [MF_CAT_MASTER] = "master", [MF_CAT_GRADS] = "grads",
    [MF_CAT_OPTIM] = "optim",   [MF_CAT_ACTS] = "acts",     [MF_CAT_WORK] = "work",
    [MF_CAT_DATA] = "data",     [MF_CAT_ADAPTER] = "adapter", [MF_CAT_QUANT] = "quant",
    [MF_CAT_COMM] = "comm",     [MF_CAT_OFFLOAD] = "offload",
    [MF_CAT_TEACHER] = "teacher",
};

const char *mf_cat_name(mf_cat c) { return c < MF_CAT_COUNT ? cat_names[c] : "?"; }

int mf_size_parse(const char *s, size_t *out) {
    if (!s || !*s) return mf_fail("empty size");
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v)) return mf_fail("bad size '%s' (expected e.g. 512MiB, 2GiB, 1000000)", s);
    while (*end == ' ') end++;
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"B", 1},
        {"k", 1024.0}, {"K", 1024.0}, {"KiB", 1024.0}, {"kB", 1e3}, {"KB", 1e3},
        {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},
        {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
        {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].u) == 0) {
            double b = v * units[i].m;
            if (b > 1.8e19) return mf_fail("size '%s' is too large", s);
            *out = (size_t)(b + 0.5);
            return 0;
        }
    }
    return mf_fail("bad size unit in '%s' (use B, KiB, MiB, GiB, TiB, kB, MB, GB)", s);
}

char *mf_size_format(size_t bytes, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) { v /= 1024.0; i++; }
    if (i == 0) snprintf(buf, n, "%zu B", bytes);
    else snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

double mf_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mf_rng_seed(mf_rng *r, uint64_t seed) {
    /* splitmix64 scramble so nearby seeds give unrelated streams; never 0 */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x853c49e6748fea9bull;
}

uint32_t mf_rng_u32(mf_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}

float mf_rng_uniform(mf_rng *r) { return (float)(mf_rng_u32(r) >> 8) / 16777216.0f; }

float mf_rng_normal(mf_rng *r) {
    float u1 = mf_rng_uniform(r), u2 = mf_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

const char *mf_cache_dir(char *buf, size_t n) {
    const char *c = getenv("MEMFIT_CACHE"), *h = getenv("HOME");
    if (c && *c) snprintf(buf, n, "%s", c);
    else snprintf(buf, n, "%s/.cache/memfit", h && *h ? h : ".");
    return buf;
}
