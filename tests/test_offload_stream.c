/* Proves the offload stream hands every region to the callback with the
 * file's current bytes, writes the updates back (and only when asked),
 * stops cleanly on a failing callback or bad arguments with the handle
 * still usable, names the path when it cannot create the file, overlaps
 * I/O with the callback, and does not leave the file in the page cache.
 * An in-memory copy of the file (the model) is the reference. */
#include "optim/offload.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAXR 8

typedef struct {
    const mf_region *r;
    const uint8_t *model;  /* what the file holds before this stream */
    int next_k, calls;
    int bad_order;         /* calls out of order or with the wrong length */
    long bad_data[MAXR];   /* bytes that differed from the model, per region */
    int fail_at;           /* return -1 at this region (-1: never) */
    unsigned sleep_us;     /* slept in odd regions */
} byte_ctx;

static int byte_fn(void *vctx, int k, void *buf, size_t len) {
    byte_ctx *c = vctx;
    c->calls++;
    if (k != c->next_k++ || k >= MAXR || len != c->r[k].len) { c->bad_order++; return 0; }
    uint8_t *b = buf;
    const uint8_t *want = c->model + c->r[k].off;
    for (size_t i = 0; i < len; i++) c->bad_data[k] += b[i] != want[i];
    if (k == c->fail_at) return mf_fail("test callback refuses region %d", k);
    for (size_t i = 0; i < len; i++) b[i] = (uint8_t)(b[i] + k + 1);
    if ((k & 1) && c->sleep_us) usleep(c->sleep_us);
    return 0;
}

static void ctx_reset(byte_ctx *c, const mf_region *r, const uint8_t *model) {
    memset(c, 0, sizeof *c);
    c->r = r;
    c->model = model;
    c->fail_at = -1;
    c->sleep_us = 2000;
}

/* Checks the callbacks of a stream over r[0..n_called-1] saw the model. */
static void check_seen(const byte_ctx *c, int n_called, const char *what) {
    CHECK(c->calls == n_called, "%s: fn called %d times, want %d", what, c->calls, n_called);
    CHECK(c->bad_order == 0, "%s: %d calls out of order or with a wrong length", what, c->bad_order);
    for (int k = 0; k < n_called && k < MAXR; k++)
        CHECK(c->bad_data[k] == 0, "%s: region %d: fn saw %ld wrong bytes", what, k, c->bad_data[k]);
}

static void model_apply(uint8_t *model, const mf_region *r, int n) {
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < r[k].len; i++) model[r[k].off + i] = (uint8_t)(model[r[k].off + i] + k + 1);
}

/* Reads the whole file back and compares it with the model. */
static void check_file(mf_offload *o, const uint8_t *model, size_t bytes, const char *what) {
    uint8_t *got = malloc(bytes);
    CHECK(got && mf_offload_read(o, 0, got, bytes) == 0, "%s: read back: %s", what, mf_error());
    if (!got) return;
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != model[i] && bad++ == 0) first = i;
    CHECK(bad == 0, "%s: %ld bytes differ from the model, first at %zu (%u, want %u)", what, bad,
          first, got[first], model[first]);
    free(got);
}

