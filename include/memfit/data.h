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
 *   offset 8   u32      version (2; version 1 files are still read)
 *   offset 12  u32      tokenizer kind (0 = bytes, 1 = gpt2, 2 = tokenizer.json)
 *   offset 16  u32      vocab size (256, 50257, or the tokenizer.json's)
 *   offset 20  u32      bytes per id (2; 4 when the vocab exceeds 65536)
 *   offset 24  u64      number of ids
 *   offset 32  u64      tokenizer hash (mf_tokenizer_hash; version 2)
 *   offset 40  u8[24]   reserved, zero (version 1: offset 32, u8[32])
 *   offset 64  u16[n] or u32[n] ids
 */
#ifndef MEMFIT_DATA_H
#define MEMFIT_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MF_TOK_HF: a Hugging Face tokenizer.json (BPE models; src/data/tokjson.c). */
typedef enum { MF_TOK_BYTES = 0, MF_TOK_GPT2 = 1, MF_TOK_HF = 2 } mf_tok_kind;

#define MF_GPT2_EOT 50256
#define MF_GPT2_VOCAB 50257

typedef struct mf_tokenizer mf_tokenizer;

/* Byte-level tokenizer: id = byte value, vocab 256. Never fails. */
mf_tokenizer *mf_tokenizer_bytes(void);
/* GPT-2 BPE from encoder.json and vocab.bpe. NULL on error (mf_error()). */
mf_tokenizer *mf_tokenizer_gpt2(const char *encoder_json, const char *vocab_bpe);
/* A Hugging Face tokenizer.json (byte-level BPE such as Llama 3 / Qwen, or
 * SentencePiece-style BPE with byte fallback such as Llama 2). Vocab size is
 * the largest id in model.vocab and added_tokens, plus one. NULL on error,
 * with a message naming the file (and the model type when it is not BPE). */
mf_tokenizer *mf_tokenizer_hf(const char *tokenizer_json);
void mf_tokenizer_free(mf_tokenizer *t);
mf_tok_kind mf_tokenizer_kind(const mf_tokenizer *t);
int mf_tokenizer_vocab(const mf_tokenizer *t);
/* Identifies the tokenizer's tables, for token files to record: 0 for
 * bytes, MF_GPT2_HASH for gpt2, FNV-1a 64 of the file's bytes for a
 * tokenizer.json. */
uint64_t mf_tokenizer_hash(const mf_tokenizer *t);
#define MF_GPT2_HASH 0x67707432656e6331ull /* "gpt2enc1": GPT-2's encoder.json + vocab.bpe */

/* A tokenizer as the config names it (spec): "bytes", "gpt2", or the path
 * of a Hugging Face tokenizer.json (anything else). */
int mf_tokenizer_spec_is_json(const char *spec);
/* The vocab size and hash (mf_tokenizer_hash) of the tokenizer spec names,
 * without keeping it: bytes and gpt2 are constants; a tokenizer.json is
 * loaded once per process and path (the answers are remembered), so the
 * model's shape can be checked against it as often as the planner asks.
 * Returns 0, or -1 (the file cannot be loaded; mf_error names it). */
int mf_tokenizer_spec_info(const char *spec, int *vocab, uint64_t *hash);
/* Names a token file's tokenizer in messages: "the bytes tokenizer", "the
 * gpt2 tokenizer", or "a tokenizer.json (hash 0x...)". */
const char *mf_tokenizer_describe(mf_tok_kind kind, uint64_t hash, char *buf, size_t n);

/* Encodes `n` bytes of UTF-8 text. Calls emit(id, ctx) for each id in order.
 * "<|endoftext|>" in the text maps to 50256 for gpt2 (as the reference does
 * with allowed_special="all"); a tokenizer.json's added tokens are matched
 * in the text the same way (add_special_tokens=False: no BOS/EOS added).
 * Returns 0, or -1 on error. */
int mf_tokenizer_encode(const mf_tokenizer *t, const char *text, size_t n,
                        void (*emit)(int32_t id, void *ctx), void *ctx);
/* Decodes one id to its bytes; returns the number of bytes (pointer valid
 * while the tokenizer lives), or -1 for an id out of range. */
int mf_tokenizer_decode(const mf_tokenizer *t, int32_t id, const char **bytes);
/* Decodes a sequence of ids to text, as the tokenizer's decoder does for
 * the whole sequence (for Llama 2's tokenizer.json that strips the one
 * leading space SentencePiece adds). *out is malloc'd and NUL-terminated;
 * returns 0, or -1 for an id out of range or out of memory. */
int mf_tokenizer_decode_text(const mf_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);

/* A read-only memory-mapped token file. Exactly one of ids (2 bytes per
 * id) and ids32 (4 bytes per id, vocab > 65536) is set; mf_tokfile_id
 * reads either. */
typedef struct {
    const uint16_t *ids;
    const uint32_t *ids32;
    uint32_t id_bytes;   /* 2 or 4 */
    uint32_t version;    /* 1 or 2 */
    uint64_t tok_hash;   /* the tokenizer's hash (version 1: implied by the kind) */
    uint64_t n;
    mf_tok_kind kind;
    uint32_t vocab;
    void *map;
    size_t map_size;
} mf_tokfile;

int mf_tokfile_open(mf_tokfile *f, const char *path);
void mf_tokfile_close(mf_tokfile *f);
static inline uint32_t mf_tokfile_id(const mf_tokfile *f, uint64_t i) {
    return f->ids ? f->ids[i] : f->ids32[i];
}
/* Writes a token file (version 2) atomically (temp file, fsync, rename),
 * for the bytes and gpt2 kinds (their hash is implied). */
int mf_tokfile_write(const char *path, mf_tok_kind kind, uint32_t vocab,
                     const uint16_t *ids, uint64_t n);
/* The same from u32 ids, for any kind; tok_hash is mf_tokenizer_hash() of
 * the tokenizer that made the ids. The file holds u32 ids when vocab >
 * 65536, u16 otherwise. */
int mf_tokfile_write32(const char *path, mf_tok_kind kind, uint32_t vocab, uint64_t tok_hash,
                       const uint32_t *ids, uint64_t n);


/* ---- chat data (src/data/chat.c) ------------------------------------- */

/* One conversation, parsed from one JSONL line: either
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 * or {"prompt": "...", "completion": "..."} (one user turn, then one
 * assistant turn). Strings are owned (NUL-terminated, len excludes it). */
typedef enum { MF_CHAT_SYSTEM = 0, MF_CHAT_USER = 1, MF_CHAT_ASSISTANT = 2 } mf_chat_role;
typedef struct {
    mf_chat_role role;
    char *content;
    size_t len;
} mf_chat_msg;
typedef struct {
    mf_chat_msg *msgs;
    int n;
    long line; /* the 1-based line number it was parsed from (for messages) */
} mf_chat;

/* Parses one line (`len` bytes, need not be NUL-terminated) into *out.
 * Returns 0, or -1 with one line in mf_error() naming the line number and
 * the problem: malformed JSON, messages not an array, a message without a
 * role or with an unknown one, content not a string, an empty (or
 * whitespace-only) assistant turn, no assistant turn at all. On error *out
 * is left empty (nothing to free). */
int mf_chat_parse_line(const char *line, size_t len, long lineno, mf_chat *out);
void mf_chat_free(mf_chat *c);
/* "system", "user", "assistant". */
const char *mf_chat_role_name(mf_chat_role r);

/* Chat templates (formats documented in src/data/chat.c). */
typedef enum {
    MF_CHAT_LLAMA3 = 0,  /* "llama3" */
    MF_CHAT_CHATML = 1,  /* "chatml" (Qwen) */
    MF_CHAT_LLAMA2 = 2,  /* "llama2" */
    MF_CHAT_SMOLLM2 = 3, /* "smollm2" (ChatML with SmolLM2's default system turn) */
} mf_chat_template;

/* By name; -1 (naming the choices) for an unknown name. */
int mf_chat_template_by_name(const char *name, mf_chat_template *out);
const char *mf_chat_template_name(mf_chat_template t);
/* Recognises a family from a Jinja chat_template string by its distinctive
 * substrings; `path` names where it came from in the error. -1 if unknown. */
int mf_chat_template_detect(const char *chat_template, const char *path, mf_chat_template *out);
/* The same from a tokenizer_config.json's `chat_template` (a string, or a
 * list of {name, template} where "default" is used). -1 naming the file
 * when it cannot be read, has no chat_template, or the family is unknown. */
int mf_chat_template_from_config(const char *tokenizer_config_json, mf_chat_template *out);

/* A rendered conversation: the text (NUL-terminated, malloc'd) and the
 * byte ranges [begin, end) that count for the loss, in order and disjoint:
 * each assistant turn's content plus the end-of-turn token after it. No
 * generation prompt is appended. */
typedef struct {
    size_t begin, end;
} mf_chat_span;
typedef struct {
    char *text;
    size_t len;
    mf_chat_span *spans;
    int n_spans;
} mf_chat_rendered;

/* Returns 0, or -1 (a conversation the template cannot express, e.g. Llama
 * 2's roles not alternating, naming the line; or out of memory). */
int mf_chat_render(mf_chat_template t, const mf_chat *c, mf_chat_rendered *out);
void mf_chat_rendered_free(mf_chat_rendered *r);

/* Tokenizes a rendered conversation: *ids (malloc'd, *n of them) and
 * *mask (malloc'd, 1 = the id lies in a loss span). The text is encoded
 * piecewise (each gap and each loss span on its own, ids concatenated) so
 * that no token straddles a span boundary; see chat.c. 0, or -1. */
int mf_chat_tokenize(const mf_tokenizer *t, const mf_chat_rendered *r, int32_t **ids, uint8_t **mask,
                     size_t *n);

/* ---- supervised fine-tuning store (src/data/sft.c) --------------------
 *
 * A JSONL file of conversations, tokenized once up front into one heap
 * store: every example's ids and loss mask, and the rows of T positions
 * the examples are laid out in. An example of n ids fills n - 1 positions
 * (inputs ids[0..n-2], targets ids[1..n-1]); a target counts for the loss
 * when its id lies in a loss span (or always, prompt_too). Packing on:
 * examples in file order fill each row until the next does not fit (no
 * example is split; a longer one is an error, or skipped); positions
 * restart at 0 with each example, so the attention's document mask keeps
 * examples apart. Packing off: one example per row, an example of more
 * than T + 1 ids split into pieces (each piece an example: the piece's
 * first id is the previous piece's last, and it does not see earlier
 * pieces). The rest of a row is padding: input id 0, target ignored. */
typedef struct {
    int T;               /* positions per row (the run's seq) */
    int prompt_too;      /* targets in the prompt count too */
    int packing;         /* several examples per row */
    int skip_bad;        /* count and skip bad lines instead of failing */
} mf_sft_opts;
typedef struct {
    uint32_t *ids;       /* (n_ids) every example's ids, concatenated */
    uint8_t *mask;       /* (n_ids) 1: a target at this id counts for the loss */
    uint64_t *off;       /* (n_ex+1) example e is ids[off[e], off[e+1]) */
    uint32_t *row;       /* (n_rows+1) row r holds examples row[r] .. row[r+1]-1 */
    int64_t n_ids, n_ex, n_rows;
    int64_t lines, skipped, skipped_long; /* lines read; bad ones skipped (of them too long) */
    int64_t n_conv, split;                /* conversations kept; extra pieces of split ones (packing off) */
    int64_t positions, pad, targets;      /* over all rows: positions, padding, counted targets */
    size_t bytes;        /* heap bytes the store holds (ids, mask, off, row) */
    mf_sft_opts o;
    mf_chat_template tpl; /* the template it was rendered with */
} mf_sft_data;

/* Reads, renders (template tpl), tokenizes and lays out `path`. Errors
 * (without skip_bad) name the line: malformed JSON, unknown role, empty
 * assistant turn, a conversation the template cannot express, an example
 * longer than T + 1 ids (with packing); an id >= max_id; no examples at all. A progress
 * line goes to stderr every 20000 lines. 0, or -1 (nothing kept). */
int mf_sft_load(mf_sft_data *d, const char *path, const mf_tokenizer *tok, mf_chat_template tpl,
                const mf_sft_opts *o, int64_t max_id);
void mf_sft_free(mf_sft_data *d);
/* The most positions one example (or piece) fills: its ids less one. */
int mf_sft_longest(const mf_sft_data *d);
/* Lays the examples out again in rows of T positions (T >= the longest). */
int mf_sft_relayout(mf_sft_data *d, int T);
/* Row r (taken modulo n_rows) into in, tg (MF_TARGET_IGNORE (-1) for
 * targets that do not count) and pos (NULL: not written), T each. Returns
 * the number of targets that count. */
int mf_sft_fill_row(const mf_sft_data *d, int64_t r, int32_t *in, int32_t *tg, int32_t *pos);
/* The counted targets of row r (modulo n_rows), without filling it. */
int mf_sft_row_targets(const mf_sft_data *d, int64_t r);
/* The text of a conversation up to its first assistant turn's content
 * (the prompt a model continues) and that content, for greedy evaluation.
 * *prompt is malloc'd. 0, or -1. */
int mf_chat_prompt(mf_chat_template t, const mf_chat *c, char **prompt, const char **answer, size_t *answer_len);

#ifdef __cplusplus
}
#endif
#endif
