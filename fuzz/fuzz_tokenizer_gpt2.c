/* GPT-2 tokenizer files: the input is encoder.json, a NUL byte, vocab.bpe.
 * A tokenizer that loads encodes and decodes a fixed text. */
#include "fuzz_util.h"
#include "memfit/data.h"

#include <stdlib.h>
#include <string.h>

static void emit(int32_t id, void *ctx) { *(int64_t *)ctx += id; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    char p1[64], p2[64];
    int f1 = fuzz_memfile(data, n1, p1, sizeof p1);
    int f2 = nul ? fuzz_memfile(nul + 1, size - n1 - 1, p2, sizeof p2) : fuzz_memfile(data, 0, p2, sizeof p2);
    if (f1 >= 0 && f2 >= 0) {
        mf_tokenizer *t = mf_tokenizer_gpt2(p1, p2);
        if (t) {
            static const char text[] = "Hello world, it's 2024!\n\tcaf\xc3\xa9  x";
            int64_t acc = 0;
            mf_tokenizer_encode(t, text, sizeof text - 1, emit, &acc);
            int32_t ids[4] = {0, 1, 256, mf_tokenizer_vocab(t) - 1};
            char *out = NULL;
            size_t len = 0;
            if (mf_tokenizer_decode_text(t, ids, 4, &out, &len) == 0) free(out);
            mf_tokenizer_free(t);
        }
    }
    if (f1 >= 0) close(f1);
    if (f2 >= 0) close(f2);
    return 0;
}
