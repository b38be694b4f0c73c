/* The YAML config file (--config): every key through the one table. */
#include "fuzz_util.h"
#include "memfit/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    static mf_config c;
    mf_config_defaults(&c);
    if (mf_config_load_yaml(&c, path) == 0) {
        static char yml[1 << 16];
        mf_config_to_yaml(&c, yml, sizeof yml);
    }
    close(fd);
    return 0;
}
