/* memfit quantize: post-training quantisation of a model file (int8, nf4). */
#ifndef MEMFIT_CLI_QUANTIZE_H
#define MEMFIT_CLI_QUANTIZE_H
int mf_cli_quantize(int argc, char **argv);
#endif
