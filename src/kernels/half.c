/* 16-bit float conversions (see kernels/half.h). Plain C the compiler
 * vectorises; fp16 rounding follows F. Giesen's float_to_half_fast3_rtne,
 * whose subnormal path lets the FPU do the rounding (so this file must not
 * be built with -ffast-math). */
#include "kernels/half.h"
#include "isa.h"

#include <immintrin.h>
#include <omp.h>

#define PAR_MIN 65536 /* below this, one thread */

float mf_fp16_to_f32(mf_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

mf_fp16 mf_f32_to_fp16(float f) {
    const uint32_t f32_inf = 255u << 23, f16_max = (127u + 16u) << 23;
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t o;
    if (u >= f16_max) {
        o = u > f32_inf ? 0x7e00u : 0x7c00u; /* NaN stays NaN, the rest overflows to inf */
    } else if (u < (113u << 23)) {
        /* result is subnormal or zero: adding 0.5 (scaled) makes the FPU round
         * the mantissa into the low bits with ties to even */
        float fu, magic;
        memcpy(&fu, &u, 4);
        memcpy(&magic, &denorm_magic, 4);
        fu += magic;
        memcpy(&u, &fu, 4);
        o = u - denorm_magic;
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu; /* rebias, round half up ... */
        u += odd;                                     /* ... or to even */
        o = u >> 13;
    }
    return (mf_fp16)(o | (sign >> 16));
}

uint32_t mf_half_sr_bits(uint64_t seed, uint64_t i) {
    /* splitmix64 of (seed, i): a counter-based generator, so element i's bits
     * do not depend on which thread converts it */
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(z >> 48);
}

/* the dispatched kernel (isa.h): the same rounding, 16 lanes with AVX-512 */
void mf_bf16_from_f32(mf_bf16 *out, const float *in, size_t n) { mf_kernels_isa_get()->to_bf16(out, in, n); }

void mf_f32_from_bf16(float *out, const mf_bf16 *in, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = mf_bf16_to_f32(in[i]);
}

void mf_fp16_from_f32(mf_fp16 *out, const float *in, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = mf_f32_to_fp16(in[i]);
}

/* F16C's vcvtph2ps widens 8 values per instruction, exactly (the same
 * results as mf_fp16_to_f32, subnormals included); chosen at run time */
__attribute__((target("f16c,avx"))) static void widen_f16c(float *out, const mf_fp16 *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + i))));
    for (; i < n; i++) out[i] = mf_fp16_to_f32(in[i]);
}

static int have_f16c(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    }
    return v;
}

void mf_f32_from_fp16(float *out, const mf_fp16 *in, size_t n) {
    if (have_f16c()) {
        const size_t blk = 16384, nb = (n + blk - 1) / blk;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (size_t k = 0; k < nb; k++) widen_f16c(out + k * blk, in + k * blk, n - k * blk < blk ? n - k * blk : blk);
        return;
    }
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = mf_fp16_to_f32(in[i]);
}

void mf_bf16_from_f32_sr(mf_bf16 *out, const float *in, size_t n, uint64_t seed, uint64_t first) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = mf_f32_to_bf16_sr(in[i], mf_half_sr_bits(seed, first + i));
}
