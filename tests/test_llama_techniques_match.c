/* Every memory technique is exact for the Llama family too (DESIGN.md,
 * principle 4), on llama-tiny at 4 layers (C 64, 8 query / 2 KV heads,
 * SwiGLU 160), with an untied head (the preset, random init) and a tied one
 * (a Hugging Face folder the PyTorch reference writes, loaded with --init):
 *   (a) recompute selective, full, every:3 (uneven segments [0,3) [3,4)),
 *       sqrt and auto under a budget that recomputes some but not all blocks
 *       give bit-identical losses over 8 steps and bit-identical weights to
 *       none, with fewer activation bytes; also for Qwen2's q/k/v biases
 *       and Mistral's sliding window shorter than T;
 *   (b) grad_accum 2 at batch 2 gives the gradients of batch 4 (1e-6 of the
 *       largest gradient, as the GPT-2 test);
 *   (c) update_in_backward gives the plain step's losses (bitwise) and
 *       weights (1e-7 relative), with fewer gradient bytes planned;
 *   (d) adamw8bit, adafactor and sgd train: the loss falls;
 *   (e) in every run above the ledger's peak equals the plan's, in total
 *       and per category;
 *   (f) optimizer state offloaded to disk gives bitwise the losses, weights
 *       and state of in-memory training;
 *   (g) the run-time batch split gives the gradients of one pass over the
 *       whole batch (2e-6 of the largest gradient, as the GPT-2 test);
 *   (h) a checkpoint written after 3 steps resumes to the uninterrupted
 *       run's losses and weights, bit for bit. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

/* auto's budget is measured against the process's RSS: under
 * AddressSanitizer freed memory would wait in a quarantine and the
 * baseline drift between trainers (as test_recompute_auto_fits_budget) */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=0:thread_local_quarantine_size_kb=0"; }

#define STEPS 8
#define L_ 4

typedef struct {
    const char *name;
    char init[256];  /* "" = the llama-tiny preset (untied), else an HF folder */
} variant;

