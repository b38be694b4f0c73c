/* The checkpoint and weights loaders (src/train/checkpoint.c) on a tiny
 * GPT-2 trainer set up once: every input goes through
 * mf_trainer_load_checkpoint and mf_trainer_load_weights (metadata checks,
 * shapes and dtypes, streaming into the arena). The seeds are a checkpoint
 * and a model file of exactly this model (fuzz/corpus/checkpoint/). */
#include "fuzz_util.h"
#include "memfit/config.h"
#include "memfit/data.h"
#include "memfit/train.h"

#include <stdlib.h>
#include <string.h>

static mf_trainer trainer;
static int ready;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static char tok[] = "/tmp/memfit-fuzz-ckpt-XXXXXX";
    int fd = mkstemp(tok);
    if (fd < 0) return 0;
    close(fd);
    uint16_t ids[4096];
    for (int i = 0; i < 4096; i++) ids[i] = (uint16_t)((i * 7919) % 256);
    if (mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, 4096)) return 0;
    mf_config c;
    mf_config_defaults(&c);
    /* the seeds' model: memfit train --model gpt2-1m --n_layer 1 --n_embd 8 --n_head 2 --block_size 8 */
    const char *kv[][2] = {{"model", "gpt2-1m"}, {"n_layer", "1"}, {"n_embd", "8"}, {"n_head", "2"},
                           {"block_size", "8"}, {"seq", "8"}, {"batch", "2"}, {"threads", "1"},
                           {"sample_tokens", "0"}, {"data", tok}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) mf_config_set(&c, kv[i][0], kv[i][1]);
    ready = mf_trainer_init(&trainer, &c, MF_MODE_TRAIN) == 0;
    unlink(tok);
    if (!ready) fprintf(stderr, "fuzz_checkpoint: trainer set-up failed: %s\n", mf_error());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready) return 0;
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    int step = trainer.step;
    (void)mf_trainer_load_checkpoint(&trainer, path);
    (void)mf_trainer_load_weights(&trainer, path);
    trainer.step = step;
    close(fd);
    return 0;
}
