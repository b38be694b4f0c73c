/* Proves the nn.Linear-layout frozen-base GEMMs of quant/quant.h
 * (mf_quant_linear_forward / _backward_input: W (N,K), row n = output n's K
 * weights, as Hugging Face's Llama stores it) compute what they say, for
 * fp32, bf16, int8 and nf4 weights, at SmolLM2-135M's shapes (K=576,
 * N=192; K=1536, N=576) and odd ones (K, N not multiples of the tile, the
 * block or 2; N past one and two tiles; M = 1 and 37), bias on and off,
 * beta 0 and 1:
 *  - out[:, 0:N) = beta * out + inp @ W^T (+ bias) and dinp += dout @ W,
 *    where W is the whole matrix dequantised by mf_quant_unpack, summed here
 *    in double: every element within 1e-5 of the sum of |terms|; beta = 0
 *    starts out as NaN (never read), beta = 1 starts it random;
 *  - out has ldo > N and dout ldd > N: out's columns past N keep their
 *    bytes, dout's (NaN) are never read;
 *  - the scratch is min(N, tile) * K floats (a tile of rows, never the
 *    whole matrix once N exceeds the tile; fp32 none): malloc'ed exactly that
 *    size (ASan in the sanitizer build), then again between guard bytes
 *    before and after it that must stay intact, with bitwise the same
 *    results;
 *  - 1, 2 and 5 OpenMP threads give the same results within fp32 round-off
 *    (the scratch and the columns are split between them);
 *  - the new forward / backward equal the Conv1D kernels
 *    (mf_quant_matmul_*) run on the transposed matrix within round-off:
 *    fp32 and bf16 transposed and packed in the same kind (per-value formats,
 *    the same values), int8 and nf4 (whose blocks run along the other axis)
 *    through the dequantised transpose as fp32. */
#include "memfit/core.h"
#include "quant/quant.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static mf_rng rng;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

static float *randn(size_t n, float s) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = s * mf_rng_normal(&rng);
    return x;
}

/* worst |got - want| / (sum |terms|) over M rows of n columns */
static double worst_rel(const float *got, int ldg, const double *want, const double *mag, int M, int n) {
    double w = 0;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < n; j++) {
            float g = got[(size_t)m * ldg + j];
            double a = mag[(size_t)m * n + j];
            double e = isnan(g) ? INFINITY : fabs(g - want[(size_t)m * n + j]) / (a > 0 ? a : 1);
            w = fmax(w, e);
        }
    return w;
}

#define NTHR 3
static const int threads[NTHR] = {1, 2, 5};

