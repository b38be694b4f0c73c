/* Atomic whole-file writes: everything goes to "<path>.tmp.<pid>" in the
 * destination's directory, and only a fully written, fsync'ed temp file is
 * renamed over the destination. A crash or error at any point leaves either
 * the old file or the new one at `path`, never a mix; the directory fsync
 * after the rename makes the new name itself durable. */
#include "io/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The pid in "<name>.tmp.<pid>", or 0 if the name has another shape. */
static long mf_atomic_tmp_pid(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t || t == name) return 0;
    for (const char *n; (n = strstr(t + 1, ".tmp.")); t = n) {}  /* the last ".tmp." */
    const char *d = t + 5;
    if (!*d || strlen(d) > 9) return 0;
    for (const char *q = d; *q; q++)
        if (*q < '0' || *q > '9') return 0;
    long pid = strtol(d, NULL, 10);
    return pid > 0 ? pid : 0;
}

/* 1 if pid is a running memfit (the CLI, or a test program of the suite,
 * which links the same writer), 0 if it is gone or some other program. */
static int mf_atomic_pid_is_writer(long pid) {
    if (pid == (long)getpid()) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    /* the program file, not /proc/PID/comm: memfit re-executes itself
     * through /proc/self/exe (OpenBLAS set-up), so its comm reads "exe" */
    char path[64], exe[4096];
    snprintf(path, sizeof path, "/proc/%ld/exe", pid);
    ssize_t n = readlink(path, exe, sizeof exe - 1);
    if (n < 0) return errno == ENOENT ? 0 : 1;  /* not ours to read, or no /proc: keep the file */
    exe[n] = '\0';
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    return strncmp(base, "memfit", 6) == 0 || strncmp(base, "test_", 5) == 0;
}

int mf_atomic_clean_stale(const char *dir, char *names, size_t cap) {
    if (names && cap) names[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return mf_fail("cannot read folder %s: %s", dir, strerror(errno));
    int removed = 0;
    size_t len = 0;
    for (struct dirent *e; (e = readdir(d));) {
        long pid = mf_atomic_tmp_pid(e->d_name);
        if (!pid || mf_atomic_pid_is_writer(pid)) continue;
        char *p = malloc(strlen(dir) + strlen(e->d_name) + 2);
        if (!p) break;
        sprintf(p, "%s/%s", dir, e->d_name);
        struct stat st;
        int ok = lstat(p, &st) == 0 && S_ISREG(st.st_mode) && (unlink(p) == 0 || errno == ENOENT);
        free(p);
        if (!ok) continue;
        if (names && removed < 3 && len + strlen(e->d_name) + 3 < cap)
            len += (size_t)snprintf(names + len, cap - len, "%s%s", removed ? ", " : "", e->d_name);
        else if (names && removed == 3 && len + 6 < cap)
            len += (size_t)snprintf(names + len, cap - len, ", ...");
        removed++;
    }
    closedir(d);
    return removed;
}
