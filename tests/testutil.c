#include "testutil.h"
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

int mf_test_failures = 0;

int mf_close(double a, double b, double rtol, double atol) {
    double d = fabs(a - b);
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return d <= atol || d <= rtol * m;
}

int mf_test_compare(const char *what, const float *got, const float *want, size_t n, double rtol, double atol) {
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!mf_close(got[i], want[i], rtol, atol)) {
            if (bad < 3) fprintf(stderr, "  %s[%zu]: memfit %.9g reference %.9g\n", what, i, got[i], want[i]);
            bad++;
        }
        if (d > worst) worst = d;
    }
    CHECK(bad == 0, "%s: %zu of %zu values differ (worst abs %.3g)", what, bad, n, worst);
    return bad == 0;
}

int mf_test_done(const char *name) {
    if (mf_test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, mf_test_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

const char *mf_test_cache_path(const char *rel, char *buf, size_t n) {
    const char *c = getenv("MEMFIT_CACHE");
    const char *home = getenv("HOME");
    if (c && *c) snprintf(buf, n, "%s/%s", c, rel);
    else snprintf(buf, n, "%s/.cache/memfit/%s", home ? home : "/root", rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

char *mf_test_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}
