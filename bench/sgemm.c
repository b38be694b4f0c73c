/* Times a square fp32 GEMM (C = A B, row-major, no transposes) on both
 * libraries memfit links, OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm),
 * alternating, and prints each one's median GFLOP/s and the faster of the
 * two: the machine's GEMM rate that bench/throughput compares memfit's model
 * FLOP rate against. Not a test.
 *   bench_sgemm [N=2048] [reps=7] [threads=all]
 * Prints one line:
 *   "sgemm N=2048 threads=2 openblas=... onednn=... gflops=<the faster>" */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchutil.h"


int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2048, reps = argc > 2 ? atoi(argv[2]) : 7;
    int th = argc > 3 ? atoi(argv[3]) : omp_get_num_procs();
    if (n < 1 || reps < 1 || reps > 1000 || th < 1) {
        fprintf(stderr, "sgemm: usage: sgemm [N>=1] [reps 1..1000] [threads>=1]\n");
        return 2;
    }
    omp_set_num_threads(th);
    openblas_set_num_threads(th);
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * 4), *b = malloc(nn * 4), *c = malloc(nn * 4);
    double *t = malloc((size_t)reps * sizeof *t), *u = malloc((size_t)reps * sizeof *u);
    if (!a || !b || !c || !t || !u) {
        fprintf(stderr, "sgemm: out of memory for N=%d\n", n);
        return 1;
    }
    for (size_t i = 0; i < nn; i++) a[i] = (float)(i % 97) * 0.01f, b[i] = (float)(i % 89) * 0.01f, c[i] = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up of both */
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t1 = bench_now();
        if (dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n) != dnnl_success) {
            fprintf(stderr, "sgemm: dnnl_sgemm failed\n");
            return 1;
        }
        double t2 = bench_now();
        if (r >= 0) t[r] = t1 - t0, u[r] = t2 - t1;
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmpd);
    qsort(u, (size_t)reps, sizeof *u, bench_cmpd);
    double f = 2.0 * n * (double)n * n * 1e-9;
    double ob = f / (reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]));
    double dn = f / (reps % 2 ? u[reps / 2] : 0.5 * (u[reps / 2 - 1] + u[reps / 2]));
    printf("sgemm N=%d threads=%d openblas=%.1f onednn=%.1f gflops=%.1f\n", n, th, ob, dn, ob > dn ? ob : dn);
    free(a), free(b), free(c), free(t), free(u);
    return 0;
}
