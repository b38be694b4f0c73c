/* memfit quantize --in MODEL --out DIR --dtype int8|nf4: post-training
 * quantisation (docs/quantize.md). Writes DIR/model.safetensors: every
 * block matrix packed exactly as a QLoRA frozen base is (src/quant:
 * int8 absmax blocks of 64, or NF4 with double-quantised constants), as a
 * U8 tensor of mf_quant_bytes() bytes under its own name; embeddings,
 * norms and biases stay fp32. Metadata: the dims, the tokenizer and
 * "quant" (the dtype), which memfit sample / eval read to plan the model
 * with the dequantise-in-GEMM kernels. Written atomically with per-tensor
 * checksums (mf_st_write); the input is verified (checksums, finite
 * values) before anything is written. */
#include "quantize.h"
#include "memfit/core.h"
#include "io/io.h"
#include "memfit/model.h"
#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f, "usage: memfit quantize --in MODEL.safetensors --out DIR --dtype int8|nf4\n"
               "  Writes DIR/model.safetensors with the block matrices stored int8 (absmax blocks of 64) or nf4\n"
               "  (QLoRA NF4, double-quantised constants), as the LoRA/QLoRA frozen base stores them; embeddings,\n"
               "  norms and biases stay fp32. memfit sample / eval run from it (--init DIR/model.safetensors) with\n"
               "  the dequantise-in-GEMM kernels. MODEL is a GPT-2 weights file memfit wrote (train --out_dir).\n"
               "  Example: memfit quantize --in runs/demo/model.safetensors --out runs/demo-int8 --dtype int8\n");
}

