/* Atomic whole-file writes: everything goes to "<path>.tmp.<pid>" in the
 * destination's directory, and only a fully written, fsync'ed temp file is
 * renamed over the destination. A crash or error at any point leaves either
 * the old file or the new one at `path`, never a mix; the directory fsync
 * after the rename makes the new name itself durable. */
#include "memfit/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void mf_atomic_release(mf_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    af->fp = NULL;
    af->path = NULL;
    af->tmp = NULL;
}

int mf_atomic_open(mf_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) return mf_fail("cannot write file: empty path");
    size_t n = strlen(path) + 32;
    af->path = strdup(path);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        mf_atomic_release(af);
        return mf_fail("cannot write %s: out of memory", path);
    }
    /* Same directory as the destination so rename() stays within one
     * filesystem and is atomic; the pid keeps concurrent writers apart. */
    snprintf(af->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    /* O_TRUNC rather than O_EXCL: a leftover temp with our pid can only
     * come from a dead process (pids are reused), and is garbage. */
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        mf_atomic_release(af);
        return mf_fail("cannot write %s: %s", path, strerror(e));
    }
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        int e = errno;
        close(fd);
        unlink(af->tmp);
        mf_atomic_release(af);
        return mf_fail("cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

/* fsync the directory holding `path` so the rename survives a crash. */
static int mf_atomic_sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = strdup(".");
    else if (slash == path) dir = strdup("/");
    else dir = strndup(path, (size_t)(slash - path));
    if (!dir) { errno = ENOMEM; return -1; }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Some filesystems cannot fsync directories (EINVAL); the data itself
     * is already synced, so that is not a failed write. */
    if (rc != 0 && e == EINVAL) rc = 0;
    errno = e;
    return rc;
}

int mf_atomic_commit(mf_atomic_file *af) {
    if (!af->fp || !af->tmp || !af->path) {
        mf_atomic_release(af);
        return mf_fail("cannot commit a file that is not open");
    }
    const char *what = NULL;
    int e = 0;
    /* A failed fwrite earlier sets the stream's error flag; errno may be
     * long gone by now, so report it as an I/O error. */
    if (ferror(af->fp)) { what = "write failed"; e = EIO; }
    else if (fflush(af->fp) != 0) { what = "write failed"; e = errno; }
    else if (fsync(fileno(af->fp)) != 0) { what = "fsync failed"; e = errno; }
    if (fclose(af->fp) != 0 && !what) { what = "close failed"; e = errno; }
    af->fp = NULL;
    if (!what && rename(af->tmp, af->path) != 0) { what = "rename failed"; e = errno; }
    if (what) {
        unlink(af->tmp);
        mf_fail("cannot write %s: %s: %s", af->path, what, strerror(e));
        mf_atomic_release(af);
        return -1;
    }
    if (mf_atomic_sync_dir(af->path) != 0) {
        e = errno;
        mf_fail("cannot write %s: fsync of its directory failed: %s", af->path, strerror(e));
        mf_atomic_release(af);
        return -1;
    }
    mf_atomic_release(af);
    return 0;
}

void mf_atomic_abort(mf_atomic_file *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp) unlink(af->tmp);
    mf_atomic_release(af);
}
