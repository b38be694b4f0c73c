#!/usr/bin/env bash
# One memfit binary under two environment settings, alternating A, B, A, B ...
# in one run: e.g. the arena's transparent huge pages on and off.
#
#   bench/env_ab.sh MEMFIT_HUGEPAGES=1 MEMFIT_HUGEPAGES=0 [ROUNDS] [extra train args]
#
# Runs smollm2-135m B4 T256 fp32 AdamW for 7 steps per run (the bench's
# llama_throughput.sh settings), --omp_wait env (libgomp's default wait, so a
# recent load average cannot switch it), OPENBLAS_CORETYPE/L2_SIZE unset.
# Prints each run's median tok/s over steps 3-7 and, at the end, the median
# of each side and the ratio A/B. Builds nothing: expects ./build/memfit.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?setting A, e.g. MEMFIT_HUGEPAGES=1}; B=${2:?setting B}; R=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
M=build/memfit
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
[ -x "$M" ] || { echo "env_ab: expects ./$M" >&2; exit 1; }
[ -f "$CACHE/moby-dick.txt" ] || bash scripts/fetch_data.sh
W=$(mktemp -d /tmp/memfit-env-ab-XXXXXX)
trap 'rm -rf "$W"' EXIT
"$M" tokenize --tokenizer bytes "$CACHE/moby-dick.txt" "$W/tok" >/dev/null
echo "command: bench/env_ab.sh $A $B $R $*"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for r in $(seq "$R"); do
  for e in "$A" "$B"; do
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$e" "$M" train --model smollm2-135m --batch 4 --seq 256 --steps 7 \
      --threads 2 --data "$W/tok" --optimizer adamw --precision fp32 --lr 3e-4 --warmup 0 --beta1 0.9 --beta2 0.95 \
      --eps 1e-8 --weight_decay 0.1 --grad_clip 1.0 --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 \
      --omp_wait env --metrics "$W/m.jsonl" "$@" > "$W/log" 2>&1 || { cat "$W/log" >&2; exit 1; }
    python3 - "$e" "$W/m.jsonl" >> "$W/runs" <<'PY'
import json, statistics, sys
t = [json.loads(l)["tok_s"] for l in open(sys.argv[2]) if l.strip()][2:]
print(sys.argv[1], "%.1f" % statistics.median(t))
PY
    tail -1 "$W/runs" | sed 's/^/run: /'
  done
done
python3 - "$A" "$B" "$W/runs" <<'PY'
import statistics, sys
a, b = sys.argv[1], sys.argv[2]
runs = [l.split() for l in open(sys.argv[3])]
ma = statistics.median(float(v) for k, v in runs if k == a)
mb = statistics.median(float(v) for k, v in runs if k == b)
print("median %s %.1f tok/s, %s %.1f tok/s: ratio %.3f" % (a, ma, b, mb, ma / mb))
PY
