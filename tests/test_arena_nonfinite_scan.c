/* mf_arena_row_nonfinite / mf_arena_row_maxabs, the scans behind the
 * message of a step that went non-finite: they find the first NaN or
 * infinity (F32, BF16, F16 rows) and the largest finite element, and read
 * only rows that are live now: a row whose lifetime ended is not looked at
 * (its bytes may be another buffer's), nor are integer rows. */
#include "memfit/core.h"
#include "kernels/half.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

int main(void) {
    mf_plan p;
    CHECK(mf_plan_init(&p, 3) == 0, "plan init");
    int64_t four[1] = {4};
    int w = mf_plan_add(&p, "w", MF_CAT_PARAMS, MF_DTYPE_F32, 1, four, 0, 2, -1);
    int h = mf_plan_add(&p, "w16", MF_CAT_PARAMS, MF_DTYPE_BF16, 1, four, 0, 2, -1);
    int f = mf_plan_add(&p, "g16", MF_CAT_GRADS, MF_DTYPE_F16, 1, four, 0, 2, -1);
    int act = mf_plan_add(&p, "act", MF_CAT_ACTS, MF_DTYPE_F32, 1, four, 0, 0, -1);
    int ids = mf_plan_add(&p, "ids", MF_CAT_DATA, MF_DTYPE_I32, 1, four, 0, 2, -1);
    mf_plan_layout(&p);
    mf_ledger l;
    mf_ledger_init(&l);
    mf_arena a;
    CHECK(mf_arena_init(&a, &p, &l) == 0, "arena init");
    float *pw = mf_arena_get(&a, w);
    mf_bf16 *ph = mf_arena_get(&a, h);
    mf_fp16 *pf = mf_arena_get(&a, f);
    float *pa = mf_arena_get(&a, act);
    int32_t *pi = mf_arena_get(&a, ids);
    const float vals[4] = {1.0f, -5.0f, 3.0f, 0.5f};
    for (int i = 0; i < 4; i++) {
        pw[i] = vals[i];
        ph[i] = mf_f32_to_bf16(vals[i]);
        pf[i] = mf_f32_to_fp16(vals[i]);
        pa[i] = vals[i];
        pi[i] = -1;  /* as a float, 0xFFFFFFFF is a NaN: integer rows are not floats */
    }
    int64_t j = -1;
    float v = 0;
    int rows[] = {w, h, f, act, ids};
    for (int r = 0; r < 5; r++) CHECK(!mf_arena_row_nonfinite(&a, rows[r], &j, &v), "row %d: finite, nothing found", r);
    /* the largest finite element, by magnitude, with its sign */
    CHECK(mf_arena_row_maxabs(&a, w, &j, &v) && j == 1 && v == -5.0f, "maxabs f32: %lld %g", (long long)j, v);
    CHECK(mf_arena_row_maxabs(&a, h, &j, &v) && j == 1 && v == -5.0f, "maxabs bf16: %lld %g", (long long)j, v);
    CHECK(!mf_arena_row_maxabs(&a, ids, &j, &v), "maxabs skips integer rows");
    pw[2] = INFINITY;
    pw[3] = NAN;
    CHECK(mf_arena_row_nonfinite(&a, w, &j, &v) && j == 2 && isinf(v), "f32: first is the inf at 2, got %lld %g",
          (long long)j, v);
    CHECK(mf_arena_row_maxabs(&a, w, &j, &v) && j == 1 && v == -5.0f, "maxabs passes over inf/NaN");
    ph[3] = mf_f32_to_bf16(NAN);
    CHECK(mf_arena_row_nonfinite(&a, h, &j, &v) && j == 3 && isnan(v), "bf16 NaN at 3, got %lld %g", (long long)j, v);
    pf[1] = 0x7C00;  /* fp16 +inf */
    CHECK(mf_arena_row_nonfinite(&a, f, &j, &v) && j == 1 && isinf(v), "fp16 inf at 1, got %lld %g", (long long)j, v);
    pa[0] = NAN;
    CHECK(mf_arena_row_nonfinite(&a, act, &j, &v) && j == 0, "live activation: NaN at 0");
    /* the activation's lifetime ends: its bytes are no longer its own */
    mf_arena_phase(&a, 1);
    CHECK(!mf_arena_row_nonfinite(&a, act, &j, &v), "a released row is not read");
    CHECK(!mf_arena_row_nonfinite(&a, -1, &j, &v) && !mf_arena_row_nonfinite(&a, p.n, &j, &v), "no such row");
    mf_arena_free(&a);
    mf_plan_free(&p);
    return mf_test_done("test_arena_nonfinite_scan");
}
