/* memfit io: safetensors files and atomic file writes.
 *
 * Owns: a parsed safetensors header (heap) and a read-only map of the file.
 * Promises: a header is validated completely (JSON syntax, dtype names,
 * shapes, offsets inside the data section, no overlaps, sizes matching
 * dtype x shape) before any tensor is handed out; writers never leave a
 * partial file at the destination path (temp file, fsync, rename, fsync of
 * the directory).
 *
 * Format (https://huggingface.co/docs/safetensors): u64 little-endian N,
 * then N bytes of JSON {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}, then the
 * data section; offsets are relative to the data section.
 */
#ifndef MEMFIT_IO_H
#define MEMFIT_IO_H

#include <stddef.h>
#include <stdint.h>
#include "memfit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *name;
    mf_dtype dtype;
    int ndim;
    int64_t shape[MF_MAX_DIMS];
    const void *data;   /* points into the map */
    size_t nbytes;
    int has_sum;        /* the file records this tensor's checksum */
    uint64_t sum;       /* XXH3-64 of its bytes (metadata "xxh3_64:<name>") */
} mf_st_tensor;

typedef struct {
    mf_st_tensor *tensors;
    int n;
    char **meta_keys, **meta_vals; /* __metadata__ (string -> string) */
    int n_meta;
    void *map;
    size_t map_size;
    char *path;         /* for messages (escaped) */
} mf_st_file;

/* Opens and validates; -1 with a message naming the file and the problem. */
int mf_st_open(mf_st_file *f, const char *path);
void mf_st_close(mf_st_file *f);
const mf_st_tensor *mf_st_find(const mf_st_file *f, const char *name);
const char *mf_st_meta(const mf_st_file *f, const char *key); /* NULL if absent */

/* Checksums and finite values. memfit's writer records an XXH3-64 of every
 * tensor's bytes in __metadata__ ("xxh3_64:<name>" -> 16 hex digits; the
 * reader moves them onto the tensors, out of meta_keys); files from other
 * tools have none and are not checked for them. A loader hands
 * each tensor through mf_st_stream: the map is read 4 MiB at a time, each
 * piece is hashed and checked for NaN/Inf (F32, BF16, F16), given to `sink`
 * (NULL: only checked) at byte offset `off`, and its pages are dropped, so
 * nothing beyond one piece is added to the process's RSS. -1 with a message
 * naming the file and the tensor if a value is not finite (before the piece
 * reaches the sink) or the checksum differs (after the last piece). */
typedef void (*mf_st_sink_fn)(void *ctx, size_t off, const void *src, size_t len);
int mf_st_stream(const mf_st_file *f, const mf_st_tensor *t, mf_st_sink_fn sink, void *ctx);
/* Every tensor of the file through mf_st_stream with no sink. */
int mf_st_verify_all(const mf_st_file *f);

/* Writer: describe the tensors, then write everything in one call. Data
 * pointers must stay valid until mf_st_write returns. A tensor whose bytes
 * are not in memory (offloaded optimizer state) gives `read` instead of
 * `data`: it is called for consecutive pieces [off, off+len) of the tensor
 * and fills buf (0 on success, -1 with a message). */
typedef int (*mf_st_read_fn)(void *ctx, uint64_t off, void *buf, size_t len);
typedef struct {
    const char *name;
    mf_dtype dtype;
    int ndim;
    int64_t shape[MF_MAX_DIMS];
    const void *data;
    size_t nbytes;
    mf_st_read_fn read;  /* used when data is NULL */
    void *read_ctx;
} mf_st_entry;

int mf_st_write(const char *path, const mf_st_entry *entries, int n,
                const char *const *meta_keys, const char *const *meta_vals,
                int n_meta);

/* Atomic whole-file write helpers: path.tmp.<pid>, fsync, rename, dir fsync. */
typedef struct {
    FILE *fp;
    char *path;
    char *tmp;
} mf_atomic_file;

int mf_atomic_open(mf_atomic_file *af, const char *path);
/* Commits (fsync + rename). On failure the destination is untouched. */
int mf_atomic_commit(mf_atomic_file *af);
/* Abandons: removes the temp file. */
void mf_atomic_abort(mf_atomic_file *af);

/* Start-up clean-up of a folder memfit writes into: removes every
 * "<name>.tmp.<pid>" whose pid is not a live memfit process (a writer that
 * was killed mid-write leaves one behind; nothing else ever would). Our own
 * pid counts as gone: call this before this process writes anything there.
 * Returns the number removed and, in `names` (cap bytes), the first few
 * names for a message; -1 with a message if the folder cannot be read. */
int mf_atomic_clean_stale(const char *dir, char *names, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
