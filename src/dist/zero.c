/* ZeRO stages 0-2 on the model's plan rows (see dist/dist.h).
 *
 * Every tensor is split by elements into one contiguous shard per rank
 * (mf_dist_shard). Per-rank model-state bytes, for Psi parameters in fp32
 * with AdamW's two fp32 moments (ZeRO paper section 5.1, with memfit's 4
 * bytes per parameter and gradient and K = 8 bytes of state):
 *   stage 0: 4 Psi + 4 Psi + 8 Psi
 *   stage 1: 4 Psi + 4 Psi + 8 Psi / N
 *   stage 2: 4 Psi + (4 + 8) Psi / N   (+ one layer's full gradients in backward)
 *   stage 3: (4 + 4 + 8) Psi / N       (+ the parameters of the layer that runs)
 * with N the shard count: the ranks, or zero_group under hybrid sharding.
 * The state rows are planned on the shard by the model (mf_optim.zero), the
 * gradient shards too; this file adds the collectives' bucket scratch and runs the
 * collectives at the points the trainer calls it. */
#include "dist/dist.h"
#include "memfit/kernels.h"

#include <string.h>

int mf_zero_shards(const mf_optim *o) { return o->group > 0 ? o->group : o->world > 1 ? o->world : 1; }

double mf_zero_comm_volume(int zero, int world, int group, double psi) {
    if (world <= 1) return 0;
    double b = psi * sizeof(float), W = world;
    if (zero == 0) return 2 * b * (W - 1) / W;  /* one all-reduce over the world */
    double N = group > 0 ? group : world, G = W / N;
    /* reduce-scatter in the group, the shard's all-reduce across groups,
     * then the parameters' all-gather(s) in the group: once after the
     * update (stages 1-2) or in forward and again in backward (stage 3) */
    return b * (N - 1) / N + 2 * (b / N) * (G - 1) / G + (zero >= 3 ? 2 : 1) * b * (N - 1) / N;
}

int mf_zero_check(const mf_config *cfg, int world) {
    if (cfg->zero_group && (world % cfg->zero_group || cfg->zero_group > world))
        return mf_fail("zero_group %d does not divide the %d ranks (groups of zero_group consecutive ranks each hold "
                       "every shard once)", cfg->zero_group, world);
    if (world <= 1) return 0;
    if (cfg->zero == 3 && strcmp(cfg->recompute, "none") != 0 && strcmp(cfg->recompute, "selective") != 0)
        return mf_fail("zero 3 gathers each layer's parameters for its own phases; recompute '%s' rebuilds blocks in "
                       "other layers' phases: use recompute none or selective with zero 3", cfg->recompute);
    if (cfg->batch % world)
        return mf_fail("batch %d does not split evenly over %d ranks (each rank takes batch / ranks sequences)",
                       cfg->batch, world);
    if (cfg->update_in_backward)
        return mf_fail("update_in_backward cannot be combined with data parallelism over %d ranks (the update needs "
                       "the gradient summed over the ranks)", world);
    if (cfg->zero >= 1 && (strcmp(cfg->optimizer, "adamw8bit") == 0 || strcmp(cfg->optimizer, "adafactor") == 0))
        return mf_fail("zero %d shards optimizer state by elements; %s state is per block or per row and column, "
                       "use adamw or sgd, or zero 0", cfg->zero, cfg->optimizer);
    return 0;
}

static int sharded(const mf_model *m) { return m->opt.zero >= 1 && m->opt.world > 1; }

int64_t mf_zero_ring_numel(const mf_model *m) {
    /* the reduce-scatter's packed bucket: one block per rank of at most the
     * largest shard, all of them within one message (MF_DIST_BUCKET) */
    int W = mf_zero_shards(&m->opt);
    int64_t most = 1, cap = MF_DIST_BUCKET / W > 0 ? MF_DIST_BUCKET / W : 1;
    for (int i = 0; i < m->n_tensors; i++) {
        if (m->tensors[i].frozen) continue;  /* LoRA's base: never reduced, never sharded (zero 0) */
        int64_t s = (m->tensors[i].numel + W - 1) / W;
        if (s > most) most = s;
    }
    return (most < cap ? most : cap) * W;
}

