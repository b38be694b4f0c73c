#!/usr/bin/env bash
# memfit against memfit: two builds (or one build under two environments)
# on the same training run, alternating A B A B ... in one script, so a
# shared machine's load falls on both alike. Default run: smollm2-135m B4
# T256 fp32 AdamW, as bench/llama_throughput.sh runs it.
#
#   A=/path/to/old/memfit B=build/memfit bench/memfit_ab.sh [MODEL] [BATCH] [SEQ]
#   A=build/memfit A_ENV="MEMFIT_GEMM_SPLIT=0" B=build/memfit bench/memfit_ab.sh
#   ROUNDS=3 STEPS=4 WARM=1 THREADS=2 ...
#
# Prints the command, the machine, per round each side's median tokens/s
# and last loss, then the medians over every timed step (steps after the
# first WARM of each run) and the ratio B/A, and the same for each side's
# fastest step (on a loaded machine, the one least slowed by other
# processes). Builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2-135m}; BATCH=${2:-4}; SEQ=${3:-256}
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-4}; WARM=${WARM:-1}; THREADS=${THREADS:-2}
A=${A:?set A=path of memfit build A}; B=${B:?set B=path of memfit build B}
A_ENV=${A_ENV:-}; B_ENV=${B_ENV:-}
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
for x in "$A" "$B"; do [ -x "$x" ] || { echo "memfit_ab: $x is not an executable memfit" >&2; exit 1; }; done
[ "$STEPS" -gt "$WARM" ] || { echo "memfit_ab: STEPS ($STEPS) must exceed WARM ($WARM)" >&2; exit 1; }
[ -f "$CACHE/moby-dick.txt" ] || bash scripts/fetch_data.sh
W=$(mktemp -d /tmp/memfit-ab-XXXXXX)
trap 'rm -rf "$W"' EXIT
"$B" tokenize --tokenizer bytes "$CACHE/moby-dick.txt" "$W/data.tok" >/dev/null
ARGS=(train --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads "$THREADS" --data "$W/data.tok"
      --optimizer adamw --precision fp32 --lr 3e-4 --warmup 0 --beta1 0.9 --beta2 0.95 --eps 1e-8
      --weight_decay 0.1 --grad_clip 1.0 --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0)
echo "command: ROUNDS=$ROUNDS STEPS=$STEPS WARM=$WARM THREADS=$THREADS A=$A A_ENV='$A_ENV' B=$B B_ENV='$B_ENV' bench/memfit_ab.sh $MODEL $BATCH $SEQ"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start, $(date -u '+%F %H:%M UTC')"
for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=${!side}; envs=${side}_ENV
    # shellcheck disable=SC2086
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${!envs} "$bin" "${ARGS[@]}" --metrics "$W/$side.$r.jsonl" \
      > "$W/$side.$r.log" 2>&1 || { tail -3 "$W/$side.$r.log" >&2; exit 1; }
  done
  echo "round $r done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
grep -h '^BLAS' "$W/A.1.log" | sed 's/^/A: /'
grep -h '^BLAS' "$W/B.1.log" | sed 's/^/B: /'
/usr/bin/python3 - "$W" "$ROUNDS" "$WARM" <<'PY'
import json, statistics, sys
w, rounds, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = {"A": [], "B": []}
for r in range(1, rounds + 1):
    for s in "AB":
        L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, s, r))]
        t = [m["tok_s"] for m in L[warm:]]
        tok[s] += t
        print("round %d %s: %8.1f tok/s (steps %s), last loss %.7g" % (
            r, s, statistics.median(t), " ".join("%.1f" % x for x in t), L[-1]["loss"]))
a, b = statistics.median(tok["A"]), statistics.median(tok["B"])
print("median tok/s: A %.1f, B %.1f; B/A %.2fx (%d timed steps each)" % (a, b, b / a, len(tok["A"])))
# the fastest step of each side: the one least slowed by other processes
a, b = max(tok["A"]), max(tok["B"])
print("best step tok/s: A %.1f, B %.1f; B/A %.2fx" % (a, b, b / a))
PY
