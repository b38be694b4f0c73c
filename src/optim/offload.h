/* memfit offload: a file that holds state (optimizer moments) outside RAM,
 * and a streamed pass over it through a double-buffered window.
 *
 * Owns: the file descriptor, a copy of the path, and one I/O thread
 * (created by mf_offload_open, joined by mf_offload_close; 256 KiB stack).
 * Resident overhead is the thread's stack pages and a small struct; the
 * module allocates no data buffers. The two window buffers belong to the
 * caller (plan rows in the arena).
 * Promises: sizes and offsets are bytes, times are seconds. A stream hands
 * every region to the callback exactly once, in order, on the calling
 * thread, and returns only after the I/O thread has stopped touching the
 * caller's buffers (on success and on every error).
 *
 * Page cache: written ranges are pushed to disk and dropped from the page
 * cache (sync_file_range, then posix_fadvise DONTNEED), pipelined one write
 * behind; read-only passes drop what they read. So while a stream runs only
 * the regions in flight (about three) sit in the page cache, and none once
 * it returns, instead of the whole state. Best-effort: it is a no-op where
 * the kernel does not support it, and on tmpfs/ramfs the page cache is the
 * file itself (mf_offload_in_ram says so; offloading there saves nothing).
 *
 * Crash safety: the file is scratch, private to the run; it is not a
 * checkpoint. A stream that fails or is killed midway leaves some regions
 * updated and others not. A checkpoint must copy the state out (for
 * example a write_back = 0 stream whose callback appends to the checkpoint
 * file) and a resume must refill the file from the checkpoint.
 *
 * Not thread-safe: one thread uses an mf_offload at a time.
 */
#ifndef MEMFIT_OFFLOAD_H
#define MEMFIT_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>
#include "memfit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_offload mf_offload;

/* A byte range of the file: [off, off + len). */
typedef struct {
    uint64_t off;
    size_t len;
} mf_region;

/* Creates (or truncates) `path` with mode 0600, preallocates `bytes` bytes
 * (reads of unwritten bytes give zeros) and starts the I/O thread. Returns
 * 0 and *o, or -1 with a message naming the path (missing directory, disk
 * full with the bytes needed and free). */
int mf_offload_open(mf_offload **o, const char *path, uint64_t bytes);
/* Stops the I/O thread, closes the file and, if remove != 0, deletes it.
 * NULL is a no-op. */
void mf_offload_close(mf_offload *o, int remove);

/* Synchronous copies for set-up and checkpoints, on the calling thread
 * (loops over short reads/writes and EINTR). [off, off + len) must lie in
 * the file. Written data is flushed and dropped from the page cache as in
 * a stream. Returns 0, or -1 with a message. */
int mf_offload_read(mf_offload *o, uint64_t off, void *dst, size_t len);
int mf_offload_write(mf_offload *o, uint64_t off, const void *src, size_t len);

/* Called on the thread that runs the stream, with region k (0-based) in
 * buf[len]; it may update buf in place (OpenMP inside is fine) but must
 * not call mf_offload_* on the same handle. Returns 0, or non-zero to stop
 * the stream (its mf_fail message, if any, is kept). */
typedef int (*mf_offload_fn)(void *ctx, int k, void *buf, size_t len);

/* The streamed pass. For k = 0..n-1: region r[k] is read into bufs[k % 2],
 * fn(ctx, k, buf, r[k].len) runs, then, if write_back, the buffer is
 * written back to r[k]. The I/O thread reads region k+1 and writes back
 * region k-1 while fn runs on region k; the read of k+2 into a buffer is
 * queued behind that buffer's write-back, so the two are never mixed.
 * bufs[0] and bufs[1] are distinct, non-overlapping, buf_bytes each, and
 * every r[k].len <= buf_bytes (bufs[1] is unused when n == 1; n == 0 is a
 * no-op). Regions lie in the file and may differ in size; they must not
 * overlap each other (the read of k+1 runs before the write-back of k;
 * neighbours are checked).
 * Returns 0, or -1 with a message (I/O error, fn failed, bad arguments).
 * On error no further fn call is made; when fn fails at region k, regions
 * before k have been written back and k and later are untouched; after an
 * I/O error the regions' contents are unspecified. The handle stays usable
 * for further streams either way. */
int mf_offload_stream(mf_offload *o, const mf_region *r, int n, void *const bufs[2],
                      size_t buf_bytes, int write_back, mf_offload_fn fn, void *ctx);

/* Measurements of the last mf_offload_stream call. I/O hidden behind the
 * callback is io_s - wait_s; without overlap wall_s would be about
 * fn_s + io_s. */
typedef struct {
    double wall_s;          /* the whole call */
    double fn_s;            /* inside fn */
    double wait_s;          /* the calling thread blocked on I/O */
    double io_s;            /* the I/O thread busy (read, write, flush) */
    uint64_t bytes_read;
    uint64_t bytes_written;
} mf_offload_stats;

void mf_offload_stats_get(const mf_offload *o, mf_offload_stats *out);

/* 1 if the file lives on tmpfs/ramfs (its bytes are RAM), else 0. */
int mf_offload_in_ram(const mf_offload *o);

#ifdef __cplusplus
}
#endif
#endif
