/* The bf16 and fp16 kernels (src/kernels/mixed.c) against the fp32 ones,
 * within the tolerances docs/precision.md states:
 *  - LayerNorm: mean and rstd bit-identical to mf_layernorm_forward; each
 *    16-bit output within one 16-bit ulp (relative 2^-8 bf16, 2^-11 fp16)
 *    of the fp32 output; GELU likewise; the embedding exact against fp32
 *    on the widened wte;
 *  - GEMMs (every transpose, bias, accumulate; the block matmuls' forward
 *    and backward; the tied head): against a double product of the same
 *    16-bit operands within 1e-5 x sum|a||b| (fp32 accumulation only), and
 *    against the fp32 kernels on the unrounded operands within
 *    2u x sum|a||b| (u = 2^-8 bf16, 2^-11 fp16: both operands rounded);
 *    bias gradients bit-identical to the fp32 kernel (same fp32 sum). */
#include "kernels/half.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void fill(float *x, size_t n, float sc, uint64_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = sc * rnd(&seed);
}

static const char *dname(mf_dtype dt) { return dt == MF_DTYPE_BF16 ? "bf16" : "fp16"; }
static double ulp16(mf_dtype dt) { return dt == MF_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048; }

/* x rounded to 16 bits and widened back */
static void round_trip(mf_dtype dt, float *w, uint16_t *h, const float *x, size_t n) {
    mf_half_from_f32(dt, h, x, n);
    mf_f32_from_half(dt, w, h, n);
}

static int bad;

/* got vs ref within tol x |ref| + tiny, element-wise */
static void close_rel(const char *what, mf_dtype dt, const float *got, const float *ref, size_t n, double tol) {
    size_t worst = 0;
    double we = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) - tol * fabs((double)ref[i]) - 1e-30;
        if (e > we) we = e, worst = i;
    }
    if (we > 0) bad++;
    CHECK(we <= 0, "%s %s: element %zu %.9g vs %.9g exceeds %.3g relative", dname(dt), what, worst,
          (double)got[worst], (double)ref[worst], tol);
}

/* C (M,N) = op(A) @ op(B): got vs double reference ref, bound tol x absref */
static void gemm_ref(const float *A, const float *B, int M, int N, int K, int tA, int tB, double *ref, double *absref) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double a = tA ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tB ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                s += a * b;
                sa += fabs(a * b);
            }
            ref[(size_t)i * N + j] = s;
            absref[(size_t)i * N + j] = sa;
        }
}

static void close_abs(const char *what, mf_dtype dt, const float *got, const double *ref, const double *absref, size_t n,
                      double tol) {
    size_t worst = 0;
    double we = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) - tol * absref[i] - 1e-30;
        if (e > we) we = e, worst = i;
    }
    if (we > 0) bad++;
    CHECK(we <= 0, "%s %s: element %zu %.9g vs %.9g (sum|ab| %.3g) exceeds %.3g", dname(dt), what, worst,
          (double)got[worst], ref[worst], absref[worst], tol);
}

static void test_gemm(mf_dtype dt) {
    const int M = 37, N = 70, K = 129;  /* K over the fp16 path's 128-row blocks */
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *Aw = malloc(na * 4), *Bw = malloc(nb * 4);
    uint16_t *Ah = malloc(na * 2), *Bh = malloc(nb * 2);
    float *C = malloc(nc * 4), *C0 = malloc(nc * 4), *bias = malloc((size_t)N * 4);
    double *ref = malloc(nc * 8), *absref = malloc(nc * 8);
    fill(A, na, 1.5f, 1);
    fill(B, nb, 0.7f, 2);
    fill(C0, nc, 3.0f, 3);
    fill(bias, (size_t)N, 0.5f, 4);
    round_trip(dt, Aw, Ah, A, na);
    round_trip(dt, Bw, Bh, B, nb);
    for (int tA = 0; tA < 2; tA++)
        for (int tB = 0; tB < 2; tB++)
            for (int acc = 0; acc < 2; acc++)
                for (int bi = 0; bi < 2; bi++) {
                    size_t sb = mf_gemm16_scratch_bytes(dt, M, N, K, tA, tB, acc, bi);
                    CHECK(sb != SIZE_MAX, "%s scratch size", dname(dt));
                    void *s = malloc(sb ? sb : 1);
                    memcpy(C, C0, nc * 4);
                    mf_gemm16(dt, C, Ah, Bh, bi ? bias : NULL, M, N, K, tA, tB, acc, s, sb ? sb : 1);
                    gemm_ref(Aw, Bw, M, N, K, tA, tB, ref, absref);
                    for (size_t i = 0; i < nc; i++) {
                        ref[i] += (acc ? C0[i] : 0.0) + (bi ? bias[i % N] : 0.0);
                        absref[i] += (acc ? fabs(C0[i]) : 0.0) + (bi ? fabs(bias[i % N]) : 0.0);
                    }
                    char what[64];
                    snprintf(what, sizeof what, "gemm tA%d tB%d acc%d bias%d", tA, tB, acc, bi);
                    close_abs(what, dt, C, ref, absref, nc, 1e-5);
                    free(s);
                }
    free(A); free(B); free(Aw); free(Bw); free(Ah); free(Bh); free(C); free(C0); free(bias); free(ref); free(absref);
}