int mf_zero_plan(mf_plan *plan, const mf_model *mc) {
    mf_model *m = (mf_model *)mc;
    m->comm = -1;
    if (m->mode != MF_MODE_TRAIN || m->opt.world <= 1) return 0;
    /* stages 0 and 1 reduce in the optimizer phase, stage 2 (and 0-1 with
     * the overlap) from the head's backward (ln_f's gradient) to the
     * embedding's; an untied head's gradient is complete with the loss, in
     * the head's forward phase; 0-1 with the overlap finish in the optimizer
     * phase */
    int bwd = m->opt.zero >= 2 || m->overlap;
    int first = bwd ? (m->t_head >= 0 ? mf_phase_head_fwd(m) : mf_phase_head_bwd(m)) : mf_phase_optim(m);
    int last = m->opt.zero >= 2 ? mf_phase_emb_bwd(m) : mf_phase_optim(m);
    int64_t shape[1] = {mf_zero_ring_numel(m)};
    m->comm = mf_plan_add(plan, "comm.bucket", MF_CAT_COMM, MF_DTYPE_F32, 1, shape, first, last, -1);
    if (m->comm < 0) return -1;
    /* the MPI library's own memory for the collectives at the planned
     * bucket: outside the arena (no ledger), resident for the whole run */
    if (mf_dist_measure_scratch()) return -1;
    size_t mpi[MF_DIST_COLL_COUNT];
    mf_dist_scratch_plan(m->opt.world, mpi);
    static const char *name[MF_DIST_COLL_COUNT] = {"comm.mpi.allreduce", "comm.mpi.reduce_scatter", "comm.mpi.allgather"};
    for (int c = 0; c < MF_DIST_COLL_COUNT; c++) {
        int64_t sh[1] = {(int64_t)mpi[c]};
        int id = mf_plan_add(plan, name[c], MF_CAT_COMM, MF_DTYPE_U8, 1, sh, 0, plan->n_phases - 1, -1);
        if (id < 0) return -1;
        plan->bufs[id].outside = 1;
    }
    return 0;
}

/* ZeRO 0-1's overlap: tensors whose reduction was started in this step's
 * backward (all of them, when the model called grads_ready for each) */
static int g_ov_done;

int mf_zero_sync_grads(mf_model *m, mf_arena *a) {
    if (m->opt.world > 1 && mf_dist_gather_wait()) return -1;
    if (m->opt.world <= 1 || m->opt.zero >= 2) return 0;
    int done = g_ov_done;
    g_ov_done = 0;
    if (done == m->n_tensors) return 0;
    if (done) return mf_fail("rank %d: the backward reduced %d of %d gradients", mf_dist_rank(), done, m->n_tensors);
    float *ring = mf_arena_get(a, m->comm);
    int64_t rn = mf_zero_ring_numel(m);
    for (int i = 0; i < m->n_tensors; i++) {
        mf_tensor *x = &m->tensors[i];
        if (x->g < 0) continue;  /* LoRA's frozen base (expert parallel) */
        float *g = mf_arena_get(a, x->g);
        /* expert parallel: an expert's gradient (or its adapters') over the
         * ranks holding it;
         * grad_dtype bf16 (ZeRO 0): summed in fp32 through the bucket (grad16.c) */
        int rc = x->ep_full > 0 ? mf_dist_ep_allreduce(g, x->numel)
               : x->g16 ? mf_grad16_allreduce((uint16_t *)g, x->numel, ring, rn)
               : m->opt.zero == 0 ? mf_dist_allreduce(g, x->numel, ring, rn) : mf_dist_reduce_scatter(g, x->numel, ring, rn);
        if (rc) return -1;
    }
    return 0;
}

int mf_zero_grads_ready(mf_model *m, mf_arena *a, int first, int n) {
    float *ring = mf_arena_get(a, m->comm);
    int64_t rn = mf_zero_ring_numel(m);
    if (m->overlap && m->opt.zero < 2) {
        /* ZeRO 0-1, the step's last micro-batch: these gradients are
         * complete; all-reduce (0) or reduce-scatter them in place (1) in
         * the background while the backward of the block before runs. The
         * same calls on the same buffers as mf_zero_sync_grads makes, so the
         * same sums bit for bit; the rows live through the step anyway */
        float *x[MF_LAYER_TENSORS];
        int64_t numel[MF_LAYER_TENSORS];
        if (n > MF_LAYER_TENSORS) return mf_fail("%d tensors in one gradient reduction (a block has %d)", n, MF_LAYER_TENSORS);
        int g16[MF_LAYER_TENSORS], any16 = 0;
        for (int i = 0; i < n; i++) {
            x[i] = mf_arena_get(a, m->tensors[first + i].g), numel[i] = m->tensors[first + i].numel;
            any16 |= g16[i] = m->tensors[first + i].g16;
        }
        g_ov_done += n;
        if (any16) return mf_grad16_allreduce_start((void *const *)x, numel, g16, n, ring, rn);
        return m->opt.zero == 0 ? mf_dist_allreduce_start(x, numel, n, ring, rn) : mf_dist_reduce_start(x, numel, NULL, n, ring, rn);
    }
    if (m->overlap && a->phase != mf_phase_emb_bwd(m)) {
        /* DDP-style overlap: this block's gradients are reduced by a
         * background thread while the next phase (the block before it)
         * computes; their rows live through that phase (the plan), and the
         * next collective joins the thread first */
        float *x[MF_LAYER_TENSORS], *acc[MF_LAYER_TENSORS];
        int64_t numel[MF_LAYER_TENSORS];
        if (n > MF_LAYER_TENSORS) return mf_fail("%d tensors in one gradient reduction (a block has %d)", n, MF_LAYER_TENSORS);
        for (int i = 0; i < n; i++) {
            mf_tensor *t = &m->tensors[first + i];
            x[i] = mf_arena_get(a, t->g);
            acc[i] = mf_arena_get(a, t->gs);
            numel[i] = t->numel;
        }
        return mf_dist_reduce_start(x, numel, acc, n, ring, rn);
    }
    for (int i = first; i < first + n; i++) {
        mf_tensor *x = &m->tensors[i];
        float *g = mf_arena_get(a, x->g), *gs = mf_arena_get(a, x->gs);
        if (mf_dist_reduce_scatter(g, x->numel, ring, rn)) return -1;
        /* accumulated over micro-batches (zeroed by mf_model_zero_grads) */
        for (int64_t k = 0; k < x->hi - x->lo; k++) gs[k] += g[x->lo + k];
    }
    return 0;
}

