/* Encode throughput of one memfit tokenizer on one text, in process: loads
 * the tokenizer once, encodes the whole text ROUNDS times, prints
 * "best_MB/s ids load_s". Used by bench/tokenize_speed.sh.
 *   bench_tokenize_speed gpt2|PATH/tokenizer.json TEXT [ROUNDS]
 */
#include "memfit/core.h"
#include "memfit/data.h"
#include "memfit/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void count(int32_t id, void *ctx) {
    (void)id;
    (*(size_t *)ctx)++;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenize_speed gpt2|PATH/tokenizer.json TEXT [ROUNDS]\n");
        return 2;
    }
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    FILE *f = fopen(argv[2], "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(n > 0 ? (size_t)n : 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }
    fclose(f);
    double t0 = mf_time_now();
    mf_tokenizer *t = mf_tokenizer_open(argv[1], NULL);
    double load = mf_time_now() - t0;
    if (!t) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    double best = 1e30;
    size_t ids = 0;
    for (int r = 0; r < rounds; r++) {
        ids = 0;
        t0 = mf_time_now();
        if (mf_tokenizer_encode(t, text, (size_t)n, count, &ids)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
        double s = mf_time_now() - t0;
        if (s < best) best = s;
    }
    printf("%.3f %zu %.3f\n", (double)n / 1e6 / best, ids, load);
    mf_tokenizer_free(t);
    free(text);
    return 0;
}
