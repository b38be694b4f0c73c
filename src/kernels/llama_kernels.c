/* Llama-family element-wise and row-wise kernels: RMSNorm, rotary position
 * embedding (RoPE, with Llama 3.1's frequency rescaling) and SwiGLU. The
 * attention they go with is flash_attention.c's grouped-query kernel.
 *
 * RMSNorm, RoPE's rotation and SwiGLU are the ISA-dispatched kernels of
 * kern_body.h (plain C with OpenMP parallel-for and simd loops, compiled
 * for the baseline and for AVX-512, see isa.h): the functions here document
 * the formulas and call the table; the RoPE table and the 16-bit embedding
 * lookup run here, once per run or cheaply. The rules of cpu.c hold: no allocation; reductions that cross rows (RMSNorm's
 * dw) are split by columns, so every output is summed in the same order
 * whatever the thread count and results are bit-identical across
 * OMP_NUM_THREADS.
 *
 * The formulas follow Hugging Face transformers (modeling_llama.py:
 * LlamaRMSNorm, apply_rotary_pos_emb / rotate_half, LlamaMLP;
 * modeling_rope_utils.py: _compute_llama3_parameters) so that a Llama
 * checkpoint computes what it computes there.
 */
#include "isa.h"
#include "kernels/half.h"
#include "memfit/kernels.h"

#include <math.h>
#include <omp.h>

/* below this many elements a kernel runs on the calling thread: a parallel
 * region costs more than the work (as MF_PAR_MIN in kern_body.h) */
#define MF_LL_PAR_MIN 4096

/* ---- RMSNorm ------------------------------------------------------------ */

/* HF LlamaRMSNorm in fp32: variance = mean(x^2), x * rsqrt(variance + eps),
 * times weight. The sum of squares is accumulated in double, so the mean is
 * the correctly rounded one up to the final rounding (PyTorch's fp32 sum
 * differs from it by its own rounding, ~1e-7 relative), and rstd is
 * computed in double and rounded once. out = (x * rstd) * w as in HF.
 * inp, out (N,C); w (C); rstd (N). out may be inp. */
void mf_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    mf_kernels_isa_get()->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}

/* y = x * r * w with r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C:
 *   dx_c = r * (g_c - x_c * r^2 * mean(g * x)),   g = dout * w,
 *   dw_c += sum_rows dout_c * x_c * r.
 * The row dot product mean(g * x) is summed in double (a difference of two
 * nearly equal terms follows). dinp is row-parallel; dw is column-parallel,
 * each column block summed over all rows in row order (thread-count
 * independent). dinp (N,C) accumulates; dw (C) accumulates, NULL: skipped. */
void mf_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C) {
    mf_kernels_isa_get()->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}

/* ---- RoPE --------------------------------------------------------------- */

/* inv_freq_i = theta^(-2i/hs), i < hs/2 (HF _compute_default_rope_parameters),
 * then for MF_ROPE_LLAMA3 the rescaling of _compute_llama3_parameters:
 * wavelengths 2 pi / inv_freq longer than orig / low_freq_factor are slowed
 * by `factor`, shorter than orig / high_freq_factor kept, and those between
 * interpolated linearly in orig / wavelen. All in double: the table's only
 * rounding is of cos and sin themselves. HF computes inv_freq and the angle
 * t * inv_freq in fp32, whose rounding grows with t (about t * 6e-8 rad);
 * this table is the exact value those approximate. */
