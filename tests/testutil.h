/* Tiny test helpers: CHECK macros that count failures and keep going. */
#ifndef MEMFIT_TESTUTIL_H
#define MEMFIT_TESTUTIL_H
#include <stddef.h>
#include <stdio.h>

extern int mf_test_failures;

#define CHECK(cond, ...) do { if (!(cond)) { mf_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

/* Relative closeness: |a-b| <= rtol*max(|a|,|b|) or |a-b| <= atol. */
int mf_close(double a, double b, double rtol, double atol);
/* got against want element-wise with mf_close (rtol, atol): one CHECK for
 * the array, the first three differing elements printed; 1 if all agree. */
int mf_test_compare(const char *what, const float *got, const float *want, size_t n, double rtol, double atol);
/* Returns the process exit code: 0 if no CHECK failed. Prints a summary. */
int mf_test_done(const char *name);
/* Path of a file under $MEMFIT_CACHE (default ~/.cache/memfit), or NULL if
 * the cache has no such file; the test then fails (data is fetched by make). */
const char *mf_test_cache_path(const char *rel, char *buf, size_t n);
/* A whole file as a NUL-terminated heap string (free it), or NULL. */
char *mf_test_read_text(const char *path);
#endif
