/* placeholder */
#include "tok_internal.h"
#include <stdlib.h>
#include <string.h>
size_t mf_nfc(const char *s, size_t n, char **out, size_t *cap) {
    if (n + 1 > *cap) { char *p = realloc(*out, n + 1); if (!p) return (size_t)-1; *out = p; *cap = n + 1; }
    memcpy(*out, s, n);
    return n;
}
