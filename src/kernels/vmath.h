/* Vectorisable float exp and tanh for the kernels' hot loops.
 *
 * glibc's expf/tanhf are scalar calls the compiler cannot vectorise without
 * -ffast-math, and they dominated GELU (about 8 ns per element) and the
 * cross-entropy over a 50k vocabulary. These are branch-free straight-line
 * code, so loops calling them vectorise under plain -O3 with SSE4.1 and up.
 *
 * mf_vexpf: Cephes expf (S. Moshier, cephes/single/expf.c): x = k ln2 + r
 * with ln2 split in two (Cody-Waite), exp(r) from a degree-7 polynomial,
 * times 2^k built in the exponent bits. Relative error about 1 ulp.
 * Inputs are clamped to [-87.3, 88]: results never overflow to inf and
 * the smallest is ~1.2e-38 rather than 0 (harmless wherever it is summed or
 * multiplied); +-inf are clamped like any other value. A NaN input gives
 * NaN, so a diverged model's NaNs stay visible in the loss instead of being
 * clamped into finite garbage. k comes from
 * the 1.5 * 2^23 rounding trick, not a float-to-int conversion (undefined
 * out of range). Assumes round-to-nearest, the default. */
#ifndef MEMFIT_KERNELS_VMATH_H
#define MEMFIT_KERNELS_VMATH_H

#include <stdint.h>
#include <string.h>

/* Clamps x to [-87.33654, 88] on its bit pattern. Float ternaries would not
 * vectorise under gcc's default -ftrapping-math (a compare may raise a flag,
 * so it is not if-converted), integer min does: as uint32, every negative
 * float below -87.33654 has larger bits than it and every positive float
 * smaller; as int32, positive floats order like their bits and negative ones
 * are below 0. NaNs come out clamped (to either end), never undefined. */
static inline float mf_vexp_clamp(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    const uint32_t lo = 0xC2AEAC4Fu; /* -87.33654f: k >= -126, exp ~FLT_MIN */
    const int32_t hi = 0x42B00000;   /* 88.0f: k <= 127 with margin */
    b = b > lo ? lo : b;
    int32_t i = (int32_t)b;
    i = i > hi ? hi : i;
    memcpy(&x, &i, sizeof x);
    return x;
}

static inline float mf_vexpf(float x0) {
    const float x = mf_vexp_clamp(x0);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float t = x * 1.44269504088896341f + magic;
    const float k = t - magic;       /* round(x / ln2), exact */
    const float r = x - k * 0.693359375f - k * -2.12194440e-4f;
    const float z = r * r;
    const float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                       4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    /* low bits of t hold k (t's ulp is 1); 2^k = (k + 127) << 23 */
    const uint32_t eb = (tb - 0x4B400000u + 127u) << 23;
    float s;
    memcpy(&s, &eb, sizeof s);
    float y = p * s;
    /* NaN in, NaN out: selected with a bit mask (NaN: exponent all ones,
     * mantissa not 0); a ternary here is not if-converted by gcc 12 */
    uint32_t xb, yb;
    memcpy(&xb, &x0, sizeof xb);
    memcpy(&yb, &y, sizeof yb);
    const uint32_t nan = 0u - (uint32_t)((xb & 0x7FFFFFFFu) > 0x7F800000u);
    yb = (xb & nan) | (yb & ~nan);
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits +-1 for large |u| (the
 * exp clamp keeps the division finite); absolute error ~1e-7, which is what
 * GELU's 0.5 x (1 + tanh) needs (near u = 0 the relative error of tanh
 * itself grows, but the 1 + tanh it is added to does not notice). */
static inline float mf_vtanhf(float u) {
    return 1.0f - 2.0f / (mf_vexpf(2.0f * u) + 1.0f);
}

#endif
