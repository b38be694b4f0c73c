/* memfit merge --model-file M --adapter DIR --out OUT [--unmerge]: folds a
 * LoRA adapter (PEFT layout) into a model file's weights, or takes it out. */
#include "merge.h"
#include "memfit/core.h"
#include "memfit/lora.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: memfit merge --model-file MODEL.safetensors --adapter DIR --out OUT.safetensors [--unmerge]\n"
               "  Folds the LoRA adapter in DIR (adapter_model.safetensors + adapter_config.json, PEFT's layout)\n"
               "  into the model's weights: W += (lora_alpha/r) * (B @ A)^T for each adapted Conv1D weight;\n"
               "  --unmerge subtracts it instead (takes a merged adapter back out).\n"
               "  Example: memfit merge --model-file out/model.safetensors --adapter out/adapter --out merged.safetensors\n");
}

int mf_cli_merge(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL;
    int unmerge = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout); return 0; }
        if (strcmp(a, "--unmerge") == 0) { unmerge = 1; continue; }
        if (strcmp(a, "--model-file") == 0 || strcmp(a, "--model_file") == 0) dst = &model;
        else if (strcmp(a, "--adapter") == 0) dst = &adapter;
        else if (strcmp(a, "--out") == 0) dst = &out;
        else { fprintf(stderr, "memfit: error: merge: unknown argument '%s' (memfit merge --help)\n", a); return 1; }
        if (i + 1 >= argc) { fprintf(stderr, "memfit: error: merge: %s needs a value\n", a); return 1; }
        *dst = argv[++i];
    }
    if (!model || !adapter || !out) {
        fprintf(stderr, "memfit: error: merge needs --model-file, --adapter and --out (memfit merge --help)\n");
        return 1;
    }
    if (mf_lora_merge_file(model, adapter, out, unmerge)) {
        fprintf(stderr, "memfit: error: %s\n", mf_error());
        return 1;
    }
    printf("wrote %s (%s %s)\n", out, unmerge ? "unmerged" : "merged", adapter);
    return 0;
}
