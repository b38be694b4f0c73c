/* The planner's time model: kernel-class rates measured on this machine
 * (calibration, cached per host and thread count) and a planned model's
 * work per optimizer step at those rates. */
#include "memfit/planner.h"
#include "kernels/half.h"
#include "kernels/isa.h" /* the bf16 FlashAttention tiles, MF_FA512_MAX_HS */
#include "memfit/kernels.h"
#include "memfit/optim.h"
#include "memfit/model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const int gemm_widths[MF_RATES_GEMM_SIZES] = {128, 256, 512, 768};
static const int gemm_rows[MF_RATES_GEMM_ROWS] = {64, 256, 1024};
static const int attn_ts[MF_RATES_ATTN_T] = {128, 256, 1024};
static const int attn_hss[MF_RATES_ATTN_HS] = {32, 64, 128};

static void fill(float *x, size_t n, float s);

/* One GEMM in the row-major form the step calls: C (M x N) = op(A) op(B)
 * (+ C when acc), op(A) M x K, op(B) K x N. */
typedef struct { int M, N, K, tA, tB, acc; mf_bf16 *a, *b; float *c; void *s; size_t sb; } gemm16_ctx;
static void run_gemm16(void *p) {
    gemm16_ctx *g = p;
    mf_gemm_bf16_sized(g->c, g->a, g->b, NULL, g->M, g->N, g->K, g->tA, g->tB, g->acc, 0, g->s, g->sb);
}

/* Repeats fn until at least min_s have passed (and at least twice); the
 * fastest repetition's seconds. The first call warms caches and is not
 * counted. */
