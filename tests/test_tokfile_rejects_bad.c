/* Token files round-trip through write/open, every malformed file is refused
 * with a message that says what is wrong, and a failed write leaves neither
 * a temp file nor a changed destination behind. */
#include "memfit/core.h"
#include "memfit/data.h"
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char mf_dir[] = "/tmp/memfit_tokfile_XXXXXX";

static const char *mf_path(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", mf_dir, name);
    return buf;
}

/* A raw token file: header fields as given, then `held` ids (0, 1, 2, ...),
 * then `extra` junk bytes. */
static void mf_raw(const char *path, const char *magic, uint32_t version, uint32_t kind, uint32_t vocab,
                   uint64_t n, uint64_t held, int extra, uint16_t bad_id_at) {
    unsigned char h[64] = { 0 };
    memcpy(h, magic, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &kind, 4);
    memcpy(h + 16, &vocab, 4);
    uint32_t bpi = 2;
    memcpy(h + 20, &bpi, 4);
    memcpy(h + 24, &n, 8);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fwrite(h, 1, sizeof h, f);
    for (uint64_t i = 0; i < held; i++) {
        uint16_t id = (uint16_t)(i % 200);
        if (bad_id_at && i == bad_id_at) id = (uint16_t)vocab;
        fwrite(&id, 2, 1, f);
    }
    for (int i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
}

/* Opening `path` must fail with a message containing each of `want`. */
static void mf_expect_reject(const char *path, const char *what, const char *want1, const char *want2) {
    mf_tokfile f;
    int rc = mf_tokfile_open(&f, path);
    CHECK(rc == -1, "%s: open succeeded", what);
    CHECK(f.map == NULL && f.ids == NULL && f.n == 0, "%s: failed open left a mapping", what);
    const char *e = mf_error();
    CHECK(strstr(e, want1) != NULL, "%s: message \"%s\" lacks \"%s\"", what, e, want1);
    if (want2) CHECK(strstr(e, want2) != NULL, "%s: message \"%s\" lacks \"%s\"", what, e, want2);
    printf("  %-20s -> %s\n", what, e);
    mf_tokfile_close(&f);
}

/* Nothing named "<prefix>.tmp.*" may stay in the test directory. */
static int mf_count_temps(const char *prefix) {
    DIR *d = opendir(mf_dir);
    int n = 0;
    size_t pl = strlen(prefix);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, prefix, pl) == 0 && strncmp(e->d_name + pl, ".tmp.", 5) == 0) n++;
    if (d) closedir(d);
    return n;
}

