/* memfit convert CHECKPOINT OUT: joins the per-rank shards a ZeRO run wrote
 * (CHECKPOINT.rank<r>-of-<N>.safetensors) into one checkpoint that a single
 * process resumes from, or that memfit sample/eval read. */
#include "convert.h"
#include "memfit/core.h"
#include "memfit/train.h"

#include <stdio.h>
#include <string.h>

int mf_cli_convert(int argc, char **argv) {
    if (argc == 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) argc = 0;
    if (argc != 2) {
        FILE *f = argc == 0 ? stdout : stderr;
        fprintf(f, "usage: memfit convert CHECKPOINT.safetensors OUT.safetensors\n"
                   "  Joins the shards of a checkpoint written by mpirun -np N memfit train --zero 1|2|3\n"
                   "  (CHECKPOINT.rank<r>-of-<N>.safetensors) into one single-process checkpoint.\n"
                   "  Example: memfit convert out/checkpoint.safetensors out/joined.safetensors\n");
        return argc == 0 ? 0 : 2;
    }
    if (mf_checkpoint_consolidate(argv[0], argv[1])) {
        fprintf(stderr, "memfit: error: %s\n", mf_error());
        return 1;
    }
    printf("wrote %s\n", argv[1]);
    return 0;
}
