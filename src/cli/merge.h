/* memfit merge: fold a LoRA adapter into a model file (or take it out). */
#ifndef MEMFIT_CLI_MERGE_H
#define MEMFIT_CLI_MERGE_H
int mf_cli_merge(int argc, char **argv);
#endif
