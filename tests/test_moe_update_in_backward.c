/* --update_in_backward on a mixture of experts (docs/moe.md, "Update in
 * backward, expert by expert"): each expert's gradient (w1, w3, w2 of one
 * expert) is computed into a row of one expert, that expert's slice of the
 * stacks is updated as soon as its backward is done, and the row serves
 * the next expert.
 *  - the plan: every layer's grad.*.experts.* rows hold one expert
 *    (F x C floats), the grads category shrinks by (E-1)/E of the expert
 *    gradient bytes against update_in_backward with whole stacks
 *    (Adafactor, or an 8-bit block that does not tile an expert, keep
 *    them), and planned == ledger in total and per category;
 *  - moe-tiny, 5 steps, against the plain step (update after backward):
 *    bit-identical losses, weights and optimizer state for AdamW top-2 and top-1, with a
 *    capacity that drops slots, recompute none / selective / full, 8-bit
 *    AdamW, SGD with momentum, bf16 experts with fp32 masters and without
 *    (stochastic rounding), and the Adafactor fallback. */
#include "memfit/train.h"
#include "model/internal.h"
#include "testutil.h"
#include "trainutil.h"

#include <string.h>

typedef struct {
    const char *name, *opt, *recompute, *prec;
    const char *kv[4][2];  /* extra settings */
    int gx;                /* 1: the expert rows hold one expert */
} variant;

typedef struct {
    double loss[5];
    unsigned char *w;  /* every tensor's weight row (16-bit without masters) and optimizer state rows, as bytes */
    size_t n, grads, expert_row;
    int64_t dropped;
} result;

/* the bytes of every weight row (the master row under 16-bit precision, the
 * 16-bit row without masters) and optimizer state row, in table order */
static unsigned char *copy_state(const mf_trainer *t, size_t *n) {
    const mf_model *m = &t->model;
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        unsigned char *out = pass ? malloc(total) : NULL;
        size_t o = 0;
        for (int i = 0; i < m->n_tensors; i++) {
            const mf_tensor *x = &m->tensors[i];
            int ids[1 + MF_OPTIM_STATES] = {mf_tensor_weights_row(x)};
            for (int k = 0; k < MF_OPTIM_STATES; k++) ids[1 + k] = x->st[k];
            for (int k = 0; k < 1 + MF_OPTIM_STATES; k++) {
                if (ids[k] < 0) continue;
                size_t b = t->plan.bufs[ids[k]].bytes;
                if (out) memcpy(out + o, mf_arena_ptr(&t->arena, ids[k]), b);
                o += b;
            }
        }
        if (pass) { *n = o; return out; }
        total = o;
    }
    return NULL;
}

static void base_config(mf_config *c, const char *tok) {
    mf_config_defaults(c);
    const char *kv[][2] = {{"model", "moe-tiny"}, {"seq", "32"}, {"batch", "4"}, {"tokenizer", "bytes"},
                           {"val_fraction", "0"}, {"sample_tokens", "0"}, {"threads", "2"}, {"loss_chunk", "0"},
                           {"lr", "3e-3"}, {"warmup", "0"}, {"grad_clip", "0"}, {"router_aux_loss_coef", "0.02"},
                           {"router_z_loss_coef", "0.001"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s %s: %s", kv[i][0], kv[i][1], mf_error());
    mf_config_set(c, "data", tok);
}

static const mf_buf *row(const mf_plan *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->bufs[i].name, name) == 0) return &p->bufs[i];
    return NULL;
}

static int run(const char *tok, const variant *v, int uib, result *r) {
    mf_config c;
    base_config(&c, tok);
    mf_config_set(&c, "optimizer", v->opt);
    mf_config_set(&c, "momentum", strcmp(v->opt, "sgd") == 0 ? "0.9" : "0");
    mf_config_set(&c, "recompute", v->recompute);
    mf_config_set(&c, "precision", v->prec);
    for (int i = 0; i < 4 && v->kv[i][0]; i++)
        CHECK(mf_config_set(&c, v->kv[i][0], v->kv[i][1]) == 0, "%s %s: %s", v->kv[i][0], v->kv[i][1], mf_error());
    mf_config_set(&c, "update_in_backward", uib ? "1" : "0");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s uib=%d: %s", v->name, uib, mf_error()); return -1; }
    memset(r, 0, sizeof *r);
    for (int s = 0; s < 5; s++) {
        mf_step_stats st;
        if (mf_trainer_step(&t, &st)) { CHECK(0, "%s uib=%d step %d: %s", v->name, uib, s + 1, mf_error()); break; }
        r->loss[s] = st.loss;
        r->dropped += t.model.moe_dropped;
    }
    CHECK(t.plan.peak_bytes == t.ledger.peak_total, "%s uib=%d: planned peak %zu, ledger peak %zu", v->name, uib,
          t.plan.peak_bytes, t.ledger.peak_total);
    for (int cat = 0; cat < MF_CAT_COUNT; cat++)
        CHECK(t.plan.max_cat[cat] == t.ledger.peak[cat], "%s uib=%d category %d: planned %zu, ledger %zu", v->name,
              uib, cat, t.plan.max_cat[cat], t.ledger.peak[cat]);
    /* the expert rows: one expert (gx) or the whole stack, in every layer */
    const mf_model *m = &t.model;
    const int64_t E = m->d.n_experts, F = m->d.ffn, C = m->d.C;
    for (int l = 0; l < m->d.L; l++)
        for (int k = 0; k < 3; k++) {
            const char *wn[3] = {"w1", "w3", "w2"};
            char nm[128];
            snprintf(nm, sizeof nm, "grad.model.layers.%d.block_sparse_moe.experts.%s.weight", l, wn[k]);
            const mf_buf *b = row(&t.plan, nm);
            const int want = uib && v->gx;
            const mf_tensor *x = &m->tensors[m->t_layer0 + l * m->nlt + m->lt[MF_LT_W1 + k]];
            CHECK(b && b->bytes == (size_t)((want ? 1 : E) * F * C * 4) && x->gx == want &&
                      x->gnumel == (want ? 1 : E) * F * C,
                  "%s uib=%d %s: %zu bytes, gx %d, want %s", v->name, uib, nm, b ? b->bytes : 0, x->gx,
                  want ? "one expert" : "the stack");
            if (l == 0 && k == 0) r->expert_row = b ? b->bytes : 0;
        }
    r->grads = t.plan.max_cat[MF_CAT_GRADS];
    r->w = copy_state(&t, &r->n);
    mf_trainer_free(&t);
    return 0;
}