int mf_zero_grad_sumsq(mf_model *m, mf_arena *a, double *out) {
    double ss = 0, se = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        mf_tensor *x = &m->tensors[i];
        if (x->g < 0) continue;  /* LoRA's frozen base */
        const float *g = x->gs >= 0 ? (const float *)mf_arena_get(a, x->gs) : (const float *)mf_arena_get(a, x->g) + x->lo;
        if (x->g16 && x->gs < 0) ss += mf_grad16_sumsq((const uint16_t *)mf_arena_get(a, x->g) + x->lo, x->hi - x->lo);
        else if (x->ep_full > 0) se += mf_sumsq(g, (size_t)(x->hi - x->lo));
        else ss += mf_sumsq(g, (size_t)(x->hi - x->lo));
    }
    /* expert parallel: each rank of an expert group holds its experts' part */
    if (m->d.ep > 1) {
        if (mf_dist_ep_sum_doubles(&se, 1)) return -1;
        ss += se;
    }
    /* stage 0: every rank holds the whole summed gradient already */
    if (sharded(m) && mf_dist_sum_doubles_group(&ss, 1)) return -1;
    *out = ss;
    return 0;
}

int mf_zero_gather_params(mf_model *m, mf_arena *a) {
    if (!sharded(m) || m->opt.zero >= 3) return 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (mf_dist_allgather(mf_arena_get(a, m->tensors[i].p), m->tensors[i].numel)) return -1;
    return 0;
}

void mf_zero_model_states(const mf_plan *p, size_t *out) {
    memset(out, 0, MF_CAT_COUNT * sizeof *out);
    for (int i = 0; i < p->n; i++) {
        const mf_buf *b = &p->bufs[i];
        if (!b->disk && b->first == 0 && b->last == p->n_phases - 1) out[b->cat] += b->bytes;
    }
}

/* the full row of tensor x that phase `phase` reads (backward has its own) */
static float *full_row(mf_model *m, mf_arena *a, const mf_tensor *x, int phase) {
    float *full = mf_arena_get(a, x->pb >= 0 && phase >= mf_phase_head_bwd(m) ? x->pb : x->p);
    memcpy(full + x->lo, mf_arena_get(a, x->ps), (size_t)(x->hi - x->lo) * sizeof(float));
    return full;
}

int mf_zero_params_needed(mf_model *m, mf_arena *a, int first, int n) {
    for (int i = first; i < first + n; i++)
        if (mf_dist_allgather(full_row(m, a, &m->tensors[i], a->phase), m->tensors[i].numel)) return -1;
    return 0;
}

int mf_zero_params_prefetch(mf_model *m, mf_arena *a, int first, int n) {
    float *x[MF_LAYER_TENSORS];
    int64_t numel[MF_LAYER_TENSORS];
    if (n > MF_LAYER_TENSORS) return mf_fail("prefetch of %d tensors (a block has %d)", n, MF_LAYER_TENSORS);
    /* the rows the next phase reads: backward's from the head's backward on */
    int next = a->phase + 1;
    for (int i = 0; i < n; i++) {
        x[i] = full_row(m, a, &m->tensors[first + i], next);
        numel[i] = m->tensors[first + i].numel;
    }
    return mf_dist_gather_start(x, numel, n);
}
