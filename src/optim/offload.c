/* Offloaded state: a preallocated scratch file, a persistent I/O thread and
 * a double-buffered stream over it.
 *
 * The I/O thread runs a FIFO of operations (read a region into a buffer,
 * write a buffer to a region, flush). FIFO order is what makes double
 * buffering safe: the stream queues "write k from buffer b" before "read
 * k+2 into buffer b", so a buffer is never refilled before it is written
 * out. (The read of k+1 is queued before the write of k, which is why
 * neighbouring regions must not overlap.)
 * The calling thread only waits for the read it needs next, and for
 * everything at the end, so that no operation touches the caller's
 * buffers after the stream returns.
 *
 * Hand-off: the mutex orders every access to the fd-side state (o->pend,
 * the counters) between the two threads; outside a stream the I/O thread
 * is idle and the calling thread uses the fd directly. */
#include "optim/offload.h"
#include "dist/dist.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MF_OFFLOAD_QCAP 8                        /* a stream has at most 4 ops in flight */
#define MF_OFFLOAD_CHUNK ((size_t)8 << 20)       /* synchronous writes flush every 8 MiB */
#define MF_OFFLOAD_IO_MAX ((size_t)1 << 30)      /* one pread/pwrite at most (Linux caps near 2 GiB) */
#define MF_OFFLOAD_STACK ((size_t)256 << 10)
#define MF_TMPFS_MAGIC 0x01021994
#define MF_RAMFS_MAGIC 0x858458f6

typedef enum { MF_OFFLOAD_OP_READ, MF_OFFLOAD_OP_WRITE, MF_OFFLOAD_OP_FLUSH } mf_offload_op_kind;

typedef struct {
    mf_offload_op_kind kind;
    void *buf;
    uint64_t off;
    size_t len;
    int drop;  /* read: drop the range from the page cache afterwards */
} mf_offload_op;

struct mf_offload {
    int fd;
    char *path;
    uint64_t bytes;
    int in_ram;

    /* A written range whose writeback was started but not yet waited for
     * and dropped; len 0 = none. Empty between calls. */
    uint64_t pend_off;
    size_t pend_len;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    mf_offload_op ops[MF_OFFLOAD_QCAP];
    uint64_t queued, done;  /* ops submitted / finished (or skipped) */
    int quit;
    int failed;             /* an op failed in this stream: skip the rest */
    char err[512];          /* the I/O thread's message for `failed` */

    mf_offload_stats st;    /* io_s and bytes_* are written by the I/O thread under mu */
};

/* ---- plain I/O, usable from either thread --------------------------- */

/* Each returns 0, or -1 with a message in err. */
static int mf_offload_pread_all(const mf_offload *o, void *dst, size_t len, uint64_t off,
                                char *err, size_t n) {
    uint8_t *p = dst;
    size_t left = len;
    while (left > 0) {
        size_t want = left < MF_OFFLOAD_IO_MAX ? left : MF_OFFLOAD_IO_MAX;
        ssize_t got = pread(o->fd, p, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            snprintf(err, n, "cannot read offload file %s at byte %llu (%zu bytes): %s", o->path,
                     (unsigned long long)off, left,
                     got == 0 ? "unexpected end of file (was it truncated?)" : strerror(errno));
            return -1;
        }
        p += got;
        off += (uint64_t)got;
        left -= (size_t)got;
    }
    return 0;
}

static int mf_offload_pwrite_all(const mf_offload *o, const void *src, size_t len, uint64_t off,
                                 char *err, size_t n) {
    const uint8_t *p = src;
    size_t left = len;
    while (left > 0) {
        size_t want = left < MF_OFFLOAD_IO_MAX ? left : MF_OFFLOAD_IO_MAX;
        ssize_t put = pwrite(o->fd, p, want, (off_t)off);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
            snprintf(err, n, "cannot write offload file %s at byte %llu (%zu bytes): %s", o->path,
                     (unsigned long long)off, left, put == 0 ? "no progress" : strerror(errno));
            return -1;
        }
        p += put;
        off += (uint64_t)put;
        left -= (size_t)put;
    }
    return 0;
}

