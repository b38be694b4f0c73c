/* Qwen2-MoE's shared expert gate (HF Qwen2MoeSparseMoeBlock): every token
 * also runs a shared SwiGLU expert (mlp.shared_expert, on the block's dense
 * gate/up/down projections, blocks.c), whose output is scaled by
 * sigmoid(mlp.shared_expert_gate.weight @ x), a (1,C) weight, and added to
 * the routed experts' output:
 *
 *   y_shared = down(silu(gate x) * up x)      (N,C), the act row sh_y
 *   s        = sigmoid(x . wg)                (N),   the act row sh_s
 *   out     += s * y_shared
 *
 * Backward (dout = d(out)): d(y_shared) = s * dout, dg = s (1 - s)
 * (dout . y_shared), dwg += sum_n dg[n] x[n], dx += dg wg. Rows are summed
 * in a fixed order (a row per thread, columns per thread for dwg), so the
 * results do not depend on the thread count. Nothing allocates. */
#include "internal.h"

#include <math.h>

void mf_moe_shared_gate_forward(float *out, float *s, const float *y, const float *x, const float *wg, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double g = 0;
        for (int c = 0; c < C; c++) g += (double)xr[c] * wg[c];
        float sn = (float)(1.0 / (1.0 + exp(-g)));
        s[n] = sn;
        if (!out) continue;
        float *o = out + (size_t)n * C;
        const float *yr = y + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] += sn * yr[c];
    }
}

void mf_moe_shared_gate_backward(float *dx, float *dwg, float *y, float *s, const float *dout, const float *x,
                                 const float *wg, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *yr = y + (size_t)n * C, *dxr = dx + (size_t)n * C;
        const float *dr = dout + (size_t)n * C;
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)dr[c] * yr[c];
        float sn = s[n], dg = (float)(sn * (1.0 - sn) * dot);
        for (int c = 0; c < C; c++) yr[c] = sn * dr[c];
        for (int c = 0; c < C; c++) dxr[c] += dg * wg[c];
        s[n] = dg;
    }
    if (!dwg) return;  /* a frozen gate (LoRA) */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double acc = 0;
        for (int n = 0; n < N; n++) acc += (double)s[n] * x[(size_t)n * C + c];
        dwg[c] += (float)acc;
    }
}
