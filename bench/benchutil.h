/* Timing helpers shared by the C benchmarks in bench/ (not a test, not
 * part of libmemfit): wall and process-CPU clocks and a median. */
#ifndef MEMFIT_BENCHUTIL_H
#define MEMFIT_BENCHUTIL_H
#include <stdlib.h>
#include <time.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* CPU seconds of the whole process (all threads): on a shared machine,
 * work per CPU-second compares kernels without the time other tenants take
 * (spin-waiting threads count as busy) */
static inline double bench_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline int bench_cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* sorts v in place */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
#endif
