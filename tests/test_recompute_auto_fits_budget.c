/* --recompute auto recomputes the fewest blocks whose plan fits --budget:
 * with no budget none, with a budget between "none" and "full" some but not
 * all blocks, with a budget below "full" every block and then the usual
 * refusal. Training through the chosen mix is bit-identical to none. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

/* Under AddressSanitizer freed memory waits in a quarantine and the
 * process's RSS drifts upward between trainers; this test compares budgets
 * against a measured baseline, so it asks for no quarantine. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=0:thread_local_quarantine_size_kb=0"; }

static void config(mf_config *c, const char *data, const char *policy) {
    tu_tiny_config(c, data);
    /* layers big enough (about 16 MiB of activations each) that the chosen
     * count does not hinge on the baseline's last few hundred KiB */
    mf_config_set(c, "n_layer", "4");
    mf_config_set(c, "n_embd", "256");
    mf_config_set(c, "n_head", "4");
    mf_config_set(c, "block_size", "128");
    mf_config_set(c, "seq", "128");
    mf_config_set(c, "batch", "8");
    mf_config_set(c, "recompute", policy);
    /* this test is about auto alone: the budget planner (which may also
     * change the micro-batch or offload the optimizer state) stays off */
    mf_config_set(c, "plan", "off");
}

static size_t arena_for(const char *data, const char *policy) {
    mf_config c;
    config(&c, data, policy);
    mf_dims d;
    mf_plan p;
    mf_model m;
    if (mf_model_build_plan(&c, MF_MODE_TRAIN, 2, 0, &d, &p, &m)) { CHECK(0, "%s", mf_error()); return 0; }
    size_t a = p.arena_bytes;
    mf_model_free(&m);
    mf_plan_free(&p);
    return a;
}

/* Arena of the plan that recomputes the lowest k blocks. */
static size_t arena_k(const char *data, int k) {
    mf_config c;
    config(&c, data, "none");
    mf_dims d;
    mf_plan p;
    mf_model m;
    mf_model_dims(&c, &d);
    mf_plan_init(&p, mf_model_n_phases(&d, MF_MODE_TRAIN));
    mf_recompute rc = {MF_RECOMPUTE_AUTO, k};
    mf_optim opt;
    mf_optim_init(&opt, &c);
    if (mf_model_plan(&m, &p, &d, c.batch, c.seq, MF_MODE_TRAIN, 2, c.loss_chunk, rc, &opt)) { CHECK(0, "%s", mf_error()); return 0; }
    mf_plan_layout(&p);
    size_t a = p.arena_bytes;
    mf_model_free(&m);
    mf_plan_free(&p);
    return a;
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 40000, 17) == 0, "token file: %s", mf_error());
    size_t none = arena_for(data, "none"), full = arena_for(data, "full");
    size_t k1 = arena_k(data, 1), k2 = arena_k(data, 2);
    CHECK(arena_k(data, 0) == none && arena_k(data, 4) == full, "auto with 0 / all blocks differs from none / full");
    CHECK(k2 < k1 && k1 <= none, "recomputing more blocks does not shrink the plan");
    printf("arena: none %zu, 1 block %zu, 2 blocks %zu, full %zu bytes\n", none, k1, k2, full);

    /* no budget: nothing recomputed. (A first trainer set up and freed
     * brings the allocator's pools to their working size, so the baselines
     * of the trainers below agree.) */
    mf_config c;
    config(&c, data, "auto");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) mf_trainer_free(&t);
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) {
        CHECK(0, "%s", mf_error());
        return mf_test_done("test_recompute_auto_fits_budget");
    }
    CHECK(t.model.auto_k == 0, "no budget: %d blocks recomputed", t.model.auto_k);
    size_t base = t.ledger.rss_baseline;
    double l_none[5];
    tu_steps(&t, 0, 5, l_none);
    mf_trainer_free(&t);
    /* steps may leave the process larger outside the plan (the GEMM
     * library's kernel caches): the baseline the next trainer reads is the
     * one after them */
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        base = t.ledger.rss_baseline;
        mf_trainer_free(&t);
    }

    /* room for the plan with two blocks recomputed, half a block to spare */
    char b[32];
    snprintf(b, sizeof b, "%zu", base + k2 + (k1 - k2) / 2);
    config(&c, data, "auto");
    mf_config_set(&c, "budget", b);
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) {
        CHECK(0, "%s", mf_error());
        return mf_test_done("test_recompute_auto_fits_budget");
    }
    CHECK(t.model.auto_k == 2, "budget %s: %d blocks recomputed, expected 2", b, t.model.auto_k);
    CHECK(t.plan.arena_bytes + t.ledger.rss_baseline <= c.budget, "chosen plan over budget");
    for (int i = 0; i < 5; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        CHECK(st.loss == l_none[i], "step %d: auto %.17g vs none %.17g", i + 1, st.loss, l_none[i]);
    }
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "ledger %zu != plan %zu", t.ledger.peak_total, t.plan.peak_bytes);
    printf("budget %s bytes: %d of 4 blocks recomputed, arena %zu\n", b, t.model.auto_k, t.plan.arena_bytes);
    mf_trainer_free(&t);

    /* below even "full": every block recomputed, and still refused */
    snprintf(b, sizeof b, "%zu", base + full / 2);
    mf_config_set(&c, "budget", b);
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0, "a budget below full was accepted");
    CHECK(strstr(mf_error(), "over by") != NULL, "message: %s", mf_error());
    unlink(data);
    return mf_test_done("test_recompute_auto_fits_budget");
}