typedef void (*bench_fn)(void *ctx);
static double best_of(bench_fn fn, void *ctx, double min_s) {
    fn(ctx);
    double best = INFINITY, start = mf_time_now();
    for (int i = 0; i < 2 || mf_time_now() - start < min_s; i++) {
        double t0 = mf_time_now();
        fn(ctx);
        double dt = mf_time_now() - t0;
        if (dt < best) best = dt;
        if (i > 200) break;
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* the median of v[0..n-1] (n >= 1; v is sorted in place) */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct { int M, N, K, tA, tB, acc; float *a, *b, *c; } gemm_ctx;
static void run_gemm(void *p) {
    gemm_ctx *g = p;
    mf_sgemm(g->tA, g->tB, g->M, g->N, g->K, 1.0f, g->a, g->tA ? g->M : g->K, g->b, g->tB ? g->K : g->N,
             g->acc ? 1.0f : 0.0f, g->c, g->N);
}

/* GFLOP/s of a block's GEMMs as a training step runs them: GPT-2's four
 * projections (C -> 3C, C -> C, C -> 4C, 4C -> C), each in its three forms
 * (forward x W, input gradient dY W^T, weight gradient x^T dY accumulated),
 * twelve products one after another, on fp32 through mf_sgemm or bf16 (0
 * when oneDNN cannot run it). The rate is the median round's, not the
 * fastest single product's: one product repeated alone ran 10-25% faster
 * than a step's mix (bench/gemm_paths.c), and at C 128 the twelve in
 * sequence took 3.9 ms a round (median) against 3.1 ms at the best
 * single-form rates, which made small models' predicted steps short.
 * Every product takes its operands from the next stretch of a pool larger
 * than the caches (64 MiB), as a step's products find theirs: written by
 * other kernels or saved by the forward long before the backward reads
 * them. With the same three buffers for all twelve (hot in the caches)
 * gpt2-1m's shapes (1024 rows, C 128) ran 10-14% faster than from the
 * pool, C 256 5%, C 768 0-2% (build/bench_gemm_cold); the effect stopped
 * growing past a 64 MiB pool. */
#define POOL_BYTES ((size_t)64 << 20)
typedef struct { size_t big, nf, nh, of, oh; float *f; mf_bf16 *h; } gemm_ws;
/* the next n values (of el bytes) of a pool of cap values, in 64-byte
 * aligned stretches, from its start again when they would run past its end */
static void *take(void *pool, size_t el, size_t cap, size_t *off, size_t n) {
    n = (n * el + 63) / 64 * 64 / el;
    if (*off + n > cap) *off = 0;
    void *p = (char *)pool + *off * el;
    *off += n;
    return p;
}
#define BLOCK_FORMS 12
static double gemm_mix_rate(gemm_ws *ws, int M, int C, int bf16) {
    /* {tA, tB, accumulate, m, n, k} per projection (in, out): y = x W
     * (M, out, in), dW += x^T dY (in, out, M), dX = dY W^T (M, in, out) */
    const int io[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    int form[BLOCK_FORMS][6];
    gemm16_ctx h[BLOCK_FORMS];
    memset(h, 0, sizeof h);
    double flops = 0;
    int ok = 1;
    for (int p = 0; p < 4; p++) {
        int in = io[p][0], out = io[p][1];
        const int f3[3][6] = {{0, 0, 0, M, out, in}, {1, 0, 1, in, out, M}, {0, 1, 0, M, in, out}};
        memcpy(form[3 * p], f3, sizeof f3);
    }
    for (int f = 0; f < BLOCK_FORMS; f++) {
        int m = form[f][3], n = form[f][4], k = form[f][5];
        if ((size_t)m * k > ws->big || (size_t)k * n > ws->big || (size_t)m * n > ws->big) ok = 0;
        flops += 2.0 * m * n * k;
        if (bf16 && ok) {
            h[f] = (gemm16_ctx){m, n, k, form[f][0], form[f][1], form[f][2], ws->h, ws->h, ws->f, NULL, 0};
            h[f].sb = mf_gemm_bf16_scratch_bytes(m, n, k, h[f].tA, h[f].tB, h[f].acc, 0, 0);
            h[f].s = h[f].sb != SIZE_MAX ? malloc(h[f].sb ? h[f].sb : 1) : NULL;
            ok = h[f].s && mf_gemm_bf16_sized(h[f].c, h[f].a, h[f].b, NULL, m, n, k, h[f].tA, h[f].tB, h[f].acc, 0,
                                              h[f].s, h[f].sb) == 0;
        }
    }
    double rounds[64];
    int nr = 0;
    /* a warm-up round, then at least 3 and until 0.04 s have passed (the
     * small products: a median over more rounds, the calibration's noise
     * on a shared machine is a small model's prediction error) */
    for (double start = 0; ok && (nr < 4 || mf_time_now() - start < 0.04) && nr < 64; nr++) {
        double t0 = mf_time_now();
        if (nr == 1) start = t0;
        for (int f = 0; f < BLOCK_FORMS; f++) {
            size_t m = (size_t)form[f][3], n = (size_t)form[f][4], k = (size_t)form[f][5];
            if (bf16) {
                h[f].a = take(ws->h, sizeof(mf_bf16), ws->nh, &ws->oh, m * k);
                h[f].b = take(ws->h, sizeof(mf_bf16), ws->nh, &ws->oh, k * n);
                h[f].c = take(ws->f, sizeof(float), ws->nf, &ws->of, m * n);
                run_gemm16(&h[f]);
            } else {
                gemm_ctx g = {form[f][3], form[f][4], form[f][5], form[f][0], form[f][1], form[f][2], NULL, NULL, NULL};
                g.a = take(ws->f, sizeof(float), ws->nf, &ws->of, m * k);
                g.b = take(ws->f, sizeof(float), ws->nf, &ws->of, k * n);
                g.c = take(ws->f, sizeof(float), ws->nf, &ws->of, m * n);
                run_gemm(&g);
            }
        }
        rounds[nr] = mf_time_now() - t0;
    }
    for (int f = 0; f < BLOCK_FORMS; f++) free(h[f].s);
    if (!ok || nr < 2) return 0;
    return flops / median(rounds + 1, nr - 1) / 1e9;  /* the rounds after the warm-up */
}

typedef struct { int B, T, C, NH; float *out, *lse, *qkv, *dqkv, *dout, *scratch; } attn_ctx;
static void run_attn(void *p) {
    attn_ctx *x = p;
    mf_flash_attention_forward(x->out, x->lse, x->qkv, x->B, x->T, x->C, x->NH);
    mf_flash_attention_backward(x->dqkv, x->scratch, x->dout, x->out, x->qkv, x->lse, x->B, x->T, x->C, x->NH);
}
#ifdef MF_HAVE_AVX512_TABLE
/* the same with bf16 tiles (what bf16 precision runs, blocks.c) */
static void run_attn16(void *p) {
    attn_ctx *x = p;
    int hs = x->C / x->NH;
    mf_flash_forward_avx512bf16(x->out, x->lse, x->qkv, x->B, x->T, x->NH, x->NH, hs, 0, NULL);
    mf_flash_backward_avx512bf16(x->dqkv, x->scratch, x->dout, x->out, x->qkv, x->lse, x->B, x->T, x->NH, x->NH, hs, 0,
                                 NULL);
}
#endif

typedef struct { int N, C; float *x, *y, *w, *b, *mean, *rstd, *big, *dbig; } elem_ctx;
static void run_elem(void *p) {
    elem_ctx *e = p;
    size_t n = (size_t)e->N * e->C;
    mf_layernorm_forward(e->y, e->mean, e->rstd, e->x, e->w, e->b, e->N, e->C);
    mf_gelu_forward(e->dbig, e->big, 4 * n);
    mf_gelu_backward(e->dbig, e->big, e->dbig, 4 * n);
}

static void fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * (float)((i * 2654435761u) % 1000) / 1000.0f - s / 2;
}

typedef struct { mf_optim o; mf_optim_shape s; void *st[MF_OPTIM_STATES]; float *p, *g; int t; } optim_ctx;
static void run_optim(void *x) {
    optim_ctx *c = x;
    mf_optim_update(&c->o, c->st, c->p, c->g, &c->s, 1e-4f, 0.1f, ++c->t, 1.0f);
}

/* One optimizer's update rate, million parameters per second, on a 1024 x
 * 4096 matrix (state rows laid out by the optimizer's own plan): 4M
 * parameters, so parameters, gradients and state (64 MiB with AdamW)
 * exceed the caches as a model's do. And *tensor_s: the seconds a step
 * spends per trainable tensor beyond its parameters at that rate, from a
 * 128 x 128 tensor's gradient-norm pass and update (the mean of 200, the
 * median of five such runs): each tensor is its own parallel region in
 * both: 6.8 us per tensor for AdamW here, 0.4 ms a step for gpt2-1m's 64. */
static double optim_rate(const char *name, double *tensor_s) {
    mf_config cfg;
    mf_config_defaults(&cfg);
    *tensor_s = 0;
    double rate = 0;
    for (int pass = 0; pass < 2; pass++) {
        optim_ctx c;
        memset(&c, 0, sizeof c);
        if (mf_config_set(&cfg, "optimizer", name) || mf_optim_init(&c.o, &cfg)) return 0;
        c.s = pass == 0 ? (mf_optim_shape){2, 1024, 4096, 0, 0} : (mf_optim_shape){2, 128, 128, 0, 0};
        mf_plan p;
        int st[MF_OPTIM_STATES];
        if (mf_plan_init(&p, 1)) return 0;
        size_t n = (size_t)c.s.rows * c.s.cols;
        uint8_t *base = NULL;
        int ok = 0;
        if (mf_optim_plan(&c.o, &p, "w", &c.s, 0, 0, -1, st) == 0) {
            mf_plan_layout(&p);
            base = calloc(1, p.arena_bytes ? p.arena_bytes : 1);
            c.p = malloc(n * 4);
            c.g = malloc(n * 4);
            if (base && c.p && c.g) {
                ok = 1;
                for (int k = 0; k < MF_OPTIM_STATES; k++) c.st[k] = st[k] >= 0 ? base + p.bufs[st[k]].offset : NULL;
                mf_optim_zero(&c.o, c.st, st, &c.s);
                fill(c.p, n, 0.1f);
                fill(c.g, n, 0.01f);
                if (pass == 0) rate = (double)n / best_of(run_optim, &c, 0.03) / 1e6;
                else {
                    double t[5], sink = 0;
                    run_optim(&c);
                    for (int k = 0; k < 5; k++) {
                        double t0 = mf_time_now();
                        for (int i = 0; i < 200; i++) {
                            sink += mf_sumsq(c.g, n);
                            run_optim(&c);
                        }
                        t[k] = (mf_time_now() - t0) / 200;
                    }
                    *tensor_s = median(t, 5) - (double)n / (rate * 1e6);
                    if (!(*tensor_s > 0) || sink < 0) *tensor_s = 0;
                }
            }
        }
        free(base); free(c.p); free(c.g);
        mf_plan_free(&p);
        if (!ok || rate <= 0) return 0;
    }
    return rate;
}

/* CPU seconds every process has used (all cores, Linux's /proc/stat:
 * user, nice, system, irq, softirq and steal, the last being other
 * virtual machines on this host), or -1 where unreadable */
static double machine_cpu_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (n != 8 || hz <= 0) return -1;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz;
}

/* CPU seconds this process has used, all its threads */
static double self_cpu_s(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u)) return 0;
    return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

