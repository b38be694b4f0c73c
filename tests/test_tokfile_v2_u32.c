/* Token file version 2: ids of a vocabulary over 65536 are stored as u32
 * and read back exactly, smaller vocabularies stay u16, the tokenizer's hash
 * is recorded and checked against the kind, version 1 files (u16, bytes or
 * gpt2) are still read, and a Llama 3 tokenizer.json corpus round-trips
 * through mf_tokenize_file. Needs $MEMFIT_CACHE from scripts/fetch_data.sh
 * (hf/llama3/tokenizer.json, moby-dick.txt) for the last part. */
#include "memfit/core.h"
#include "memfit/data.h"
#include "memfit/train.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char mf_dir[] = "/tmp/memfit_tokfile2_XXXXXX";

/* A raw header (version, kind, vocab, bytes per id, n, hash) and n ids of
 * `bpi` bytes each, all equal to `id`. */
static void mf_raw(const char *path, uint32_t version, uint32_t kind, uint32_t vocab, uint32_t bpi, uint64_t n,
                   uint64_t hash, uint32_t id) {
    unsigned char h[64] = { 0 };
    memcpy(h, "MFTOKENS", 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &kind, 4);
    memcpy(h + 16, &vocab, 4);
    memcpy(h + 20, &bpi, 4);
    memcpy(h + 24, &n, 8);
    memcpy(h + 32, &hash, 8);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fwrite(h, 1, 64, f);
    for (uint64_t i = 0; i < n; i++) fwrite(&id, bpi, 1, f);
    fclose(f);
}

static void mf_expect_reject(const char *path, const char *what, const char *want) {
    mf_tokfile f;
    int rc = mf_tokfile_open(&f, path);
    CHECK(rc == -1 && strstr(mf_error(), want) && strstr(mf_error(), path), "%s: got rc %d, '%s' (want '%s')", what,
          rc, rc ? mf_error() : "", want);
    printf("  %-28s -> %s\n", what, mf_error());
    if (rc == 0) mf_tokfile_close(&f);
}

static void mf_push(int32_t id, void *ctx) {
    uint32_t **p = ctx;
    *(*p)++ = (uint32_t)id;
}

