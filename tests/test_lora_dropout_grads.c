/* The LoRA kernels with dropout on: the backward uses the forward's mask.
 * With loss = sum(w * out), out += s * dropout(x) @ A^T @ B^T is linear in
 * each of x, A and B, so a central difference equals the derivative up to
 * fp32 rounding; every element of dA, dB and dx is checked against one
 * (computed in double from the kernel's own forward). Also: the mask keeps
 * a fraction 1-p of the elements (within 1% at p = 0.3 over 10^5), kept
 * values are scaled by 1/(1-p), and a different seed draws another mask. */
#include "memfit/core.h"
#include "memfit/lora.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 6, IN = 10, OUT = 7, R = 3 };
static const float S = 1.75f, P = 0.3f;
static const uint64_t SEED = 12345;

static double loss_of(const float *x, const float *A, const float *B, const float *w) {
    float out[N * OUT] = {0}, u[N * R], xd[N * IN];
    mf_lora_forward(out, u, xd, x, A, B, N, IN, OUT, R, S, P, SEED);
    double l = 0;
    for (int i = 0; i < N * OUT; i++) l += (double)w[i] * out[i];
    return l;
}

static void check_grad(const char *what, float *v, int n, const float *g, const float *x, const float *A,
                       const float *B, const float *w) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float keep = v[i];
        v[i] = keep + 0.5f;
        double lp = loss_of(x, A, B, w);
        v[i] = keep - 0.5f;
        double lm = loss_of(x, A, B, w);
        v[i] = keep;
        double fd = lp - lm;  /* linear in v[i]: exact up to rounding */
        if (!mf_close(g[i], fd, 1e-4, 1e-4)) {
            if (bad++ < 3) fprintf(stderr, "  %s[%d]: backward %.7g, difference %.7g\n", what, i, g[i], fd);
        }
    }
    CHECK(bad == 0, "%s: %d of %d elements differ from the central difference", what, bad, n);
}

int main(void) {
    mf_rng r;
    mf_rng_seed(&r, 7);
    float x[N * IN], A[R * IN], B[OUT * R], w[N * OUT];
    for (int i = 0; i < N * IN; i++) x[i] = mf_rng_normal(&r);
    for (int i = 0; i < R * IN; i++) A[i] = mf_rng_normal(&r);
    for (int i = 0; i < OUT * R; i++) B[i] = mf_rng_normal(&r);
    for (int i = 0; i < N * OUT; i++) w[i] = mf_rng_normal(&r);
    /* backward: dout = w */
    float du[N * R], dA[R * IN] = {0}, dB[OUT * R] = {0}, u[N * R], xd[N * IN], dx[N * IN] = {0};
    mf_lora_backward_params(du, dA, dB, u, xd, w, x, A, B, N, IN, OUT, R, S, P, SEED);
    mf_lora_backward_input(dx, xd, du, A, N, IN, R, P, SEED);
    check_grad("dA", A, R * IN, dA, x, A, B, w);
    check_grad("dB", B, OUT * R, dB, x, A, B, w);
    check_grad("dx", x, N * IN, dx, x, A, B, w);

    /* the mask: keep-rate, scaling, dependence on the seed */
    enum { M = 100000 };
    float *ones = malloc(M * sizeof *ones), *d1 = malloc(M * sizeof *d1), *d2 = malloc(M * sizeof *d2);
    float Aone[1];
    float *o1 = calloc(M, sizeof *o1), *uu = malloc(M * sizeof *uu);
    for (int i = 0; i < M; i++) ones[i] = 1.0f;
    Aone[0] = 1.0f;
    /* in = 1, r = 1, out = 1, A = B = 1, s = 1: out = dropout(x) elementwise, xd = the mask times 1/(1-p) */
    memset(o1, 0, M * sizeof *o1);
    mf_lora_forward(o1, uu, d1, ones, Aone, Aone, M, 1, 1, 1, 1.0f, P, SEED);
    memset(o1, 0, M * sizeof *o1);
    mf_lora_forward(o1, uu, d2, ones, Aone, Aone, M, 1, 1, 1, 1.0f, P, mf_lora_dropout_seed(SEED, 1, 0, 0));
    int kept = 0, odd = 0, same = 0;
    for (int i = 0; i < M; i++) {
        kept += d1[i] != 0.0f;
        odd += !(d1[i] == 0.0f || fabsf(d1[i] - 1.0f / (1.0f - P)) < 1e-6f);
        same += (d1[i] != 0.0f) == (d2[i] != 0.0f);
    }
    double rate = (double)kept / M;
    CHECK(fabs(rate - (1.0 - P)) < 0.01, "keep rate %.4f, want %.2f", rate, 1.0 - P);
    CHECK(odd == 0, "%d kept values not scaled by 1/(1-p)", odd);
    /* two independent masks agree on p^2 + (1-p)^2 = 58% of elements */
    CHECK(fabs((double)same / M - (P * P + (1 - P) * (1 - P))) < 0.01, "masks of two seeds agree on %.4f", (double)same / M);
    printf("dropout p=%.1f: dA, dB, dx equal the central differences; keep rate %.4f\n", (double)P, rate);
    free(ones);
    free(d1);
    free(d2);
    free(o1);
    free(uu);
    return mf_test_done("test_lora_dropout_grads");
}
