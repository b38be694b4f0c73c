/* Times the FlashAttention kernel's document masking (packing): one row of
 * T tokens as a single causal sequence (pos NULL, the plain path) against
 * the same row packed with documents of D tokens (positions restarting per
 * document: key tiles before a query tile's document are skipped), forward
 * + backward, alternating the two in one run; prints the medians of wall
 * and process-CPU time and their ratio. Not a test. Built with the project
 * (cmake --build build --target bench_docmask):
 *
 *   OMP_NUM_THREADS=2 build/bench_docmask [reps]
 */
#include "memfit/kernels.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"

static void bench(int B, int T, int NH, int NKV, int hs, int D, int reps) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t nqkv = (size_t)B * T * QKV, nout = (size_t)B * T * C;
    float *qkv = malloc(nqkv * sizeof *qkv), *dout = malloc(nout * sizeof *dout), *out = malloc(nout * sizeof *out);
    float *dqkv = malloc(nqkv * sizeof *dqkv), *lse = malloc((size_t)B * NH * T * sizeof *lse);
    float *scr = malloc(mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()) * sizeof *scr);
    int32_t *pos = malloc((size_t)B * T * sizeof *pos);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nout; i++) dout[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) pos[(size_t)b * T + t] = t % D;
    double w[2][64], c[2][64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            const int32_t *p = k ? pos : NULL;
            double w0 = bench_now(), c0 = bench_cpu();
            mf_flash_attention_doc_forward(out, lse, qkv, B, T, NH, NKV, hs, 0, p);
            mf_flash_attention_doc_backward(dqkv, scr, dout, out, qkv, lse, B, T, NH, NKV, hs, 0, p);
            if (r >= 0) w[k][r] = bench_now() - w0, c[k][r] = bench_cpu() - c0; /* r = -1: warm-up */
        }
    double w0 = bench_median(w[0], reps), w1 = bench_median(w[1], reps), c0 = bench_median(c[0], reps),
           c1 = bench_median(c[1], reps);
    printf("B %d T %d heads %d/%d hs %d: one causal sequence %.1f ms (cpu %.1f), documents of %d %.1f ms (cpu %.1f): "
           "ratio %.2f (cpu %.2f)\n", B, T, NH, NKV, hs, 1e3 * w0, 1e3 * c0, D, 1e3 * w1, 1e3 * c1, w1 / w0, c1 / c0);
    free(qkv), free(dout), free(out), free(dqkv), free(lse), free(scr), free(pos);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    bench(2, 1024, 8, 2, 64, 128, reps);
    bench(2, 1024, 8, 2, 64, 512, reps);
    return 0;
}