static void test_layers(mf_dtype dt) {
    const int B = 2, T = 9, C = 48, OC = 96, N = B * T, V = 40, Vp = 64;
    size_t nx = (size_t)N * C, nw = (size_t)C * OC, ny = (size_t)N * OC;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *lw = malloc(C * 4), *lb = malloc(C * 4), *bias = malloc(OC * 4);
    float *ref = malloc(ny * 4), *got = malloc(ny * 4), *xw = malloc(nx * 4), *ww = malloc(nw * 4);
    float *m0 = malloc(N * 4), *r0 = malloc(N * 4), *m1 = malloc(N * 4), *r1 = malloc(N * 4);
    uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2), *h = malloc(ny * 2);
    fill(x, nx, 2.0f, 11);
    for (size_t i = 0; i < nx; i++) x[i] += 3.0f;  /* a large mean */
    fill(w, nw, 0.2f, 12);
    fill(lw, C, 1.0f, 13);
    fill(lb, C, 0.3f, 14);
    fill(bias, OC, 0.1f, 15);

    /* LayerNorm */
    mf_layernorm_forward(ref, m0, r0, x, lw, lb, N, C);
    mf_layernorm_forward16(h, dt, m1, r1, x, lw, lb, N, C);
    mf_f32_from_half(dt, got, h, nx);
    CHECK(memcmp(m0, m1, N * 4) == 0 && memcmp(r0, r1, N * 4) == 0, "%s layernorm: statistics differ from fp32", dname(dt));
    close_rel("layernorm", dt, got, ref, nx, ulp16(dt));

    /* GELU */
    mf_gelu_forward(ref, x, nx);
    mf_gelu_forward16(h, dt, x, nx);
    mf_f32_from_half(dt, got, h, nx);
    close_rel("gelu", dt, got, ref, nx, ulp16(dt));

    /* matmul forward and backward: x (N,C) @ w (C,OC) */
    round_trip(dt, xw, xh, x, nx);
    round_trip(dt, ww, wh, w, nw);
    size_t sb = 0;
    int shp[3][5] = {{N, OC, C, 0, 0}, {C, OC, N, 1, 0}, {N, C, OC, 0, 1}};
    for (int k = 0; k < 3; k++) {
        size_t s = mf_gemm16_scratch_bytes(dt, shp[k][0], shp[k][1], shp[k][2], shp[k][3], shp[k][4], k != 2, k == 0);
        size_t s2 = mf_gemm16_scratch_bytes(dt, shp[k][0], shp[k][1], shp[k][2], shp[k][3], shp[k][4], k == 0 ? 1 : k != 2, 0);
        if (s > sb) sb = s;
        if (s2 > sb) sb = s2;
    }
    size_t sv = mf_gemm16_scratch_bytes(dt, N, Vp, C, 0, 1, 0, 0);
    if (sv > sb) sb = sv;
    sv = mf_gemm16_scratch_bytes(dt, N, C, Vp, 0, 0, 0, 0);
    if (sv > sb) sb = sv;
    sv = mf_gemm16_scratch_bytes(dt, Vp, C, N, 1, 0, 1, 0);
    if (sv > sb) sb = sv;
    void *scr = malloc(sb ? sb : 1);
    if (!sb) sb = 1;
    mf_matmul_forward(ref, xw, ww, bias, N, C, OC, 0);
    mf_matmul16_forward(dt, got, xh, wh, bias, N, C, OC, 0, scr, sb);
    close_rel("matmul forward (same operands)", dt, got, ref, ny, 1e-4);
    /* against the unrounded fp32 operands: sum|x||w| bound */
    double *dref = malloc(ny * 8), *dabs = malloc(ny * 8);
    gemm_ref(x, w, N, OC, C, 0, 0, dref, dabs);
    for (size_t i = 0; i < ny; i++) dref[i] += bias[i % OC], dabs[i] += fabs(bias[i % OC]);
    close_abs("matmul forward vs fp32 operands", dt, got, dref, dabs, ny, 2 * ulp16(dt));

    float *dout = malloc(ny * 4), *doutw = malloc(ny * 4), *dinp0 = malloc(nx * 4), *dinp1 = malloc(nx * 4);
    float *dw0 = calloc(nw, 4), *dw1 = calloc(nw, 4), *db0 = calloc(OC, 4), *db1 = calloc(OC, 4);
    uint16_t *d16 = malloc(ny * 2);
    fill(dout, ny, 0.05f, 16);
    round_trip(dt, doutw, d16, dout, ny);
    mf_matmul_backward(dinp0, dw0, db0, doutw, xw, ww, N, C, OC);
    /* dbias from the fp32 dout: the fp32 kernel's sum */
    memset(db0, 0, OC * 4);
    float *dummy = calloc(nw, 4), *dummyi = malloc(nx * 4);
    mf_matmul_backward(dummyi, dummy, db0, dout, xw, ww, N, C, OC);
    mf_matmul16_backward(dt, dinp1, dw1, 0, db1, dout, d16, xh, wh, N, C, OC, scr, sb);
    close_rel("matmul backward dinp", dt, dinp1, dinp0, nx, 1e-4);
    close_rel("matmul backward dw", dt, dw1, dw0, nw, 1e-4);
    CHECK(memcmp(db0, db1, OC * 4) == 0, "%s matmul backward: bias gradient differs from fp32's", dname(dt));
    if (memcmp(db0, db1, OC * 4)) bad++;

    /* tied head: logits (N,Vp) = x @ wte^T, wte (Vp,C) */
    size_t ne = (size_t)Vp * C, nl = (size_t)N * Vp;
    float *wte = malloc(ne * 4), *wtew = malloc(ne * 4), *lg0 = malloc(nl * 4), *lg1 = malloc(nl * 4);
    uint16_t *wteh = malloc(ne * 2), *dl16 = malloc(nl * 2);
    fill(wte, ne, 0.1f, 17);
    for (size_t i = (size_t)V * C; i < ne; i++) wte[i] = 0.0f;
    round_trip(dt, wtew, wteh, wte, ne);
    mf_classifier_forward(lg0, xw, wtew, N, C, Vp);
    mf_classifier16_forward(dt, lg1, xh, wteh, N, C, Vp, scr, sb);
    close_rel("classifier forward", dt, lg1, lg0, nl, 1e-4);
    float *dl = malloc(nl * 4), *dlw = malloc(nl * 4), *dx0 = malloc(nx * 4), *dx1 = malloc(nx * 4);
    float *dwte0 = calloc(ne, 4), *dwte1 = calloc(ne, 4);
    fill(dl, nl, 0.01f, 18);
    round_trip(dt, dlw, dl16, dl, nl);
    mf_classifier_backward(dx0, dwte0, dlw, xw, wtew, N, C, Vp);
    mf_classifier16_backward(dt, dx1, dwte1, 0, dl, dl16, xh, wteh, N, C, Vp, scr, sb);
    close_rel("classifier backward dx", dt, dx1, dx0, nx, 1e-4);
    close_rel("classifier backward dwte", dt, dwte1, dwte0, ne, 1e-4);

    /* embedding: exact against fp32 on the widened table */
    int32_t *ids = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) ids[i] = (i * 7) % V;
    float *wpe = malloc((size_t)T * C * 4), *e0 = malloc(nx * 4), *e1 = malloc(nx * 4);
    fill(wpe, (size_t)T * C, 0.1f, 19);
    mf_encoder_forward(e0, ids, wtew, wpe, B, T, C);
    mf_encoder_forward16(e1, ids, wteh, dt, wpe, B, T, C);
    CHECK(memcmp(e0, e1, nx * 4) == 0, "%s embedding differs from fp32 on the widened table", dname(dt));

    free(x); free(w); free(lw); free(lb); free(bias); free(ref); free(got); free(xw); free(ww);
    free(m0); free(r0); free(m1); free(r1); free(xh); free(wh); free(h); free(scr); free(dref); free(dabs);
    free(dout); free(doutw); free(dinp0); free(dinp1); free(dw0); free(dw1); free(db0); free(db1); free(d16);
    free(dummy); free(dummyi); free(wte); free(wtew); free(lg0); free(lg1); free(wteh); free(dl16); free(dl); free(dlw);
    free(dx0); free(dx1); free(dwte0); free(dwte1); free(ids); free(wpe); free(e0); free(e1);
}