/* Page-cache hygiene. sync_file_range only reports what the device said;
 * EIO/ENOSPC there means written state was lost, so those are errors, and
 * anything else (unsupported filesystem) is ignored. Note len 0 would mean
 * "to the end of the file" to both calls, hence the guards. */
static int mf_offload_sfr_failed(const mf_offload *o, uint64_t off, size_t len, char *err, size_t n) {
    int e = errno;
    if (e != EIO && e != ENOSPC) return 0;
    snprintf(err, n, "cannot write offload file %s at byte %llu (%zu bytes): %s", o->path,
             (unsigned long long)off, len, strerror(e));
    return -1;
}

/* Starts writeback of a just-written range without waiting for it. */
static int mf_offload_wb_start(const mf_offload *o, uint64_t off, size_t len, char *err, size_t n) {
    if (len == 0 || o->in_ram) return 0;
#ifdef SYNC_FILE_RANGE_WRITE
    if (sync_file_range(o->fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE) != 0)
        return mf_offload_sfr_failed(o, off, len, err, n);
#else
    (void)off; (void)err; (void)n;
#endif
    return 0;
}

/* Waits for a range's writeback, then drops its now-clean pages. */
static int mf_offload_wb_finish(const mf_offload *o, uint64_t off, size_t len, char *err, size_t n) {
    if (len == 0 || o->in_ram) return 0;
#ifdef SYNC_FILE_RANGE_WRITE
    unsigned fl = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
    if (sync_file_range(o->fd, (off_t)off, (off_t)len, fl) != 0 &&
        mf_offload_sfr_failed(o, off, len, err, n) != 0)
        return -1;
#else
    /* Without sync_file_range, DONTNEED still drops what the kernel has
     * already written back. */
    (void)err; (void)n;
#endif
    (void)posix_fadvise(o->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    return 0;
}

static void mf_offload_drop(const mf_offload *o, uint64_t off, size_t len) {
    if (len > 0 && !o->in_ram) (void)posix_fadvise(o->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

/* Writes one range and pipelines its flush: this range's writeback starts
 * now, the previous range's is waited for and dropped. At most two ranges
 * are dirty in the page cache at a time. */
static int mf_offload_write_range(mf_offload *o, const void *src, size_t len, uint64_t off,
                                  char *err, size_t n) {
    if (mf_offload_pwrite_all(o, src, len, off, err, n) != 0) return -1;
    if (mf_offload_wb_start(o, off, len, err, n) != 0) return -1;
    int rc = mf_offload_wb_finish(o, o->pend_off, o->pend_len, err, n);
    o->pend_off = off;
    o->pend_len = len;
    return rc;
}

static int mf_offload_flush(mf_offload *o, char *err, size_t n) {
    int rc = mf_offload_wb_finish(o, o->pend_off, o->pend_len, err, n);
    o->pend_len = 0;
    return rc;
}

/* ---- the I/O thread ------------------------------------------------- */

static void *mf_offload_thread(void *arg) {
    mf_offload *o = arg;
    char err[sizeof o->err];
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->quit && o->done == o->queued) pthread_cond_wait(&o->cv_work, &o->mu);
        if (o->done == o->queued) break; /* quit, nothing left */
        mf_offload_op op = o->ops[o->done % MF_OFFLOAD_QCAP];
        int skip = o->failed;
        pthread_mutex_unlock(&o->mu);

        int rc = 0;
        double t0 = mf_time_now();
        if (!skip) {
            err[0] = '\0';
            if (op.kind == MF_OFFLOAD_OP_READ) {
                rc = mf_offload_pread_all(o, op.buf, op.len, op.off, err, sizeof err);
                if (rc == 0 && op.drop) mf_offload_drop(o, op.off, op.len);
            } else if (op.kind == MF_OFFLOAD_OP_WRITE) {
                rc = mf_offload_write_range(o, op.buf, op.len, op.off, err, sizeof err);
            } else {
                rc = mf_offload_flush(o, err, sizeof err);
            }
        }
        double dt = mf_time_now() - t0;

        pthread_mutex_lock(&o->mu);
        if (!skip) {
            o->st.io_s += dt;
            if (op.kind == MF_OFFLOAD_OP_READ) o->st.bytes_read += op.len;
            if (op.kind == MF_OFFLOAD_OP_WRITE) o->st.bytes_written += op.len;
        }
        if (rc != 0 && !o->failed) {
            o->failed = 1;
            memcpy(o->err, err, sizeof o->err);
        }
        o->done++;
        pthread_cond_broadcast(&o->cv_done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static uint64_t mf_offload_submit(mf_offload *o, mf_offload_op op) {
    pthread_mutex_lock(&o->mu);
    if (o->queued - o->done >= MF_OFFLOAD_QCAP) mf_panic("mf_offload: I/O queue overflow");
    uint64_t seq = o->queued++;
    o->ops[seq % MF_OFFLOAD_QCAP] = op;
    pthread_cond_signal(&o->cv_work);
    pthread_mutex_unlock(&o->mu);
    return seq;
}

/* Blocks until op `seq` (and all before it) is done; time counts as wait.
 * Returns 0, or -1 if any op of this stream failed. */
static int mf_offload_wait(mf_offload *o, uint64_t seq) {
    double t0 = mf_time_now();
    pthread_mutex_lock(&o->mu);
    while (o->done <= seq) pthread_cond_wait(&o->cv_done, &o->mu);
    int failed = o->failed;
    pthread_mutex_unlock(&o->mu);
    o->st.wait_s += mf_time_now() - t0;
    return failed ? -1 : 0;
}

/* ---- open / close ----------------------------------------------------- */

static int mf_offload_range_ok(const mf_offload *o, uint64_t off, size_t len) {
    return (uint64_t)len <= o->bytes && off <= o->bytes - (uint64_t)len;
}

int mf_offload_open(mf_offload **out, const char *path_in, uint64_t bytes) {
    *out = NULL;
    if (!path_in || !*path_in) return mf_fail("cannot create offload file: empty path");
    /* under mpirun every rank streams a file of its own: PATH.rank<r> */
    char rpath[4096 + 32];
    const char *path = mf_dist_rank_path(path_in, rpath, sizeof rpath);
    if (bytes > (uint64_t)INT64_MAX) return mf_fail("cannot create offload file %s: size too large", path);
    mf_offload *o = calloc(1, sizeof *o);
    char *p = strdup(path);
    if (!o || !p) {
        free(o);
        free(p);
        return mf_fail("cannot create offload file %s: out of memory", path);
    }
    o->path = p;
    o->bytes = bytes;
    o->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o->fd < 0) {
        int e = errno;
        free(o->path);
        free(o);
        return mf_fail("cannot create offload file %s: %s", path, strerror(e));
    }
    char sz[32], fr[32];
    int e = bytes > 0 ? posix_fallocate(o->fd, 0, (off_t)bytes) : 0; /* returns the error */
    if (e != 0) {
        struct statvfs sv;
        if (e == ENOSPC && fstatvfs(o->fd, &sv) == 0)
            mf_fail("cannot create offload file %s: not enough disk space (needs %s, %s free); "
                    "put it on a larger disk", path, mf_size_format((size_t)bytes, sz, sizeof sz),
                    mf_size_format((size_t)sv.f_bavail * sv.f_frsize, fr, sizeof fr));
        else
            mf_fail("cannot create offload file %s: preallocating %s failed: %s", path,
                    mf_size_format((size_t)bytes, sz, sizeof sz), strerror(e));
        goto fail_file;
    }
    /* (collective under mpirun: every rank opens its file here) */
    if (mf_dist_file_private(o->fd, path)) goto fail_file;
    struct statfs sf;
    if (fstatfs(o->fd, &sf) == 0)
        o->in_ram = (unsigned long)sf.f_type == MF_TMPFS_MAGIC || (unsigned long)sf.f_type == MF_RAMFS_MAGIC;
    (void)posix_fadvise(o->fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* longer readahead */

    if ((e = pthread_mutex_init(&o->mu, NULL)) != 0) goto fail_thread;
    if ((e = pthread_cond_init(&o->cv_work, NULL)) != 0) {
        pthread_mutex_destroy(&o->mu);
        goto fail_thread;
    }
    if ((e = pthread_cond_init(&o->cv_done, NULL)) != 0) {
        pthread_cond_destroy(&o->cv_work);
        pthread_mutex_destroy(&o->mu);
        goto fail_thread;
    }
    /* The I/O thread blocks every signal, so handlers (Ctrl-C to stop a
     * run) run on the training thread, not in the middle of our I/O. */
    pthread_attr_t attr;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_init(&attr);
    size_t stack = MF_OFFLOAD_STACK;
    long smin = sysconf(_SC_THREAD_STACK_MIN);
    if (smin > 0 && (size_t)smin > stack) stack = (size_t)smin;
    pthread_attr_setstacksize(&attr, stack);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&o->thread, &attr, mf_offload_thread, o);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        pthread_cond_destroy(&o->cv_done);
        pthread_cond_destroy(&o->cv_work);
        pthread_mutex_destroy(&o->mu);
        goto fail_thread;
    }
    *out = o;
    return 0;

fail_thread:
    mf_fail("cannot create offload file %s: starting the I/O thread failed: %s", path, strerror(e));
fail_file:
    close(o->fd);
    unlink(path);
    free(o->path);
    free(o);
    return -1;
}

void mf_offload_close(mf_offload *o, int remove) {
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    o->quit = 1;
    pthread_cond_signal(&o->cv_work);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    pthread_cond_destroy(&o->cv_done);
    pthread_cond_destroy(&o->cv_work);
    pthread_mutex_destroy(&o->mu);
    close(o->fd);
    if (remove) unlink(o->path);
    free(o->path);
    free(o);
}

/* ---- synchronous copies ----------------------------------------------- */

int mf_offload_read(mf_offload *o, uint64_t off, void *dst, size_t len) {
    char err[sizeof o->err];
    if (!mf_offload_range_ok(o, off, len))
        return mf_fail("cannot read offload file %s: bytes [%llu, +%zu) are outside its %llu bytes",
                       o->path, (unsigned long long)off, len, (unsigned long long)o->bytes);
    if (mf_offload_pread_all(o, dst, len, off, err, sizeof err) != 0) return mf_fail("%s", err);
    mf_offload_drop(o, off, len);
    return 0;
}

int mf_offload_write(mf_offload *o, uint64_t off, const void *src, size_t len) {
    char err[sizeof o->err];
    if (!mf_offload_range_ok(o, off, len))
        return mf_fail("cannot write offload file %s: bytes [%llu, +%zu) are outside its %llu bytes",
                       o->path, (unsigned long long)off, len, (unsigned long long)o->bytes);
    const uint8_t *p = src;
    /* In chunks, so that a large set-up write (a whole state restored from
     * a checkpoint) never has more than two chunks dirty in the page cache. */
    for (size_t at = 0; at < len; at += MF_OFFLOAD_CHUNK) {
        size_t m = len - at < MF_OFFLOAD_CHUNK ? len - at : MF_OFFLOAD_CHUNK;
        if (mf_offload_write_range(o, p + at, m, off + at, err, sizeof err) != 0) {
            o->pend_len = 0;
            return mf_fail("%s", err);
        }
    }
    if (mf_offload_flush(o, err, sizeof err) != 0) return mf_fail("%s", err);
    return 0;
}

/* ---- the stream ------------------------------------------------------- */

int mf_offload_stream(mf_offload *o, const mf_region *r, int n, void *const bufs[2],
                      size_t buf_bytes, int write_back, mf_offload_fn fn, void *ctx) {
    double t0 = mf_time_now();
    memset(&o->st, 0, sizeof o->st); /* the I/O thread is idle: no lock needed */
    if (n < 0 || !fn || (n > 0 && (!r || !bufs || !bufs[0])) || (n > 1 && !bufs[1]))
        return mf_fail("offload stream over %s: bad arguments (n = %d)", o->path, n);
    if (n > 1) {
        uintptr_t a = (uintptr_t)bufs[0], b = (uintptr_t)bufs[1];
        if (a < b + buf_bytes && b < a + buf_bytes)
            return mf_fail("offload stream over %s: the two window buffers overlap", o->path);
    }
    for (int k = 0; k < n; k++) {
        if (r[k].len > buf_bytes)
            return mf_fail("offload stream over %s: region %d is %zu bytes, the window buffers %zu",
                           o->path, k, r[k].len, buf_bytes);
        if (!mf_offload_range_ok(o, r[k].off, r[k].len))
            return mf_fail("offload stream over %s: region %d [%llu, +%zu) is outside its %llu bytes",
                           o->path, k, (unsigned long long)r[k].off, r[k].len,
                           (unsigned long long)o->bytes);
        if (k > 0 && r[k].len > 0 && r[k - 1].len > 0 &&
            r[k].off < r[k - 1].off + r[k - 1].len && r[k - 1].off < r[k].off + r[k].len)
            return mf_fail("offload stream over %s: regions %d and %d overlap", o->path, k - 1, k);
    }
    pthread_mutex_lock(&o->mu);
    o->failed = 0;
    o->err[0] = '\0';
    pthread_mutex_unlock(&o->mu);

    uint64_t rd[2] = {0, 0}; /* sequence number of the read pending into each buffer */
    for (int k = 0; k < n && k < 2; k++)
        rd[k] = mf_offload_submit(o, (mf_offload_op){MF_OFFLOAD_OP_READ, bufs[k], r[k].off, r[k].len, !write_back});

    int rc = 0, fn_failed = -1;
    char fnmsg[sizeof o->err];
    for (int k = 0; k < n; k++) {
        void *b = bufs[k & 1];
        if (mf_offload_wait(o, rd[k & 1]) != 0) { rc = -1; break; }
        mf_fail("%s", ""); /* so a message after fn is fn's own */
        double tf = mf_time_now();
        int frc = fn(ctx, k, b, r[k].len);
        o->st.fn_s += mf_time_now() - tf;
        if (frc != 0) {
            snprintf(fnmsg, sizeof fnmsg, "%s", mf_error());
            if (!fnmsg[0]) snprintf(fnmsg, sizeof fnmsg, "callback returned %d", frc);
            fn_failed = k;
            rc = -1;
            break;
        }
        if (write_back)
            mf_offload_submit(o, (mf_offload_op){MF_OFFLOAD_OP_WRITE, b, r[k].off, r[k].len, 0});
        if (k + 2 < n)
            rd[k & 1] = mf_offload_submit(o, (mf_offload_op){MF_OFFLOAD_OP_READ, b, r[k + 2].off, r[k + 2].len, !write_back});
    }
    /* Always drain: the caller's buffers are free only when the queue is. */
    if (write_back) mf_offload_submit(o, (mf_offload_op){MF_OFFLOAD_OP_FLUSH, NULL, 0, 0, 0});
    /* queued is written only by this thread, so it can be read unlocked */
    int io_failed = o->queued > 0 && mf_offload_wait(o, o->queued - 1) != 0;
    o->st.wall_s = mf_time_now() - t0;

    if (io_failed) return mf_fail("%s", o->err); /* names the path already */
    if (fn_failed >= 0)
        return mf_fail("offload stream over %s: region %d of %d (bytes [%llu, +%zu)): %s", o->path,
                       fn_failed, n, (unsigned long long)r[fn_failed].off, r[fn_failed].len, fnmsg);
    return rc;
}

void mf_offload_stats_get(const mf_offload *o, mf_offload_stats *out) { *out = o->st; }

int mf_offload_in_ram(const mf_offload *o) { return o->in_ram; }
