/* Token files: a 64-byte header and little-endian u16 ids (format in
 * include/memfit/data.h and docs/formats.md).
 *
 * Reading maps the file read-only and validates everything once at open
 * (header fields, exact size, every id < vocab), so the trainer can index
 * ids without checks. Writing goes to a temp file that is fsync'd and
 * renamed over the destination: a crash or error never leaves a half-written
 * token file under the real name.
 */
#include "memfit/core.h"
#include "memfit/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are mapped as little-endian u16 arrays: port mf_tokfile_* to big-endian hosts first"
#endif

#define MF_TOK_MAGIC "MFTOKENS"
#define MF_TOK_VERSION 1u
#define MF_TOK_HEADER 64u

static uint32_t mf_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t mf_le64(const unsigned char *p) { return mf_le32(p) | (uint64_t)mf_le32(p + 4) << 32; }

static void mf_put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void mf_put64(unsigned char *p, uint64_t v) {
    mf_put32(p, (uint32_t)v);
    mf_put32(p + 4, (uint32_t)(v >> 32));
}

/* The vocab a tokenizer kind implies, or 0 for an unknown kind. */
static uint32_t mf_kind_vocab(uint32_t kind) {
    return kind == MF_TOK_BYTES ? 256u : kind == MF_TOK_GPT2 ? (uint32_t)MF_GPT2_VOCAB : 0u;
}

static int mf_check_header(const unsigned char *h, const char *path, uint64_t *n) {
    if (memcmp(h, MF_TOK_MAGIC, 8) != 0)
        return mf_fail("%s is not a memfit token file (bad magic; expected \"%s\")", path, MF_TOK_MAGIC);
    uint32_t version = mf_le32(h + 8), kind = mf_le32(h + 12), vocab = mf_le32(h + 16), bpi = mf_le32(h + 20);
    if (version != MF_TOK_VERSION)
        return mf_fail("token file %s has version %u; this memfit reads version %u", path, version, MF_TOK_VERSION);
    if (!mf_kind_vocab(kind))
        return mf_fail("token file %s has unknown tokenizer kind %u (0 = bytes, 1 = gpt2)", path, kind);
    if (vocab != mf_kind_vocab(kind))
        return mf_fail("token file %s: vocab size %u does not match tokenizer kind %s (vocab %u)", path, vocab,
                       kind == MF_TOK_BYTES ? "bytes" : "gpt2", mf_kind_vocab(kind));
    if (bpi != 2) return mf_fail("token file %s has %u bytes per id; only 2 is supported", path, bpi);
    for (int i = 32; i < 64; i++)
        if (h[i]) return mf_fail("token file %s: reserved header byte %d is not zero", path, i);
    *n = mf_le64(h + 24);
    return 0;
}

int mf_tokfile_open(mf_tokfile *f, const char *path) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail("cannot open token file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mf_fail("cannot stat token file %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) { close(fd); return mf_fail("token file %s is not a regular file", path); }
    size_t size = (size_t)st.st_size;
    if (size == 0) { close(fd); return mf_fail("token file %s is empty", path); }
    if (size < MF_TOK_HEADER) {
        close(fd);
        return mf_fail("token file %s is truncated: %zu bytes, shorter than the %u-byte header", path, size,
                       MF_TOK_HEADER);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mf_fail("cannot map token file %s: %s", path, strerror(e));
    const unsigned char *h = map;
    uint64_t n = 0;
    if (mf_check_header(h, path, &n) != 0) { munmap(map, size); return -1; }
    uint64_t held = (size - MF_TOK_HEADER) / 2;
    if (n > held) {
        munmap(map, size);
        return mf_fail("token file %s is truncated: header says %llu ids, file holds %llu", path,
                       (unsigned long long)n, (unsigned long long)held);
    }
    if (size != MF_TOK_HEADER + 2 * n) {
        munmap(map, size);
        return mf_fail("token file %s has %llu trailing bytes after the %llu ids its header promises", path,
                       (unsigned long long)(size - MF_TOK_HEADER - 2 * n), (unsigned long long)n);
    }
    uint32_t vocab = mf_le32(h + 16);
    const uint16_t *ids = (const uint16_t *)(h + MF_TOK_HEADER);
    for (uint64_t i = 0; i < n; i++) {
        if (ids[i] >= vocab) {
            unsigned bad = ids[i];
            munmap(map, size);
            return mf_fail("token file %s: id %u at byte offset %llu (index %llu) is not below the vocab size %u",
                           path, bad, (unsigned long long)(MF_TOK_HEADER + 2 * i), (unsigned long long)i, vocab);
        }
    }
    (void)madvise(map, size, MADV_WILLNEED);
    f->ids = ids;
    f->n = n;
    f->kind = (mf_tok_kind)mf_le32(h + 12);
    f->vocab = vocab;
    f->map = map;
    f->map_size = size;
    return 0;
}

void mf_tokfile_close(mf_tokfile *f) {
    if (f->map) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

static int mf_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* fsyncs the directory holding `path`, so the rename itself is durable. */
static int mf_fsync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return mf_fail("out of memory");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        rc = mf_fail("token file %s: cannot sync directory %s: %s", path, dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int mf_tokfile_write(const char *path, mf_tok_kind kind, uint32_t vocab, const uint16_t *ids, uint64_t n) {
    uint32_t want = mf_kind_vocab((uint32_t)kind);
    if (!want) return mf_fail("cannot write token file %s: unknown tokenizer kind %d", path, (int)kind);
    if (vocab != want)
        return mf_fail("cannot write token file %s: vocab %u does not match tokenizer kind %s (%u)", path, vocab,
                       kind == MF_TOK_BYTES ? "bytes" : "gpt2", want);
    if (n && !ids) return mf_fail("cannot write token file %s: no ids given", path);
    if (n > (SIZE_MAX - MF_TOK_HEADER) / 2) return mf_fail("cannot write token file %s: too many ids", path);
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] >= vocab)
            return mf_fail("cannot write token file %s: id %u at index %llu is not below the vocab size %u", path,
                           ids[i], (unsigned long long)i, vocab);

    unsigned char h[MF_TOK_HEADER] = { 0 };
    memcpy(h, MF_TOK_MAGIC, 8);
    mf_put32(h + 8, MF_TOK_VERSION);
    mf_put32(h + 12, (uint32_t)kind);
    mf_put32(h + 16, vocab);
    mf_put32(h + 20, 2);
    mf_put64(h + 24, n);

    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) return mf_fail("out of memory");
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = mf_fail("cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    const char *step = "write";
    int ok = mf_write_all(fd, h, sizeof h) == 0 && mf_write_all(fd, ids, (size_t)n * 2) == 0;
    if (ok && !(ok = fsync(fd) == 0)) step = "fsync";
    int e = errno;
    if (close(fd) != 0 && ok) { ok = 0; step = "close"; e = errno; }
    if (ok && rename(tmp, path) != 0) { ok = 0; step = "rename"; e = errno; }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return mf_fail("cannot write token file %s (%s failed): %s", path, step, strerror(e));
    }
    free(tmp);
    return mf_fsync_dir(path);
}
