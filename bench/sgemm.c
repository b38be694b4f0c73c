/* Times a square fp32 GEMM (cblas_sgemm, C = A B, row-major, no transposes)
 * on the BLAS memfit links and prints its median GFLOP/s: the machine's GEMM
 * rate that bench/throughput compares memfit's model FLOP rate against.
 * Not a test.
 *   sgemm [N=2048] [reps=7] [threads=all]
 * Prints one line: "sgemm N=2048 threads=2 median_s=... gflops=..." */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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
    double *t = malloc((size_t)reps * sizeof *t);
    if (!a || !b || !c || !t) {
        fprintf(stderr, "sgemm: out of memory for N=%d\n", n);
        return 1;
    }
    for (size_t i = 0; i < nn; i++) a[i] = (float)(i % 97) * 0.01f, b[i] = (float)(i % 89) * 0.01f, c[i] = 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmpd);
    double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    printf("sgemm N=%d threads=%d median_s=%.5f gflops=%.1f\n", n, th, med, 2.0 * n * (double)n * n / med * 1e-9);
    free(a), free(b), free(c), free(t);
    return 0;
}