int mf_rates_busy(const mf_rates *r) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (r->busy_cores < 0 || ncpu <= 0) return 0;
    double spare = (double)ncpu - r->threads;
    return r->busy_cores > (spare > 0 ? spare : 0) + 0.25;
}

int mf_planner_calibrate(mf_rates *r, int nthreads) {
    double t0 = mf_time_now(), m0 = machine_cpu_s(), s0 = self_cpu_s();
    memset(r, 0, sizeof *r);
    r->threads = nthreads;
    /* GEMM at the shape of a block's MLP (rows x C x 4C) for several widths
     * and row counts (small micro-batches run GEMMs far below peak) */
    gemm_ws ws = {(size_t)gemm_rows[MF_RATES_GEMM_ROWS - 1] * 4 * gemm_widths[MF_RATES_GEMM_SIZES - 1], 0, 0, 0, 0,
                  NULL, NULL};
    if (gemm_widths[MF_RATES_GEMM_SIZES - 1] > gemm_rows[MF_RATES_GEMM_ROWS - 1])
        ws.big = (size_t)gemm_widths[MF_RATES_GEMM_SIZES - 1] * 4 * gemm_widths[MF_RATES_GEMM_SIZES - 1];
    /* the pools: at least one product's three operands (+ alignment) */
    ws.nf = POOL_BYTES / sizeof(float) > 3 * ws.big + 48 ? POOL_BYTES / sizeof(float) : 3 * ws.big + 48;
    ws.nh = POOL_BYTES / sizeof(mf_bf16) > 2 * ws.big + 64 ? POOL_BYTES / sizeof(mf_bf16) : 2 * ws.big + 64;
    ws.f = aligned_alloc(64, ws.nf * sizeof(float));  /* sizes: multiples of 64 bytes */
    ws.h = aligned_alloc(64, ws.nh * sizeof(mf_bf16));
    int wok = ws.f && ws.h;
    if (wok) {
        /* written, not calloc's zero pages (which all map one physical
         * page: every read would hit the cache); one 64 KiB pattern,
         * copied (fill() over all of it took 0.4 s) */
        enum { PAT = 16384 };
        fill(ws.f, PAT, 1);
        for (size_t i = 0; i < PAT; i++) ws.h[i] = mf_f32_to_bf16(ws.f[i]);
        for (size_t i = PAT; i < ws.nf; i += PAT) memcpy(ws.f + i, ws.f, 4 * (ws.nf - i < PAT ? ws.nf - i : PAT));
        for (size_t i = PAT; i < ws.nh; i += PAT) memcpy(ws.h + i, ws.h, 2 * (ws.nh - i < PAT ? ws.nh - i : PAT));
    }
    for (int j = 0; j < MF_RATES_GEMM_ROWS && wok; j++) {
        r->gemm_m[j] = gemm_rows[j];
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) {
            r->gemm_c[i] = gemm_widths[i];
            r->gemm_gflops[j][i] = gemm_mix_rate(&ws, gemm_rows[j], gemm_widths[i], 0);
            r->gemm16_gflops[j][i] = gemm_mix_rate(&ws, gemm_rows[j], gemm_widths[i], 1);
            /* oneDNN cannot run bf16: bf16 is not offered faster */
            if (r->gemm16_gflops[j][i] <= 0) r->gemm16_gflops[j][i] = r->gemm_gflops[j][i];
        }
    }
    free(ws.f);
    free(ws.h);
    if (!wok) return mf_fail("calibration: out of memory");
    /* more rows never make a GEMM slower per FLOP; a measurement that says
     * so is noise (the machine is shared), so the table is made monotone */
    for (int j = 1; j < MF_RATES_GEMM_ROWS; j++)
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++)
            if (r->gemm_gflops[j][i] < r->gemm_gflops[j - 1][i]) r->gemm_gflops[j][i] = r->gemm_gflops[j - 1][i];
    for (int j = 1; j < MF_RATES_GEMM_ROWS; j++)
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++)
            if (r->gemm16_gflops[j][i] < r->gemm16_gflops[j - 1][i]) r->gemm16_gflops[j][i] = r->gemm16_gflops[j - 1][i];
    /* attention at several sequence lengths and head sizes (its rate more
     * than halves from T 1024 hs 64 to T 128 hs 32): B 2 and at least 4
     * heads, at least two (batch, head) pairs per thread */
    {
        int NH = nthreads > 4 ? nthreads : 4, Tmax = attn_ts[MF_RATES_ATTN_T - 1];
        int hsmax = attn_hss[MF_RATES_ATTN_HS - 1];
        attn_ctx x = {2, 0, 0, NH, NULL, NULL, NULL, NULL, NULL, NULL};
        size_t n = (size_t)x.B * Tmax * NH * hsmax;
        size_t sf = 0;
        for (int i = 0; i < MF_RATES_ATTN_HS; i++) {
            size_t f = mf_flash_attention_scratch_floats(Tmax, attn_hss[i], nthreads);
            if (f > sf) sf = f;
        }
        x.out = malloc(n * 4); x.dout = malloc(n * 4); x.qkv = malloc(3 * n * 4); x.dqkv = malloc(3 * n * 4);
        x.lse = malloc((size_t)x.B * NH * Tmax * 4); x.scratch = malloc(sf * 4);
        int ok = x.out && x.dout && x.qkv && x.dqkv && x.lse && x.scratch;
        if (ok) {
            fill(x.qkv, 3 * n, 1);
            fill(x.dout, n, 1);
            for (int t = 0; t < MF_RATES_ATTN_T; t++)
                for (int h = 0; h < MF_RATES_ATTN_HS; h++) {
                    r->attn_t[t] = x.T = attn_ts[t];
                    r->attn_hs[h] = attn_hss[h];
                    x.C = NH * attn_hss[h];
                    double s = best_of(run_attn, &x, 0.03);
                    double fwd = 2.0 * x.B * NH * (double)x.T * x.T * attn_hss[h];
                    r->attn_gflops[t][h] = 3.5 * fwd / s / 1e9;  /* forward 1 + backward 2.5 (see attn_flops) */
                }
            /* bf16 tiles: their speed-up at one point (T 256, hs 64; both
             * measured back to back), applied to the whole table */
            r->attn16_ratio = 1;
#ifdef MF_HAVE_AVX512_TABLE
            if (mf_kernels_isa_bf16dot_ok()) {
                x.T = 256, x.C = NH * 64;
                double s32 = best_of(run_attn, &x, 0.03), s16 = best_of(run_attn16, &x, 0.03);
                if (s16 > 0) r->attn16_ratio = s32 / s16;
            }
#endif
        }
        free(x.out); free(x.dout); free(x.qkv); free(x.dqkv); free(x.lse); free(x.scratch);
        if (!ok) return mf_fail("calibration: out of memory");
        /* a longer sequence never runs slower per FLOP (fewer diagonal
         * tiles): a measurement that says so is noise */
        for (int t = 1; t < MF_RATES_ATTN_T; t++)
            for (int h = 0; h < MF_RATES_ATTN_HS; h++)
                if (r->attn_gflops[t][h] < r->attn_gflops[t - 1][h]) r->attn_gflops[t][h] = r->attn_gflops[t - 1][h];
    }
    /* element-wise: LayerNorm forward and GELU forward + backward on a
     * block's rows (N 1024, C 768) */
    {
        elem_ctx e = {1024, 768, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        size_t n = (size_t)e.N * e.C;
        e.x = malloc(n * 4); e.y = malloc(n * 4); e.w = malloc(e.C * 4); e.b = malloc(e.C * 4);
        e.mean = malloc(e.N * 4); e.rstd = malloc(e.N * 4); e.big = malloc(4 * n * 4); e.dbig = malloc(4 * n * 4);
        int ok = e.x && e.y && e.w && e.b && e.mean && e.rstd && e.big && e.dbig;
        if (ok) {
            fill(e.x, n, 2); fill(e.w, e.C, 1); fill(e.b, e.C, 1); fill(e.big, 4 * n, 4);
            double s = best_of(run_elem, &e, 0.2);
            /* bytes as the step model counts them: LN reads x writes y; GELU
             * forward reads and writes 4n; backward reads 2 x 4n writes 4n */
            r->elem_gbs = (2.0 * n + 2.0 * 4 * n + 3.0 * 4 * n) * 4 / s / 1e9;
        }
        free(e.x); free(e.y); free(e.w); free(e.b); free(e.mean); free(e.rstd); free(e.big); free(e.dbig);
        if (!ok) return mf_fail("calibration: out of memory");
    }
    /* the optimizers' updates (AdamW's sqrt and division, 8-bit AdamW's
     * quantisation) are far from memory-bound: each is its own class */
    static const char *const opt[4] = {"adamw", "adamw8bit", "adafactor", "sgd"};
    for (int k = 0; k < 4; k++) {
        double tensor_s;
        if ((r->optim_mps[k] = optim_rate(opt[k], &tensor_s)) <= 0)
            return mf_fail("calibration: optimizer %s failed", opt[k]);
        r->optim_tensor_us[k] = tensor_s * 1e6;
    }
    /* disk: write (to the device: fdatasync) then read 64 MiB through a
     * 4 MiB buffer, as the offload windows do (pwrite/pread) */
    {
        char dir[MF_PATH_MAX], path[MF_PATH_MAX + 64];
        mf_cache_dir(dir, sizeof dir);
        snprintf(path, sizeof path, "%s/calibrate.%d.tmp", dir, (int)getpid());
        size_t chunk = (size_t)4 << 20, total = (size_t)64 << 20;
        char *buf = malloc(chunk);
        int fd = buf ? open(path, O_RDWR | O_CREAT | O_TRUNC, 0600) : -1;
        if (fd < 0) {
            /* no cache folder: the model uses the memory rate for I/O */
            r->disk_gbs = 0;
        } else {
            memset(buf, 1, chunk);
            double best = INFINITY;
            int bad = 0;
            for (int rep = 0; rep < 3 && !bad; rep++) {
                double s0 = mf_time_now();
                for (size_t off = 0; off < total && !bad; off += chunk) bad |= pwrite(fd, buf, chunk, (off_t)off) != (ssize_t)chunk;
                /* sustained: a state larger than the dirty-page limits is
                 * written back at the device's speed */
                bad |= fdatasync(fd) != 0;
                for (size_t off = 0; off < total && !bad; off += chunk) bad |= pread(fd, buf, chunk, (off_t)off) != (ssize_t)chunk;
                double s = mf_time_now() - s0;
                if (s < best) best = s;
            }
            close(fd);
            unlink(path);
            r->disk_gbs = bad ? 0 : 2.0 * (double)total / best / 1e9;
        }
        free(buf);
    }
    r->calib_s = mf_time_now() - t0;
    /* what the rest of the machine used meanwhile: other processes on the
     * cores the calibration's threads need make every rate low (and
     * OpenMP's barriers wait for descheduled threads) */
    double m1 = machine_cpu_s();
    r->busy_cores = m0 < 0 || m1 < 0 || r->calib_s <= 0 ? -1
                    : fmax(0.0, ((m1 - m0) - (self_cpu_s() - s0)) / r->calib_s);
    return 0;
}

