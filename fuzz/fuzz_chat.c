/* One line of a chat JSONL file (mf_chat_parse_line), as the loader hands
 * it over: not NUL-terminated, with its length. */
#include "fuzz_util.h"
#include "memfit/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy so ASan sees any read past the line's end */
    char *line = malloc(size ? size : 1);
    if (!line) return 0;
    memcpy(line, data, size);
    mf_chat c;
    if (mf_chat_parse_line(line, size, 1, &c) == 0) mf_chat_free(&c);
    free(line);
    return 0;
}
