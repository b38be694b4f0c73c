/* Token files: a 64-byte header and little-endian u16 or u32 ids (format in
 * include/memfit/data.h and docs/formats.md). Version 2 (written) records
 * the tokenizer's hash and holds u32 ids when the vocabulary exceeds 65536;
 * version 1 files (u16, bytes or gpt2 only) are still read.
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
#error "token files are mapped as little-endian u16/u32 arrays: port mf_tokfile_* to big-endian hosts first"
#endif

#define MF_TOK_MAGIC "MFTOKENS"
#define MF_TOK_VERSION 2u
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

/* The vocab a tokenizer kind implies (0 for tokenizer.json: any), or -1
 * for a kind this version does not know. */
static int64_t mf_kind_vocab(uint32_t version, uint32_t kind) {
    if (kind == MF_TOK_BYTES) return 256;
    if (kind == MF_TOK_GPT2) return MF_GPT2_VOCAB;
    if (kind == MF_TOK_HF && version >= 2) return 0;
    return -1;
}

static const char *mf_kind_name(uint32_t kind) {
    return kind == MF_TOK_BYTES ? "bytes" : kind == MF_TOK_GPT2 ? "gpt2" : "tokenizer.json";
}

/* The hash a kind implies (tokenizer.json: any but 0). */
static uint64_t mf_kind_hash(uint32_t kind) { return kind == MF_TOK_GPT2 ? MF_GPT2_HASH : 0; }

/* Bytes per id a version-2 file must use for this vocab. */
static uint32_t mf_id_bytes(uint32_t vocab) { return vocab > 65536 ? 4u : 2u; }

static int mf_check_header(const unsigned char *h, const char *path, uint64_t *n) {
    if (memcmp(h, MF_TOK_MAGIC, 8) != 0)
        return mf_fail("%s is not a memfit token file (bad magic; expected \"%s\")", path, MF_TOK_MAGIC);
    uint32_t version = mf_le32(h + 8), kind = mf_le32(h + 12), vocab = mf_le32(h + 16), bpi = mf_le32(h + 20);
    if (version != 1 && version != MF_TOK_VERSION)
        return mf_fail("token file %s has version %u; this memfit reads versions 1 and %u", path, version,
                       MF_TOK_VERSION);
    int64_t want = mf_kind_vocab(version, kind);
    if (want < 0)
        return mf_fail("token file %s (version %u) has unknown tokenizer kind %u (0 = bytes, 1 = gpt2%s)", path,
                       version, kind, version >= 2 ? ", 2 = tokenizer.json" : "");
    if (want ? vocab != (uint32_t)want : (vocab == 0 || vocab > (1u << 31)))
        return mf_fail("token file %s: vocab size %u does not match tokenizer kind %s%s", path, vocab,
                       mf_kind_name(kind), want ? (kind == MF_TOK_BYTES ? " (vocab 256)" : " (vocab 50257)") : "");
    uint32_t want_bpi = version == 1 ? 2u : mf_id_bytes(vocab);
    if (bpi != want_bpi)
        return mf_fail("token file %s (version %u) has %u bytes per id; vocab %u needs %u", path, version, bpi, vocab,
                       want_bpi);
    int reserved_from = 32;
    if (version >= 2) {
        uint64_t hash = mf_le64(h + 32);
        if (kind == MF_TOK_HF && hash == 0)
            return mf_fail("token file %s (version %u): tokenizer.json kind with tokenizer hash 0 (it must record "
                           "the tokenizer's hash)", path, version);
        if (kind != MF_TOK_HF && hash != mf_kind_hash(kind))
            return mf_fail("token file %s (version %u): tokenizer hash 0x%016llx is not the %s tokenizer's", path,
                           version, (unsigned long long)hash, mf_kind_name(kind));
        reserved_from = 40;
    }
    for (int i = reserved_from; i < 64; i++)
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
    uint32_t bpi = mf_le32(h + 20);
    uint64_t held = (size - MF_TOK_HEADER) / bpi;
    if (n > held) {
        munmap(map, size);
        return mf_fail("token file %s is truncated: header says %llu ids, file holds %llu", path,
                       (unsigned long long)n, (unsigned long long)held);
    }
    if (size != MF_TOK_HEADER + bpi * n) {
        munmap(map, size);
        return mf_fail("token file %s has %llu trailing bytes after the %llu ids its header promises", path,
                       (unsigned long long)(size - MF_TOK_HEADER - bpi * n), (unsigned long long)n);
    }
    uint32_t vocab = mf_le32(h + 16);
    const uint16_t *ids = bpi == 2 ? (const uint16_t *)(h + MF_TOK_HEADER) : NULL;
    const uint32_t *ids32 = bpi == 4 ? (const uint32_t *)(h + MF_TOK_HEADER) : NULL;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = ids ? ids[i] : ids32[i];
        if (id >= vocab) {
            munmap(map, size);
            return mf_fail("token file %s: id %u at byte offset %llu (index %llu) is not below the vocab size %u",
                           path, id, (unsigned long long)(MF_TOK_HEADER + (uint64_t)bpi * i), (unsigned long long)i,
                           vocab);
        }
    }
    (void)madvise(map, size, MADV_WILLNEED);
    f->ids = ids;
    f->ids32 = ids32;
    f->id_bytes = bpi;
    f->version = mf_le32(h + 8);
    f->tok_hash = f->version >= 2 ? mf_le64(h + 32) : mf_kind_hash(mf_le32(h + 12));
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

