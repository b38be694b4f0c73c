/* Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with
 * Sublinear Memory Cost", arXiv:1804.04235), written to follow
 * transformers.optimization.Adafactor.step (a port of fairseq's) operation
 * for operation, with the sums in double. See optim.h for the formulas. */
#include "memfit/core.h"
#include "memfit/optim.h"

#include <math.h>

/* Sums run over MF_AF_PARTS fixed contiguous ranges, each in order, then
 * the partials in order: the result is the same for any thread count. */
#define MF_AF_PARTS 64

mf_adafactor_hp mf_adafactor_hp_default(void) {
    mf_adafactor_hp hp = {
        .lr = 0.0f, .relative_step = 1, .scale_parameter = 1, .warmup_init = 0,
        .beta1 = 0.0f, .decay_rate = -0.8f, .eps1 = 1e-30f, .eps2 = 1e-3f,
        .clip_threshold = 1.0f, .wd = 0.0f,
    };
    return hp;
}

size_t mf_adafactor_state_bytes(int64_t rows, int64_t cols, int factored,
                                int momentum) {
    size_t n = (size_t)rows * (size_t)cols;
    size_t v = factored ? (size_t)rows + (size_t)cols : n;
    return sizeof(float) * (v + (momentum ? n : 0));
}

static double sum_parts(const double *part) {
    double s = 0.0;
    for (int k = 0; k < MF_AF_PARTS; k++) s += part[k];
    return s;
}

/* sum of x[i]^2 over n elements */
static double sumsq(const float *x, size_t n) {
    double part[MF_AF_PARTS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < MF_AF_PARTS; k++) {
        size_t lo = n * k / MF_AF_PARTS, hi = n * (k + 1) / MF_AF_PARTS;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    return sum_parts(part);
}

/* Factored second moment: vr[r] = b2 vr[r] + omb2 mean_c(g^2 + eps1),
 * vc[c] = b2 vc[c] + omb2 mean_r(g^2 + eps1). Sets *vr_mean = mean(vr) and
 * returns the sum over the tensor of the squared unclipped update
 * (g * rsqrt(vr[r] / mean(vr)) * rsqrt(vc[c]))^2 = g^2 mean(vr) / (vr[r] vc[c]). */
static double factored_stats(const float *g, float *vr, float *vc, size_t rows,
                             size_t cols, float gscale, float eps1, float b2,
                             float omb2, float *vr_mean) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *gr = g + r * cols;
        double s = 0.0;
        for (size_t c = 0; c < cols; c++) {
            float gi = gr[c] * gscale;
            s += (double)(gi * gi + eps1);
        }
        vr[r] = b2 * vr[r] + omb2 * (float)(s / (double)cols);
    }
    /* column sums: each task owns CB columns and walks every row */
    enum { CB = 64 };
    size_t ncb = (cols + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (size_t cb = 0; cb < ncb; cb++) {
        size_t c0 = cb * CB, len = cols - c0 < CB ? cols - c0 : CB;
        double acc[CB] = {0};
        for (size_t r = 0; r < rows; r++) {
            const float *gr = g + r * cols + c0;
            for (size_t c = 0; c < len; c++) {
                float gi = gr[c] * gscale;
                acc[c] += (double)(gi * gi + eps1);
            }
        }
        for (size_t c = 0; c < len; c++)
            vc[c0 + c] = b2 * vc[c0 + c] + omb2 * (float)(acc[c] / (double)rows);
    }
    double vr_sum = 0.0;
    for (size_t r = 0; r < rows; r++) vr_sum += vr[r];
    *vr_mean = (float)(vr_sum / (double)rows);
    double part[MF_AF_PARTS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < MF_AF_PARTS; k++) {
        size_t lo = rows * k / MF_AF_PARTS, hi = rows * (k + 1) / MF_AF_PARTS;
        double s = 0.0;
        for (size_t r = lo; r < hi; r++) {
            const float *gr = g + r * cols;
            double sr = 0.0;
            for (size_t c = 0; c < cols; c++) {
                float gi = gr[c] * gscale;
                sr += (double)(gi * gi / vc[c]);
            }
            s += sr * (double)*vr_mean / (double)vr[r];
        }
        part[k] = s;
    }
    return sum_parts(part);
}