int main(void) {
    CHECK(mkdtemp(mf_dir) != NULL, "mkdtemp");
    char p[256], q[256];

    /* round trip, both kinds, including an empty file of ids */
    uint16_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (uint16_t)((i * 7919) % MF_GPT2_VOCAB);
    ids[999] = MF_GPT2_VOCAB - 1;
    mf_path("gpt2.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, ids, 1000) == 0, "write: %s", mf_error());
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 64 + 2000, "file size %lld", (long long)st.st_size);
    mf_tokfile f;
    CHECK(mf_tokfile_open(&f, p) == 0, "open: %s", mf_error());
    CHECK(f.n == 1000 && f.kind == MF_TOK_GPT2 && f.vocab == MF_GPT2_VOCAB, "header n=%llu kind=%d vocab=%u",
          (unsigned long long)f.n, (int)f.kind, f.vocab);
    CHECK(f.ids && memcmp(f.ids, ids, sizeof ids) == 0, "ids differ after round trip");
    mf_tokfile_close(&f);
    CHECK(f.map == NULL, "close clears the struct");
    mf_tokfile_close(&f); /* closing twice is harmless */

    uint16_t bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint16_t)i;
    mf_path("bytes.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_BYTES, 256, bytes, 256) == 0, "write bytes: %s", mf_error());
    CHECK(mf_tokfile_open(&f, p) == 0 && f.n == 256 && f.kind == MF_TOK_BYTES && f.vocab == 256 &&
          memcmp(f.ids, bytes, sizeof bytes) == 0, "bytes round trip: %s", mf_error());
    mf_tokfile_close(&f);

    mf_path("none.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, NULL, 0) == 0, "write 0 ids: %s", mf_error());
    CHECK(mf_tokfile_open(&f, p) == 0 && f.n == 0, "open 0 ids: %s", mf_error());
    mf_tokfile_close(&f);

    /* overwriting replaces the old content */
    mf_path("gpt2.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, ids + 10, 5) == 0, "overwrite: %s", mf_error());
    CHECK(mf_tokfile_open(&f, p) == 0 && f.n == 5 && f.ids[0] == ids[10], "overwrite round trip: %s", mf_error());
    mf_tokfile_close(&f);
    CHECK(mf_count_temps("gpt2.tok") == 0, "a temp file was left after successful writes");

    /* bad files */
    printf("rejected files:\n");
    mf_raw(mf_path("magic.tok", p, sizeof p), "MFTOKENZ", 1, 1, MF_GPT2_VOCAB, 4, 4, 0, 0);
    mf_expect_reject(p, "bad magic", "magic", p);
    mf_raw(mf_path("version.tok", p, sizeof p), "MFTOKENS", 2, 1, MF_GPT2_VOCAB, 4, 4, 0, 0);
    mf_expect_reject(p, "wrong version", "version 2", NULL);
    mf_raw(mf_path("kind.tok", p, sizeof p), "MFTOKENS", 1, 7, MF_GPT2_VOCAB, 4, 4, 0, 0);
    mf_expect_reject(p, "unknown kind", "kind 7", NULL);
    mf_raw(mf_path("vocab.tok", p, sizeof p), "MFTOKENS", 1, 0, MF_GPT2_VOCAB, 4, 4, 0, 0);
    mf_expect_reject(p, "vocab/kind mismatch", "vocab", NULL);
    mf_raw(mf_path("trunc.tok", p, sizeof p), "MFTOKENS", 1, 1, MF_GPT2_VOCAB, 100, 60, 0, 0);
    mf_expect_reject(p, "truncated", "truncated: header says 100 ids, file holds 60", p);
    mf_raw(mf_path("trunc_odd.tok", p, sizeof p), "MFTOKENS", 1, 1, MF_GPT2_VOCAB, 100, 99, 1, 0);
    mf_expect_reject(p, "truncated mid-id", "header says 100 ids, file holds 99", NULL);
    mf_raw(mf_path("trail.tok", p, sizeof p), "MFTOKENS", 1, 1, MF_GPT2_VOCAB, 10, 10, 3, 0);
    mf_expect_reject(p, "trailing bytes", "3 trailing bytes", NULL);
    mf_raw(mf_path("bigid.tok", p, sizeof p), "MFTOKENS", 1, 1, MF_GPT2_VOCAB, 50, 50, 0, 17);
    mf_expect_reject(p, "id >= vocab", "id 50257 at byte offset 98", NULL);
    mf_raw(mf_path("bigbyte.tok", p, sizeof p), "MFTOKENS", 1, 0, 256, 50, 50, 0, 3);
    mf_expect_reject(p, "byte id >= 256", "id 256 at byte offset 70", NULL);
    FILE *e = fopen(mf_path("empty.tok", p, sizeof p), "wb");
    if (e) fclose(e);
    mf_expect_reject(p, "empty file", "empty", p);
    e = fopen(mf_path("short.tok", p, sizeof p), "wb");
    if (e) { fputs("MFTOKENS", e); fclose(e); }
    mf_expect_reject(p, "shorter than header", "header", NULL);
    mf_expect_reject(mf_path("missing.tok", p, sizeof p), "nonexistent path", "No such file", p);
    mf_expect_reject(mf_dir, "a directory", "not a regular file", NULL);
    char hugen[256];
    mf_raw(mf_path("hugen.tok", hugen, sizeof hugen), "MFTOKENS", 1, 1, MF_GPT2_VOCAB, UINT64_MAX / 2 + 5, 3, 0, 0);
    mf_expect_reject(hugen, "absurd id count", "truncated", NULL);

    /* failed writes: nothing left behind, destination untouched */
    mf_path("nodir/x.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, ids, 10) == -1, "write into a missing directory");
    CHECK(strstr(mf_error(), "nodir") != NULL, "message \"%s\" names the path", mf_error());
    CHECK(access(mf_path("nodir", q, sizeof q), F_OK) != 0, "write created the directory");

    mf_path("dest_is_dir", p, sizeof p); /* rename onto a directory fails after the temp is written */
    CHECK(mkdir(p, 0755) == 0, "mkdir %s", p);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, ids, 1000) == -1, "write onto a directory");
    printf("  failed write         -> %s\n", mf_error());
    CHECK(mf_count_temps("dest_is_dir") == 0, "failed write left a temp file");
    rmdir(p);

    mf_path("keep.tok", p, sizeof p);
    CHECK(mf_tokfile_write(p, MF_TOK_BYTES, 256, bytes, 256) == 0, "write keep.tok: %s", mf_error());
    uint16_t bad[3] = { 1, 256, 2 };
    CHECK(mf_tokfile_write(p, MF_TOK_BYTES, 256, bad, 3) == -1 && strstr(mf_error(), "index 1"),
          "id >= vocab refused at write: %s", mf_error());
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, 256, bytes, 3) == -1, "kind/vocab mismatch refused at write");
    CHECK(mf_tokfile_write(p, (mf_tok_kind)5, 256, bytes, 3) == -1, "unknown kind refused at write");
    CHECK(mf_tokfile_open(&f, p) == 0 && f.n == 256 && memcmp(f.ids, bytes, sizeof bytes) == 0,
          "destination changed by failed writes");
    mf_tokfile_close(&f);
    CHECK(mf_count_temps("keep.tok") == 0, "failed write left a temp file");

    /* clean up */
    DIR *d = opendir(mf_dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char x[512];
        snprintf(x, sizeof x, "%s/%s", mf_dir, de->d_name);
        unlink(x);
    }
    if (d) closedir(d);
    rmdir(mf_dir);
    return mf_test_done("test_tokfile_rejects_bad");
}
