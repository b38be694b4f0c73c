/* Config: defaults from the table, YAML then flags, units, and clear errors
 * for unknown keys and out-of-range values; the LR schedule's shape. */
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/optim.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    mf_config c;
    mf_config_defaults(&c);
    CHECK(c.batch == 8 && c.grad_accum == 1 && fabs(c.lr - 1e-3) < 1e-15, "defaults");
    CHECK(strcmp(c.model, "gpt2-10m") == 0, "default model %s", c.model);

    char path[] = "/tmp/memfit-cfg-XXXXXX";
    int fd = mkstemp(path);
    const char *yaml = "# a comment\nmodel: gpt2-124m\nbatch: 4\nlr: 3e-4\nbudget: 2GiB\n";
    CHECK(write(fd, yaml, strlen(yaml)) == (ssize_t)strlen(yaml), "write");
    close(fd);
    char a0[] = "--config", a2[] = "--batch=6", a3[] = "--seq", a4[] = "128", a5[] = "--grad-accum=2";
    char *argv[] = {a0, path, a2, a3, a4, a5};
    char *pos[4];
    CHECK(mf_config_parse_args(&c, 6, argv, pos, 4) == 0, "%s", mf_error());
    CHECK(strcmp(c.model, "gpt2-124m") == 0, "model from file");
    CHECK(c.batch == 6, "flag overrides file: %d", c.batch);
    CHECK(c.seq == 128 && c.grad_accum == 2, "seq/accum");
    CHECK(c.budget == 2ull << 30, "budget %zu", c.budget);
    CHECK(mf_config_was_set(&c, "batch") && !mf_config_was_set(&c, "steps"), "was_set");

    CHECK(mf_config_set(&c, "bogus", "1") < 0 && strstr(mf_error(), "unknown config key 'bogus'"), "%s", mf_error());
    CHECK(mf_config_set(&c, "batch", "0") < 0 && strstr(mf_error(), "batch"), "%s", mf_error());
    CHECK(mf_config_set(&c, "batch", "4x") < 0, "trailing junk accepted");
    CHECK(mf_config_set(&c, "lr", "nan") < 0, "nan lr accepted");
    CHECK(mf_config_set(&c, "budget", "2 parsecs") < 0, "bad unit accepted");
    CHECK(mf_config_set(&c, "tokenizer", "sentencepiece") < 0, "bad enum accepted");
    size_t s;
    CHECK(mf_size_parse("512MiB", &s) == 0 && s == 512ull << 20, "MiB");
    CHECK(mf_size_parse("1.5GB", &s) == 0 && s == 1500000000ull, "GB");
    CHECK(mf_size_parse("-1", &s) < 0, "negative size accepted");

    const char *bad = "model: [1, 2]\n";
    FILE *fp = fopen(path, "w");
    CHECK(fp && fputs(bad, fp) >= 0, "write");
    if (fp) fclose(fp);
    CHECK(mf_config_load_yaml(&c, path) < 0 && strstr(mf_error(), path), "%s", mf_error());
    unlink(path);
    CHECK(mf_config_load_yaml(&c, "/nonexistent/x.yaml") < 0, "missing file accepted");

    /* the YAML a checkpoint stores reads back to the same config */
    mf_config a, b;
    mf_config_defaults(&a);
    mf_config_set(&a, "prompt", "He said \"call me\" \\ then left");
    mf_config_set(&a, "lr", "0.000123456789");
    mf_config_set(&a, "budget", "3GiB");
    static char yml[1 << 16];
    CHECK(mf_config_to_yaml(&a, yml, sizeof yml) == 0, "%s", mf_error());
    char ypath[] = "/tmp/memfit-yml-XXXXXX";
    int yfd = mkstemp(ypath);
    CHECK(write(yfd, yml, strlen(yml)) == (ssize_t)strlen(yml), "write");
    close(yfd);
    mf_config_defaults(&b);
    CHECK(mf_config_load_yaml(&b, ypath) == 0, "%s", mf_error());
    CHECK(strcmp(a.prompt, b.prompt) == 0, "prompt round trip: '%s'", b.prompt);
    CHECK(a.lr == b.lr && a.budget == b.budget && a.seed == b.seed, "numbers round trip");
    unlink(ypath);

    /* one rule for switches: --flag, --flag 0/1, --flag=V, true/false/on/off/yes/no, --no-flag */
    {
        struct { const char *a, *b; int want; } sw[] = {
            {"--master_weights", NULL, 1}, {"--master_weights", "0", 0}, {"--master_weights", "1", 1},
            {"--master_weights=0", NULL, 0}, {"--master_weights=1", NULL, 1}, {"--master_weights", "false", 0},
            {"--master_weights", "true", 1}, {"--master_weights=off", NULL, 0}, {"--master_weights=ON", NULL, 1},
            {"--master-weights", "no", 0}, {"--master_weights", "yes", 1}, {"--no-master_weights", NULL, 0},
            {"--no-master-weights", NULL, 0},
        };
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
            mf_config_defaults(&c);
            c.master_weights = !sw[i].want;
            char x[64], y[16];
            snprintf(x, sizeof x, "%s", sw[i].a);
            snprintf(y, sizeof y, "%s", sw[i].b ? sw[i].b : "");
            char *av[] = {x, y};
            int n = sw[i].b ? 2 : 1;
            CHECK(mf_config_parse_args(&c, n, av, pos, 4) == 0, "%s %s: %s", sw[i].a, y, mf_error());
            CHECK(c.master_weights == sw[i].want, "%s %s gave %d", sw[i].a, y, c.master_weights);
        }
        /* a switch followed by a word that is no switch value leaves it as a positional */
        mf_config_defaults(&c);
        char s1[] = "--master_weights", s2[] = "model.safetensors";
        char *av[] = {s1, s2};
        CHECK(mf_config_parse_args(&c, 2, av, pos, 4) == 1 && c.master_weights == 1, "positional after a switch");
        const char *badv[] = {"--master_weights=2", "--master_weights=maybe", "--master_weights="};
        for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
            char b[64];
            snprintf(b, sizeof b, "%s", badv[i]);
            char *bv[] = {b};
            CHECK(mf_config_parse_args(&c, 1, bv, pos, 4) < 0 && strstr(mf_error(), "switch") &&
                  strstr(mf_error(), "--no-master_weights"), "%s: %s", badv[i], mf_error());
        }
        char nb[] = "--no-master_weights=1", nl[] = "--no-lr";
        char *nv[] = {nb}, *lv[] = {nl};
        CHECK(mf_config_parse_args(&c, 1, nv, pos, 4) < 0 && strstr(mf_error(), "takes no value"), "%s", mf_error());
        CHECK(mf_config_parse_args(&c, 1, lv, pos, 4) < 0 && strstr(mf_error(), "unknown option"), "--no- of a non-switch: %s", mf_error());
        CHECK(mf_config_set(&c, "relative_step", "on") == 0 && c.relative_step == 1, "YAML on");
        CHECK(mf_config_set(&c, "relative_step", "2") < 0, "2 accepted as a switch value");
    }

    /* warm-up then cosine to min_lr_frac */
    mf_config_defaults(&c);
    c.lr = 1.0; c.warmup = 10; c.steps = 110; c.min_lr_frac = 0.1;
    CHECK(fabs(mf_lr_at(&c, 0) - 0.1) < 1e-12, "warm-up start %g", mf_lr_at(&c, 0));
    CHECK(fabs(mf_lr_at(&c, 9) - 1.0) < 1e-12, "warm-up end");
    CHECK(fabs(mf_lr_at(&c, 60) - 0.55) < 1e-12, "cosine middle %g", mf_lr_at(&c, 60));
    CHECK(fabs(mf_lr_at(&c, 110) - 0.1) < 1e-12, "cosine end");
    CHECK(mf_clip_scale(2.0, 1.0) < 0.5 && mf_clip_scale(0.5, 1.0) == 1.0f, "clip");
    return mf_test_done("test_config_parse");
}
