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
