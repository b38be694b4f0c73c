/* The planner's time model counts the calls whose fixed cost its rates
 * leave out, as docs/planner.md states them, and times the attention's
 * projections at their own rate. With every class rate made free, a
 * per-call cost of 1 us turns the predicted step into the count itself:
 * gpt2-1m (L5 C128, P = 4 projections per block) at B8 T128 (1024 rows, 4
 * loss chunks of 256) has per micro-step 5 x (4 + 8) + 4 x 3 = 72 GEMM calls
 * and 5 x (5 + 4 + 4) + 4 + 4 = 73 other regions, and per optimizer step
 * 1 + 2 x 10 = 21 (the ten block matrices of 65536 elements: c_fc and
 * c_proj; c_attn has 49152). bf16 adds 4 + 2 regions per block, recompute
 * full 4 GEMM calls and 5 regions per block, grad_accum 2 doubles the
 * micro-step's and keeps the update's, and at 8 rows (8 x 128 < 4096) the
 * block kernels do not fork. */
#include "memfit/planner.h"
#include "testutil.h"

#include <string.h>

static mf_rates free_rates(void) {
    mf_rates r;
    memset(&r, 0, sizeof r);
    r.threads = 2;
    for (int j = 0; j < MF_RATES_GEMM_ROWS; j++)
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) {
            r.gemm_c[i] = 128 << i, r.gemm_m[j] = 64 << (2 * j);
            r.gemm_gflops[j][i] = r.gemm16_gflops[j][i] = 1e12;
        }
    for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) r.attnproj_factor[i] = r.attnproj16_factor[i] = 1;
    r.attn_gflops = r.elem_gbs = r.disk_gbs = 1e12;
    for (int k = 0; k < 4; k++) r.optim_mps[k] = 1e12;
    return r;
}

/* predicted seconds of gpt2-1m with the settings given (key, value pairs) */
static double predict(const mf_rates *r, mf_planner_choice *c, int batch, const char *const *kv) {
    mf_config cfg;
    mf_config_defaults(&cfg);
    mf_config_set(&cfg, "model", "gpt2-1m");
    mf_config_set(&cfg, "seq", "128");
    cfg.batch = batch;
    for (int i = 0; kv && kv[i]; i += 2)
        if (mf_config_set(&cfg, kv[i], kv[i + 1])) CHECK(0, "%s=%s: %s", kv[i], kv[i + 1], mf_error());
    mf_dims d;
    mf_plan p;
    mf_model m;
    if (mf_model_build_plan(&cfg, MF_MODE_TRAIN, 2, 0, &d, &p, &m)) { CHECK(0, "%s", mf_error()); return -1; }
    memset(c, 0, sizeof *c);
    c->grad_accum = cfg.grad_accum;
    double s = mf_planner_predict(r, c, &m, &p);
    mf_model_free(&m);
    mf_plan_free(&p);
    return s;
}

/* microseconds the fixed costs add: the prediction with the costs set,
 * less the one without */
static double fixed_us(double region_us, double gemm_us, double gemm16_us, int batch, const char *const *kv,
                       mf_planner_choice *c) {
    mf_rates r = free_rates();
    double base = predict(&r, c, batch, kv);
    r.region_us = region_us, r.gemm_call_us = gemm_us, r.gemm16_call_us = gemm16_us;
    return (predict(&r, c, batch, kv) - base) * 1e6;
}

static void counts(const char *what, int batch, const char *const *kv, double gemms, double regions, int bf16) {
    mf_planner_choice c;
    double g = fixed_us(0, bf16 ? 0 : 1, bf16 ? 1 : 0, batch, kv, &c);
    CHECK(c.gemm_calls == gemms, "%s: %.0f GEMM calls counted, want %.0f", what, c.gemm_calls, gemms);
    CHECK(mf_close(g, gemms, 1e-6, 1e-3), "%s: 1 us per %s GEMM call adds %.3f us, want %.0f", what,
          bf16 ? "bf16" : "fp32", g, gemms);
    /* the other path's call cost does not apply */
    double other = fixed_us(0, bf16 ? 1 : 0, bf16 ? 0 : 1, batch, kv, &c);
    CHECK(mf_close(other, 0, 1e-6, 1e-3), "%s: the %s path's call cost adds %.3f us", what, bf16 ? "fp32" : "bf16", other);
    double rg = fixed_us(1, 0, 0, batch, kv, &c);
    CHECK(c.regions == regions, "%s: %.0f regions counted, want %.0f", what, c.regions, regions);
    CHECK(mf_close(rg, regions, 1e-6, 1e-3), "%s: 1 us per region adds %.3f us, want %.0f", what, rg, regions);
    printf("%-28s GEMM calls %4.0f  regions %4.0f\n", what, c.gemm_calls, c.regions);
}

int main(void) {
    const char *const bf16[] = {"precision", "bf16", NULL};
    const char *const full[] = {"recompute", "full", NULL};
    const char *const accum2[] = {"grad_accum", "2", NULL};
    counts("fp32 B8", 8, NULL, 72, 73 + 21, 0);
    counts("bf16 B8", 8, bf16, 72, 73 + 5 * 6 + 21, 1);
    counts("fp32 B8 recompute full", 8, full, 72 + 5 * 4, 73 + 5 * 5 + 21, 0);
    counts("fp32 B8 x accum 2", 8, accum2, 2 * 72, 2 * 73 + 21, 0);
    /* 8 rows: one loss chunk, no block kernel forks */
    {
        mf_planner_choice c;
        const char *const seq8[] = {"seq", "8", NULL};
        fixed_us(1, 1, 0, 1, seq8, &c);
        CHECK(c.gemm_calls == 5 * 12 + 3, "B1 T8: %.0f GEMM calls, want 63", c.gemm_calls);
        CHECK(c.regions == 21, "B1 T8: %.0f regions, want the update's 21", c.regions);
    }
    /* the attention's projections (a third of GPT-2's block FLOPs) at half
     * the MLP's rate take twice as long: one third of the block GEMM time
     * more; the head's GEMMs are unchanged */
    for (int h = 0; h < 2; h++) {
        mf_rates r = free_rates();
        for (int j = 0; j < MF_RATES_GEMM_ROWS; j++)
            for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) r.gemm_gflops[j][i] = r.gemm16_gflops[j][i] = 100;
        mf_planner_choice c;
        const char *const *kv = h ? bf16 : NULL;
        double one = predict(&r, &c, 8, kv);
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) {
            if (h) r.attnproj16_factor[i] = 0.5;
            else r.attnproj_factor[i] = 0.5;
        }
        double half = predict(&r, &c, 8, kv);
        /* gpt2-1m: blocks 5 x 3 x 2 x 1024 x 12 x 128^2 FLOPs, a third of them the attention's projections */
        double ap = 5.0 * 3 * 2 * 1024 * 4 * 128 * 128;
        CHECK(mf_close(half - one, ap / 100e9, 1e-6, 0), "%s: attention projections at half rate add %.6g s, want %.6g",
              h ? "bf16" : "fp32", half - one, ap / 100e9);
        /* the other precision's factor does not apply */
        for (int i = 0; i < MF_RATES_GEMM_SIZES; i++) {
            if (h) r.attnproj16_factor[i] = 1, r.attnproj_factor[i] = 0.5;
            else r.attnproj_factor[i] = 1, r.attnproj16_factor[i] = 0.5;
        }
        CHECK(mf_close(predict(&r, &c, 8, kv), one, 1e-9, 0), "%s: the other precision's factor applied",
              h ? "bf16" : "fp32");
    }
    return mf_test_done("test_planner_time_terms");
}
