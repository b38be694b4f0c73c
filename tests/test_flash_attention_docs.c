/* Document masking in the FlashAttention kernel (packing): with a positions
 * row (pos restarting at 0 at each document), every document of a packed
 * row gets the out, lse and dqkv it gets when run alone as a plain causal
 * sequence (mf_flash_attention_gqa_* with no positions), within fp32
 * round-off (tiles fall differently, so sums run in another order: 2e-5
 * relative, 1e-6 absolute). Rows of T = 200 hold documents longer than a
 * 64-row tile, shorter ones, ones crossing tile edges and a 1-token one,
 * so the skipped key tiles (forward) and query tiles (backward) are
 * exercised; GQA 4/2 and 2/2 heads, with and without a sliding window.
 * NaN keys and values in the tiles a document must skip prove they are not
 * read: they would poison the output. pos NULL is bitwise the plain kernel. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static float *nanbuf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void run(mf_rng *rng, int B, int T, int NH, int NKV, int hs, int window, const int *lens, int nlens) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t nqkv = (size_t)B * T * QKV, nout = (size_t)B * T * C;
    float *qkv = malloc(nqkv * sizeof *qkv), *dout = malloc(nout * sizeof *dout);
    int32_t *pos = malloc((size_t)B * T * sizeof *pos);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dout[i] = mf_rng_normal(rng);
    /* every row: the documents of lens (cycled, shifted per row), the last cut at T */
    for (int b = 0; b < B; b++)
        for (int t = 0, k = b; t < T; k++) {
            int n = lens[k % nlens];
            if (n > T - t) n = T - t;
            for (int i = 0; i < n; i++) pos[(size_t)b * T + t + i] = i;
            t += n;
        }
    float *out = nanbuf(nout), *lse = nanbuf((size_t)B * NH * T), *dqkv = nanbuf(nqkv);
    float *scr = nanbuf(mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()));
    mf_flash_attention_doc_forward(out, lse, qkv, B, T, NH, NKV, hs, window, pos);
    mf_flash_attention_doc_backward(dqkv, scr, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
    int docs = 0, bad = 0;
    for (int b = 0; b < B && !bad; b++)
        for (int s = 0; s < T && !bad;) {
            int e = s + 1;
            while (e < T && pos[(size_t)b * T + e] != 0) e++;
            int n = e - s;
            /* the document alone, with NaN everywhere else in its copy's row
             * block: none, it is alone; the packed run had the other
             * documents beside it, which must not have mattered */
            float *q1 = malloc((size_t)n * QKV * sizeof *q1), *d1 = malloc((size_t)n * C * sizeof *d1);
            memcpy(q1, qkv + ((size_t)b * T + s) * QKV, (size_t)n * QKV * sizeof *q1);
            memcpy(d1, dout + ((size_t)b * T + s) * C, (size_t)n * C * sizeof *d1);
            float *o1 = nanbuf((size_t)n * C), *l1 = nanbuf((size_t)NH * n), *g1 = nanbuf((size_t)n * QKV);
            float *s1 = nanbuf(mf_flash_attention_scratch_floats(n, hs, omp_get_max_threads()));
            mf_flash_attention_gqa_forward(o1, l1, q1, 1, n, NH, NKV, hs, window);
            mf_flash_attention_gqa_backward(g1, s1, d1, o1, q1, l1, 1, n, NH, NKV, hs, window);
            char what[96];
            snprintf(what, sizeof what, "T%d NH%d/%d w%d row %d doc [%d,%d) out", T, NH, NKV, window, b, s, e);
            bad |= !mf_test_compare(what, out + ((size_t)b * T + s) * C, o1, (size_t)n * C, 2e-5, 1e-6);
            for (int h = 0; h < NH; h++) {
                snprintf(what, sizeof what, "T%d row %d doc [%d,%d) lse head %d", T, b, s, e, h);
                bad |= !mf_test_compare(what, lse + ((size_t)b * NH + h) * T + s, l1 + (size_t)h * n, (size_t)n, 2e-5, 1e-6);
            }
            snprintf(what, sizeof what, "T%d NH%d/%d w%d row %d doc [%d,%d) dqkv", T, NH, NKV, window, b, s, e);
            bad |= !mf_test_compare(what, dqkv + ((size_t)b * T + s) * QKV, g1, (size_t)n * QKV, 2e-5, 1e-6);
            free(q1), free(d1), free(o1), free(l1), free(g1), free(s1);
            docs++;
            s = e;
        }
    printf("T %d, heads %d/%d, hs %d, window %d: %d documents match their runs alone\n", T, NH, NKV, hs, window, docs);
    /* poison: keys and values of row 0's first document set to NaN. A query
     * tile whose first row's document starts at or after the first key
     * tile wholly past it skips every tile holding NaN, so its rows come
     * out bitwise unchanged (a tile it did read would spread NaN: masked
     * scores are zeroed, but 0 x NaN values is NaN). */
    int e0 = 1;
    while (e0 < T && pos[e0] != 0) e0++;
    if (e0 < T) {
        float *o2 = nanbuf(nout), *l2 = nanbuf((size_t)B * NH * T);
        float *qp = malloc(nqkv * sizeof *qp);
        memcpy(qp, qkv, nqkv * sizeof *qp);
        for (int t = 0; t < e0; t++)
            for (int c = C; c < QKV; c++) qp[(size_t)t * QKV + c] = NAN;
        mf_flash_attention_doc_forward(o2, l2, qp, B, T, NH, NKV, hs, window, pos);
        int tiles = 0;
        for (int i0 = 0; i0 < T; i0 += 64) {
            if ((i0 - pos[i0]) / 64 * 64 < (e0 + 63) / 64 * 64) continue;
            int nq = T - i0 < 64 ? T - i0 : 64;
            CHECK(memcmp(o2 + (size_t)i0 * C, out + (size_t)i0 * C, (size_t)nq * C * sizeof *o2) == 0,
                  "query tile %d read a key tile of an earlier document", i0);
            tiles++;
        }
        CHECK(tiles > 0, "no query tile skips the first document (T %d, e0 %d)", T, e0);
        free(o2), free(l2), free(qp);
    }
    /* pos NULL: bitwise the plain kernel */
    float *o3 = nanbuf(nout), *l3 = nanbuf((size_t)B * NH * T), *o4 = nanbuf(nout), *l4 = nanbuf((size_t)B * NH * T);
    mf_flash_attention_doc_forward(o3, l3, qkv, B, T, NH, NKV, hs, window, NULL);
    mf_flash_attention_gqa_forward(o4, l4, qkv, B, T, NH, NKV, hs, window);
    CHECK(memcmp(o3, o4, nout * sizeof *o3) == 0, "pos NULL is not bitwise the plain kernel");
    free(o3), free(l3), free(o4), free(l4);
    free(qkv), free(dout), free(pos), free(out), free(lse), free(dqkv), free(scr);
}

int main(void) {
    mf_rng rng;
    mf_rng_seed(&rng, 20);
    const int lens[] = {70, 13, 1, 90, 40, 64, 5};
    run(&rng, 2, 200, 4, 2, 16, 0, lens, 7);
    run(&rng, 2, 200, 2, 2, 8, 0, lens + 2, 4);
    run(&rng, 1, 200, 4, 2, 16, 24, lens, 7);
    const int one[] = {200};
    run(&rng, 1, 200, 4, 1, 16, 0, one, 1);
    return mf_test_done("test_flash_attention_docs");
}
