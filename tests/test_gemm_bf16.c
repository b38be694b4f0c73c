/* Proves mf_gemm_bf16 computes op(A) @ op(B) (+ bias) (+ C) from bf16
 * operands with fp32 accumulation:
 *  - every combination of transposed A / B, accumulate, bias and fp32 or bf16
 *    output, on odd shapes (no multiple of any tile), on shapes split into
 *    column and K blocks, and a GPT-2-sized one,
 *    against a double-precision product of the same bf16 values: within
 *    K * 2^-23 of sum |a||b| for fp32 output (what fp32 accumulation can lose)
 *    and additionally half a bf16 ulp for bf16 output;
 *  - the scratch it asks for is enough (the buffer around it is checked for
 *    writes), and a call without the scratch it needs is refused;
 *  - bad shapes are refused with a message, not a crash;
 *  - it reports which oneDNN kernel runs (AVX512_BF16 on this machine). */
#include "memfit/core.h"
#include "kernels/half.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (float)((rng >> 11) * 0x1p-53) * 2 - 1; }

static int run(int M, int N, int K, int tA, int tB, int acc, int cbf, int has_bias) {
    int fails = 0;
    mf_bf16 *A = malloc((size_t)M * K * 2), *B = malloc((size_t)K * N * 2);
    float *bias = malloc((size_t)N * 4), *C0 = malloc((size_t)M * N * 4);
    void *C = malloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = mf_f32_to_bf16(urand());
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = mf_f32_to_bf16(urand());
    for (int j = 0; j < N; j++) bias[j] = urand();
    for (size_t i = 0; i < (size_t)M * N; i++) {
        C0[i] = cbf ? mf_bf16_to_f32(mf_f32_to_bf16(urand() * 4)) : urand() * 4;
        if (cbf) ((mf_bf16 *)C)[i] = mf_f32_to_bf16(C0[i]);
        else ((float *)C)[i] = C0[i];
    }
    size_t need = mf_gemm_bf16_scratch_bytes(M, N, K, tA, tB, acc, cbf, has_bias);
    CHECK(need != SIZE_MAX, "scratch query failed: %s", mf_error());
    unsigned char *scr = malloc(need + 128);
    memset(scr, 0xA5, need + 128);
    int rc = mf_gemm_bf16(C, A, B, has_bias ? bias : NULL, M, N, K, tA, tB, acc, cbf, scr + 64);
    CHECK(rc == 0, "gemm failed: %s", mf_error());
    for (int i = 0; i < 64; i++) fails += scr[i] != 0xA5 || scr[need + 64 + i] != 0xA5;
    CHECK(fails == 0, "the GEMM wrote outside its %zu scratch bytes", need);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double a = mf_bf16_to_f32(tA ? A[(size_t)k * M + i] : A[(size_t)i * K + k]);
                double b = mf_bf16_to_f32(tB ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
                s += a * b;
                sa += fabs(a * b);
            }
            if (has_bias) { s += bias[j]; sa += fabs(bias[j]); }
            if (acc) { s += C0[(size_t)i * N + j]; sa += fabs(C0[(size_t)i * N + j]); }
            double got = cbf ? mf_bf16_to_f32(((mf_bf16 *)C)[(size_t)i * N + j]) : ((float *)C)[(size_t)i * N + j];
            double tol = (K + 2) * 0x1p-23 * sa + (cbf ? fabs(s) * 0x1p-8 : 0) + 1e-30;
            double e = fabs(got - s) / tol;
            if (e > worst) worst = e;
        }
    CHECK(worst <= 1.0, "%dx%dx%d tA%d tB%d acc%d cbf16 %d bias %d: error %.2f x the bound", M, N, K, tA, tB, acc,
          cbf, has_bias, worst);
    if (need) CHECK(mf_gemm_bf16(C, A, B, NULL, M, N, K, tA, tB, acc, cbf, NULL) != 0 || has_bias,
                    "a call without its scratch was not refused");
    free(A); free(B); free(bias); free(C0); free(C); free(scr);
    return worst <= 1.0;
}

int main(void) {
    const char *impl = mf_gemm_bf16_impl();
    printf("oneDNN bf16 matmul: %s\n", impl[0] ? impl : "(none)");
    CHECK(impl[0] != 0, "oneDNN has no bf16 matmul here");
    int ok = 0, n = 0;
    for (int c = 0; c < 32; c++) {
        ok += run(37, 61, 129, c & 1, (c >> 1) & 1, (c >> 2) & 1, (c >> 3) & 1, (c >> 4) & 1);
        n++;
    }
    /* N and K above the column and K blocks (dnnl_mm.c), not multiples of
     * them: every transpose form, with and without accumulate and bias, and
     * a bf16 output (not K-blocked) */
    for (int c = 0; c < 8; c++) {
        ok += run(9, 1100, 1300, c & 1, (c >> 1) & 1, (c >> 2) & 1, c == 7, c & 1);
        n++;
    }
    ok += run(256, 768, 768, 0, 0, 0, 0, 1); n++;  /* a GPT-2 forward projection */
    ok += run(768, 768, 256, 1, 0, 1, 0, 0); n++;  /* its weight gradient */
    ok += run(256, 768, 768, 0, 1, 0, 1, 0); n++;  /* its input gradient, bf16 out */
    printf("%d of %d shapes within the bound\n", ok, n);
    CHECK(mf_gemm_bf16_scratch_bytes(0, 4, 4, 0, 0, 0, 0, 0) == SIZE_MAX && strstr(mf_error(), "bad shape"),
          "a zero dimension was not refused: %s", mf_error());
    return mf_test_done("test_gemm_bf16");
}