/* grad_dtype bf16: a weight gradient's GEMM writing a bf16 row equals the
 * fp32 GEMM's result (the same operands, starting from the widened old
 * values) rounded to nearest-even, element for element; K is the rows of
 * the micro-batch. Large K: the fp32 result may be summed in K blocks
 * (dnnl_mm.c) and the bf16 one not, so there within one bf16 place. */
static void test_grad16(void) {
    static const int shp[][4] = {{96, 160, 64, 0}, {64, 96, 200, 1}, {48, 80, 2304, 0}};  /* M, N, K, start nonzero */
    for (int k = 0; k < 3; k++) {
        int M = shp[k][0], N = shp[k][1], K = shp[k][2];
        size_t na = (size_t)K * M, nb = (size_t)K * N, nc = (size_t)M * N;
        float *a = malloc(na * 4), *b = malloc(nb * 4), *aw = malloc(na * 4), *bw = malloc(nb * 4);
        float *c32 = malloc(nc * 4), *old = malloc(nc * 4);
        uint16_t *ah = malloc(na * 2), *bh = malloc(nb * 2), *c16 = malloc(nc * 2), *oldh = malloc(nc * 2);
        fill(a, na, 0.5f, 31 + k);
        fill(b, nb, 0.02f, 41 + k);
        fill(old, nc, shp[k][3] ? 0.05f : 0.0f, 51 + k);
        round_trip(MF_DTYPE_BF16, aw, ah, a, na);
        round_trip(MF_DTYPE_BF16, bw, bh, b, nb);
        round_trip(MF_DTYPE_BF16, c32, oldh, old, nc);  /* c32 = the old values widened */
        memcpy(c16, oldh, nc * 2);
        size_t sb = mf_gemm16_scratch_bytes(MF_DTYPE_BF16, M, N, K, 1, 0, 1, 0);
        size_t s2 = mf_gemm_bf16_scratch_bytes(M, N, K, 1, 0, 1, 1, 0);
        if (s2 > sb) sb = s2;
        void *scr = malloc(sb ? sb : 1);
        /* dW (M,N) += A^T B, A stored (K,M): the layers' and the head's form */
        mf_gemm16_dw(MF_DTYPE_BF16, c32, 0, ah, bh, M, N, K, 1, 0, scr, sb ? sb : 1);
        mf_gemm16_dw(MF_DTYPE_BF16, c16, 1, ah, bh, M, N, K, 1, 0, scr, sb ? sb : 1);
        size_t diff = 0, far = 0;
        double mx = 0;
        for (size_t i = 0; i < nc; i++) mx = fmax(mx, fabs(c32[i]));
        for (size_t i = 0; i < nc; i++) {
            uint16_t want = mf_f32_to_bf16(c32[i]);
            if (c16[i] != want) {
                diff++;
                /* one bf16 place of the value, plus fp32 round-off of the
                 * largest sum (an element near zero may change sign) */
                if (fabs(mf_bf16_to_f32(c16[i]) - c32[i]) > fabs(c32[i]) / 256 + mx * 0x1p-16) far++;
            }
        }
        int exact = K <= 1024;
        CHECK(exact ? diff == 0 : far == 0, "bf16 gradient %dx%dx%d (start %s): %zu of %zu differ from the fp32 "
              "gradient rounded, %zu by more than one bf16 place", M, N, K, shp[k][3] ? "nonzero" : "zero", diff, nc, far);
        if (exact ? diff : far) bad++;
        printf("bf16 gradient %dx%dx%d (start %s): %zu of %zu elements differ from the fp32 gradient rounded to "
               "nearest-even%s\n", M, N, K, shp[k][3] ? "nonzero" : "zero", diff, nc, exact ? "" : " (K blocked, within one place)");
        free(a); free(b); free(aw); free(bw); free(c32); free(old); free(ah); free(bh); free(c16); free(oldh); free(scr);
    }
}

int main(void) {
    mf_dtype dts[2] = {MF_DTYPE_BF16, MF_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        test_gemm(dts[i]);
        test_layers(dts[i]);
    }
    test_grad16();
    return mf_test_done("test_precision_kernels");
}
