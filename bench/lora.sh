#!/usr/bin/env bash
# Full fine-tuning vs LoRA r=8 vs QLoRA-NF4 r=8 (when this build has the
# quantised base) on one model, same precision (fp32 compute), same
# recompute and loss chunking, runs alternating A B C A B C. Prints peak RSS
# (VmHWM, whole process), median tokens/s (first step of each run untimed),
# trainable parameters, and the ratios to full fine-tuning.
#   bench/lora.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
#   RECOMPUTE=none bench/lora.sh             (default full, for all three)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-3}; ROUNDS=${ROUNDS:-2}; THREADS=${THREADS:-2}; RECOMPUTE=${RECOMPUTE:-full}
M=${MEMFIT_BIN:-build/memfit}
LORA="r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
declare -A ARGS=([full]="" [lora]="--lora $LORA" [qlora]="--lora $LORA --base_dtype nf4")
RUNS="full lora"
if "$M" estimate --model "$MODEL" --batch "$B" --seq "$T" --lora "$LORA" --base_dtype nf4 >/dev/null 2>&1; then RUNS="full lora qlora"
else echo "note: this build has no NF4 base (--base_dtype nf4 refused); QLoRA row skipped"; fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "config:  $MODEL batch $B seq $T, recompute $RECOMPUTE, loss_chunk 256, fp32 compute, AdamW; $STEPS steps per run (first untimed), $ROUNDS rounds, $THREADS threads"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
for r in $(seq "$ROUNDS"); do
  for p in $RUNS; do
    # shellcheck disable=SC2086
    "$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --recompute "$RECOMPUTE" \
      ${ARGS[$p]} --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --metrics "$W/$p.$r.jsonl" > "$W/$p.$r.log"
  done
done
echo "load after:  $(uptime | sed 's/.*load average/load average/')"
for p in $RUNS; do
  # shellcheck disable=SC2086
  "$M" estimate --model "$MODEL" --batch "$B" --seq "$T" --recompute "$RECOMPUTE" ${ARGS[$p]} --json > "$W/$p.est"
done
/usr/bin/python3 - "$W" "$ROUNDS" $RUNS <<'PY'
import json, statistics, sys
w, rounds, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
label = {"full": "full fine-tune", "lora": "LoRA r=8", "qlora": "QLoRA-NF4 r=8"}
res = {}
for p in runs:
    tok, rss = [], []
    for r in range(1, rounds + 1):
        L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, p, r))]
        tok += [m["tok_s"] for m in L[1:]]
        rss.append(max(m["rss_peak_bytes"] for m in L))
    est = json.load(open("%s/%s.est" % (w, p)))
    res[p] = (max(rss), statistics.median(tok), est["n_trainable"], est.get("arena_bytes", 0))
f = res["full"]
print("| run | peak RSS | x full | tokens/s (median) | x full | trainable params |")
print("|---|---|---|---|---|---|")
for p in runs:
    r, t, n, _ = res[p]
    print("| %s | %.1f MiB | %.3f | %.1f | %.2f | %s |" % (label[p], r / 2**20, r / f[0], t, t / f[1], format(int(n), ",")))
PY