static void lconfig(mf_config *c, const char *data, const variant *v) {
    mf_config_defaults(c);
    const char *kv[][2] = {{"model", "llama-tiny"}, {"n_layer", "4"}, {"block_size", "128"}, {"batch", "4"},
                           {"seq", "64"}, {"steps", "8"}, {"warmup", "2"}, {"lr", "3e-3"}, {"sample_tokens", "0"},
                           {"val_every", "0"}, {"threads", "1"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s=%s: %s", kv[i][0], kv[i][1], mf_error());
    mf_config_set(c, "data", data);
    if (v->init[0]) mf_config_set(c, "init", v->init);
}

/* (e): the ledger's peak equals the plan's, in total and per category */
static void check_ledger(const mf_trainer *t, const char *what) {
    CHECK(t->ledger.peak_total == t->plan.peak_bytes, "%s: ledger peak %zu != planned %zu", what, t->ledger.peak_total,
          t->plan.peak_bytes);
    for (int i = 0; i < MF_CAT_COUNT; i++)
        CHECK(t->ledger.at_peak[i] == t->plan.peak_cat[i], "%s %s: ledger %zu != planned %zu", what,
              mf_cat_name((mf_cat)i), t->ledger.at_peak[i], t->plan.peak_cat[i]);
}

typedef struct {
    double loss[64];
    float *w;
    size_t nw, acts, grads;
    int auto_k, ok;
} result;

/* Trains `steps` steps of c; the losses, the final weights, the planned
 * activation and gradient bytes; the ledger checked. */
static void train(const mf_config *c, const char *what, int steps, result *r) {
    memset(r, 0, sizeof *r);
    mf_trainer t;
    if (mf_trainer_init(&t, c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", what, mf_error()); return; }
    CHECK(t.d.arch == MF_ARCH_LLAMA && t.d.L == L_, "%s: not a 4-layer Llama", what);
    tu_steps(&t, 0, steps, r->loss);
    check_ledger(&t, what);
    r->acts = t.plan.peak_cat[MF_CAT_ACTS];
    r->grads = t.plan.max_cat[MF_CAT_GRADS];
    r->auto_k = t.model.auto_k;
    r->w = tu_copy_tensors(&t, 0, &r->nw);
    r->ok = r->w != NULL;
    mf_trainer_free(&t);
}

/* Arena bytes of the plan that recomputes the lowest k blocks. */
static size_t arena_k(const mf_config *c0, int k) {
    mf_config c = *c0;
    mf_dims d;
    mf_plan p;
    mf_model m;
    if (mf_model_dims(&c, &d)) { CHECK(0, "%s", mf_error()); return 0; }
    mf_plan_init(&p, mf_model_n_phases(&d, MF_MODE_TRAIN));
    mf_recompute rc = {MF_RECOMPUTE_AUTO, k};
    mf_optim opt;
    mf_optim_init(&opt, &c);
    if (mf_model_plan(&m, &p, &d, c.batch, c.seq, MF_MODE_TRAIN, 2, c.loss_chunk, rc, &opt)) {
        CHECK(0, "%s", mf_error());
        mf_plan_free(&p);
        return 0;
    }
    mf_plan_layout(&p);
    size_t a = p.arena_bytes;
    mf_model_free(&m);
    mf_plan_free(&p);
    return a;
}

/* (a) */
static void recompute(const char *data, const variant *v, int with_auto) {
    mf_config c;
    lconfig(&c, data, v);
    mf_config_set(&c, "recompute", "none");
    result r0, r1;
    char what[128];
    snprintf(what, sizeof what, "%s none", v->name);
    train(&c, what, STEPS, &r0);
    if (!r0.ok) return;
    CHECK(r0.loss[STEPS - 1] < r0.loss[0], "%s: loss did not fall (%.6f -> %.6f)", what, r0.loss[0], r0.loss[STEPS - 1]);
    const char *pol[] = {"selective", "full", "every:3", "sqrt", "auto"};
    for (int k = 0; k < 5; k++) {
        lconfig(&c, data, v);
        mf_config_set(&c, "recompute", pol[k]);
        if (strcmp(pol[k], "auto") == 0) {
            if (!with_auto) continue;
            /* a budget between recomputing 1 and 2 blocks: the choice is some
             * but not all blocks even if the baseline moves by a block */
            mf_config_set(&c, "plan", "off");
            size_t a1 = arena_k(&c, 1), a2 = arena_k(&c, 2);
            mf_trainer t;
            if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); continue; }
            size_t base = t.ledger.rss_baseline;
            mf_trainer_free(&t);
            if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
                base = t.ledger.rss_baseline;
                mf_trainer_free(&t);
            }
            char b[32];
            snprintf(b, sizeof b, "%zu", base + a2 + (a1 - a2) / 2);
            mf_config_set(&c, "budget", b);
        }
        snprintf(what, sizeof what, "%s %s", v->name, pol[k]);
        train(&c, what, STEPS, &r1);
        if (!r1.ok) continue;
        int same = 1;
        for (int i = 0; i < STEPS; i++) {
            CHECK(r0.loss[i] == r1.loss[i], "%s step %d: loss %.17g vs none %.17g", what, i + 1, r1.loss[i], r0.loss[i]);
            same &= r0.loss[i] == r1.loss[i];
        }
        int wsame = r0.nw == r1.nw && memcmp(r0.w, r1.w, r0.nw * sizeof *r0.w) == 0;
        CHECK(wsame, "%s: weights after %d steps differ from none", what, STEPS);
        CHECK(r1.acts < r0.acts, "%s keeps %zu activation bytes, none %zu", what, r1.acts, r0.acts);
        if (strcmp(pol[k], "auto") == 0)
            CHECK(r1.auto_k >= 1 && r1.auto_k < L_, "%s: %d of %d blocks recomputed, expected some but not all", what,
                  r1.auto_k, L_);
        char note[48] = "";
        if (strcmp(pol[k], "auto") == 0) snprintf(note, sizeof note, ", %d of %d blocks recomputed", r1.auto_k, L_);
        printf("%-32s activations %7zu bytes (none %zu)%s; %d losses %s, weights %s\n", what, r1.acts, r0.acts, note,
               STEPS, same ? "identical" : "DIFFER", wsame ? "identical" : "DIFFER");
        free(r1.w);
    }
    free(r0.w);
}

/* (b): the step's forward/backward part, as test_grad_accum_matches_big_batch */
static float *accum_grads(const char *data, const variant *v, const char *B, const char *accum, size_t *n, double *loss) {
    mf_config c;
    lconfig(&c, data, v);
    mf_config_set(&c, "batch", B);
    mf_config_set(&c, "grad_accum", accum);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return NULL; }
    int k = c.grad_accum;
    float dscale = 1.0f / ((float)t.B * t.T * k);
    *loss = 0;
    for (int i = 0; i < k; i++) {
        mf_arena_step(&t.arena);
        if (i == 0) mf_model_zero_grads(&t.model, &t.arena);
        mf_trainer_load_batch(&t);
        *loss += mf_model_forward(&t.model, &t.arena, t.B, t.T, 1, dscale) / k;
        mf_model_backward(&t.model, &t.arena, t.B, t.T);
    }
    char what[96];
    snprintf(what, sizeof what, "%s batch %s accum %s", v->name, B, accum);
    check_ledger(&t, what);
    float *g = tu_copy_tensors(&t, 1, n);
    mf_trainer_free(&t);
    return g;
}

