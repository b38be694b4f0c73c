/* LoRA: the --lora setting, the adapter kernels and dropout.
 * See include/memfit/lora.h for the maths and PEFT's conventions. */
#include "memfit/lora.h"
#include "memfit/core.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const target_names[MF_LORA_TARGETS] = {
    "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "q_proj", "k_proj", "v_proj", "o_proj",
    "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"};
static const char *const target_paths[MF_LORA_TARGETS] = {
    "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "block_sparse_moe.experts.w1", "block_sparse_moe.experts.w2", "block_sparse_moe.experts.w3"};

const char *mf_lora_target_name(int k) { return k >= 0 && k < MF_LORA_TARGETS ? target_names[k] : "?"; }
const char *mf_lora_target_path(int k) { return k >= 0 && k < MF_LORA_TARGETS ? target_paths[k] : "?"; }

void mf_lora_target_dims(int k, int C, int *in, int *out) {
    static const int fi[4] = {1, 1, 1, 4}, fo[4] = {3, 1, 4, 1};
    *in = k >= 0 && k < 4 ? fi[k] * C : 0;
    *out = k >= 0 && k < 4 ? fo[k] * C : 0;
}

int mf_lora_n_targets(const mf_lora_cfg *cfg) {
    int n = 0;
    for (int k = 0; k < MF_LORA_TARGETS; k++) n += (cfg->targets >> k) & 1;
    return n;
}

char *mf_lora_targets_str(const mf_lora_cfg *cfg, char *buf, size_t n) {
    buf[0] = 0;
    for (int k = 0; k < MF_LORA_TARGETS; k++)
        if (cfg->targets >> k & 1) {
            if (buf[0]) strncat(buf, ",", n - strlen(buf) - 1);
            strncat(buf, target_names[k], n - strlen(buf) - 1);
        }
    return buf;
}

static int target_index(const char *s, size_t len) {
    for (int k = 0; k < MF_LORA_TARGETS; k++)
        if ((strlen(target_names[k]) == len && strncmp(s, target_names[k], len) == 0) ||
            (strlen(target_paths[k]) == len && strncmp(s, target_paths[k], len) == 0))
            return k;
    /* PEFT users often write the last part only; it is ambiguous for c_proj */
    return -1;
}

int mf_lora_parse(const char *s, mf_lora_cfg *out) {
    memset(out, 0, sizeof *out);
    if (!s || !*s || strcmp(s, "off") == 0) return 0;
    int have_alpha = 0, have_r = 0, in_targets = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        char key[32] = "", val[64] = "";
        if (len == 0) return mf_fail("lora '%s': empty item (two commas in a row?)", s);
        if (eq) {
            size_t kl = (size_t)(eq - p), vl = len - kl - 1;
            if (kl >= sizeof key || vl >= sizeof val) return mf_fail("lora '%s': item '%.*s' too long", s, (int)len, p);
            memcpy(key, p, kl);
            memcpy(val, eq + 1, vl);
        }
        if (!eq && !in_targets)
            return mf_fail("lora '%s': '%.*s' is not key=value (keys: r, alpha, dropout, targets)", s, (int)len, p);
        if (!eq || strcmp(key, "targets") == 0) {
            const char *t = eq ? eq + 1 : p;
            size_t tl = eq ? len - (size_t)(eq - p) - 1 : len;
            if (eq) in_targets = 1, out->targets = 0, out->targets_given = 1;
            int k = target_index(t, tl);
            if (k < 0)
                return mf_fail("lora '%s': unknown target '%.*s' (GPT-2: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; "
                               "Llama family: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; "
                               "Mixtral's experts: w1, w2, w3)",
                               s, (int)tl, t);
            if (out->targets >> k & 1) return mf_fail("lora '%s': target '%.*s' given twice", s, (int)tl, t);
            out->targets |= 1u << k;
        } else {
            in_targets = 0;
            char *end;
            double v = strtod(val, &end);
            if (!val[0] || *end || !isfinite(v)) return mf_fail("lora '%s': %s expects a number, got '%s'", s, key, val);
            if (strcmp(key, "r") == 0) {
                if (v != floor(v) || v < 1 || v > 4096) return mf_fail("lora '%s': r must be a whole number in [1, 4096], got '%s'", s, val);
                out->r = (int)v;
                have_r = 1;
            } else if (strcmp(key, "alpha") == 0) {
                if (v <= 0) return mf_fail("lora '%s': alpha must be > 0, got '%s'", s, val);
                out->alpha = (float)v;
                have_alpha = 1;
            } else if (strcmp(key, "dropout") == 0) {
                if (v < 0 || v >= 1) return mf_fail("lora '%s': dropout must be in [0, 1), got '%s'", s, val);
                out->dropout = (float)v;
            } else return mf_fail("lora '%s': unknown key '%s' (keys: r, alpha, dropout, targets)", s, key);
        }
        p += len + (e ? 1 : 0);
        if (e && !*p) return mf_fail("lora '%s': trailing comma", s);
    }
    if (!have_r) return mf_fail("lora '%s': r=N is required", s);
    if (!have_alpha) out->alpha = (float)out->r;
    if (!out->targets) out->targets = 1u << MF_LORA_ATTN_C_ATTN;
    return 0;
}