static void cache_path(char *buf, size_t n, int nthreads) {
    char dir[MF_PATH_MAX], host[128] = "host";
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++) if (*p == '/') *p = '_';
    /* the format version is in the name (binaries of other versions keep
     * their own file), and the GEMM backend and kernel ISA: each has its own rates */
    snprintf(buf, n, "%s/rates-v12-%s-%s-%s-t%d.txt", mf_cache_dir(dir, sizeof dir), host, mf_sgemm_name(),
             mf_kernels_isa_name(), nthreads);
}

static int rates_load(mf_rates *r, const char *path, int nthreads) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(r, 0, sizeof *r);
    int ok = fscanf(f, "memfit-rates 12 threads %d\n", &r->threads) == 1 && r->threads == nthreads;
    for (int j = 0; ok && j < MF_RATES_GEMM_ROWS; j++)
        for (int i = 0; ok && i < MF_RATES_GEMM_SIZES; i++)
            ok = fscanf(f, "gemm %d %d %lf %lf\n", &r->gemm_m[j], &r->gemm_c[i], &r->gemm_gflops[j][i],
                        &r->gemm16_gflops[j][i]) == 4 && r->gemm_gflops[j][i] > 0 && r->gemm16_gflops[j][i] > 0;
    for (int t = 0; ok && t < MF_RATES_ATTN_T; t++)
        for (int h = 0; ok && h < MF_RATES_ATTN_HS; h++)
            ok = fscanf(f, "attn %d %d %lf\n", &r->attn_t[t], &r->attn_hs[h], &r->attn_gflops[t][h]) == 3 &&
                 r->attn_gflops[t][h] > 0;
    ok = ok && fscanf(f, "attn16_ratio %lf\nelem %lf\ndisk %lf\ncalib_s %lf\nbusy_cores %lf\n", &r->attn16_ratio,
                      &r->elem_gbs, &r->disk_gbs, &r->calib_s, &r->busy_cores) == 5 && r->elem_gbs > 0 &&
         r->attn16_ratio > 0;
    for (int k = 0; ok && k < 4; k++)
        ok = fscanf(f, "optim %lf %lf\n", &r->optim_mps[k], &r->optim_tensor_us[k]) == 2 && r->optim_mps[k] > 0 &&
             r->optim_tensor_us[k] >= 0;
    fclose(f);
    return ok ? 0 : -1;
}

