/* memfit data: tokenizers and token files.
 *
 * Owns: the tokenizer tables (heap, loaded once at start-up, outside the
 * planned arena) and read-only memory maps of token files. Promises: GPT-2
 * BPE ids are identical to the reference GPT-2 tokenizer; token files are
 * validated (magic, version, size) before any id is read; ids handed to the
 * trainer are all < the file's vocab size.
 *
 * Token file format (little-endian), documented in docs/formats.md:
 *   offset 0   char[8]  magic "MFTOKENS"
 *   offset 8   u32      version (1)
 *   offset 12  u32      tokenizer kind (0 = bytes, 1 = gpt2)
 *   offset 16  u32      vocab size (256 or 50257)
 *   offset 20  u32      bytes per id (2)
 *   offset 24  u64      number of ids
 *   offset 32  u8[32]   reserved, zero
 *   offset 64  u16[n]   ids
 */
#ifndef MEMFIT_DATA_H
#define MEMFIT_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MF_TOK_BYTES = 0, MF_TOK_GPT2 = 1 } mf_tok_kind;

#define MF_GPT2_EOT 50256
#define MF_GPT2_VOCAB 50257

typedef struct mf_tokenizer mf_tokenizer;

/* Byte-level tokenizer: id = byte value, vocab 256. Never fails. */
mf_tokenizer *mf_tokenizer_bytes(void);
/* GPT-2 BPE from encoder.json and vocab.bpe. NULL on error (mf_error()). */
mf_tokenizer *mf_tokenizer_gpt2(const char *encoder_json, const char *vocab_bpe);
void mf_tokenizer_free(mf_tokenizer *t);
mf_tok_kind mf_tokenizer_kind(const mf_tokenizer *t);
int mf_tokenizer_vocab(const mf_tokenizer *t);

/* Encodes `n` bytes of UTF-8 text. Calls emit(id, ctx) for each id in order.
 * "<|endoftext|>" in the text maps to 50256 for gpt2 (as the reference does
 * with allowed_special="all"). Returns 0, or -1 on error. */
int mf_tokenizer_encode(const mf_tokenizer *t, const char *text, size_t n,
                        void (*emit)(int32_t id, void *ctx), void *ctx);
/* Decodes one id to its bytes; returns the number of bytes (pointer valid
 * while the tokenizer lives), or -1 for an id out of range. */
int mf_tokenizer_decode(const mf_tokenizer *t, int32_t id, const char **bytes);

/* A read-only memory-mapped token file. */
typedef struct {
    const uint16_t *ids;
    uint64_t n;
    mf_tok_kind kind;
    uint32_t vocab;
    void *map;
    size_t map_size;
} mf_tokfile;

int mf_tokfile_open(mf_tokfile *f, const char *path);
void mf_tokfile_close(mf_tokfile *f);
/* Writes a token file atomically (temp file, fsync, rename). */
int mf_tokfile_write(const char *path, mf_tok_kind kind, uint32_t vocab,
                     const uint16_t *ids, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
