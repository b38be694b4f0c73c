/* Proves the BLAS-based attention kernels agree with the textbook triple
 * loop (computed in double) for edge and ordinary shapes: T = 1 (a single
 * token attends only to itself), T = 5 (not a power of two), T = 64; one
 * head and four heads; 1, 2 and 3 OpenMP threads (3 exceeds the cores of a
 * small machine and the number of (b, h) tasks of some shapes). Outputs
 * are pre-filled with NaN so anything left unwritten shows up, and scratch
 * is allocated at exactly the advertised size so ASan catches overruns. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"

static void run(mf_rng *rng, int B, int T, int C, int NH, int nt) {
    omp_set_num_threads(nt);
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T;
    const size_t nscr = mf_attention_scratch_floats(T, omp_get_max_threads());
    float *qkv = malloc(nqkv * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *out = malloc(nout * sizeof(float)), *att = malloc(natt * sizeof(float));
    float *dqkv = malloc(nqkv * sizeof(float)), *scratch = malloc(nscr * sizeof(float));
    double *dq = malloc(nqkv * sizeof(double)), *dd = malloc(nout * sizeof(double));
    double *rp = malloc(natt * sizeof(double)), *rout = malloc(nout * sizeof(double));
    double *rdqkv = malloc(nqkv * sizeof(double));
    for (size_t i = 0; i < nqkv; i++) dq[i] = qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dd[i] = dout[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) out[i] = NAN;
    for (size_t i = 0; i < natt; i++) att[i] = NAN;
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = NAN;
    for (size_t i = 0; i < nscr; i++) scratch[i] = NAN;

    attn_ref(dq, dd, rout, rp, NULL, rdqkv, B, T, C, NH);
    mf_attention_forward(out, att, qkv, B, T, C, NH);
    mf_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    expect_close("out", out, rout, nout, B, T, C, NH, nt);
    expect_close("att", att, rp, natt, B, T, C, NH, nt);
    expect_close("dqkv", dqkv, rdqkv, nqkv, B, T, C, NH, nt);
    free(qkv); free(dout); free(out); free(att); free(dqkv); free(scratch);
    free(dq); free(dd); free(rp); free(rout); free(rdqkv);
}

int main(void) {
    mf_rng rng;
    mf_rng_seed(&rng, 42);
    const int nt0 = omp_get_max_threads();
    static const int shapes[][4] = { /* B, T, C, NH */
        {1, 1, 8, 1},  {2, 1, 16, 4}, {2, 5, 16, 1}, {2, 5, 32, 4},
        {1, 64, 16, 1}, {2, 64, 64, 4}, {3, 64, 48, 4}, {4, 32, 64, 8},
    };
    for (int nt = 1; nt <= 3; nt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            run(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], nt);
    omp_set_num_threads(nt0);
    return mf_test_done("test_attention_matches_naive");
}