int main(void) {
    CHECK(mkdtemp(mf_dir) != NULL, "mkdtemp");
    char p[256];
    mf_tokfile f;
    struct stat st;

    /* u32: vocab 128256, ids up to the last one */
    enum { N = 1000 };
    uint32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (uint32_t)((i * 104729u) % 128256u);
    ids[N - 1] = 128255;
    snprintf(p, sizeof p, "%s/l3.tok", mf_dir);
    uint64_t hash = 0x0123456789abcdefull;
    CHECK(mf_tokfile_write32(p, MF_TOK_HF, 128256, hash, ids, N) == 0, "write u32: %s", mf_error());
    CHECK(stat(p, &st) == 0 && st.st_size == 64 + 4 * N, "u32 file size %lld", (long long)st.st_size);
    CHECK(mf_tokfile_open(&f, p) == 0, "open u32: %s", mf_error());
    CHECK(f.version == 2 && f.kind == MF_TOK_HF && f.vocab == 128256 && f.id_bytes == 4 && f.tok_hash == hash &&
          f.n == N && f.ids == NULL && f.ids32 != NULL, "u32 header: v%u kind %d vocab %u bpi %u n %llu", f.version,
          (int)f.kind, f.vocab, f.id_bytes, (unsigned long long)f.n);
    int same = 1;
    for (int i = 0; i < N && f.ids32; i++) same &= mf_tokfile_id(&f, (uint64_t)i) == ids[i];
    CHECK(same, "u32 ids differ after the round trip");
    mf_tokfile_close(&f);

    /* a tokenizer.json vocab that fits u16 stays u16 */
    for (int i = 0; i < N; i++) ids[i] %= 32000;
    snprintf(p, sizeof p, "%s/l2.tok", mf_dir);
    CHECK(mf_tokfile_write32(p, MF_TOK_HF, 32000, hash, ids, N) == 0, "write u16 from u32: %s", mf_error());
    CHECK(stat(p, &st) == 0 && st.st_size == 64 + 2 * N, "u16 file size %lld", (long long)st.st_size);
    CHECK(mf_tokfile_open(&f, p) == 0 && f.id_bytes == 2 && f.ids && f.tok_hash == hash && f.ids[5] == ids[5],
          "open u16 tokenizer.json file: %s", mf_error());
    mf_tokfile_close(&f);

    /* gpt2 through the u16 writer: version 2, gpt2's hash */
    uint16_t small[3] = { 1, 2, 50256 };
    snprintf(p, sizeof p, "%s/g.tok", mf_dir);
    CHECK(mf_tokfile_write(p, MF_TOK_GPT2, MF_GPT2_VOCAB, small, 3) == 0, "write gpt2: %s", mf_error());
    CHECK(mf_tokfile_open(&f, p) == 0 && f.version == 2 && f.tok_hash == MF_GPT2_HASH && f.ids[2] == 50256,
          "gpt2 v2 file: %s", mf_error());
    mf_tokfile_close(&f);

    /* version 1 is still read */
    snprintf(p, sizeof p, "%s/v1.tok", mf_dir);
    mf_raw(p, 1, MF_TOK_GPT2, MF_GPT2_VOCAB, 2, 10, 0, 50256);
    CHECK(mf_tokfile_open(&f, p) == 0 && f.version == 1 && f.n == 10 && f.ids[9] == 50256 &&
          f.tok_hash == MF_GPT2_HASH, "version 1 gpt2 file: %s", mf_error());
    mf_tokfile_close(&f);

    /* write-side refusals */
    CHECK(mf_tokfile_write32(p, MF_TOK_HF, 128256, 0, ids, 3) == -1 && strstr(mf_error(), "hash"),
          "tokenizer.json file without a hash: %s", mf_error());
    CHECK(mf_tokfile_write(p, MF_TOK_HF, 32000, small, 3) == -1, "u16 writer refuses tokenizer.json (no hash)");
    CHECK(mf_tokfile_write32(p, MF_TOK_GPT2, MF_GPT2_VOCAB, 42, ids, 3) == -1 && strstr(mf_error(), "hash"),
          "gpt2 with another hash: %s", mf_error());

    printf("rejected files:\n");
    snprintf(p, sizeof p, "%s/bad.tok", mf_dir);
    mf_raw(p, 3, MF_TOK_GPT2, MF_GPT2_VOCAB, 2, 4, MF_GPT2_HASH, 1);
    mf_expect_reject(p, "version 3", "version 3");
    mf_raw(p, 1, MF_TOK_HF, 32000, 2, 4, 0, 1);
    mf_expect_reject(p, "tokenizer.json in version 1", "unknown tokenizer kind 2");
    mf_raw(p, 2, MF_TOK_HF, 128256, 2, 4, hash, 1);
    mf_expect_reject(p, "vocab 128256 with u16 ids", "needs 4");
    mf_raw(p, 2, MF_TOK_HF, 32000, 4, 4, hash, 1);
    mf_expect_reject(p, "vocab 32000 with u32 ids", "needs 2");
    mf_raw(p, 2, MF_TOK_HF, 128256, 4, 4, 0, 1);
    mf_expect_reject(p, "tokenizer.json hash 0", "hash");
    mf_raw(p, 2, MF_TOK_HF, 128256, 4, 4, hash, 128256);
    mf_expect_reject(p, "u32 id >= vocab", "id 128256 at byte offset 64");
    mf_raw(p, 2, MF_TOK_BYTES, 256, 2, 4, 7, 1);
    mf_expect_reject(p, "bytes kind with a hash", "hash");

    /* a Llama 3 corpus end to end: text -> token file -> the same ids */
    char l3[4096], moby[4096];
    const char *pl = mf_test_cache_path("hf/llama3/tokenizer.json", l3, sizeof l3);
    const char *pm = mf_test_cache_path("moby-dick.txt", moby, sizeof moby);
    CHECK(pl && pm, "%s is missing: run scripts/fetch_data.sh", !pl ? l3 : moby);
    mf_tokenizer *t = pl ? mf_tokenizer_hf(l3) : NULL;
    CHECK(!pl || t, "load %s: %s", l3, mf_error());
    if (t && pm) {
        snprintf(p, sizeof p, "%s/moby.l3.tok", mf_dir);
        CHECK(mf_tokenize_file(t, moby, p) == 0, "tokenize: %s", mf_error());
        CHECK(mf_tokfile_open(&f, p) == 0, "open: %s", mf_error());
        FILE *tf = fopen(moby, "rb");
        char *text = malloc(2 << 20);
        size_t len = tf && text ? fread(text, 1, 2 << 20, tf) : 0;
        if (tf) fclose(tf);
        uint32_t *want = malloc(len * sizeof *want), *w = want;
        CHECK(want && mf_tokenizer_encode(t, text, len, mf_push, &w) == 0, "encode");
        size_t nw = want ? (size_t)(w - want) : 0;
        CHECK(f.n == nw && f.id_bytes == 4 && f.tok_hash == mf_tokenizer_hash(t), "file has %llu ids, want %zu",
              (unsigned long long)f.n, nw);
        int eq = f.n == nw;
        for (size_t i = 0; eq && i < nw; i++) eq = mf_tokfile_id(&f, i) == want[i];
        CHECK(eq, "token file ids differ from the encoder's");
        printf("moby-dick.txt with Llama 3: %llu u32 ids, hash 0x%016llx\n", (unsigned long long)f.n,
               (unsigned long long)f.tok_hash);
        mf_tokfile_close(&f);
        free(text);
        free(want);
        unlink(p);
    }
    mf_tokenizer_free(t);
    const char *names[] = { "l3.tok", "l2.tok", "g.tok", "v1.tok", "bad.tok" };
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", mf_dir, names[i]);
        unlink(p);
    }
    rmdir(mf_dir);
    return mf_test_done("test_tokfile_v2_u32");
}