static int quantize(const char *in, const char *dir, int kind, size_t *bytes_in, size_t *bytes_out) {
    struct stat sb;
    if (stat(in, &sb) != 0) return mf_fail("%s: %s", in, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return mf_fail("%s is a folder: quantize takes a GPT-2 weights file memfit wrote (Llama-family Hugging Face "
                       "folders are not supported yet)", in);
    mf_st_file f;
    if (mf_st_open(&f, in)) return -1;
    const char *dims = mf_st_meta(&f, "dims"), *tok = mf_st_meta(&f, "tokenizer"), *q = mf_st_meta(&f, "quant");
    mf_dims d;
    int rc = 0;
    if (q) rc = mf_fail("%s is already quantised (%s); quantize its fp32 source", in, q);
    else if (!dims) rc = mf_fail("%s has no dims metadata: quantize takes a weights file memfit wrote", in);
    else if (mf_model_dims_parse(dims, &d)) rc = mf_fail("%s: bad dims metadata '%s'", in, dims);
    else if (d.arch != MF_ARCH_GPT2) rc = mf_fail("%s: a Llama-family model; quantize supports GPT-2 files only for now", in);
    if (rc) { mf_st_close(&f); return rc; }
    snprintf(d.tokenizer, sizeof d.tokenizer, "%s", tok ? tok : "gpt2");
    /* the inference plan of a quantised model says which tensors are packed */
    mf_plan plan = {0};
    mf_model m = {0};
    mf_lora_cfg lora = {0};
    lora.base = kind;
    mf_recompute none = {MF_RECOMPUTE_NONE, 0};
    if (mf_plan_init(&plan, mf_model_n_phases(&d, MF_MODE_INFER)) ||
        mf_model_plan_lora(&m, &plan, &d, 1, 1, MF_MODE_INFER, 1, 0, none, NULL, &lora)) {
        mf_plan_free(&plan);
        mf_st_close(&f);
        return -1;
    }
    mf_st_entry *e = calloc((size_t)m.n_tensors, sizeof *e);
    void **packed = calloc((size_t)m.n_tensors, sizeof *packed);
    if (!e || !packed) rc = mf_fail("out of memory");
    *bytes_in = *bytes_out = 0;
    for (int i = 0; i < m.n_tensors && !rc; i++) {
        const mf_tensor *x = &m.tensors[i];
        const mf_st_tensor *s = mf_st_find(&f, x->name);
        size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
        if (!s) { rc = mf_fail("%s: tensor '%s' is missing (the dims %s describe it)", in, x->name, dims); break; }
        if (s->dtype != MF_DTYPE_F32 || s->nbytes != n * sizeof(float)) {
            rc = mf_fail("%s: tensor '%s' is %s of %zu bytes; quantize needs F32 of %zu", in, x->name,
                         mf_dtype_name(s->dtype), s->nbytes, n * sizeof(float));
            break;
        }
        if (mf_st_stream(&f, s, NULL, NULL)) { rc = -1; break; }  /* checksum and finite values */
        *bytes_in += s->nbytes;
        e[i] = (mf_st_entry){.name = x->name, .dtype = MF_DTYPE_F32, .ndim = s->ndim,
                             .shape = {s->shape[0], s->shape[1]}, .data = s->data, .nbytes = s->nbytes};
        if (x->qkind) {
            size_t nb = mf_quant_bytes((mf_quant_kind)x->qkind, x->numel);
            if (!(packed[i] = malloc(nb))) { rc = mf_fail("out of memory packing %s", x->name); break; }
            mf_quant_pack((mf_quant_kind)x->qkind, packed[i], s->data, x->numel);
            e[i] = (mf_st_entry){.name = x->name, .dtype = MF_DTYPE_U8, .ndim = 1, .shape = {(int64_t)nb},
                                 .data = packed[i], .nbytes = nb};
        }
        *bytes_out += e[i].nbytes;
    }
    char path[MF_PATH_MAX + 32];
    if (!rc && snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        rc = mf_fail("--out %s: path too long", dir);
    if (!rc && mkdir(dir, 0755) != 0 && errno != EEXIST) rc = mf_fail("--out %s: %s", dir, strerror(errno));
    if (!rc) {
        const char *keys[] = {"format", "dims", "tokenizer", "quant", "quantized_from"};
        const char *vals[] = {"memfit-weights-1", dims, d.tokenizer, mf_quant_name((mf_quant_kind)kind), in};
        rc = mf_st_write(path, e, m.n_tensors, keys, vals, 5);
    }
    for (int i = 0; packed && i < m.n_tensors; i++) free(packed[i]);
    free(packed);
    free(e);
    mf_model_free(&m);
    mf_plan_free(&plan);
    mf_st_close(&f);
    return rc;
}

int mf_cli_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *dt = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], **dst = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout); return 0; }
        if (strcmp(a, "--in") == 0) dst = &in;
        else if (strcmp(a, "--out") == 0) dst = &out;
        else if (strcmp(a, "--dtype") == 0) dst = &dt;
        else { fprintf(stderr, "memfit: error: quantize: unknown argument '%s' (memfit quantize --help)\n", a); return 1; }
        if (i + 1 >= argc) { fprintf(stderr, "memfit: error: quantize: %s needs a value\n", a); return 1; }
        *dst = argv[++i];
    }
    if (!in || !out || !dt) {
        fprintf(stderr, "memfit: error: quantize needs --in, --out and --dtype (memfit quantize --help)\n");
        return 1;
    }
    int kind;
    if (strcmp(dt, "int8") == 0) kind = MF_QUANT_INT8;
    else if (strcmp(dt, "nf4") == 0) kind = MF_QUANT_NF4;
    else {
        fprintf(stderr, "memfit: error: quantize: --dtype '%s' is not int8 or nf4\n", dt);
        return 1;
    }
    size_t bi, bo;
    if (quantize(in, out, kind, &bi, &bo)) {
        fprintf(stderr, "memfit: error: %s\n", mf_error());
        return 1;
    }
    printf("wrote %s/model.safetensors (%s): weights %.2f MiB -> %.2f MiB (%.2fx smaller)\n", out, dt,
           (double)bi / (1 << 20), (double)bo / (1 << 20), (double)bi / (double)bo);
    return 0;
}