static void check_shape(mf_quant_kind k, int M, int K, int N, int with_bias, float beta) {
    const char *kn = mf_quant_name(k);
    int ldo = N + 1 + 2 * with_bias, ldd = N + (beta != 0.0f ? 5 : 0);
    size_t nw = (size_t)N * K;
    float *w = randn(nw, 0.02f), *inp = randn((size_t)M * K, 1.0f);
    float *bias = with_bias ? randn((size_t)N, 0.1f) : NULL;
    float *dout = xmalloc((size_t)M * ldd * sizeof(float)), *doutd = randn((size_t)M * N, 1.0f);
    for (int m = 0; m < M; m++)
        for (int j = 0; j < ldd; j++) dout[(size_t)m * ldd + j] = j < N ? doutd[(size_t)m * N + j] : NAN;
    float *out0 = randn((size_t)M * ldo, 1.0f), *dinp0 = randn((size_t)M * K, 1.0f);
    for (int m = 0; m < M; m++) {
        for (int j = N; j < ldo; j++) out0[(size_t)m * ldo + j] = 12345.0f + j; /* must keep these bytes */
        if (beta == 0.0f)
            for (int j = 0; j < N; j++) out0[(size_t)m * ldo + j] = NAN; /* must never be read */
    }
    void *wq = xmalloc(mf_quant_bytes(k, (int64_t)nw));
    mf_quant_pack(k, wq, w, (int64_t)nw);
    float *wd = xmalloc(nw * sizeof(float)); /* the reference's whole dequantised matrix */
    mf_quant_unpack(k, wd, wq, 0, (int64_t)nw);

    /* the reference in double, with sum |terms| per element */
    double *fw = xmalloc((size_t)M * N * sizeof(double)), *fa = xmalloc((size_t)M * N * sizeof(double));
    double *bw = xmalloc((size_t)M * K * sizeof(double)), *ba = xmalloc((size_t)M * K * sizeof(double));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0, a = bias ? fabs(bias[n]) : 0;
            if (beta != 0.0f) {
                s += beta * (double)out0[(size_t)m * ldo + n];
                a += fabs(beta * (double)out0[(size_t)m * ldo + n]);
            }
            for (int kk = 0; kk < K; kk++) {
                double t = (double)inp[(size_t)m * K + kk] * wd[(size_t)n * K + kk];
                s += t;
                a += fabs(t);
            }
            fw[(size_t)m * N + n] = s;
            fa[(size_t)m * N + n] = a;
        }
    for (int m = 0; m < M; m++) {
        for (int kk = 0; kk < K; kk++) {
            bw[(size_t)m * K + kk] = dinp0[(size_t)m * K + kk];
            ba[(size_t)m * K + kk] = fabs(dinp0[(size_t)m * K + kk]);
        }
        for (int n = 0; n < N; n++) {
            double d = doutd[(size_t)m * N + n];
            for (int kk = 0; kk < K; kk++) {
                double t = d * wd[(size_t)n * K + kk];
                bw[(size_t)m * K + kk] += t;
                ba[(size_t)m * K + kk] += fabs(t);
            }
        }
    }

    size_t sb = mf_quant_linear_scratch_bytes(k, M, K, N);
    if (k == MF_QUANT_F32) CHECK(sb == 0, "fp32 needs no scratch, got %zu", sb);
    else CHECK(sb == (size_t)(N < MF_QUANT_TILE_ROWS ? N : MF_QUANT_TILE_ROWS) * K * 4,
               "%s M=%d K=%d N=%d: scratch %zu bytes is not one tile of rows", kn, M, K, N, sb);
    if (N > MF_QUANT_TILE_ROWS) CHECK(sb < nw * 4, "%s: scratch holds the whole matrix", kn);

    size_t no = (size_t)M * ldo, nd = (size_t)M * K;
    float *out[NTHR], *dinp[NTHR];
    double worst_f = 0, worst_b = 0, thr_f = 0, thr_b = 0;
    int saved = omp_get_max_threads();
    for (int ti = 0; ti < NTHR; ti++) {
        omp_set_num_threads(threads[ti]);
        out[ti] = xmalloc(no * sizeof(float));
        dinp[ti] = xmalloc(nd * sizeof(float));
        memcpy(out[ti], out0, no * sizeof(float));
        memcpy(dinp[ti], dinp0, nd * sizeof(float));
        void *scratch = sb ? xmalloc(sb) : NULL; /* exactly sb bytes: ASan catches any overrun */
        mf_quant_linear_forward(out[ti], ldo, inp, wq, bias, M, K, N, beta, k, scratch);
        mf_quant_linear_backward_input(dinp[ti], dout, ldd, wq, M, K, N, k, scratch);
        free(scratch);
        worst_f = fmax(worst_f, worst_rel(out[ti], ldo, fw, fa, M, N));
        worst_b = fmax(worst_b, worst_rel(dinp[ti], K, bw, ba, M, K));
        int kept = 1;
        for (int m = 0; m < M; m++)
            kept &= !memcmp(out[ti] + (size_t)m * ldo + N, out0 + (size_t)m * ldo + N, (size_t)(ldo - N) * 4);
        CHECK(kept, "%s M=%d K=%d N=%d threads %d: out's columns past N (ldo %d) were written", kn, M, K, N,
              threads[ti], ldo);

        /* again between guard bytes: nothing outside [0, sb) is touched, and
         * the same thread count gives bitwise the same result */
        uint8_t *g = xmalloc(sb + 512);
        memset(g, 0xa5, 256);
        memset(g + 256 + sb, 0xa5, 256);
        float *o2 = xmalloc(no * sizeof(float)), *d2 = xmalloc(nd * sizeof(float));
        memcpy(o2, out0, no * sizeof(float));
        memcpy(d2, dinp0, nd * sizeof(float));
        mf_quant_linear_forward(o2, ldo, inp, wq, bias, M, K, N, beta, k, g + 256);
        mf_quant_linear_backward_input(d2, dout, ldd, wq, M, K, N, k, g + 256);
        int touched = 0;
        for (int i = 0; i < 256; i++) touched += (g[i] != 0xa5) + (g[256 + sb + i] != 0xa5);
        CHECK(touched == 0, "%s M=%d K=%d N=%d threads %d: %d guard bytes around the scratch were written", kn, M,
              K, N, threads[ti], touched);
        CHECK(!memcmp(o2, out[ti], no * 4) && !memcmp(d2, dinp[ti], nd * 4),
              "%s M=%d K=%d N=%d threads %d: a second call differs", kn, M, K, N, threads[ti]);
        free(g);
        free(o2);
        free(d2);
        if (ti > 0) { /* against 1 thread, relative to sum |terms| */
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    size_t i = (size_t)m * ldo + n;
                    thr_f = fmax(thr_f, fabs((double)out[ti][i] - out[0][i]) / fa[(size_t)m * N + n]);
                }
            for (size_t i = 0; i < nd; i++) thr_b = fmax(thr_b, fabs((double)dinp[ti][i] - dinp[0][i]) / ba[i]);
        }
    }
    omp_set_num_threads(saved);
    CHECK(worst_f <= 1e-5, "%s M=%d K=%d N=%d bias=%d beta=%g: forward off by %g (relative to sum |terms|)", kn, M,
          K, N, with_bias, beta, worst_f);
    CHECK(worst_b <= 1e-5, "%s M=%d K=%d N=%d: backward_input off by %g", kn, M, K, N, worst_b);
    CHECK(thr_f <= 1e-6 && thr_b <= 1e-6, "%s M=%d K=%d N=%d: 2 or 5 threads differ from 1 by %g / %g", kn, M, K,
          N, thr_f, thr_b);

    /* the Conv1D kernels on the transposed matrix (beta 0 only: they overwrite) */
    double old_f = 0, old_b = 0;
    if (beta == 0.0f) {
        mf_quant_kind kc = k == MF_QUANT_F32 || k == MF_QUANT_BF16 ? k : MF_QUANT_F32;
        const float *src = kc == k ? w : wd;
        float *wt = xmalloc(nw * sizeof(float));
        for (int n = 0; n < N; n++)
            for (int kk = 0; kk < K; kk++) wt[(size_t)kk * N + n] = src[(size_t)n * K + kk];
        void *wtq = xmalloc(mf_quant_bytes(kc, (int64_t)nw));
        mf_quant_pack(kc, wtq, wt, (int64_t)nw);
        size_t sbc = mf_quant_matmul_scratch_bytes(kc, M, K, N);
        void *sc = sbc ? xmalloc(sbc) : NULL;
        float *oc = xmalloc((size_t)M * N * sizeof(float)), *dc = xmalloc(nd * sizeof(float));
        memcpy(dc, dinp0, nd * sizeof(float));
        mf_quant_matmul_forward(oc, inp, wtq, bias, M, K, N, kc, sc);
        mf_quant_matmul_backward_input(dc, doutd, wtq, M, K, N, kc, sc);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                old_f = fmax(old_f, fabs((double)out[0][(size_t)m * ldo + n] - oc[(size_t)m * N + n]) /
                                        fa[(size_t)m * N + n]);
        for (size_t i = 0; i < nd; i++) old_b = fmax(old_b, fabs((double)dinp[0][i] - dc[i]) / ba[i]);
        CHECK(old_f <= 1e-5 && old_b <= 1e-5, "%s M=%d K=%d N=%d: differs from the Conv1D kernel by %g / %g", kn,
              M, K, N, old_f, old_b);
        free(wt);
        free(wtq);
        free(sc);
        free(oc);
        free(dc);
    }
    printf("%-4s M=%-2d K=%-4d N=%-3d bias=%d beta=%g scratch %7zu B: fwd %.1e bwd %.1e | 2,5 thr vs 1 %.1e %.1e"
           " | vs Conv1D %.1e %.1e\n",
           kn, M, K, N, with_bias, beta, sb, worst_f, worst_b, thr_f, thr_b, old_f, old_b);

    for (int ti = 0; ti < NTHR; ti++) {
        free(out[ti]);
        free(dinp[ti]);
    }
    free(w);
    free(inp);
    free(bias);
    free(dout);
    free(doutd);
    free(out0);
    free(dinp0);
    free(wq);
    free(wd);
    free(fw);
    free(fa);
    free(bw);
    free(ba);
}

int main(void) {
    mf_rng_seed(&rng, 12);
    const mf_quant_kind ks[] = {MF_QUANT_F32, MF_QUANT_BF16, MF_QUANT_INT8, MF_QUANT_NF4};
    const int shapes[][3] = {
        {37, 576, 192}, /* SmolLM2-135M k_proj / v_proj */
        {1, 1536, 576}, /* SmolLM2-135M down_proj, one token */
        {37, 300, 259}, /* N one past a tile; K not a block multiple: rows start mid-block */
        {37, 65, 513},  /* N two tiles and one row */
        {1, 257, 67},
        {37, 7, 9},     /* under a tile and a block */
        {1, 1, 1},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int k = 0; k < 4; k++)
            for (int b = 0; b < 2; b++)
                for (int beta = 0; beta < 2; beta++)
                    check_shape(ks[k], shapes[s][0], shapes[s][1], shapes[s][2], b, (float)beta);
    return mf_test_done("test_quant_linear");
}
