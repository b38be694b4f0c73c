#!/usr/bin/env bash
# Activation checkpointing: recompute none, selective, sqrt and full on one model, alternating
# A B A B in one run. Prints planned activation bytes (the most alive at
# any phase), peak RSS, median tokens/s and the recompute overhead.
#   bench/recompute.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
#   EXTRA="--block_size 2048" bench/recompute.sh gpt2-124m 1 2048   (long context)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-6}; ROUNDS=${ROUNDS:-2}; THREADS=${THREADS:-2}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
M=build/memfit
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "config:  $MODEL ${EXTRA:-} batch $B seq $T, $STEPS steps per run (first untimed), $ROUNDS rounds, $THREADS threads"
for r in $(seq "$ROUNDS"); do
  for p in none selective sqrt full; do
    "$M" train --model "$MODEL" --batch "$B" --seq "$T" "${EXTRA_ARGS[@]}" --steps "$STEPS" --threads "$THREADS" --recompute "$p" \
      --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --metrics "$W/$p.$r.jsonl" > /dev/null
  done
done
for p in none selective sqrt full; do "$M" estimate --model "$MODEL" --batch "$B" --seq "$T" "${EXTRA_ARGS[@]}" --recompute "$p" --json > "$W/$p.est"; done
/usr/bin/python3 - "$W" "$ROUNDS" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for p in ("none", "selective", "sqrt", "full"):
    tok, rss = [], []
    for r in range(1, rounds + 1):
        L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, p, r))]
        tok += [m["tok_s"] for m in L[1:]]
        rss.append(L[-1]["rss_peak_bytes"])
    est = json.load(open("%s/%s.est" % (w, p)))
    res[p] = (est["max"]["acts"], max(rss), statistics.median(tok))
print("%-9s %14s %12s %14s %10s" % ("policy", "activations", "peak RSS", "tokens/s (med)", "overhead"))
for p in ("none", "selective", "sqrt", "full"):
    a, r, t = res[p]
    print("%-9s %10.1f MiB %8.2f GiB %14.1f %9.1f%%" % (p, a / 2**20, r / 2**30, t, 100.0 * (res["none"][2] / t - 1)))
for p in ("selective", "sqrt", "full"):
    print("%s vs none: activations %.2fx smaller" % (p, res["none"][0] / res[p][0]))
PY
