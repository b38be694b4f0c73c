/* The byte tokenizer is the identity on bytes: every one of the 256 byte
 * values encodes to its own id and decodes back, "<|endoftext|>" is just 13
 * bytes, and out-of-range ids are refused. */
#include "memfit/core.h"
#include "memfit/data.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t ids[1024];
    size_t n;
} mf_ids;

static void mf_ids_push(int32_t id, void *ctx) {
    mf_ids *l = ctx;
    if (l->n < sizeof l->ids / sizeof l->ids[0]) l->ids[l->n] = id;
    l->n++;
}

/* encode -> ids must be the byte values; decode must give the bytes back. */
static void mf_check_roundtrip(const mf_tokenizer *t, const unsigned char *s, size_t n, const char *what) {
    mf_ids l = { .n = 0 };
    CHECK(mf_tokenizer_encode(t, (const char *)s, n, mf_ids_push, &l) == 0, "%s: encode: %s", what, mf_error());
    CHECK(l.n == n, "%s: %zu bytes gave %zu ids", what, n, l.n);
    char back[1024];
    size_t m = 0;
    for (size_t i = 0; i < l.n && i < n; i++) {
        CHECK(l.ids[i] == s[i], "%s: byte %zu is 0x%02x but id is %d", what, i, s[i], l.ids[i]);
        const char *b = NULL;
        int k = mf_tokenizer_decode(t, l.ids[i], &b);
        CHECK(k == 1 && b, "%s: decode(%d) gave %d bytes", what, l.ids[i], k);
        if (k == 1 && b && m < sizeof back) back[m++] = b[0];
    }
    CHECK(m == n && memcmp(back, s, n) == 0, "%s: decode(encode(s)) != s", what);
}

int main(void) {
    mf_tokenizer *t = mf_tokenizer_bytes();
    CHECK(t != NULL, "mf_tokenizer_bytes returned NULL");
    if (!t) return mf_test_done("test_tokenizer_bytes");
    CHECK(mf_tokenizer_kind(t) == MF_TOK_BYTES, "kind %d", (int)mf_tokenizer_kind(t));
    CHECK(mf_tokenizer_vocab(t) == 256, "vocab %d", mf_tokenizer_vocab(t));

    unsigned char all[512];
    for (int i = 0; i < 256; i++) all[i] = (unsigned char)i;
    for (int i = 0; i < 256; i++) all[256 + i] = (unsigned char)(255 - i);
    mf_check_roundtrip(t, all, sizeof all, "all 256 byte values, up and down");

    for (int v = 0; v < 256; v++) {
        const char *b = NULL;
        CHECK(mf_tokenizer_decode(t, v, &b) == 1 && b && (unsigned char)b[0] == v, "decode(%d)", v);
    }
    const char *b = NULL;
    CHECK(mf_tokenizer_decode(t, 256, &b) == -1, "decode(256) must be refused");
    CHECK(mf_tokenizer_decode(t, -1, &b) == -1, "decode(-1) must be refused");

    const char *s = "Hello <|endoftext|> w\303\266rld \377\000!";
    mf_check_roundtrip(t, (const unsigned char *)s, 30, "text with <|endoftext|>, UTF-8 and NUL");
    mf_ids l = { .n = 0 };
    mf_tokenizer_encode(t, "<|endoftext|>", 13, mf_ids_push, &l);
    CHECK(l.n == 13 && l.ids[0] == '<', "<|endoftext|> is 13 plain bytes for the byte tokenizer");

    mf_ids e = { .n = 0 };
    CHECK(mf_tokenizer_encode(t, NULL, 0, mf_ids_push, &e) == 0 && e.n == 0, "empty text gives no ids");

    /* Two handles are independent and freeing one leaves the other usable. */
    mf_tokenizer *t2 = mf_tokenizer_bytes();
    mf_tokenizer_free(t2);
    mf_check_roundtrip(t, all, 256, "after freeing another handle");
    mf_tokenizer_free(t);
    mf_tokenizer_free(NULL);
    return mf_test_done("test_tokenizer_bytes");
}
