/* safetensors reader: open (header validation), then every tensor streamed
 * through the checksum / finite-value check into a sink that reads each
 * byte, as the checkpoint loader does. */
#include "fuzz_util.h"
#include "io/io.h"

static void sink(void *ctx, size_t off, const void *src, size_t len) {
    (void)off;
    const unsigned char *p = src;
    unsigned acc = 0;
    for (size_t i = 0; i < len; i++) acc += p[i];
    *(unsigned *)ctx += acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    mf_st_file f;
    if (mf_st_open(&f, path) == 0) {
        unsigned acc = 0;
        for (int i = 0; i < f.n; i++) {
            mf_st_stream(&f, &f.tensors[i], sink, &acc);
            (void)mf_st_find(&f, f.tensors[i].name);
        }
        for (int i = 0; i < f.n_meta; i++) (void)mf_st_meta(&f, f.meta_keys[i]);
        mf_st_close(&f);
    }
    close(fd);
    return 0;
}
