/* Token files (memfit tokenize output, v1 u16 and v2 u32): open, then read
 * every id (at most 1 << 16) as the data loader does. */
#include "fuzz_util.h"
#include "memfit/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    mf_tokfile f;
    if (mf_tokfile_open(&f, path) == 0) {
        uint64_t acc = 0, n = f.n < (1u << 16) ? f.n : (1u << 16);
        for (uint64_t i = 0; i < n; i++) acc += mf_tokfile_id(&f, i);
        if (f.n) acc += mf_tokfile_id(&f, f.n - 1);
        (void)acc;
        mf_tokfile_close(&f);
    }
    close(fd);
    return 0;
}