static void compare(const char *tok, const variant *v) {
    result p, u;
    if (run(tok, v, 0, &p)) return;
    if (run(tok, v, 1, &u)) { free(p.w); return; }
    size_t same = 0;
    for (size_t i = 0; p.w && u.w && i < p.n && p.n == u.n; i++) same += p.w[i] == u.w[i];
    for (int s = 0; s < 5; s++)
        CHECK(p.loss[s] == u.loss[s], "%s step %d: plain %.17g, update_in_backward %.17g", v->name, s + 1, p.loss[s],
              u.loss[s]);
    CHECK(p.n == u.n && same == p.n, "%s: %zu of %zu bytes of weights and optimizer state differ", v->name,
          p.n - same, p.n);
    CHECK(p.dropped == u.dropped, "%s: dropped %lld vs %lld", v->name, (long long)p.dropped, (long long)u.dropped);
    CHECK(u.grads < p.grads, "%s: update_in_backward planned %zu gradient bytes, plain %zu", v->name, u.grads, p.grads);
    printf("%-34s 5 losses identical (%.9f .. %.9f), %zu/%zu bytes of weights+state equal, %lld slots dropped; "
           "grads %zu -> %zu B, expert row %zu B\n",
           v->name, p.loss[0], p.loss[4], same, p.n, (long long)p.dropped, p.grads, u.grads, u.expert_row);
    free(p.w);
    free(u.w);
}

/* the grads category: one expert's rows against whole stacks, both under
 * update_in_backward (an 8-bit block of 3000 elements does not tile an
 * expert's 4096, so the stacks stay whole there; the other rows agree) */
static void grads_bytes(const char *tok) {
    size_t g[2] = {0, 0};
    int64_t E = 0, F = 0, C = 0;
    for (int k = 0; k < 2; k++) {
        mf_config c;
        base_config(&c, tok);
        mf_config_set(&c, "optimizer", "adamw8bit");
        mf_config_set(&c, "update_in_backward", "1");
        mf_config_set(&c, "optim_block", k ? "3000" : "2048");
        mf_dims d;
        mf_plan p;
        mf_model m;
        if (mf_model_build_plan(&c, MF_MODE_TRAIN, 2, 0, &d, &p, &m)) { CHECK(0, "plan: %s", mf_error()); return; }
        CHECK(m.tensors[m.t_layer0 + m.lt[MF_LT_W2]].gx == !k, "optim_block %s: gx %d", k ? "3000" : "2048",
              m.tensors[m.t_layer0 + m.lt[MF_LT_W2]].gx);
        g[k] = p.max_cat[MF_CAT_GRADS], E = d.n_experts, F = d.ffn, C = d.C;
        mf_model_free(&m);
        mf_plan_free(&p);
    }
    /* one layer's three stacks live at once: (E-1) experts of 3 F C floats fewer */
    const size_t saved = (size_t)((E - 1) * 3 * F * C * 4);
    CHECK(g[1] - g[0] == saved, "grads: whole stacks %zu, one expert %zu: saved %zu, want (E-1) x 3FC x 4 = %zu", g[1],
          g[0], g[1] - g[0], saved);
    printf("grads category, update_in_backward: whole expert stacks %zu B, one expert's rows %zu B (%zu B saved)\n",
           g[1], g[0], g[1] - g[0]);
}

int main(void) {
    char tok[256];
    CHECK(tu_make_tokens(tok, sizeof tok, 1 << 16, 7) == 0, "token file: %s", mf_error());
    grads_bytes(tok);
    const variant vs[] = {
        {"adamw top-2 none", "adamw", "none", "fp32", {{0}}, 1},
        {"adamw top-1 selective", "adamw", "selective", "fp32", {{"num_experts_per_tok", "1"}}, 1},
        {"adamw top-2 cf 0.5 full", "adamw", "full", "fp32", {{"capacity_factor", "0.5"}}, 1},
        {"adamw top-1 cf 0.75 every:2", "adamw", "every:2", "fp32",
         {{"num_experts_per_tok", "1"}, {"capacity_factor", "0.75"}}, 1},
        {"adamw8bit top-2 selective", "adamw8bit", "selective", "fp32", {{0}}, 1},
        {"sgd top-2 cf 0.5 none", "sgd", "none", "fp32", {{"capacity_factor", "0.5"}}, 1},
        {"bf16 adamw top-2 cf 0.75 full", "adamw", "full", "bf16", {{"capacity_factor", "0.75"}}, 1},
        {"bf16 no master adamw8bit none", "adamw8bit", "none", "bf16", {{"master_weights", "0"}}, 1},
        {"adafactor (whole stacks) none", "adafactor", "none", "fp32", {{0}}, 0},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) compare(tok, &vs[i]);
    remove(tok);
    return mf_test_done("test_moe_update_in_backward");
}
