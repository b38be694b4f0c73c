/* Proves the 16-bit conversions do what kernels/half.h says:
 *  - bf16 -> fp32 -> bf16 is the identity on all 65536 bf16 patterns (NaNs
 *    stay NaN), and fp16 likewise;
 *  - fp32 -> bf16 and fp32 -> fp16 pick the nearest representable value with
 *    ties to even (overflow to inf, subnormals kept), checked against a
 *    reference that searches the format's values in double precision: for
 *    4M random fp32 patterns and, for fp16, every value, every midpoint
 *    between neighbours (the ties) and the floats one ulp either side;
 *  - fp16 conversions agree with the F16C instructions (when the CPU has
 *    them) on the same inputs;
 *  - stochastic rounding keeps representable values exact, is unbiased
 *    (mean of 2^16 draws within 4 standard errors of x), and gives the same
 *    bits whatever the thread count. */
#include "kernels/half.h"
#include "testutil.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float fl(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd32(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 16); }

/* nearest of two candidate patterns lo < hi (same sign) by value, ties to the
 * even pattern; hi_val may be the virtual value past the largest finite */
static int pick(double x, double lo_val, double hi_val, int lo_even) {
    double dl = fabs(x - lo_val), dh = fabs(hi_val - x);
    if (dl < dh) return 0;
    if (dh < dl) return 1;
    return lo_even ? 0 : 1;
}

static uint16_t ref_bf16(float f) {
    uint32_t u = bits(f);
    if (isnan(f)) return 0xffff; /* any NaN: compared by class */
    uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)((sign | a) >> 16);
    uint32_t lo = a >> 16, hi = lo + 1;
    double x = fabs((double)f);
    double lv = (double)fl(lo << 16);
    double hv = hi == 0x7f80u ? ldexp(1.0, 128) : (double)fl(hi << 16);
    uint32_t r = pick(x, lv, hv, (lo & 1) == 0) ? hi : lo;
    return (uint16_t)((sign >> 16) | r);
}

static double fp16_val(uint32_t h) { /* positive finite pattern -> value */
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    return e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
}

static uint16_t ref_fp16(float f) {
    if (isnan(f)) return 0xffff;
    uint16_t sign = bits(f) >> 31 ? 0x8000 : 0;
    double x = fabs((double)f);
    if (isinf(f)) return sign | 0x7c00;
    /* binary search the largest pattern with value <= x */
    uint32_t lo = 0, hi = 0x7bff;
    if (x >= fp16_val(0x7bff)) lo = 0x7bff;
    else {
        while (hi - lo > 1) { uint32_t mid = (lo + hi) / 2; if (fp16_val(mid) <= x) lo = mid; else hi = mid; }
    }
    if (fp16_val(lo) == x) return sign | (uint16_t)lo;
    uint32_t up = lo + 1;
    double uv = up == 0x7c00 ? 65536.0 : fp16_val(up);
    return sign | (uint16_t)(pick(x, fp16_val(lo), uv, (lo & 1) == 0) ? up : lo);
}

static int same16(uint16_t got, uint16_t want, int nan_exp) {
    /* want 0xffff means "a NaN"; nan_exp is the exponent mask of the format */
    if (want == 0xffff) return (got & nan_exp) == nan_exp && (got & ~(nan_exp | 0x8000)) != 0;
    return got == want;
}

static int has_f16c;
__attribute__((target("f16c"))) static uint16_t hw_fp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
__attribute__((target("f16c"))) static float hw_fp16_f32(uint16_t h) { return _cvtsh_ss(h); }

static int bad_bf16, bad_fp16, bad_hw;
static void check_one(float f) {
    uint16_t b = mf_f32_to_bf16(f), rb = ref_bf16(f);
    if (!same16(b, rb, 0x7f80) && bad_bf16++ < 5)
        CHECK(0, "bf16(%a = 0x%08x) = 0x%04x, nearest-even is 0x%04x", (double)f, bits(f), b, rb);
    uint16_t h = mf_f32_to_fp16(f), rh = ref_fp16(f);
    if (!same16(h, rh, 0x7c00) && bad_fp16++ < 5)
        CHECK(0, "fp16(%a = 0x%08x) = 0x%04x, nearest-even is 0x%04x", (double)f, bits(f), h, rh);
    if (has_f16c) {
        uint16_t hw = hw_fp16(f);
        int ok = isnan(f) ? (hw & 0x7c00) == 0x7c00 && (h & 0x7c00) == 0x7c00 && (h & 0x3ff) : hw == h;
        if (!ok && bad_hw++ < 5) CHECK(0, "fp16(%a) = 0x%04x, F16C gives 0x%04x", (double)f, h, hw);
    }
}

