/* Shared set-up for tests that train: a small random token file and a
 * config for a tiny GPT-2 that trains in milliseconds. */
#ifndef MEMFIT_TRAINUTIL_H
#define MEMFIT_TRAINUTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/data.h"
#include "memfit/model.h"
#include "memfit/train.h"
#include "testutil.h"

/* Writes n pseudo-random byte-level ids with some structure (so the loss
 * can fall) to a fresh temp file; path receives its name. */
static inline int tu_make_tokens(char *path, size_t n, uint64_t count, uint64_t seed) {
    snprintf(path, n, "/tmp/memfit-test-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    uint16_t *ids = malloc(count * sizeof *ids);
    if (!ids) return -1;
    mf_rng r;
    mf_rng_seed(&r, seed);
    const char *text = "the whale swam under the ship and the sea was calm; ";
    size_t tl = strlen(text);
    for (uint64_t i = 0; i < count; i++)
        ids[i] = (mf_rng_u32(&r) % 8 == 0) ? (uint16_t)(mf_rng_u32(&r) % 256) : (uint16_t)(unsigned char)text[i % tl];
    int rc = mf_tokfile_write(path, MF_TOK_BYTES, 256, ids, count);
    free(ids);
    return rc;
}

/* A 2-layer byte-level model: C=32, 4 heads, T=16. */
static inline void tu_tiny_config(mf_config *c, const char *data) {
    mf_config_defaults(c);
    mf_config_set(c, "model", "gpt2-1m");
    mf_config_set(c, "n_layer", "2");
    mf_config_set(c, "n_embd", "32");
    mf_config_set(c, "n_head", "4");
    mf_config_set(c, "block_size", "16");
    mf_config_set(c, "batch", "2");
    mf_config_set(c, "seq", "16");
    mf_config_set(c, "steps", "10");
    mf_config_set(c, "warmup", "2");
    mf_config_set(c, "sample_tokens", "0");
    mf_config_set(c, "val_every", "0");
    mf_config_set(c, "threads", "2");
    mf_config_set(c, "data", data);
}
/* A copy of every parameter (grads = 0) or gradient (grads = 1), in table
 * order, as one array; *n receives its length. */
static inline float *tu_copy_tensors(const mf_trainer *t, int grads, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < t->model.n_tensors; i++) total += (size_t)t->model.tensors[i].numel;
    float *out = malloc(total * sizeof *out), *p = out;
    for (int i = 0; out && i < t->model.n_tensors; i++) {
        const mf_tensor *x = &t->model.tensors[i];
        /* weights: the fp32 row (the master row under 16-bit precision) */
        memcpy(p, mf_arena_ptr(&t->arena, grads ? x->g : mf_tensor_weights_row(x)), (size_t)x->numel * sizeof *p);
        p += x->numel;
    }
    *n = total;
    return out;
}
/* Runs steps [from, to) of t, each CHECKed, loss[i] = step i's loss. */
static inline void tu_steps(mf_trainer *t, int from, int to, double *loss) {
    for (int i = from; i < to; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(t, &st) == 0, "step %d: %s", i + 1, mf_error());
        loss[i] = st.loss;
    }
}

/* The logits (V wide) of all B*T rows of the next batch, from a forward
 * pass without loss; the caller frees. */
static inline float *tu_logits_of(mf_trainer *t, int B, int T) {
    int V = t->d.V;
    float *out = malloc((size_t)B * T * V * sizeof *out);
    mf_arena_step(&t->arena);
    mf_trainer_load_batch(t);
    mf_model_forward(&t->model, &t->arena, B, T, 0, 0.0f);
    for (int r = 0; out && r < B * T; r++)
        memcpy(out + (size_t)r * V, mf_model_logits(&t->model, &t->arena, T, r / T, r % T), (size_t)V * sizeof *out);
    return out;
}
#endif