static void grad_accum(const char *data, const variant *v) {
    size_t n1 = 0, n2 = 0;
    double l1 = 0, l2 = 0;
    float *g1 = accum_grads(data, v, "4", "1", &n1, &l1), *g2 = accum_grads(data, v, "2", "2", &n2, &l2);
    CHECK(g1 && g2 && n1 == n2, "%s: gradient sizes", v->name);
    CHECK(mf_close(l1, l2, 1e-6, 0), "%s: losses %.9g vs %.9g", v->name, l1, l2);
    double worst = 0, gmax = 0;
    for (size_t i = 0; g1 && g2 && n1 == n2 && i < n1; i++) {
        gmax = fmax(gmax, fabs(g1[i]));
        worst = fmax(worst, fabs(g1[i] - g2[i]));
    }
    CHECK(gmax > 0 && worst <= 1e-6 * gmax, "%s: accumulated gradients differ by %.3g (max |g| %.3g)", v->name, worst,
          gmax);
    printf("%-32s batch 4 vs 2 x accum 2: loss %.9f vs %.9f, worst gradient difference %.2g of max |g| %.3g\n", v->name,
           l1, l2, gmax > 0 ? worst / gmax : 0, gmax);
    free(g1);
    free(g2);
}

/* (c): as test_update_in_backward_matches */
static void uib(const char *data, const variant *v, const char *opt, const char *rc) {
    result r[2];
    for (int u = 0; u < 2; u++) {
        mf_config c;
        lconfig(&c, data, v);
        mf_config_set(&c, "optimizer", opt);
        mf_config_set(&c, "momentum", strcmp(opt, "adamw") && strcmp(opt, "adamw8bit") ? "0.9" : "0");
        mf_config_set(&c, "grad_clip", "0");
        mf_config_set(&c, "recompute", rc);
        mf_config_set(&c, "update_in_backward", u ? "1" : "0");
        char what[96];
        snprintf(what, sizeof what, "%s %s %s uib=%d", v->name, opt, rc, u);
        train(&c, what, 6, &r[u]);
    }
    if (r[0].ok && r[1].ok && r[0].nw == r[1].nw) {
        double worst = 0;
        size_t same = 0;
        for (size_t i = 0; i < r[0].nw; i++) {
            if (r[0].w[i] == r[1].w[i]) same++;
            else worst = fmax(worst, fabs((double)r[0].w[i] - r[1].w[i]) / fmax(fabs((double)r[0].w[i]), 1e-30));
        }
        int lsame = 1;
        for (int i = 0; i < 6; i++) {
            CHECK(r[0].loss[i] == r[1].loss[i], "%s %s uib step %d: loss %.17g vs %.17g", v->name, opt, i + 1,
                  r[1].loss[i], r[0].loss[i]);
            lsame &= r[0].loss[i] == r[1].loss[i];
        }
        CHECK(worst <= 1e-7, "%s %s uib: weights differ by %.3g relative", v->name, opt, worst);
        CHECK(r[1].grads < r[0].grads, "%s %s: update_in_backward planned %zu gradient bytes, plain %zu", v->name, opt,
              r[1].grads, r[0].grads);
        printf("%-32s update_in_backward %-9s recompute %-9s: 6 losses %s, %zu/%zu weights bitwise equal (worst %.2g "
               "rel); gradients %zu -> %zu bytes\n", v->name, opt, rc, lsame ? "identical" : "DIFFER", same, r[0].nw,
               worst, r[0].grads, r[1].grads);
    } else CHECK(0, "%s %s uib: runs failed", v->name, opt);
    free(r[0].w);
    free(r[1].w);
}