int main(void) {
    __builtin_cpu_init();
    has_f16c = __builtin_cpu_supports("f16c");

    /* round trips over every 16-bit pattern */
    int bad = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        float b = mf_bf16_to_f32((mf_bf16)p);
        CHECK(bits(b) == p << 16, "bf16 0x%04x -> 0x%08x", p, bits(b));
        uint16_t back = mf_f32_to_bf16(b);
        if (isnan(b)) bad += !isnan(mf_bf16_to_f32(back));
        else bad += back != p;
        float h = mf_fp16_to_f32((mf_fp16)p);
        uint16_t hb = mf_f32_to_fp16(h);
        if (isnan(h)) bad += (p & 0x7c00) != 0x7c00 || (p & 0x3ff) == 0 || !isnan(mf_fp16_to_f32(hb));
        else bad += hb != p || (((p & 0x7c00) != 0x7c00) && fabs((double)h) != fp16_val(p & 0x7fff));
        if (has_f16c && !isnan(h)) bad += bits(hw_fp16_f32((mf_fp16)p)) != bits(h);
    }
    CHECK(bad == 0, "%d 16-bit patterns do not round-trip exactly", bad);

    /* nearest-even rounding: random patterns, then fp16's critical points */
    for (int i = 0; i < 4 << 20; i++) check_one(fl(rnd32() << 16 ^ rnd32()));
    for (uint32_t p = 0; p < 0x7c00; p++) {
        double v = fp16_val(p), next = p + 1 == 0x7c00 ? 65536.0 : fp16_val(p + 1);
        float mid = (float)((v + next) / 2); /* exact in fp32: fp16 has 11 bits */
        float vs[6] = {(float)v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid, -(float)v};
        for (int k = 0; k < 6; k++) check_one(vs[k]);
    }
    float edge[] = {65504.0f, 65519.99f, 65520.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f,
                    0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 0x1p-126f, 0x1p-149f, 3.3895313892515355e38f,
                    3.4028235e38f, fl(0x7f7f8000u), fl(0x7f7f7fffu), fl(0x00008000u), fl(0x80018000u)};
    for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) check_one(edge[k]);
    CHECK(mf_f32_to_bf16(fl(0x7f7f8000u)) == 0x7f80, "bf16 of the overflow midpoint must be inf");
    CHECK(mf_f32_to_fp16(65520.0f) == 0x7c00 && mf_f32_to_fp16(65519.99f) == 0x7bff, "fp16 overflow threshold");
    CHECK(mf_f32_to_fp16(0x1p-25f) == 0 && mf_f32_to_fp16(0x1.8p-25f) == 1, "fp16 smallest subnormal ties");
    printf("nearest-even: bf16 %d, fp16 %d mismatches; F16C %s, %d mismatches\n", bad_bf16, bad_fp16,
           has_f16c ? "checked" : "absent", bad_hw);

    /* array versions equal the scalar ones, any thread count */
    size_t n = 300001;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    mf_bf16 *b1 = malloc(n * 2), *b2 = malloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = ldexpf((float)(rnd32() % 100000) / 100000.0f - 0.5f, (int)(rnd32() % 40) - 20);
    mf_bf16_from_f32(b1, x, n);
    mf_f32_from_bf16(y, b1, n);
    mf_fp16_from_f32(b2, x, n);
    mf_f32_from_fp16(z, b2, n);
    int abad = 0;
    for (size_t i = 0; i < n; i++)
        abad += b1[i] != mf_f32_to_bf16(x[i]) || bits(y[i]) != bits(mf_bf16_to_f32(b1[i])) ||
                b2[i] != mf_f32_to_fp16(x[i]) || bits(z[i]) != bits(mf_fp16_to_f32(b2[i]));
    CHECK(abad == 0, "%d array elements differ from the scalar conversion", abad);

    /* stochastic rounding */
    omp_set_num_threads(1);
    mf_bf16_from_f32_sr(b1, x, n, 1234, 77);
    omp_set_num_threads(2);
    mf_bf16_from_f32_sr(b2, x, n, 1234, 77);
    CHECK(memcmp(b1, b2, n * 2) == 0, "stochastic rounding depends on the thread count");
    int sbad = 0;
    for (size_t i = 0; i < n; i++) {
        mf_bf16 lo = (mf_bf16)(bits(x[i]) >> 16);
        sbad += b1[i] != lo && b1[i] != lo + 1; /* one of the two neighbours */
        sbad += b1[i] != mf_f32_to_bf16_sr(x[i], mf_half_sr_bits(1234, 77 + i));
    }
    CHECK(sbad == 0, "%d stochastic results are not a neighbour / not the documented bits", sbad);
    for (uint32_t p = 0x3f80; p < 0x3f90; p++) {
        float v = mf_bf16_to_f32((mf_bf16)p);
        CHECK(mf_f32_to_bf16_sr(v, 0xffff) == p && mf_f32_to_bf16_sr(v, 0) == p, "exact value 0x%04x moved", p);
    }
    float probes[] = {1.0f + 0x1p-9f, 1.0f + 0x1p-12f, -3.14159265f, 1e-3f, 123456.7f};
    for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
        double s = 0, s2 = 0;
        const int draws = 1 << 16;
        for (int i = 0; i < draws; i++) {
            double v = mf_bf16_to_f32(mf_f32_to_bf16_sr(probes[k], mf_half_sr_bits(99, (uint64_t)i)));
            s += v; s2 += v * v;
        }
        double mean = s / draws, sd = sqrt(fmax(s2 / draws - mean * mean, 0)), se = sd / sqrt(draws);
        CHECK(fabs(mean - probes[k]) <= 4 * se + 1e-12 * fabs(probes[k]), "sr mean %.9g vs %.9g (se %.3g)", mean,
              (double)probes[k], se);
    }
    CHECK(mf_f32_to_bf16_sr(INFINITY, 0xffff) == 0x7f80 && isnan(mf_bf16_to_f32(mf_f32_to_bf16_sr(NAN, 0))),
          "sr of inf/NaN");
    free(x); free(y); free(z); free(b1); free(b2);
    return mf_test_done("test_half_convert");
}
