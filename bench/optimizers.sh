#!/usr/bin/env bash
# Optimizer memory: adamw, adamw8bit, adafactor, sgd, update_in_backward,
# disk offload and the leanest combination on one model, alternating
# A B A B in one run. Prints planned optimizer-state and gradient bytes,
# peak RSS, median tokens/s and the ratio to adamw.
#   bench/optimizers.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-4}; ROUNDS=${ROUNDS:-2}; THREADS=${THREADS:-2}
M=build/memfit
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
names=(adamw adamw8bit adafactor sgd uib offload lean)
args=("--optimizer adamw"
      "--optimizer adamw8bit"
      "--optimizer adafactor"
      "--optimizer sgd --momentum 0.9"
      "--optimizer adamw --update_in_backward --grad_clip 0"
      "--optimizer adamw --offload optimizer=disk:$W/state.bin"
      "--optimizer adamw8bit --update_in_backward --grad_clip 0 --recompute full")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; offload file on $(df -T "$W" | awk 'NR==2{print $2}')"
echo "config:  $MODEL batch $B seq $T, $STEPS steps per run (first untimed), $ROUNDS rounds, $THREADS threads"
for r in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    read -r -a a <<< "${args[$i]}"
    "$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" "${a[@]}" \
      --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --metrics "$W/${names[$i]}.$r.jsonl" > /dev/null
  done
done
for i in "${!names[@]}"; do
  read -r -a a <<< "${args[$i]}"
  "$M" estimate --model "$MODEL" --batch "$B" --seq "$T" "${a[@]}" --json > "$W/${names[$i]}.est"
done
/usr/bin/python3 - "$W" "$ROUNDS" "${names[@]}" <<'PY'
import json, statistics, sys
w, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
res = {}
for n in names:
    tok, rss = [], []
    for r in range(1, rounds + 1):
        L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, n, r))]
        tok += [m["tok_s"] for m in L[1:]]
        rss.append(L[-1]["rss_peak_bytes"])
    e = json.load(open("%s/%s.est" % (w, n)))
    state = e["max"]["optim"] + e["max"]["quant"]
    res[n] = (state, e["disk"], e["max"]["grads"], max(rss), statistics.median(tok))
base = res["adamw"]
print("%-10s %12s %7s %12s %12s %10s %11s %8s" % ("setting", "state (RAM)", "vs adamw", "state (disk)", "grads", "peak RSS", "tokens/s", "speed"))
for n in names:
    s, d, g, r, t = res[n]
    print("%-10s %8.1f MiB %7.3fx %8.1f MiB %8.1f MiB %6.2f GiB %11.1f %7.2fx" % (
        n, s / 2**20, s / base[0], d / 2**20, g / 2**20, r / 2**30, t, t / base[4]))
PY
echo "lean = adamw8bit + update_in_backward + recompute full"