/* (d) */
static void optimizer_trains(const char *data, const variant *v, const char *opt, const char *lr) {
    mf_config c;
    lconfig(&c, data, v);
    mf_config_set(&c, "optimizer", opt);
    mf_config_set(&c, "lr", lr);
    mf_config_set(&c, "momentum", strcmp(opt, "sgd") == 0 ? "0.9" : "0");
    mf_config_set(&c, "steps", "30");
    result r;
    char what[96];
    snprintf(what, sizeof what, "%s %s", v->name, opt);
    train(&c, what, 30, &r);
    if (!r.ok) return;
    double first = (r.loss[0] + r.loss[1] + r.loss[2]) / 3, last = (r.loss[27] + r.loss[28] + r.loss[29]) / 3;
    int finite = 1;
    for (int i = 0; i < 30; i++) finite &= isfinite(r.loss[i]);
    CHECK(finite && last < first - 0.5, "%s: loss %.4f (first 3 steps) -> %.4f (last 3): did not fall by 0.5", what,
          first, last);
    printf("%-32s 30 steps: loss %.4f -> %.4f\n", what, first, last);
    free(r.w);
}

/* (f): as test_offload_matches_memory */
static unsigned char *state_bytes(mf_trainer *t, int i, int k, size_t *n) {
    int id = t->model.tensors[i].st[k];
    const mf_buf *b = &t->plan.bufs[id];
    *n = (size_t)b->numel * mf_dtype_size(b->dtype);
    unsigned char *out = malloc(*n);
    if (b->disk) { if (mf_offstate_row_io(t, i, id, 0, out, *n, 0)) CHECK(0, "%s", mf_error()); }
    else memcpy(out, mf_arena_ptr(&t->arena, id), *n);
    return out;
}