/* Unfactored: v = b2 v + omb2 (g^2 + eps1); returns the sum of g^2 / v. */
static double full_stats(const float *g, float *v, size_t n, float gscale,
                         float eps1, float b2, float omb2) {
    double part[MF_AF_PARTS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < MF_AF_PARTS; k++) {
        size_t lo = n * k / MF_AF_PARTS, hi = n * (k + 1) / MF_AF_PARTS;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) {
            float gi = g[i] * gscale;
            float vi = b2 * v[i] + omb2 * (gi * gi + eps1);
            v[i] = vi;
            s += (double)(gi * gi / vi);
        }
        part[k] = s;
    }
    return sum_parts(part);
}

/* One row segment of the second pass: u = scale * g / sqrt(rr * vd[i]),
 * with momentum m = beta1 m + (1 - beta1) u and u = m; p = p - wdl p - u.
 * The decay is p.add_(p, alpha=-wd*lr) as transformers writes it, not
 * p * (1 - wd*lr): with Adafactor's small step sizes 1 - wd*lr can round
 * to 1 in fp32. */
static void apply(float *p, float *m, const float *g, const float *vd, float rr,
                  size_t len, float gscale, float scale, float wdl, float beta1) {
    float omb1 = (float)(1.0 - (double)beta1);
    if (m) {
        for (size_t i = 0; i < len; i++) {
            float u = scale * ((g[i] * gscale) / sqrtf(rr * vd[i]));
            float mi = beta1 * m[i] + omb1 * u;
            m[i] = mi;
            p[i] = (p[i] - wdl * p[i]) - mi;
        }
    } else {
        for (size_t i = 0; i < len; i++)
            p[i] = (p[i] - wdl * p[i]) - scale * ((g[i] * gscale) / sqrtf(rr * vd[i]));
    }
}

void mf_adafactor_update(float *p, const float *g, float *vr, float *vc,
                         float *v, float *m, int64_t rows, int64_t cols,
                         const mf_adafactor_hp *hp, int t, float gscale) {
    size_t R = (size_t)rows, C = (size_t)cols, n = R * C;
    if (n == 0) return;
    if (hp->beta1 > 0.0f && !m) mf_panic("mf_adafactor_update: beta1 > 0 needs m");
    if (!v && (!vr || !vc)) mf_panic("mf_adafactor_update: give v, or vr and vc");
    /* step size, as Adafactor._get_lr: RMS(p) is taken before the step */
    double lr = hp->lr;
    if (hp->relative_step) {
        double min_step = hp->warmup_init ? 1e-6 * t : 1e-2;
        lr = fmin(min_step, 1.0 / sqrt((double)t));
    }
    if (hp->scale_parameter) lr *= fmax((double)hp->eps2, sqrt(sumsq(p, n) / (double)n));
    double beta2t = 1.0 - pow((double)t, (double)hp->decay_rate);
    float b2 = (float)beta2t, omb2 = (float)(1.0 - beta2t);

    float vr_mean = 1.0f;
    double usq = v ? full_stats(g, v, n, gscale, hp->eps1, b2, omb2)
                   : factored_stats(g, vr, vc, R, C, gscale, hp->eps1, b2, omb2, &vr_mean);
    /* update /= max(1, RMS(update) / clip_threshold); update *= lr */
    double clip = 1.0;
    if (hp->clip_threshold > 0.0f) clip = fmax(1.0, sqrt(usq / (double)n) / hp->clip_threshold);
    float scale = (float)(lr / clip);
    float wdl = (float)((double)hp->wd * lr);
    float *mm = hp->beta1 > 0.0f ? m : NULL;

    if (v) {
        /* fixed chunks so each task's inner loop is long and vectorised */
        enum { CH = 4096 };
        size_t nch = (n + CH - 1) / CH;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < nch; k++) {
            size_t i0 = k * CH, len = n - i0 < CH ? n - i0 : CH;
            apply(p + i0, mm ? mm + i0 : NULL, g + i0, v + i0, 1.0f, len, gscale,
                  scale, wdl, hp->beta1);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < R; r++) {
        size_t i0 = r * C;
        apply(p + i0, mm ? mm + i0 : NULL, g + i0, vc, vr[r] / vr_mean, C, gscale,
              scale, wdl, hp->beta1);
    }
}
