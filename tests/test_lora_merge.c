/* memfit merge: folding an adapter into the base weights gives a plain model
 * whose logits equal base + adapter's (1e-5 relative, 1e-6 absolute), and
 * --unmerge takes it back out: every weight returns to the base within fp32
 * round-off (two roundings: |w' - w| <= 2^-23 (|w| + |delta|)); tensors the
 * adapter does not touch are copied bit for bit. */
#include "io/io.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

#define B_ 2
#define T_ 16

static void config(mf_config *c, const char *data, int lora) {
    tu_tiny_config(c, data);
    mf_config_set(c, "n_layer", "3");
    mf_config_set(c, "loss_chunk", "0");
    if (lora) mf_config_set(c, "lora", "r=4,alpha=16,targets=attn.c_attn,mlp.c_fc,mlp.c_proj");
}

int main(void) {
    char data[64], dir[] = "/tmp/memfit-merge-XXXXXX", base[1200], ad[1200], merged[1200], un[1200], cmd[1300];
    CHECK(tu_make_tokens(data, sizeof data, 4000, 3) == 0, "token file: %s", mf_error());
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(base, sizeof base, "%s/base.safetensors", dir);
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    snprintf(merged, sizeof merged, "%s/merged.safetensors", dir);
    snprintf(un, sizeof un, "%s/unmerged.safetensors", dir);
    mf_config c;
    config(&c, data, 1);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    /* a few steps so both A and B are trained values */
    for (int i = 0; i < 5; i++) CHECK(mf_trainer_step(&t, NULL) == 0, "%s", mf_error());
    CHECK(mf_trainer_save_weights(&t, base) == 0, "%s", mf_error());
    CHECK(mf_lora_save_adapter(&t.model, &t.arena, ad, base) == 0, "%s", mf_error());
    t.data_pos = 0;
    float *l_ad = tu_logits_of(&t, B_, T_);
    int V = t.d.V;
    mf_trainer_free(&t);

    CHECK(mf_lora_merge_file(base, ad, merged, 0) == 0, "merge: %s", mf_error());
    CHECK(mf_lora_merge_file(merged, ad, un, 1) == 0, "unmerge: %s", mf_error());

    /* the merged model, without adapters, gives base + adapter's logits */
    config(&c, data, 0);
    mf_config_set(&c, "init", merged);
    if (mf_trainer_init(&t, &c, MF_MODE_INFER) == 0) {
        float *l_m = tu_logits_of(&t, B_, T_);
        size_t bad = 0;
        for (size_t i = 0; l_m && l_ad && i < (size_t)B_ * T_ * V; i++) bad += !mf_close(l_m[i], l_ad[i], 1e-5, 1e-6);
        CHECK(l_m && l_ad && bad == 0, "merged logits: %zu differ from base + adapter", bad);
        free(l_m);
        mf_trainer_free(&t);
    } else CHECK(0, "merged model: %s", mf_error());

    /* unmerge(merge(W)) == W within round-off; untouched tensors bit-identical */
    mf_st_file fb, fm, fu;
    if (mf_st_open(&fb, base) || mf_st_open(&fm, merged) || mf_st_open(&fu, un)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    CHECK(fb.n == fu.n && fb.n == fm.n, "tensor counts %d %d %d", fb.n, fm.n, fu.n);
    int changed = 0;
    for (int i = 0; i < fb.n; i++) {
        const mf_st_tensor *w = &fb.tensors[i], *m = mf_st_find(&fm, w->name), *u = mf_st_find(&fu, w->name);
        if (!m || !u || m->nbytes != w->nbytes || u->nbytes != w->nbytes) { CHECK(0, "%s missing or resized", w->name); continue; }
        const float *a = w->data, *b = m->data, *x = u->data;
        size_t n = w->nbytes / 4, bad = 0;
        int is_target = strstr(w->name, "c_attn.weight") || strstr(w->name, "c_fc.weight") || strstr(w->name, "mlp.c_proj.weight");
        if (!is_target) {
            CHECK(memcmp(a, b, w->nbytes) == 0 && memcmp(a, x, w->nbytes) == 0, "%s changed but has no adapter", w->name);
            continue;
        }
        changed += memcmp(a, b, w->nbytes) != 0;
        for (size_t k = 0; k < n; k++) {
            double bound = ldexp(fabs(a[k]) + fabs((double)b[k] - a[k]), -23);
            if (fabs((double)x[k] - a[k]) > bound) bad++;
        }
        CHECK(bad == 0, "%s: %zu of %zu values not back to the base within round-off", w->name, bad, n);
    }
    CHECK(changed == 9, "merge changed %d weights, want 9 (3 layers x 3 targets)", changed);
    printf("merge: %d weights changed, merged logits == base + adapter, unmerge returns the base within round-off\n", changed);
    mf_st_close(&fb);
    mf_st_close(&fm);
    mf_st_close(&fu);
    free(l_ad);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    unlink(data);
    return mf_test_done("test_lora_merge");
}
