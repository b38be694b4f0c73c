/* Proves the FlashAttention kernels (tiled, online softmax, no T x T buffer)
 * compute the same causal attention as the naive kernels and as a textbook
 * triple loop in double: forward out and per-row log-sum-exp, backward dqkv.
 * Shapes cover T = 1, T below one tile, T = 65 / 200 / 257 (partial last
 * tiles, not multiples of the 64 tile), hs = 2, 4, 16, 32, 64 and 128;
 * 1, 2 and 3 OpenMP threads. Also: results repeat bitwise for a given thread
 * count; causality (changing a later token's k and v - by a lot, so its
 * scores would dominate any row that saw it - leaves every earlier row's
 * output, lse and dq bitwise unchanged). Outputs are pre-filled with NaN so
 * anything left unwritten shows up; scratch is allocated at exactly the
 * advertised size so ASan catches overruns. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"

static void expect_close_f(const char *what, const float *got, const float *want,
                           size_t n, int B, int T, int C, int NH, int nt) {
    double *w = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) w[i] = want[i];
    expect_close(what, got, w, n, B, T, C, NH, nt);
    free(w);
}

static float *nanbuf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* Rows [0, nrows) of a (rows, width) array, columns [c0, c0 + nc), bitwise. */
static int rows_equal(const float *a, const float *b, int nrows, int width, int c0, int nc) {
    for (int r = 0; r < nrows; r++)
        if (memcmp(a + (size_t)r * width + c0, b + (size_t)r * width + c0, (size_t)nc * sizeof(float)))
            return 0;
    return 1;
}

static void run(mf_rng *rng, int B, int T, int C, int NH, int nt) {
    omp_set_num_threads(nt);
    const int hs = C / NH;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t nlse = (size_t)B * NH * T, natt = (size_t)B * NH * T * T;
    const size_t nscr = mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads());
    const size_t nnscr = mf_attention_scratch_floats(T, omp_get_max_threads());
    float *qkv = malloc(nqkv * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *out = nanbuf(nout), *lse = nanbuf(nlse), *dqkv = nanbuf(nqkv), *scratch = nanbuf(nscr);
    float *out2 = nanbuf(nout), *lse2 = nanbuf(nlse), *dqkv2 = nanbuf(nqkv);
    float *nout_ = nanbuf(nout), *natt_ = nanbuf(natt), *ndqkv = nanbuf(nqkv), *nscratch = nanbuf(nnscr);
    double *dq = malloc(nqkv * sizeof(double)), *dd = malloc(nout * sizeof(double));
    double *rout = malloc(nout * sizeof(double)), *rlse = malloc(nlse * sizeof(double));
    double *rdqkv = malloc(nqkv * sizeof(double));
    for (size_t i = 0; i < nqkv; i++) dq[i] = qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dd[i] = dout[i] = mf_rng_normal(rng);

    attn_ref(dq, dd, rout, NULL, rlse, rdqkv, B, T, C, NH);
    mf_flash_attention_forward(out, lse, qkv, B, T, C, NH);
    mf_flash_attention_backward(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH);
    expect_close("out", out, rout, nout, B, T, C, NH, nt);
    expect_close("lse", lse, rlse, nlse, B, T, C, NH, nt);
    expect_close("dqkv", dqkv, rdqkv, nqkv, B, T, C, NH, nt);

    /* against the naive fp32 kernels */
    mf_attention_forward(nout_, natt_, qkv, B, T, C, NH);
    mf_attention_backward(ndqkv, nscratch, dout, qkv, natt_, B, T, C, NH);
    expect_close_f("out vs naive", out, nout_, nout, B, T, C, NH, nt);
    expect_close_f("dqkv vs naive", dqkv, ndqkv, nqkv, B, T, C, NH, nt);

    /* deterministic for a given thread count (scratch left dirty) */
    mf_flash_attention_forward(out2, lse2, qkv, B, T, C, NH);
    mf_flash_attention_backward(dqkv2, scratch, dout, out2, qkv, lse2, B, T, C, NH);
    CHECK(!memcmp(out, out2, nout * sizeof(float)) && !memcmp(lse, lse2, nlse * sizeof(float)) &&
          !memcmp(dqkv, dqkv2, nqkv * sizeof(float)),
          "not bitwise repeatable B=%d T=%d C=%d NH=%d threads=%d", B, T, C, NH, nt);

    /* causality: change token t0's k and v (all heads) to large values */
    if (T > 1) {
        const int t0 = T / 2 + 1 < T ? T / 2 + 1 : T - 1;
        for (int b = 0; b < B; b++) {
            float *row = qkv + ((size_t)b * T + t0) * 3 * C;
            for (int c = C; c < 3 * C; c++) row[c] = 20.0f * (c & 1 ? 1.0f : -1.0f) + row[c];
        }
        for (size_t i = 0; i < nout; i++) out2[i] = NAN;
        for (size_t i = 0; i < nlse; i++) lse2[i] = NAN;
        for (size_t i = 0; i < nqkv; i++) dqkv2[i] = NAN;
        mf_flash_attention_forward(out2, lse2, qkv, B, T, C, NH);
        mf_flash_attention_backward(dqkv2, scratch, dout, out2, qkv, lse2, B, T, C, NH);
        int ok = 1;
        for (int b = 0; b < B; b++) {
            ok &= rows_equal(out + (size_t)b * T * C, out2 + (size_t)b * T * C, t0, C, 0, C);
            ok &= rows_equal(dqkv + (size_t)b * T * 3 * C, dqkv2 + (size_t)b * T * 3 * C, t0, 3 * C, 0, C);
            for (int h = 0; h < NH; h++)
                ok &= !memcmp(lse + ((size_t)b * NH + h) * T, lse2 + ((size_t)b * NH + h) * T,
                              (size_t)t0 * sizeof(float));
        }
        /* and token t0's own output did change (the test can fail) */
        ok &= memcmp(out + (size_t)t0 * C, out2 + (size_t)t0 * C, (size_t)C * sizeof(float)) != 0;
        CHECK(ok, "causality: rows before t0=%d changed (or t0 did not) B=%d T=%d C=%d NH=%d threads=%d",
              t0, B, T, C, NH, nt);
    }

    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(scratch);
    free(out2); free(lse2); free(dqkv2);
    free(nout_); free(natt_); free(ndqkv); free(nscratch);
    free(dq); free(dd); free(rout); free(rlse); free(rdqkv);
}

int main(void) {
    mf_rng rng;
    mf_rng_seed(&rng, 1234);
    const int nt0 = omp_get_max_threads();
    static const int shapes[][4] = { /* B, T, C, NH */
        {2, 7, 12, 3}, {1, 1, 8, 2}, {2, 65, 64, 4}, {1, 200, 96, 3}, {1, 257, 128, 2},
        {1, 64, 20, 1}, {3, 130, 30, 5},
    };
    for (int nt = 1; nt <= 3; nt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            run(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], nt);
    /* scratch is O(tile) per thread, not O(T^2) */
    CHECK(mf_flash_attention_scratch_floats(2048, 64, 1) < 2048u * 64u,
          "scratch grows like T^2: %zu", mf_flash_attention_scratch_floats(2048, 64, 1));
    omp_set_num_threads(nt0);
    return mf_test_done("test_flash_attention_matches_naive");
}
