/* Private to src/data/: helpers shared by the GPT-2 tokenizer (tokenizer.c)
 * and the Hugging Face tokenizer.json one (tokjson.c). */
#ifndef MEMFIT_DATA_TOK_INTERNAL_H
#define MEMFIT_DATA_TOK_INTERNAL_H

#include "memfit/data.h"

#include <stddef.h>
#include <stdint.h>

/* Reads a whole file, NUL-terminated; `what` names it in errors. */
int mf_read_file(const char *path, const char *what, char **out, size_t *len);
/* GPT-2's bytes_to_unicode() inverse: code point (< 324) -> byte, or -1. */
void mf_unicode_to_bytes(int inv[324]);
/* A byte-level spelling (UTF-8 of mapped code points) -> raw bytes; out
 * needs room for len bytes. Returns the raw length or -1. */
int mf_unmap(const int inv[324], const char *s, size_t len, char *out);
/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629). */
size_t mf_utf8_valid_len(const unsigned char *s, size_t n);
/* A binary min-heap of packed (rank, position) keys, the merge queue both
 * BPE encoders use for long pre-tokens (tokenizer.c). */
void mf_tok_heap_push(uint64_t *h, size_t *n, uint64_t v);
uint64_t mf_tok_heap_pop(uint64_t *h, size_t *n);
/* GPT-2's pre-tokenisation pattern (also ByteLevel's use_regex). */
extern const char mf_gpt2_pattern[];

/* The tokenizer.json tokenizer (tokjson.c). */
typedef struct mf_hftok mf_hftok;
mf_hftok *mf_hftok_load(const char *path);
void mf_hftok_free(mf_hftok *h);
int mf_hftok_vocab(const mf_hftok *h);
uint64_t mf_hftok_hash(const mf_hftok *h);
int mf_hftok_encode(const mf_hftok *h, const char *text, size_t n, void (*emit)(int32_t, void *), void *ctx);
int mf_hftok_decode(const mf_hftok *h, int32_t id, const char **bytes);
/* Applies the decoder steps that act on the joined text (Strip after Fuse). */
void mf_hftok_finish_text(const mf_hftok *h, const char **s, size_t *n);

/* NFC normalization (unorm.c): writes the NFC form of valid UTF-8 s[0..n)
 * into *out (malloc'd/realloc'd, capacity *cap); returns its length, or
 * (size_t)-1 when out of memory. Invalid UTF-8 bytes are copied as they are. */
size_t mf_nfc(const char *s, size_t n, char **out, size_t *cap);

#endif
