/* Hugging Face tokenizer.json: load; a tokenizer that loads encodes a
 * fixed text and the input's first bytes, and decodes the ids back. */
#include "fuzz_util.h"
#include "memfit/data.h"

#include <stdlib.h>
#include <string.h>

typedef struct { int32_t ids[512]; size_t n; } ids_buf;
static void emit(int32_t id, void *ctx) {
    ids_buf *b = ctx;
    if (b->n < 512) b->ids[b->n++] = id;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    mf_tokenizer *t = mf_tokenizer_hf(path);
    if (t) {
        static const char text[] = "Hello world, it's 2024!\n\tcaf\xc3\xa9  x <|begin_of_text|>";
        ids_buf b = {.n = 0};
        mf_tokenizer_encode(t, text, sizeof text - 1, emit, &b);
        mf_tokenizer_encode(t, (const char *)data, size < 64 ? size : 64, emit, &b);
        char *out = NULL;
        size_t len = 0;
        if (mf_tokenizer_decode_text(t, b.ids, b.n, &out, &len) == 0) free(out);
        mf_tokenizer_free(t);
    }
    close(fd);
    return 0;
}