static void test_streams(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/memfit_test_offload_%ld.bin", dir, (long)getpid());
    const size_t bytes = (3u << 20) + 12345; /* 3 MiB and an odd tail */
    mf_offload *o = NULL;
    if (mf_offload_open(&o, path, bytes) != 0) {
        CHECK(0, "open %s: %s", path, mf_error());
        return;
    }
    uint8_t *model = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) model[i] = (uint8_t)(i * 7 + (i >> 9) + 1);
    /* fill in two writes, the split unaligned */
    CHECK(mf_offload_write(o, 0, model, 777777) == 0, "fill: %s", mf_error());
    CHECK(mf_offload_write(o, 777777, model + 777777, bytes - 777777) == 0, "fill: %s", mf_error());
    check_file(o, model, bytes, "after fill");

    /* Uneven regions: a small one, a gap the stream must not touch, and an
     * untouched tail. The window is the largest region. */
    const size_t win = 1536u << 10;
    const mf_region r[5] = {
        {0, 1u << 20},
        {1u << 20, 1000},                     /* smaller than the others */
        {(1u << 20) + 1000 + 4096, win},      /* after a 4 KiB gap */
        {(1u << 20) + 1000 + 4096 + win, 333333},
        {(1u << 20) + 1000 + 4096 + win + 333333, 150000},
    };
    CHECK(r[4].off + r[4].len + 100 < bytes, "regions leave a tail");
    uint8_t *w0 = malloc(win), *w1 = malloc(win);
    void *const bufs[2] = {w0, w1};
    byte_ctx c;
    mf_offload_stats st;

    ctx_reset(&c, r, model);
    CHECK(mf_offload_stream(o, r, 5, bufs, win, 1, byte_fn, &c) == 0, "stream: %s", mf_error());
    check_seen(&c, 5, "write-back stream");
    model_apply(model, r, 5);
    check_file(o, model, bytes, "after write-back stream");
    mf_offload_stats_get(o, &st);
    size_t sum = 0;
    for (int k = 0; k < 5; k++) sum += r[k].len;
    CHECK(st.bytes_read == sum && st.bytes_written == sum, "bytes moved %llu/%llu, want %zu",
          (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_written, sum);

    /* write_back = 0: fn sees the data (and scribbles on it), the file stays. */
    ctx_reset(&c, r, model);
    CHECK(mf_offload_stream(o, r, 5, bufs, win, 0, byte_fn, &c) == 0, "read-only stream: %s", mf_error());
    check_seen(&c, 5, "read-only stream");
    check_file(o, model, bytes, "after read-only stream");
    mf_offload_stats_get(o, &st);
    CHECK(st.bytes_written == 0, "read-only stream wrote %llu bytes", (unsigned long long)st.bytes_written);

    /* n = 1 (bufs[1] unused) and n = 0 */
    const mf_region one = {4097, 500000};
    void *const only[2] = {w0, NULL};
    ctx_reset(&c, &one, model);
    CHECK(mf_offload_stream(o, &one, 1, only, win, 1, byte_fn, &c) == 0, "n = 1: %s", mf_error());
    check_seen(&c, 1, "n = 1");
    model_apply(model, &one, 1);
    check_file(o, model, bytes, "after n = 1");
    ctx_reset(&c, r, model);
    CHECK(mf_offload_stream(o, r, 0, bufs, win, 1, byte_fn, &c) == 0, "n = 0: %s", mf_error());
    CHECK(c.calls == 0, "n = 0 called fn %d times", c.calls);
    check_file(o, model, bytes, "after n = 0");

    /* fn fails at region 2: error naming it, 0 and 1 written back, the rest untouched */
    ctx_reset(&c, r, model);
    c.fail_at = 2;
    int rc = mf_offload_stream(o, r, 5, bufs, win, 1, byte_fn, &c);
    CHECK(rc == -1, "failing fn: stream returned %d", rc);
    CHECK(strstr(mf_error(), "test callback refuses region 2") && strstr(mf_error(), path),
          "failing fn: message '%s'", mf_error());
    printf("failing callback: %s\n", mf_error());
    check_seen(&c, 3, "failing fn");
    model_apply(model, r, 2);
    check_file(o, model, bytes, "after failing fn");

    /* the I/O thread still works */
    ctx_reset(&c, r, model);
    CHECK(mf_offload_stream(o, r, 5, bufs, win, 1, byte_fn, &c) == 0, "stream after failure: %s", mf_error());
    check_seen(&c, 5, "stream after failure");
    model_apply(model, r, 5);
    check_file(o, model, bytes, "after stream after failure");

    /* An I/O error on the I/O thread: the file is cut short behind our
     * back, so reading region 2 hits the end. The stream stops (fn saw at
     * most regions 0 and 1), names the problem, and the handle recovers
     * once the file is whole again. */
    CHECK(truncate(path, (off_t)r[2].off + 10) == 0, "truncate %s", path);
    ctx_reset(&c, r, model);
    rc = mf_offload_stream(o, r, 5, bufs, win, 1, byte_fn, &c);
    CHECK(rc == -1 && strstr(mf_error(), "unexpected end of file"), "short file: rc %d, '%s'", rc, mf_error());
    printf("short file: %s\n", mf_error());
    CHECK(c.calls <= 2 && c.bad_order == 0 && c.bad_data[0] == 0 && c.bad_data[1] == 0,
          "short file: %d calls, %d out of order", c.calls, c.bad_order);
    CHECK(truncate(path, (off_t)bytes) == 0, "truncate %s", path);
    CHECK(mf_offload_write(o, 0, model, bytes) == 0, "refill: %s", mf_error());
    ctx_reset(&c, r, model);
    CHECK(mf_offload_stream(o, r, 5, bufs, win, 1, byte_fn, &c) == 0, "stream after I/O error: %s", mf_error());
    check_seen(&c, 5, "stream after I/O error");
    model_apply(model, r, 5);
    check_file(o, model, bytes, "after stream after I/O error");

    /* bad arguments are refused before any I/O or fn call */
    const mf_region too_big[2] = {{0, 100}, {200, win + 1}};
    const mf_region past_end[1] = {{bytes - 10, 11}};
    const mf_region overlap[2] = {{0, 1000}, {999, 10}};
    void *const same[2] = {w0, w0 + 100}; /* 1000-byte windows 100 bytes apart */
    struct { const mf_region *r; int n; void *const *bufs; size_t win; const char *want; } bad[] = {
        {too_big, 2, bufs, win, "the window buffers"},
        {past_end, 1, bufs, win, "outside"},
        {overlap, 2, bufs, win, "overlap"},
        {too_big, 2, same, 1000, "window buffers overlap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ctx_reset(&c, bad[i].r, model);
        rc = mf_offload_stream(o, bad[i].r, bad[i].n, bad[i].bufs, bad[i].win, 1, byte_fn, &c);
        CHECK(rc == -1 && strstr(mf_error(), bad[i].want) && c.calls == 0,
              "bad arguments %zu: rc %d, %d calls, message '%s'", i, rc, c.calls, mf_error());
    }
    CHECK(mf_offload_read(o, bytes - 1, w0, 2) == -1 && strstr(mf_error(), "outside"),
          "read past the end: '%s'", mf_error());
    check_file(o, model, bytes, "after refused calls");

    mf_offload_close(o, 1);
    CHECK(access(path, F_OK) != 0, "close(remove = 1) left %s", path);
    free(w0);
    free(w1);
    free(model);
}

static void test_open_fails_with_path(void) {
    const char *path = "/nonexistent-memfit-dir/sub/state.bin";
    mf_offload *o = (mf_offload *)&o; /* must be reset to NULL */
    int rc = mf_offload_open(&o, path, 1 << 20);
    CHECK(rc == -1 && o == NULL, "open in a missing directory: rc %d", rc);
    CHECK(strstr(mf_error(), path) != NULL, "message does not name the path: '%s'", mf_error());
    printf("missing directory: %s\n", mf_error());
}

/* ---- overlap: 8 MiB regions of floats, fn sleeps 20 ms ---------------- */

#define OV_N 8
#define OV_REGION ((size_t)8 << 20)
#define OV_FLOATS (OV_REGION / sizeof(float))

typedef struct { long bad; } float_ctx;

static float ov_value(size_t i) { return (float)(i & 1023); }

static int float_fn(void *vctx, int k, void *buf, size_t len) {
    float_ctx *c = vctx;
    float *x = buf;
    size_t base = (size_t)k * OV_FLOATS;
    for (size_t i = 0; i < len / sizeof(float); i++) {
        c->bad += x[i] != ov_value(base + i);
        x[i] += (float)(k + 1);
    }
    usleep(20000);
    return 0;
}

/* Fraction of the file's pages in the page cache (mincore), or -1. */
static double cached_fraction(const char *path, size_t bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    void *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    long pg = sysconf(_SC_PAGESIZE);
    size_t np = (bytes + (size_t)pg - 1) / (size_t)pg, in = 0;
    unsigned char *vec = malloc(np);
    if (vec && mincore(m, bytes, vec) == 0)
        for (size_t i = 0; i < np; i++) in += vec[i] & 1;
    else
        in = (size_t)-1;
    free(vec);
    munmap(m, bytes);
    return in == (size_t)-1 ? -1 : (double)in / (double)np;
}

static void test_overlap(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/memfit_test_offload_ov_%ld.bin", dir, (long)getpid());
    const size_t bytes = OV_N * OV_REGION;
    mf_offload *o = NULL;
    if (mf_offload_open(&o, path, bytes) != 0) {
        CHECK(0, "open %s: %s", path, mf_error());
        return;
    }
    float *w0 = malloc(OV_REGION), *w1 = malloc(OV_REGION);
    void *const bufs[2] = {w0, w1};
    for (int k = 0; k < OV_N; k++) {
        for (size_t i = 0; i < OV_FLOATS; i++) w0[i] = ov_value((size_t)k * OV_FLOATS + i);
        CHECK(mf_offload_write(o, (uint64_t)k * OV_REGION, w0, OV_REGION) == 0, "fill: %s", mf_error());
    }
    mf_region r[OV_N];
    for (int k = 0; k < OV_N; k++) r[k] = (mf_region){(uint64_t)k * OV_REGION, OV_REGION};

    float_ctx c = {0};
    CHECK(mf_offload_stream(o, r, OV_N, bufs, OV_REGION, 1, float_fn, &c) == 0, "overlap stream: %s", mf_error());
    CHECK(c.bad == 0, "overlap stream: fn saw %ld wrong floats", c.bad);
    mf_offload_stats st;
    mf_offload_stats_get(o, &st);

    double cached = cached_fraction(path, bytes);
    long bad = 0;
    for (int k = 0; k < OV_N; k++) {
        CHECK(mf_offload_read(o, r[k].off, w0, OV_REGION) == 0, "read back: %s", mf_error());
        for (size_t i = 0; i < OV_FLOATS; i++)
            bad += w0[i] != ov_value((size_t)k * OV_FLOATS + i) + (float)(k + 1);
    }
    CHECK(bad == 0, "overlap stream: %ld floats wrong after write-back", bad);

    /* Without overlap the call would take fn_s + io_s. At most
     * min(fn_s, io_s) can hide, less the first read and the last write
     * and flush, which nothing overlaps (here 50-80% of it hides). The
     * ratio wall / serial is printed, not asserted: it depends on how fast
     * the disk is relative to fn. Asserting a quarter of the hideable time
     * keeps this from flaking on a loaded machine. */
    double serial = st.fn_s + st.io_s;
    double hideable = st.fn_s < st.io_s ? st.fn_s : st.io_s;
    double hidden = serial - st.wall_s;
    printf("overlap: %d x %zu MiB, fn %.0f ms, I/O thread busy %.0f ms (%.0f MiB/s), waited %.0f ms; "
           "wall %.0f ms vs serial %.0f ms (%.2fx), hid %.0f%% of the hideable %.0f ms\n",
           OV_N, OV_REGION >> 20, st.fn_s * 1e3, st.io_s * 1e3,
           (double)(st.bytes_read + st.bytes_written) / (1 << 20) / (st.io_s > 0 ? st.io_s : 1),
           st.wait_s * 1e3, st.wall_s * 1e3, serial * 1e3, st.wall_s / serial,
           100 * hidden / hideable, hideable * 1e3);
    CHECK(hidden >= 0.25 * hideable, "overlap: hid only %.0f ms of %.0f ms", hidden * 1e3, hideable * 1e3);

    if (mf_offload_in_ram(o)) {
        printf("page cache: %s is on tmpfs/ramfs, not checked\n", dir);
    } else {
        printf("page cache: %.1f%% of the %zu MiB file resident after the stream\n", 100 * cached, bytes >> 20);
        CHECK(cached >= 0 && cached < 0.25, "%.0f%% of the file left in the page cache", 100 * cached);
    }
    mf_offload_close(o, 1);
    free(w0);
    free(w1);
}

int main(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    test_streams(dir);
    test_open_fails_with_path();
    test_overlap(dir);
    return mf_test_done("test_offload_stream");
}
