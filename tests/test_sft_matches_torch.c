/* Chat fine-tuning's loss against PyTorch (tests/ref/llama_torch.py
 * make-sft-case, written from cross_entropy's ignore_index and a
 * block-diagonal causal mask, not from our C): a Llama batch (GQA, untied
 * head), and a GPT-2 one (tests/ref/gpt2_torch.py make-sft-case: learned
 * positions by document, tied head, packed), whose prompt targets and
 * document-boundary targets are ignored
 *   - packed: each row holds several documents, positions restart at 0 per
 *     document, attention stays inside each (--packing on: data.pos);
 *   - one sequence per row (--packing off): the masked loss alone;
 * gives the same loss (1e-5 relative) and every parameter gradient (1e-4
 * relative, 1e-6 absolute, as test_llama_matches_torch) as
 * cross_entropy(ignore_index=-100), the mean over the targets that count.
 * The loss runs 7 rows at a time (loss_chunk 7), so chunks with no counted
 * target and chunks split mid-document are both exercised. */
#include "io/io.h"
#include "memfit/train.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define T_ 32
#define B_ 2
#define V_ 256

static void run_case(const char *src, const char *name, int packed, int gpt2) {
    char dir[] = "/tmp/memfit-sft-parity-XXXXXX", cmd[2048], p[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    printf("== %s\n", name);
    if (gpt2)
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 %s/tests/ref/gpt2_torch.py make-sft-case --out %s --layers 2 --embd 32 --heads 4 "
                 "--vocab %d --seq %d --batch %d --seed 3", src, dir, V_, T_, B_);
    else
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 %s/tests/ref/llama_torch.py make-sft-case --out %s --layers 2 --hidden 64 --heads 8 "
                 "--kv_heads 2 --head_dim 8 --inter 96 --vocab %d --seq %d --batch %d --seed 3 --tied 0 "
                 "--norm_jitter 0.1 --packed %d",
                 src, dir, V_, T_, B_, packed);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s (needs /usr/bin/python3 with python3-torch)", cmd); return; }
    /* the trainer needs chat data to plan for: one short example */
    char jl[1200];
    snprintf(jl, sizeof jl, "%s/one.jsonl", dir);
    FILE *f = fopen(jl, "w");
    if (f) fputs("{\"prompt\": \"a\", \"completion\": \"b\"}\n", f), fclose(f);
    mf_config c;
    mf_config_defaults(&c);
    const char *kv[][2] = {{"seq", "32"}, {"batch", "2"}, {"tokenizer", "bytes"}, {"chat_template", "llama2"},
                           {"sample_tokens", "0"}, {"threads", "2"}, {"loss_chunk", "7"},
                           {"packing", packed ? "on" : "off"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(&c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    mf_config_set(&c, "data", jl);
    if (gpt2) {
        /* GPT-2 from the reference's weights file (HF GPT-2 names) */
        const char *g[][2] = {{"model", "gpt2-1m"}, {"n_layer", "2"}, {"n_embd", "32"}, {"n_head", "4"},
                              {"block_size", "32"}};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) CHECK(mf_config_set(&c, g[i][0], g[i][1]) == 0, "%s", mf_error());
        snprintf(p, sizeof p, "%s/weights.safetensors", dir);
    } else snprintf(p, sizeof p, "%s/hf", dir);
    mf_config_set(&c, "init", p);
    mf_st_file batch, ref;
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    if (mf_st_open(&batch, p)) { CHECK(0, "%s", mf_error()); return; }
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); mf_st_close(&batch); return; }
    CHECK((t.model.pos >= 0) == packed, "packing %d: data.pos row %d", packed, t.model.pos);
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (mf_st_open(&ref, p)) { CHECK(0, "%s", mf_error()); mf_trainer_free(&t); mf_st_close(&batch); return; }
    const mf_st_tensor *in = mf_st_find(&batch, "inputs"), *tg = mf_st_find(&batch, "targets"),
                       *ps = mf_st_find(&batch, "pos");
    CHECK(in && tg && ps && in->nbytes == B_ * T_ * 4, "batch tensors");
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    int counted = 0;
    if (in && tg && ps) {
        memcpy(mf_arena_get(&t.arena, t.model.inputs), in->data, B_ * T_ * 4);
        memcpy(mf_arena_get(&t.arena, t.model.targets), tg->data, B_ * T_ * 4);
        if (packed) memcpy(mf_arena_get(&t.arena, t.model.pos), ps->data, B_ * T_ * 4);
        for (int i = 0; i < B_ * T_; i++) counted += ((const int32_t *)tg->data)[i] != MF_TARGET_IGNORE;
    }
    CHECK(counted > 0 && counted < B_ * T_, "the batch has ignored and counted targets (%d of %d)", counted, B_ * T_);
    const char *rc = mf_st_meta(&ref, "counted");
    CHECK(rc && atoi(rc) == counted, "counted targets memfit %d torch %s", counted, rc ? rc : "?");
    double loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (float)counted);
    mf_model_backward(&t.model, &t.arena, B_, T_);
    const char *ls = mf_st_meta(&ref, "loss");
    CHECK(ls && mf_close(loss, atof(ls), 1e-5, 0), "loss memfit %.9g torch %s", loss, ls ? ls : "?");
    int ng = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[128];
        snprintf(nm, sizeof nm, "grad.%s", x->name);
        const mf_st_tensor *g = mf_st_find(&ref, nm);
        size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
        CHECK(g && g->nbytes == n * 4, "reference gradient %s", nm);
        if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, n, 1e-4, 1e-6);
    }
    printf("loss %.9g (torch %s) over %d of %d targets; %d of %d gradients agree\n", loss, ls ? ls : "?", counted,
           B_ * T_, ng, t.model.n_tensors);
    mf_trainer_free(&t);
    mf_st_close(&ref);
    mf_st_close(&batch);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    src = src ? src : "..";
    run_case(src, "Llama: packed documents, prompts and boundaries ignored", 1, 0);
    run_case(src, "Llama: one sequence per row, prompts ignored", 0, 0);
    run_case(src, "GPT-2: packed documents (learned positions restart), prompts and boundaries ignored", 1, 1);
    return mf_test_done("test_sft_matches_torch");
}