static int mf_tokfile_put(const char *path, const unsigned char *h, const void *body, size_t body_len);

/* Writes a version-2 file from u16 (ids16) or u32 (ids32) ids. */
static int mf_tokfile_write_any(const char *path, mf_tok_kind kind, uint32_t vocab, uint64_t tok_hash,
                                const uint16_t *ids16, const uint32_t *ids32, uint64_t n) {
    int64_t want = mf_kind_vocab(MF_TOK_VERSION, (uint32_t)kind);
    if (want < 0) return mf_fail("cannot write token file %s: unknown tokenizer kind %d", path, (int)kind);
    if (want ? vocab != (uint32_t)want : (vocab == 0 || vocab > (1u << 31)))
        return mf_fail("cannot write token file %s: vocab %u does not match tokenizer kind %s", path, vocab,
                       mf_kind_name((uint32_t)kind));
    if (kind == MF_TOK_HF ? tok_hash == 0 : tok_hash != mf_kind_hash((uint32_t)kind))
        return mf_fail("cannot write token file %s: tokenizer hash 0x%016llx is not the %s tokenizer's", path,
                       (unsigned long long)tok_hash, mf_kind_name((uint32_t)kind));
    uint32_t bpi = mf_id_bytes(vocab);
    if (n && !ids16 && !ids32) return mf_fail("cannot write token file %s: no ids given", path);
    if (n > (SIZE_MAX - MF_TOK_HEADER) / 4) return mf_fail("cannot write token file %s: too many ids", path);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = ids16 ? ids16[i] : ids32[i];
        if (id >= vocab)
            return mf_fail("cannot write token file %s: id %u at index %llu is not below the vocab size %u", path, id,
                           (unsigned long long)i, vocab);
    }
    /* the ids in the file's width */
    void *conv = NULL;
    const void *body = bpi == 2 ? (const void *)ids16 : (const void *)ids32;
    if (n && !body) {
        conv = malloc((size_t)n * bpi);
        if (!conv) return mf_fail("out of memory writing %s", path);
        for (uint64_t i = 0; i < n; i++) {
            if (bpi == 2) ((uint16_t *)conv)[i] = (uint16_t)ids32[i];
            else ((uint32_t *)conv)[i] = ids16[i];
        }
        body = conv;
    }

    unsigned char h[MF_TOK_HEADER] = { 0 };
    memcpy(h, MF_TOK_MAGIC, 8);
    mf_put32(h + 8, MF_TOK_VERSION);
    mf_put32(h + 12, (uint32_t)kind);
    mf_put32(h + 16, vocab);
    mf_put32(h + 20, bpi);
    mf_put64(h + 24, n);
    mf_put64(h + 32, tok_hash);
    int rc = mf_tokfile_put(path, h, body, (size_t)n * bpi);
    free(conv);
    return rc;
}

int mf_tokfile_write(const char *path, mf_tok_kind kind, uint32_t vocab, const uint16_t *ids, uint64_t n) {
    if (kind == MF_TOK_HF)
        return mf_fail("cannot write token file %s: a tokenizer.json file needs its hash (mf_tokfile_write32)", path);
    return mf_tokfile_write_any(path, kind, vocab, mf_kind_hash((uint32_t)kind), ids, NULL, n);
}

int mf_tokfile_write32(const char *path, mf_tok_kind kind, uint32_t vocab, uint64_t tok_hash, const uint32_t *ids,
                       uint64_t n) {
    return mf_tokfile_write_any(path, kind, vocab, tok_hash, NULL, ids, n);
}

/* Header then body to a temp file, fsync, rename, fsync the directory. */
static int mf_tokfile_put(const char *path, const unsigned char *h, const void *body, size_t body_len) {
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
    int ok = mf_write_all(fd, h, MF_TOK_HEADER) == 0 && mf_write_all(fd, body, body_len) == 0;
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