static void rates_save(const mf_rates *r, const char *path) {
    char tmp[MF_PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;  /* no cache folder: calibrate next time too */
    fprintf(f, "memfit-rates 12 threads %d\n", r->threads);
    for (int j = 0; j < MF_RATES_GEMM_ROWS; j++)
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++)
            fprintf(f, "gemm %d %d %.6g %.6g\n", r->gemm_m[j], r->gemm_c[i], r->gemm_gflops[j][i], r->gemm16_gflops[j][i]);
    for (int t = 0; t < MF_RATES_ATTN_T; t++)
        for (int h = 0; h < MF_RATES_ATTN_HS; h++)
            fprintf(f, "attn %d %d %.6g\n", r->attn_t[t], r->attn_hs[h], r->attn_gflops[t][h]);
    fprintf(f, "attn16_ratio %.6g\nelem %.6g\ndisk %.6g\ncalib_s %.3f\nbusy_cores %.3f\n", r->attn16_ratio, r->elem_gbs,
            r->disk_gbs, r->calib_s, r->busy_cores);
    for (int k = 0; k < 4; k++) fprintf(f, "optim %.6g %.6g\n", r->optim_mps[k], r->optim_tensor_us[k]);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

int mf_planner_rates_cached(mf_rates *r, int nthreads) {
    char path[MF_PATH_MAX + 200];
    cache_path(path, sizeof path, nthreads);
    return rates_load(r, path, nthreads);
}

int mf_planner_rates(mf_rates *r, int nthreads, int force, int *from_cache) {
    char path[MF_PATH_MAX + 200];
    cache_path(path, sizeof path, nthreads);
    if (from_cache) *from_cache = 0;
    if (force != 1 && rates_load(r, path, nthreads) == 0 && (force != 2 || !mf_rates_busy(r))) {
        if (from_cache) *from_cache = 1;
        return 0;
    }
    if (mf_planner_calibrate(r, nthreads)) return -1;
    rates_save(r, path);
    return 0;
}

/* position of x between the calibrated points v[0..n-1]: index i and
 * fraction f of the way (log scale) to v[i+1], clamped */
static void locate(const int *v, int n, double x, int *i, double *f) {
    if (x <= v[0]) { *i = 0; *f = 0; return; }
    if (x >= v[n - 1]) { *i = n - 2; *f = 1; return; }
    int k = 1;
    while (k < n - 1 && x > v[k]) k++;
    *i = k - 1;
    *f = log(x / v[k - 1]) / log((double)v[k] / v[k - 1]);
}

/* bilinear (log scale) in a grid g[j][i] over rows v[j] and columns u[i] */
static double interp(const int *v, int nv, const int *u, int nu, const double *g, double row, double col) {
    int i, j;
    double fc, fm;
    locate(u, nu, col, &i, &fc);
    locate(v, nv, row, &j, &fm);
    const double *g0 = g + (size_t)j * nu, *g1 = g0 + nu;
    double lo = g0[i] + fc * (g0[i + 1] - g0[i]);
    double hi = g1[i] + fc * (g1[i + 1] - g1[i]);
    return lo + fm * (hi - lo);
}

double mf_rates_gemm(const mf_rates *r, int C, int M) {
    return interp(r->gemm_m, MF_RATES_GEMM_ROWS, r->gemm_c, MF_RATES_GEMM_SIZES, &r->gemm_gflops[0][0], M, C);
}
double mf_rates_gemm16(const mf_rates *r, int C, int M) {
    return interp(r->gemm_m, MF_RATES_GEMM_ROWS, r->gemm_c, MF_RATES_GEMM_SIZES, &r->gemm16_gflops[0][0], M, C);
}
double mf_rates_attn(const mf_rates *r, int T, int hs) {
    return interp(r->attn_t, MF_RATES_ATTN_T, r->attn_hs, MF_RATES_ATTN_HS, &r->attn_gflops[0][0], T, hs);
}

/* The work of one optimizer step of a planned model.
 * GEMM FLOPs: a block's matmuls are 2N(3C^2 + C^2 + 4C^2 + 4C^2) forward,
 * twice that backward (input and weight gradients); the tied head 2N C Vp
 * likewise. Attention (causal, FlashAttention): 2 B NH T^2 hs forward (QK^T
 * and PV over half the square); backward recomputes the scores and takes
 * four products: 2.5x forward. A recomputed block adds its forward.
 * Element-wise bytes: per block forward, LayerNorm x2 (read+write N C
 * each), GELU (read+write 4NC), residual adds (3NC each): 18 NC floats;
 * backward twice that; selective recomputation adds the LayerNorm and GELU
 * forwards (12 NC); the loss reads the logits and writes their gradient
 * (2 N Vp); zeroing the gradients and their norm read or write them
 * twice. The optimizer's update is its own class (parameters per second of
 * that optimizer's kernel, plus a calibrated cost per trainable tensor:
 * its own parallel regions in the norm and the update). Offload moves
 * every state byte out and back once per step. LoRA: see below. */
double mf_planner_predict(const mf_rates *r, mf_planner_choice *c, const mf_model *m, const mf_plan *p) {
    const mf_dims *d = &m->d;
    double N = (double)m->B * m->T, C = d->C;
    /* (GPT-2: 12 C^2 weights per block; the attention term 2 B NH T^2 hs) */
    double blk_mm = 2 * N * (double)mf_model_block_matmul_params(d), head = 2 * N * C * d->Vp;
    double attn_f = mf_model_attention_flops(d, m->B, m->T);
    int nrec = 0;
    for (int l = 0; l < d->L; l++) nrec += m->seg > 0 || l < m->auto_k;
    int sel = m->recompute.policy == MF_RECOMPUTE_SELECTIVE;
    /* LoRA: the base and the tied head are frozen, so backward takes only
     * the input gradients (one product, not two); the adapters add
     * 2N(in r + r out) per target forward and twice that backward, i.e. 6N
     * per trainable parameter (8N where recomputed); a quantised base is
     * dequantised a tile at a time on every pass over it (forward,
     * input gradient, recompute), about 5 bytes moved per weight */
    int lora = m->lora.r > 0, quant = 0;
    double trainable = 0, nparams = 0, ntrain = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        nparams += (double)m->tensors[i].numel;
        if (!m->tensors[i].frozen) trainable += (double)m->tensors[i].numel, ntrain++;
        quant |= m->tensors[i].qkind != 0;
    }
    /* a recomputed block whose output is not needed again (the top block
     * of each segment, every auto-chosen block) stops before its MLP's
     * down projection (blocks.c, write_out 0): a dense block's C x F
     * product is not rerun, a third of GPT-2's block */
    int nskip = m->seg > 0 ? (d->L + m->seg - 1) / m->seg : (m->auto_k < d->L ? m->auto_k : d->L);
    double down = d->n_experts > 0 ? 0 : 2 * N * C * (double)d->ffn;  /* GPT-2's ffn is 4C */
    double gemm = (lora ? 2 : 3) * (d->L * blk_mm + head) + nrec * blk_mm - nskip * down;
    if (lora) gemm += (6.0 + 2.0 * nrec / d->L) * N * trainable;
    double attn = 3.5 * d->L * attn_f + nrec * attn_f;
    double elem = 4.0 * (3 * d->L * 18 * N * C + nrec * 18 * N * C + (sel ? d->L * 12 * N * C : 0) + 2 * N * d->Vp);
    /* 16-bit: rounding every GEMM's output gradient and the attention
     * output (backward: 10 NC read + write per block, forward 2 NC) and the
     * head's d(logits); the master weights rounded into their copies */
    int h16 = m->cdt != MF_DTYPE_F32;
    if (h16) elem += 4.0 * (d->L * 12 * N * C + N * d->Vp) + 6.0 * (double)p->total_cat[MF_CAT_MASTER] / 4;
    if (quant) elem += 5.0 * (2 * d->L + nrec) * (double)mf_model_block_matmul_params(d);
    /* a trainable head's weight gradient reads and writes the whole Vp x C
     * fp32 gradient once per group of head_dw_rows rows (a loss chunk in
     * fp32), traffic the calibrated block products (operands of at most
     * 1024 x 3072) do not have: gpt2-10m (C 160, 256-row chunks) moves
     * 64 MB for each 4.1 GFLOP product */
    if (!lora) elem += ceil(N / (m->head_dw_rows > 0 ? m->head_dw_rows : N)) * 2.0 * d->Vp * C * 4;
    int accum = c->grad_accum > 0 ? c->grad_accum : 1;
    /* zeroing the gradients and their norm: two passes over them */
    double grads = (double)p->total_cat[MF_CAT_GRADS];
    if (lora) nparams = trainable; /* the optimizer updates the adapters only */
    c->gemm_flops = accum * gemm;
    c->attn_flops = accum * attn;
    c->elem_bytes = accum * elem + 2.0 * grads;
    c->io_bytes = 2.0 * p->disk_bytes;
    c->optim_params = nparams;
    double disk = r->disk_gbs > 0 ? r->disk_gbs : r->elem_gbs;
    /* bf16 GEMMs at their own calibrated rate; fp16 widens to fp32 sgemm */
    double grate = m->cdt == MF_DTYPE_BF16 ? mf_rates_gemm16(r, d->C, m->B * m->T) : mf_rates_gemm(r, d->C, m->B * m->T);
    /* bf16 precision: FlashAttention's tiles in bf16 where the CPU has them */
    double arate = mf_rates_attn(r, m->T, d->hd);
    if (m->cdt == MF_DTYPE_BF16 && d->hd <= MF_FA512_MAX_HS && mf_flash_attention_bf16_tiles()) arate *= r->attn16_ratio;
    c->pred_s = c->gemm_flops / (grate * 1e9) + c->attn_flops / (arate * 1e9) +
                c->elem_bytes / (r->elem_gbs * 1e9) + c->io_bytes / (disk * 1e9) +
                nparams / (r->optim_mps[m->opt.kind] * 1e6) + ntrain * r->optim_tensor_us[m->opt.kind] * 1e-6;
    return c->pred_s;
}
