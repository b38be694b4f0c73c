/* GPT-2's learned positions for packed documents (src/data/sft.c packs
 * examples into rows; each token's position restarts at 0 with its
 * document, as it would if the document were run on its own). */
#include "memfit/kernels.h"

#include <omp.h>

void mf_pos_embed_add(float *out, const float *wpe, const int32_t *pos, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const float *pe = wpe + (size_t)pos[n] * C;
        for (int c = 0; c < C; c++) o[c] += pe[c];
    }
}

void mf_pos_embed_backward(float *dwpe, const float *dout, const int32_t *pos, int N, int C) {
    /* threads own column ranges and walk the rows in order: no races, and
     * the sums do not depend on the thread count */
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int c0 = (int)((int64_t)C * t / nt), c1 = (int)((int64_t)C * (t + 1) / nt);
        for (int n = 0; n < N; n++) {
            float *d = dwpe + (size_t)pos[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}
