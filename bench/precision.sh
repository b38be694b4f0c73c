#!/usr/bin/env bash
# Mixed precision, in one run: tokens/s of fp32, bf16 (and fp16) alternating
# A B A B, then peak RSS per precision with recompute none and full.
#   bench/precision.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
# STEPS (per speed run, first untimed), ROUNDS, THREADS, SPEED=fp32,bf16,...,
# RSS_STEPS (steps per RSS run) may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-4}; ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-2}; RSS_STEPS=${RSS_STEPS:-2}
IFS=, read -r -a SPEED <<< "${SPEED:-fp32,bf16}"
M=build/memfit
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --threads "$THREADS" --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, avx512_bf16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
echo "config:  $MODEL batch $B seq $T, $STEPS steps per speed run (first untimed), $ROUNDS rounds, $THREADS threads"
echo "load before: $(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
  for p in "${SPEED[@]}"; do
    "$M" train "${common[@]}" --steps "$STEPS" --precision "$p" --metrics "$W/speed.$p.$r.jsonl" > "$W/speed.$p.$r.log"
  done
done
echo "load after speed runs: $(uptime | sed 's/.*load average: //')"
names=(fp32 bf16 bf16-nomaster fp16)
args=("--precision fp32" "--precision bf16" "--precision bf16 --master_weights=0" "--precision fp16")
for rc in none full; do
  for i in "${!names[@]}"; do
    read -r -a a <<< "${args[$i]}"
    "$M" train "${common[@]}" --steps "$RSS_STEPS" --recompute "$rc" "${a[@]}" --metrics "$W/rss.${names[$i]}.$rc.jsonl" > /dev/null
  done
done
echo "load after RSS runs: $(uptime | sed 's/.*load average: //')"
/usr/bin/python3 - "$W" "$ROUNDS" "${SPEED[@]}" <<'PY'
import json, statistics, sys
w, rounds, speed = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = {}
for p in speed:
    tok = []
    for r in range(1, rounds + 1):
        L = [json.loads(l) for l in open("%s/speed.%s.%d.jsonl" % (w, p, r))]
        tok += [m["tok_s"] for m in L[1:]]
    med[p] = (statistics.median(tok), min(tok), max(tok), len(tok))
print("\n%-6s %10s %20s %8s" % ("prec", "tokens/s", "(min..max, n)", "vs fp32"))
for p in speed:
    m, lo, hi, n = med[p]
    print("%-6s %10.1f %20s %7.2fx" % (p, m, "(%.1f..%.1f, %d)" % (lo, hi, n), m / med["fp32"][0] if "fp32" in med else float("nan")))
print("\n%-14s %-9s %12s %12s %12s %9s %s" % ("precision", "recompute", "planned", "pred. RSS", "peak RSS", "RSS-pred", "ledger"))
for rc in ("none", "full"):
    for n in ("fp32", "bf16", "bf16-nomaster", "fp16"):
        L = [json.loads(l) for l in open("%s/rss.%s.%s.jsonl" % (w, n, rc))]
        m = L[-1]
        pred = m["arena_bytes"] + m["rss_baseline_bytes"]
        print("%-14s %-9s %8.1f MiB %8.1f MiB %8.1f MiB %+8.2f%% %s" % (
            n, rc, m["planned_peak_bytes"] / 2**20, pred / 2**20, m["rss_peak_bytes"] / 2**20,
            100.0 * (m["rss_peak_bytes"] - pred) / pred, "== plan" if m["ledger_peak_bytes"] == m["planned_peak_bytes"] else "DIFF"))
PY
