#!/usr/bin/env bash
# mf_sgemm's fp32 backends on a whole training step, in one run: tokens/s
# and peak RSS of memfit train with MEMFIT_GEMM=onednn (dnnl_sgemm, the default, with the
# library's own packing buffers), matmul (oneDNN's matmul primitive with the
# scratch a plan row) and openblas, alternating A B C per round.
#   bench/gemm_backend.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
# STEPS (per run, first untimed), ROUNDS, THREADS, BACKENDS=onednn,matmul,...
# may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-4}; ROUNDS=${ROUNDS:-4}; THREADS=${THREADS:-2}
IFS=, read -r -a BK <<< "${BACKENDS:-onednn,matmul,openblas}"
M=build/memfit
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --threads "$THREADS" --steps "$STEPS" --sample_tokens 0 --val_every 0
        --val_batches 1 --progress 0)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "config:  $MODEL batch $B seq $T fp32, $STEPS steps per run (first untimed), $ROUNDS rounds, $THREADS threads"
echo "load before: $(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
  for g in "${BK[@]}"; do
    MEMFIT_GEMM=$g "$M" train "${common[@]}" --metrics "$W/$g.$r.jsonl" > "$W/$g.$r.log"
  done
done
echo "load after: $(uptime | sed 's/.*load average: //')"
/usr/bin/python3 - "$W" "$ROUNDS" "${BK[@]}" <<'PY'
import json, statistics, sys
w, rounds, bk = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
res = {}
for g in bk:
    tok, last = [], None
    for r in range(1, rounds + 1):
        L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, g, r))]
        tok += [m["tok_s"] for m in L[1:]]
        last = L[-1]
    res[g] = (statistics.median(tok), min(tok), max(tok), len(tok), last)
ref = bk[0]
print("\n%-9s %10s %20s %9s %12s %12s %12s %9s" % ("backend", "tokens/s", "(min..max, n)", "vs " + ref, "runtime",
                                                    "pred. RSS", "peak RSS", "RSS-pred"))
for g in bk:
    m, lo, hi, n, x = res[g]
    pred = x["arena_bytes"] + x["rss_baseline_bytes"]
    print("%-9s %10.1f %20s %8.2fx %8.1f MiB %8.1f MiB %8.1f MiB %+8.2f%%" % (
        g, m, "(%.1f..%.1f, %d)" % (lo, hi, n), m / res[ref][0], x["rss_baseline_bytes"] / 2**20, pred / 2**20,
        x["rss_peak_bytes"] / 2**20, 100.0 * (x["rss_peak_bytes"] - pred) / pred))
PY
