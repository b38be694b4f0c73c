/* Times the frozen-base GEMMs of quant/quant.h (weight dequantised a tile of
 * rows at a time, then OpenBLAS sgemm) against plain fp32 sgemm on GPT-2
 * 124M's linear-layer shapes at batch 4 x seq 256 (M = 1024), forward
 * (out = inp @ W + b) and backward_input (dinp += dout @ W^T). Each rep runs
 * fp32, bf16, int8, nf4 back to back (A B C D A B C D ...); the table gives
 * median milliseconds and the ratio to fp32, and the time of dequantising
 * the whole matrix once (mf_quant_unpack), the part of the overhead that is
 * not sgemm on tiles; then, per shape, the nn.Linear-layout kernels
 * (mf_quant_linear_*, the same product with W^T packed) as a time ratio to
 * the Conv1D ones. Not a test. From the repository root, after `make` (or
 * any cmake build of build/):
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -Iinclude \
 *       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/quant_gemm.c \
 *       build/libmemfit.a -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -lm \
 *       -o /tmp/quant_gemm && /tmp/quant_gemm [reps]
 */
#include "memfit/core.h"
#include "quant/quant.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchutil.h"


#define NK 4
#define MAXREP 200

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1 || reps > MAXREP) reps = 9;
    struct { const char *what; int M, K, N; } shapes[] = {
        {"attn.c_attn", 1024, 768, 2304}, {"attn.c_proj", 1024, 768, 768},
        {"mlp.c_fc", 1024, 768, 3072}, {"mlp.c_proj", 1024, 3072, 768},
    };
    const mf_quant_kind ks[NK] = {MF_QUANT_F32, MF_QUANT_BF16, MF_QUANT_INT8, MF_QUANT_NF4};
    mf_rng rng;
    mf_rng_seed(&rng, 1);
    printf("memfit bench/quant_gemm: threads %d, tile %d rows, %d reps, median ms (ratio to fp32)\n",
           omp_get_max_threads(), MF_QUANT_TILE_ROWS, reps);
    printf("%-12s %-4s %5s %5s %5s | %8s | %16s %16s %16s | %s\n", "shape", "op", "M", "K", "N", "fp32", "bf16",
           "int8", "nf4", "unpack whole W bf16/int8/nf4");
    double tot[2][NK] = {{0}}, tpack[4][NK];
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s].M, K = shapes[s].K, N = shapes[s].N;
        float *w = malloc((size_t)K * N * 4), *inp = malloc((size_t)M * K * 4), *dout = malloc((size_t)M * N * 4);
        float *out = malloc((size_t)M * N * 4), *dinp = malloc((size_t)M * K * 4), *bias = malloc((size_t)N * 4);
        float *wd = malloc((size_t)K * N * 4);
        for (size_t i = 0; i < (size_t)K * N; i++) w[i] = 0.02f * mf_rng_normal(&rng);
        for (size_t i = 0; i < (size_t)M * K; i++) inp[i] = mf_rng_normal(&rng);
        for (size_t i = 0; i < (size_t)M * N; i++) dout[i] = mf_rng_normal(&rng);
        for (int i = 0; i < N; i++) bias[i] = 0.01f * i;
        for (size_t i = 0; i < (size_t)M * K; i++) dinp[i] = 0;
        void *wq[NK], *scr[NK];
        for (int k = 0; k < NK; k++) {
            wq[k] = malloc(mf_quant_bytes(ks[k], (int64_t)K * N));
            mf_quant_pack(ks[k], wq[k], w, (int64_t)K * N); /* first touch of the pages */
            double t0 = bench_now();
            mf_quant_pack(ks[k], wq[k], w, (int64_t)K * N);
            tpack[s][k] = (bench_now() - t0) * 1e3;
            size_t sb = mf_quant_matmul_scratch_bytes(ks[k], M, K, N);
            scr[k] = sb ? malloc(sb) : NULL;
        }
        static double tf[NK][MAXREP], tb[NK][MAXREP], tu[NK][MAXREP];
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up, untimed */
            for (int k = 0; k < NK; k++) {
                double t0 = bench_now();
                mf_quant_matmul_forward(out, inp, wq[k], bias, M, K, N, ks[k], scr[k]);
                double t1 = bench_now();
                mf_quant_matmul_backward_input(dinp, dout, wq[k], M, K, N, ks[k], scr[k]);
                double t2 = bench_now();
                mf_quant_unpack(ks[k], wd, wq[k], 0, (int64_t)K * N);
                double t3 = bench_now();
                if (r >= 0) {
                    tf[k][r] = t1 - t0;
                    tb[k][r] = t2 - t1;
                    tu[k][r] = t3 - t2;
                }
            }
        }
        for (int op = 0; op < 2; op++) {
            double med[NK], mu[NK];
            for (int k = 0; k < NK; k++) {
                med[k] = bench_median(op ? tb[k] : tf[k], reps) * 1e3;
                mu[k] = bench_median(tu[k], reps) * 1e3;
                tot[op][k] += med[k];
            }
            printf("%-12s %-4s %5d %5d %5d | %8.2f | %8.2f (%5.3fx) %8.2f (%5.3fx) %8.2f (%5.3fx) | %.2f / %.2f / %.2f\n",
                   shapes[s].what, op ? "bwd" : "fwd", M, K, N, med[0], med[1], med[1] / med[0], med[2],
                   med[2] / med[0], med[3], med[3] / med[0], mu[1], mu[2], mu[3]);
        }
        /* the nn.Linear-layout kernels on the same product: W^T (N,K) packed,
         * against the Conv1D kernels above (medians of the same reps) */
        {
            float *wt = malloc((size_t)K * N * 4);
            for (int kk = 0; kk < K; kk++)
                for (int n = 0; n < N; n++) wt[(size_t)n * K + kk] = w[(size_t)kk * N + n];
            double lf[NK], lb[NK];
            for (int k = 0; k < NK; k++) {
                void *q = malloc(mf_quant_bytes(ks[k], (int64_t)K * N));
                mf_quant_pack(ks[k], q, wt, (int64_t)K * N);
                size_t sb = mf_quant_linear_scratch_bytes(ks[k], M, K, N);
                void *sc = sb ? malloc(sb) : NULL;
                static double xf[MAXREP], xb[MAXREP];
                for (int r = -1; r < reps; r++) {
                    double t0 = bench_now();
                    mf_quant_linear_forward(out, N, inp, q, bias, M, K, N, 0.0f, ks[k], sc);
                    double t1 = bench_now();
                    mf_quant_linear_backward_input(dinp, dout, N, q, M, K, N, ks[k], sc);
                    double t2 = bench_now();
                    if (r >= 0) {
                        xf[r] = t1 - t0;
                        xb[r] = t2 - t1;
                    }
                }
                lf[k] = bench_median(xf, reps) * 1e3 / (bench_median(tf[k], reps) * 1e3);
                lb[k] = bench_median(xb, reps) * 1e3 / (bench_median(tb[k], reps) * 1e3);
                free(q);
                free(sc);
            }
            printf("%-12s nn.Linear layout, time / Conv1D kernel's: fwd %.3f %.3f %.3f %.3f, bwd %.3f %.3f %.3f %.3f"
                   " (fp32 bf16 int8 nf4)\n",
                   shapes[s].what, lf[0], lf[1], lf[2], lf[3], lb[0], lb[1], lb[2], lb[3]);
            free(wt);
        }
        for (int k = 0; k < NK; k++) {
            free(wq[k]);
            free(scr[k]);
        }
        free(w); free(inp); free(dout); free(out); free(dinp); free(bias); free(wd);
    }
    printf("pack, once per weight when the base is loaded (ms, one timing): ");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        printf("%s %.1f / %.1f / %.1f%s", shapes[s].what, tpack[s][1], tpack[s][2], tpack[s][3],
               s + 1 < sizeof shapes / sizeof *shapes ? "; " : " (bf16 / int8 / nf4)\n");
    for (int op = 0; op < 2; op++)
        printf("all four, %s: fp32 %.2f ms; bf16 %.3fx, int8 %.3fx, nf4 %.3fx\n", op ? "bwd" : "fwd", tot[op][0],
               tot[op][1] / tot[op][0], tot[op][2] / tot[op][0], tot[op][3] / tot[op][0]);
    return 0;
}
