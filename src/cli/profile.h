/* memfit profile: the tables printed after the profiled steps (per layer,
 * per category, top consumers, suggestions from re-planned configs). */
#ifndef MEMFIT_CLI_PROFILE_H
#define MEMFIT_CLI_PROFILE_H

#include <stdio.h>
#include "observe.h"

/* Forward FLOPs of transformer block l's pass over B x T tokens: the four
 * matmuls 2*N*(C*3C + C*C + C*4C + 4C*C) plus causal attention
 * 2*2*B*NH*T*T*hs/2 (QK^T and AV over the lower triangle). */
double mf_profile_block_flops(const mf_dims *d, int B, int T);

/* Prints the profile of the steps `o` observed on trainer t. */
void mf_profile_print(FILE *f, const mf_trainer *t, const mf_observer *o);

#endif
