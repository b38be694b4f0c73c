/* Times every fp32 GEMM shape of a Llama-family training step (default
 * smollm2-135m, B4 T256: C 576, K/V width 192, ffn 1536, vocab 49152, loss
 * chunk 256, 30 layers) in the transpose forms src/model/llama.c and
 * src/kernels/classifier.c call (weights (out, in): forward x W^T,
 * dW += dY^T x, dX = dY W), three ways, alternating per repetition:
 * "onednn" is mf_sgemm's default backend (each call sliced across the
 * threads by memfit, gemm.c), "dnnl-thr" is dnnl_sgemm called directly
 * (oneDNN threading each call, what mf_sgemm did before), "openblas" is
 * mf_sgemm's OpenBLAS backend. Prints per shape GFLOP per wall second and
 * per process-CPU second (the fairer one on a shared machine; libgomp's
 * spin while a thread waits counts as CPU), the median of the repetitions
 * (BENCH_BEST=1: the fastest), and a step total weighted by how often a
 * step runs each shape. Not a test.
 *   build/bench_gemm_llama [reps=5] [threads=all] [C kv ffn vocab rows layers]
 */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "memfit/train.h"

typedef struct { char what[24]; int M, N, K, ta, tb; float beta; int per; } shape;
#define NB 3

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5, th = argc > 2 ? atoi(argv[2]) : omp_get_num_procs();
    int C = 576, KV = 192, F = 1536, V = 49152, N = 1024, L = 30;
    if (argc > 8) C = atoi(argv[3]), KV = atoi(argv[4]), F = atoi(argv[5]), V = atoi(argv[6]), N = atoi(argv[7]),
                  L = atoi(argv[8]);
    if (reps < 1 || reps > 100 || th < 1 || C < 1 || KV < 1 || F < 1 || V < 1 || N < 1 || L < 1) {
        fprintf(stderr, "bench_gemm_llama: usage: bench_gemm_llama [reps 1..100] [threads>=1] [C kv ffn vocab rows layers]\n");
        return 2;
    }
    const char *be = getenv("BENCH_BEST");
    const int best = be && atoi(be) > 0;
    mf_threads_setup(th);
    const int R = N < 256 ? N : 256, chunks = (N + R - 1) / R;
    /* projection (out, in, how many per layer, forward accumulates into the residual) */
    struct { const char *n; int out, in, per, acc; } pr[] = {
        {"q", C, C, 1, 0}, {"kv", KV, C, 2, 0}, {"o", C, C, 1, 1}, {"gate/up", F, C, 2, 0}, {"down", C, F, 1, 1}};
    shape sh[32];
    int ns = 0;
    for (int p = 0; p < 5; p++) {
        int o = pr[p].out, i = pr[p].in, k = pr[p].per * L;
        sh[ns] = (shape){"", N, o, i, 0, 1, (float)pr[p].acc, k};
        snprintf(sh[ns++].what, sizeof sh[0].what, "%s fwd x W^T", pr[p].n);
        sh[ns] = (shape){"", o, i, N, 1, 0, 1.0f, k};
        snprintf(sh[ns++].what, sizeof sh[0].what, "%s dW dY^T x", pr[p].n);
        /* dX: the first projection of a group overwrites, the others accumulate */
        sh[ns] = (shape){"", N, i, o, 0, 0, (p == 1 || p == 3) ? 1.0f : 0.0f, k};
        snprintf(sh[ns++].what, sizeof sh[0].what, "%s dX dY W", pr[p].n);
    }
    sh[ns] = (shape){"head fwd x E^T", R, V, C, 0, 1, 0, chunks}, ns++;
    sh[ns] = (shape){"head dX dZ E", R, C, V, 0, 0, 0, chunks}, ns++;
    sh[ns] = (shape){"head dE dZ^T x", V, C, R, 1, 0, 1, chunks}, ns++;
    const char *bk[NB] = {"onednn", "dnnl-thr", "openblas"};
    size_t big = 0;
    for (int s = 0; s < ns; s++) {
        size_t a = (size_t)sh[s].M * sh[s].K, b = (size_t)sh[s].K * sh[s].N, c = (size_t)sh[s].M * sh[s].N;
        if (a > big) big = a;
        if (b > big) big = b;
        if (c > big) big = c;
    }
    float *A = malloc(big * 4), *B = malloc(big * 4), *Cm = malloc(big * 4);
    double *t[NB], *u[NB], tot[NB] = {0}, totc[NB] = {0}, flops = 0;
    for (int b = 0; b < NB; b++) t[b] = malloc((size_t)reps * sizeof(double)), u[b] = malloc((size_t)reps * sizeof(double));
    if (!A || !B || !Cm) { fprintf(stderr, "bench_gemm_llama: out of memory\n"); return 1; }
    for (size_t i = 0; i < big; i++) A[i] = (float)(i % 97) * 1e-3f, B[i] = (float)(i % 89) * 1e-3f, Cm[i] = 0;
    printf("fp32 GEMM of a Llama step (C %d, kv %d, ffn %d, vocab %d, rows %d, %d layers), %s of %d, %d threads\n",
           C, KV, F, V, N, L, best ? "best" : "median", reps, th);
    printf("%-18s %6s %6s %6s %4s  %s\n", "gemm", "M", "N", "K", "/stp", "GFLOP per wall s | per CPU s:");
    printf("%-18s %6s %6s %6s %4s ", "", "", "", "", "");
    for (int b = 0; b < NB; b++) printf(" %9s", bk[b]);
    printf(" |");
    for (int b = 0; b < NB; b++) printf(" %9s", bk[b]);
    printf("\n");
    for (int s = 0; s < ns; s++) {
        const shape *q = &sh[s];
        int lda = q->ta ? q->M : q->K, ldb = q->tb ? q->K : q->N, ldc = q->N;
        for (int r = -1; r < reps; r++)
            for (int b = 0; b < NB; b++) {
                double t0 = bench_now(), c0 = bench_cpu();
                if (b == 1)
                    dnnl_sgemm(q->ta ? 'T' : 'N', q->tb ? 'T' : 'N', q->M, q->N, q->K, 1.0f, A, lda, B, ldb, q->beta,
                               Cm, ldc);
                else
                    mf_sgemm_use(bk[b]), mf_sgemm(q->ta, q->tb, q->M, q->N, q->K, 1.0f, A, lda, B, ldb, q->beta, Cm, ldc);
                if (r >= 0) t[b][r] = bench_now() - t0, u[b][r] = bench_cpu() - c0;
            }
        double f = 2.0 * q->M * (double)q->N * q->K;
        printf("%-18s %6d %6d %6d %4d ", q->what, q->M, q->N, q->K, q->per);
        double m[NB], mc[NB];
        for (int b = 0; b < NB; b++) {
            if (best) qsort(t[b], (size_t)reps, sizeof(double), bench_cmpd), qsort(u[b], (size_t)reps, sizeof(double), bench_cmpd);
            m[b] = best ? t[b][0] : bench_median(t[b], reps), mc[b] = best ? u[b][0] : bench_median(u[b], reps);
        }
        for (int b = 0; b < NB; b++) printf(" %9.1f", f / m[b] * 1e-9), tot[b] += q->per * m[b];
        printf(" |");
        for (int b = 0; b < NB; b++) printf(" %9.1f", f / mc[b] * 1e-9), totc[b] += q->per * mc[b];
        printf("\n");
        flops += q->per * f;
    }
    printf("%-18s %23s ", "step total", "");
    for (int b = 0; b < NB; b++) printf(" %9.1f", flops / tot[b] * 1e-9);
    printf(" |");
    for (int b = 0; b < NB; b++) printf(" %9.1f", flops / totc[b] * 1e-9);
    printf("   (%.0f GFLOP; seconds: ", flops * 1e-9);
    for (int b = 0; b < NB; b++) printf("%s %.2f%s", bk[b], tot[b], b < NB - 1 ? ", " : ")\n");
    free(A), free(B), free(Cm);
    for (int b = 0; b < NB; b++) free(t[b]), free(u[b]);
    return 0;
}