/* ---- counter-based random numbers ---------------------------------------
 * splitmix64 (Steele, Lea, Flood 2014) of a counter: any element's value is
 * computed on its own, so threads, recomputation and backward agree. */
static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t mf_lora_dropout_seed(uint64_t seed, uint64_t micro_step, int layer, int target) {
    return mix64(mix64(mix64(seed ^ 0xD5A61266F0C9392Cull) ^ micro_step) ^ ((uint64_t)layer << 8 | (uint64_t)target));
}

void mf_lora_init_a_part(float *A, int64_t lo, int64_t n, int in, uint64_t seed) {
    /* torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)),
     * bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in), fan_in = in */
    float bound = 1.0f / sqrtf((float)in);
    uint64_t s = mix64(seed);
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(mix64(s + (uint64_t)(lo + i)) >> 40) * (1.0f / 16777216.0f);  /* [0, 1) */
        A[i] = (2.0f * u - 1.0f) * bound;
    }
}

void mf_lora_init_a(float *A, int r, int in, uint64_t seed) { mf_lora_init_a_part(A, 0, (int64_t)r * in, in, seed); }

/* keep element i with probability 1-p; threshold on 24 random bits */
#define DROP_STRIDE 0x632BE59BD9B4E019ull
static inline int keep(uint64_t dseed, uint64_t i, uint32_t thr) {
    return (uint32_t)(mix64(dseed + i * DROP_STRIDE) >> 40) >= thr;
}

/* keep(dseed + first * DROP_STRIDE, i) == keep(dseed, first + i) (mod 2^64) */
uint64_t mf_lora_dropout_at(uint64_t dseed, uint64_t first) { return dseed + first * DROP_STRIDE; }
static uint32_t threshold(float p) { return (uint32_t)lrint((double)p * 16777216.0); }

/* xd = dropout(x) (inverted: kept elements scaled by 1/(1-p)) */
static void dropout_apply(float *xd, const float *x, int64_t n, float p, uint64_t dseed) {
    uint32_t thr = threshold(p);
    float s = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) xd[i] = keep(dseed, (uint64_t)i, thr) ? x[i] * s : 0.0f;
}

static const float *lora_input(float *xd, const float *x, int N, int in, float p, uint64_t dseed) {
    if (p <= 0.0f) return x;
    dropout_apply(xd, x, (int64_t)N * in, p, dseed);
    return xd;
}

void mf_lora_forward(float *out, float *u, float *xd, const float *x, const float *A, const float *B,
                     int N, int in, int outd, int r, float scale, float p, uint64_t dseed) {
    mf_lora_forward_ld(out, outd, u, xd, x, A, B, N, in, outd, r, scale, p, dseed);
}

void mf_lora_forward_ld(float *out, int ldo, float *u, float *xd, const float *x, const float *A, const float *B,
                        int N, int in, int outd, int r, float scale, float p, uint64_t dseed) {
    if (N <= 0) return;
    const float *xi = lora_input(xd, x, N, in, p, dseed);
    /* u (N,r) = xi (N,in) @ A^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, in, 1.0f, xi, in, A, in, 0.0f, u, r);
    /* out (N,outd) += scale * u @ B^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, outd, r, scale, u, r, B, r, 1.0f, out, ldo);
}

void mf_lora_backward_params(float *du, float *dA, float *dB, float *u, float *xd, const float *dout,
                             const float *x, const float *A, const float *B, int N, int in, int outd, int r,
                             float scale, float p, uint64_t dseed) {
    mf_lora_backward_params_ld(du, dA, dB, u, xd, dout, outd, x, A, B, N, in, outd, r, scale, p, dseed);
}

void mf_lora_backward_params_ld(float *du, float *dA, float *dB, float *u, float *xd, const float *dout, int ldd,
                                const float *x, const float *A, const float *B, int N, int in, int outd, int r,
                                float scale, float p, uint64_t dseed) {
    if (N <= 0) return;
    const float *xi = lora_input(xd, x, N, in, p, dseed);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, in, 1.0f, xi, in, A, in, 0.0f, u, r);
    /* dB (outd,r) += scale * dout^T @ u */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, outd, r, N, scale, dout, ldd, u, r, 1.0f, dB, r);
    /* du (N,r) = scale * dout @ B */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, outd, scale, dout, ldd, B, r, 0.0f, du, r);
    /* dA (r,in) += du^T @ xi */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, N, 1.0f, du, r, xi, in, 1.0f, dA, in);
}

void mf_lora_backward_input(float *dx, float *xd, const float *du, const float *A, int N, int in, int r,
                            float p, uint64_t dseed) {
    if (N <= 0) return;
    if (p <= 0.0f) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, r, 1.0f, du, r, A, in, 1.0f, dx, in);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, r, 1.0f, du, r, A, in, 0.0f, xd, in);
    uint32_t thr = threshold(p);
    float s = 1.0f / (1.0f - p);
    int64_t n = (int64_t)N * in;
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++)
        if (keep(dseed, (uint64_t)i, thr)) dx[i] += xd[i] * s;
}
