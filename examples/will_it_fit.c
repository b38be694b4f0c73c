/* will_it_fit: "will this model train in N GiB?", answered by libmemfit's
 * planner without allocating the model.
 *
 *   will_it_fit PRESET GIB [--key=value ...]
 *   will_it_fit smollm2-135m 4 --batch 4 --seq 512 --precision bf16
 *
 * Builds a config (the same table and parser as `memfit train`), plans one
 * training step, prints the planned peak bytes per memory category (the
 * numbers `memfit estimate --json` prints under "bytes"), the arena and the
 * process total, and "fits: yes" or "fits: no". Exit status: 0 fits,
 * 1 does not fit, 2 bad input.
 *
 * Build against an installed memfit:
 *   cc will_it_fit.c $(pkg-config --cflags --libs memfit) -o will_it_fit
 */
#include <memfit/memfit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(const char *what) {
    fprintf(stderr, "will_it_fit: error: %s\n", what);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc < 3 ? stderr : stdout,
                "usage: will_it_fit PRESET GIB [--key=value ...] (any `memfit train` key)\n");
        return argc < 3 ? 2 : 0;
    }
    char *end;
    double gib = strtod(argv[2], &end);
    if (end == argv[2] || *end || !(gib > 0) || gib > 1 << 20) return bad("GIB must be a number of GiB > 0, e.g. 4 or 0.5");

    mf_config cfg;
    mf_config_defaults(&cfg);
    if (mf_config_set(&cfg, "model", argv[1])) return bad(mf_error());
    char *pos[1];
    int npos = mf_config_parse_args(&cfg, argc - 3, argv + 3, pos, 1);
    if (npos < 0) return bad(mf_error());
    if (npos > 0) { fprintf(stderr, "will_it_fit: error: unexpected argument '%s'\n", pos[0]); return 2; }
    cfg.budget = (size_t)(gib * 1024.0 * 1024.0 * 1024.0);

    /* the plan depends on the thread count (per-thread scratch rows) */
    int nthreads = mf_threads_setup(cfg.threads);
    mf_dims d;
    if (mf_model_dims(&cfg, &d)) return bad(mf_error());
    /* bytes this process holds outside the arena (code, libraries, stacks):
     * memfit estimate measures them after warming the BLAS, we read them now */
    size_t runtime = mf_rss_current();
    mf_plan plan;
    mf_model model;
    if (mf_model_build_plan(&cfg, MF_MODE_TRAIN, nthreads, runtime, &d, &plan, &model)) return bad(mf_error());

    char a[32], b[32];
    printf("model %s: %lld parameters, batch %d, seq %d, precision %s, optimizer %s\n", cfg.model,
           (long long)mf_model_n_params(&d), model.B, model.T, cfg.precision, cfg.optimizer);
    printf("%-10s %15s\n", "category", "bytes");
    for (int c = 0; c < MF_CAT_COUNT; c++)
        printf("%-10s %15zu  %s\n", mf_cat_name((mf_cat)c), plan.peak_cat[c], mf_size_format(plan.peak_cat[c], a, sizeof a));
    printf("%-10s %15zu  %s  (peak live bytes of one training step)\n", "total", plan.peak_bytes,
           mf_size_format(plan.peak_bytes, a, sizeof a));
    printf("%-10s %15zu  %s  (what the arena reserves)\n", "arena", plan.arena_bytes,
           mf_size_format(plan.arena_bytes, a, sizeof a));
    printf("%-10s %15zu  %s  (this process outside the arena, measured)\n", "runtime", runtime,
           mf_size_format(runtime, a, sizeof a));
    int fits = mf_plan_check_budget(&plan, runtime, cfg.budget) == 0;
    printf("budget %s, need %s: fits: %s\n", mf_size_format(cfg.budget, a, sizeof a),
           mf_size_format(plan.arena_bytes + runtime, b, sizeof b), fits ? "yes" : "no");
    if (!fits) printf("  %s\n", mf_error());
    mf_model_free(&model);
    mf_plan_free(&plan);
    return fits ? 0 : 1;
}