static double rope_inv_freq(int i, int hs, double theta, const mf_rope_scaling *sc) {
    const double f = pow(theta, -2.0 * i / hs);
    if (!sc || sc->type != MF_ROPE_LLAMA3) return f;
    const double orig = sc->original_max_position_embeddings;
    const double lo = sc->low_freq_factor, hi = sc->high_freq_factor, factor = sc->factor;
    const double low_wavelen = orig / lo, high_wavelen = orig / hi;
    const double wavelen = 2.0 * 3.14159265358979323846 / f; /* 2 pi (M_PI is not C11) */
    if (wavelen > low_wavelen) return f / factor;
    if (wavelen < high_wavelen) return f;
    const double smooth = (orig / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * f / factor + smooth * f;
}

/* tab: cos (T, hs/2), then sin (T, hs/2), row t = position t. */
void mf_rope_table(float *tab, int T, int hs, double theta, const mf_rope_scaling *sc) {
    const int half = hs / 2;
    if (T <= 0 || half <= 0) return;
    double inv[512]; /* hs <= 1024: far beyond any model's head size */
    if (half > 512) mf_panic("mf_rope_table: head size %d > 1024", hs);
    for (int i = 0; i < half; i++) inv[i] = rope_inv_freq(i, hs, theta, sc);
    float *cs = tab, *sn = tab + (size_t)T * half;
#pragma omp parallel for schedule(static) if ((size_t)T * half >= MF_LL_PAR_MIN)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)t * inv[i];
            cs[(size_t)t * half + i] = (float)cos(a);
            sn[(size_t)t * half + i] = (float)sin(a);
        }
}

/* HF: q' = q * cos + rotate_half(q) * sin with cos, sin repeated over the
 * two halves and rotate_half(x) = (-x2, x1), i.e. per pair (x1, x2) =
 * (x[i], x[i + hs/2]):
 *   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
 * (two products and one add each, as PyTorch computes them, so the fp32
 * results match its for the same table). The inverse (transpose) rotation
 * uses -sin; it is the backward: dx = R^T dy. The q and k heads of a row
 * are contiguous (heads 0 .. NH+NKV-1); v heads follow and are untouched.
 * pos[n] must lie in [0, T): the table has T positions. */
void mf_rope_apply(float *qkv, const float *tab, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                   int inverse) {
    mf_kernels_isa_get()->rope_apply(qkv, tab, pos, B, T, NH, NKV, hs, inverse);
}

/* ---- SwiGLU ------------------------------------------------------------- */

/* silu(g) = g * sigmoid(g) = g / (1 + exp(-g)) (PyTorch's silu), with the
 * vectorisable exp of vmath.h (~1 ulp; its clamp only touches |g| > 87,
 * where silu is 0 or g to fp32 precision anyway). */
void mf_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    mf_kernels_isa_get()->swiglu_forward(out, gate, up, n);
}

/* With s = sigmoid(g): silu(g) = g s, silu'(g) = s (1 + g (1 - s)).
 * Each element's inputs are read before its outputs are written, so dgate
 * may be gate and dup may be up. */
void mf_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    mf_kernels_isa_get()->swiglu_backward(dgate, dup, dout, gate, up, n);
}

/* ---- 16-bit outputs (mixed precision) ------------------------------------
 * The same formulas with the output that feeds a GEMM rounded to bf16/fp16
 * (nearest-even) as it is written; rstd is computed exactly as
 * mf_rmsnorm_forward computes it, so the fp32 backward reads the same
 * statistics whether the forward was 16-bit or not. */
void mf_rmsnorm_forward16(void *out, mf_dtype dt, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps) {
    mf_kernels_isa_get()->rmsnorm_forward16(out, dt, rstd, inp, w, N, C, eps);
}

void mf_swiglu_forward16(void *out, mf_dtype dt, const float *gate, const float *up, size_t n) {
    mf_kernels_isa_get()->swiglu_forward16(out, dt, gate, up, n);
}

void mf_embed_forward16(float *out, const int32_t *inp, const void *wte, mf_dtype dt, int N, int C) {
    const uint16_t *w = wte;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_LL_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const uint16_t *r = w + (size_t)inp[n] * C;
        float *o = out + (size_t)n * C;
        if (dt == MF_DTYPE_BF16) for (int c = 0; c < C; c++) o[c] = mf_bf16_to_f32(r[c]);
        else for (int c = 0; c < C; c++) o[c] = mf_fp16_to_f32(r[c]);
    }
}