static void offload(const char *data, const variant *v, const char *opt) {
    char path[96], off[128], what[96];
    snprintf(path, sizeof path, "%s.%s.state", data, opt);
    snprintf(off, sizeof off, "optimizer=disk:%s", path);
    snprintf(what, sizeof what, "%s %s offload", v->name, opt);
    mf_config cm, cd;
    lconfig(&cm, data, v);
    mf_config_set(&cm, "optimizer", opt);
    mf_config_set(&cm, "momentum", strcmp(opt, "sgd") == 0 ? "0.9" : "0");
    cd = cm;
    mf_config_set(&cd, "offload", off);
    mf_config_set(&cd, "offload_window", "16KiB");
    mf_trainer a, b;
    if (mf_trainer_init(&a, &cm, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", what, mf_error()); return; }
    if (mf_trainer_init(&b, &cd, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", what, mf_error()); mf_trainer_free(&a); return; }
    CHECK(b.plan.peak_cat[MF_CAT_OPTIM] == 0 && b.plan.disk_bytes > 0, "%s: state not on disk (%zu arena bytes)", what,
          b.plan.peak_cat[MF_CAT_OPTIM]);
    CHECK(b.off_n > 2, "%s: only %d chunks", what, b.off_n);
    int lsame = 1;
    for (int s = 0; s < 5; s++) {
        mf_step_stats sa, sb;
        CHECK(mf_trainer_step(&a, &sa) == 0 && mf_trainer_step(&b, &sb) == 0, "%s: %s", what, mf_error());
        CHECK(sa.loss == sb.loss, "%s step %d: %.17g vs %.17g", what, s + 1, sb.loss, sa.loss);
        lsame &= sa.loss == sb.loss;
    }
    int wsame = 1, ssame = 1;
    for (int i = 0; i < a.model.n_tensors; i++) {
        const mf_tensor *x = &a.model.tensors[i];
        int eq = memcmp(mf_arena_ptr(&a.arena, x->p), mf_arena_ptr(&b.arena, b.model.tensors[i].p),
                        (size_t)x->numel * sizeof(float)) == 0;
        CHECK(eq, "%s: weights %s differ", what, x->name);
        wsame &= eq;
        for (int k = 0; k < MF_OPTIM_STATES; k++) {
            if (x->st[k] < 0) continue;
            size_t na, nb;
            unsigned char *sa = state_bytes(&a, i, k, &na), *sb = state_bytes(&b, i, k, &nb);
            eq = na == nb && memcmp(sa, sb, na) == 0;
            CHECK(eq, "%s: state %s differs", what, a.plan.bufs[x->st[k]].name);
            ssame &= eq;
            free(sa);
            free(sb);
        }
    }
    check_ledger(&a, what);
    check_ledger(&b, what);
    printf("%-32s 5 steps: losses %s, weights %s, state %s; %.1f KiB on disk in %d chunks\n", what,
           lsame ? "identical" : "DIFFER", wsame ? "identical" : "DIFFER", ssame ? "identical" : "DIFFER",
           b.plan.disk_bytes / 1024.0, b.off_n);
    mf_trainer_free(&a);
    mf_trainer_free(&b);
    CHECK(access(path, F_OK) != 0, "%s: state file left behind", what);
}

/* (g): as test_batch_split_matches_whole */
static float *split_grads(const char *data, const variant *v, int B, int planT, int rows, int T, size_t *n,
                          double *loss, int *micro) {
    mf_config c;
    lconfig(&c, data, v);
    char b[16], s[16];
    snprintf(b, sizeof b, "%d", B);
    snprintf(s, sizeof s, "%d", planT);
    mf_config_set(&c, "block_size", "64");
    mf_config_set(&c, "batch", b);
    mf_config_set(&c, "seq", s);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "init %dx%d: %s", B, planT, mf_error()); return NULL; }
    *micro = mf_trainer_accumulate(&t, rows, T, 1.0f, loss);
    CHECK(*micro > 0, "%dx%d in plan %dx%d: %s", rows, T, B, planT, mf_error());
    float *g = *micro > 0 ? tu_copy_tensors(&t, 1, n) : NULL;
    CHECK(t.ledger.peak_total <= t.plan.peak_bytes, "ledger %zu over plan %zu", t.ledger.peak_total, t.plan.peak_bytes);
    mf_trainer_free(&t);
    return g;
}

static void batch_split(const char *data, const variant *v, int rows, int T, int splitB, int splitT, int want) {
    size_t n1 = 0, n2 = 0;
    double l1 = 0, l2 = 0;
    int m1 = 0, m2 = 0;
    char what[128];
    snprintf(what, sizeof what, "%s %d x %d in a plan of %d x %d", v->name, rows, T, splitB, splitT);
    float *g1 = split_grads(data, v, rows, T, rows, T, &n1, &l1, &m1);
    float *g2 = split_grads(data, v, splitB, splitT, rows, T, &n2, &l2, &m2);
    CHECK(g1 && g2 && n1 == n2, "%s: sizes", what);
    CHECK(m1 == 1, "%s: the whole batch took %d micro-batches in its own plan", what, m1);
    CHECK(m2 == want, "%s: split into %d micro-batches, expected %d", what, m2, want);
    CHECK(mf_close(l1, l2, 1e-6, 0), "%s: losses %.9g vs %.9g", what, l1, l2);
    double worst = 0, gmax = 0;
    for (size_t i = 0; g1 && g2 && n1 == n2 && i < n1; i++) {
        gmax = fmax(gmax, fabs(g1[i]));
        worst = fmax(worst, fabs(g1[i] - g2[i]));
    }
    CHECK(gmax > 0 && worst <= 2e-6 * gmax, "%s: max difference %.3g vs max |g| %.3g", what, worst, gmax);
    printf("%-48s %d micro-batches, loss %.6f vs %.6f, worst difference %.2g of max |g| %.3g\n", what, m2, l1, l2,
           gmax > 0 ? worst / gmax : 0, gmax);
    free(g1);
    free(g2);
}

/* (h) a checkpoint after 3 of 8 steps resumes bit-identically (weights,
 * optimizer state, data position, schedule) */
static void resume(const char *data, const variant *v, const char *opt) {
    char ckpt[96], what[96];
    snprintf(ckpt, sizeof ckpt, "%s.%s.ckpt", data, opt);
    snprintf(what, sizeof what, "%s %s resume", v->name, opt);
    mf_config c;
    lconfig(&c, data, v);
    mf_config_set(&c, "optimizer", opt);
    mf_config_set(&c, "momentum", strcmp(opt, "sgd") == 0 ? "0.9" : "0");
    result whole;
    train(&c, what, STEPS, &whole);
    if (!whole.ok) return;
    double loss[STEPS];
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", what, mf_error()); free(whole.w); return; }
    tu_steps(&t, 0, 3, loss);
    CHECK(mf_trainer_save_checkpoint(&t, ckpt) == 0, "%s: %s", what, mf_error());
    mf_trainer_free(&t);
    mf_config_set(&c, "resume", ckpt);
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", what, mf_error()); free(whole.w); return; }
    CHECK(t.step == 3, "%s: resumed at step %d", what, t.step);
    tu_steps(&t, 3, STEPS, loss);
    check_ledger(&t, what);
    size_t n = 0;
    float *w = tu_copy_tensors(&t, 0, &n);
    int same = 1;
    for (int i = 0; i < STEPS; i++) {
        CHECK(loss[i] == whole.loss[i], "%s step %d: loss %.17g vs %.17g uninterrupted", what, i + 1, loss[i],
              whole.loss[i]);
        same &= loss[i] == whole.loss[i];
    }
    int wsame = w && n == whole.nw && memcmp(w, whole.w, n * sizeof *w) == 0;
    CHECK(wsame, "%s: weights after %d steps differ from an uninterrupted run", what, STEPS);
    printf("%-32s 3 steps, checkpoint, 5 more: %d losses %s, weights %s\n", what, STEPS,
           same ? "identical" : "DIFFER", wsame ? "identical" : "DIFFER");
    free(w);
    free(whole.w);
    mf_trainer_free(&t);
    unlink(ckpt);
}

/* HF folders from the PyTorch reference, llama-tiny's shape at 4 layers,
 * written concurrently (each run starts torch: seconds). */
static int make_hf(const char *src, const char *tmp, const char *const (*dirs)[2], int n) {
    char cmd[4096] = "";
    for (int i = 0; i < n; i++)
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd),
                 "/usr/bin/python3 %s/tests/ref/llama_torch.py make-hf --out %s/%s --layers 4 --hidden 64 --heads 8 "
                 "--kv_heads 2 --head_dim 8 --inter 160 --vocab 256 --max_pos 256 --seed 3 --norm_jitter 0.1 %s "
                 ">/dev/null & ", src, tmp, dirs[i][0], dirs[i][1]);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "wait");
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s", cmd); return -1; }
    for (int i = 0; i < n; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s/config.json", tmp, dirs[i][0]);
        if (access(p, R_OK) != 0) {
            CHECK(0, "the reference wrote no %s (needs /usr/bin/python3 with python3-torch): %s", p, cmd);
            return -1;
        }
    }
    return 0;
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    src = src ? src : "..";
    char data[64], tmp[] = "/tmp/memfit-llama-tech-XXXXXX";
    CHECK(tu_make_tokens(data, sizeof data, 40000, 21) == 0, "token file: %s", mf_error());
    if (!mkdtemp(tmp)) { CHECK(0, "mkdtemp"); return mf_test_done("test_llama_techniques_match"); }
    variant untied = {"llama-tiny L4 untied", ""}, tied = {"llama L4 tied (HF folder)", ""};
    variant qwen = {"qwen2 L4 q/k/v biases, tied", ""}, mistral = {"mistral L4 window 16 < T 64", ""};
    snprintf(tied.init, sizeof tied.init, "%s/tied", tmp);
    snprintf(qwen.init, sizeof qwen.init, "%s/qwen2", tmp);
    snprintf(mistral.init, sizeof mistral.init, "%s/mistral", tmp);
    static const char *const dirs[3][2] = {{"tied", "--arch llama --tied 1"},
                                           {"qwen2", "--arch qwen2 --tied 1 --rope_theta 1000000 --rms_eps 1e-6"},
                                           {"mistral", "--arch mistral --tied 0 --window 16"}};
    int have = make_hf(src, tmp, dirs, 3) == 0;

    const variant *vs[2] = {&untied, &tied};
    for (int k = 0; k < 2; k++) {
        const variant *v = vs[k];
        if (k == 1 && !have) break;
        /* the folder's head is tied, the preset's is not */
        mf_config c;
        lconfig(&c, data, v);
        mf_dims d;
        CHECK(mf_model_dims(&c, &d) == 0 && d.tied == k && d.L == L_ && d.NKV == 2 && d.ffn == 160,
              "%s: dims (tied %d, L %d, kv %d, ffn %d)", v->name, d.tied, d.L, d.NKV, d.ffn);
        recompute(data, v, 1);
        grad_accum(data, v);
        uib(data, v, "adamw", "none");
        uib(data, v, k ? "sgd" : "adamw8bit", "full");
        uib(data, v, k ? "adafactor" : "adamw", "every:3");
        optimizer_trains(data, v, "adamw8bit", "3e-3");
        optimizer_trains(data, v, "adafactor", "1e-2");
        optimizer_trains(data, v, "sgd", "0.1");
        offload(data, v, "adamw");
        offload(data, v, k ? "sgd" : "adamw8bit");
        batch_split(data, v, 12, 16, 2, 16, 6);
        batch_split(data, v, 5, 24, 4, 16, 3);
        batch_split(data, v, 2, 48, 4, 16, 2);
        resume(data, v, k ? "adafactor" : "adamw");
    }
    if (have) recompute(data, &qwen, 0);
    if (have) recompute(data, &mistral, 0);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {}
    unlink(data);
    return mf_test_done("test_llama_techniques_match");
}
