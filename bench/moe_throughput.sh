#!/usr/bin/env bash
# moe-small (Mixtral block: 8 experts, top-2; 106,209,792 params, 30,712,320
# active per token) against a dense Llama of the same active parameters
# (llama-tiny widened to L8 C512 8/2 heads, SwiGLU width 2048 = k x 1024: the
# same GEMM FLOPs per token; 30,679,552 params), fp32, AdamW, alternating
# MoE, dense, MoE, dense ... in one run. tokens/s per timed step (after WARM
# steps) from --metrics, medians over every round; the ratio MoE / dense is
# the mixture's overhead (routing, permutation, per-expert GEMMs, and the
# optimizer on 3.5x the parameters). Peak RSS: predicted (baseline + arena)
# and measured (VmHWM) of the MoE's last round.
#
#   bench/moe_throughput.sh            (ROUNDS=3 STEPS=6 WARM=1 B=8 T=256 THREADS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-6}; WARM=${WARM:-1}; B=${B:-8}; T=${T:-256}; THREADS=${THREADS:-2}
M=build/memfit
W=$(mktemp -d /tmp/memfit-moebench-XXXXXX)
trap 'rm -rf "$W"' EXIT
head -c 2000000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null
common=(--data "$W/c.tok" --batch "$B" --seq "$T" --steps "$STEPS" --val_every 0 --sample_tokens 0 --progress 0
        --threads "$THREADS" --warmup 0)
moe=(--model moe-small)
dense=(--model llama-tiny --n_layer 8 --n_embd 512 --n_head 8 --n_kv_head 2 --intermediate_size 2048 --block_size 1024)
echo "command: $0 (ROUNDS=$ROUNDS STEPS=$STEPS WARM=$WARM B=$B T=$T THREADS=$THREADS)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  for k in moe dense; do
    if [ $k = moe ]; then args=("${moe[@]}"); else args=("${dense[@]}"); fi
    "$M" train "${args[@]}" "${common[@]}" --metrics "$W/$k.$r.jsonl" > "$W/$k.$r.log" 2>&1
    echo "round $r $k: $(/usr/bin/python3 -c "
import json,sys
m=[json.loads(l) for l in open('$W/$k.$r.jsonl')][$WARM:]
print(' '.join('%.0f' % x['tok_s'] for x in m))") tok/s (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
/usr/bin/python3 - "$W" "$ROUNDS" "$WARM" <<'PY'
import json, statistics, sys
w, R, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
med = {}
for k in ("moe", "dense"):
    xs = []
    for r in range(1, R + 1):
        xs += [json.loads(l)["tok_s"] for l in open("%s/%s.%d.jsonl" % (w, k, r))][warm:]
    med[k] = statistics.median(xs)
    print("%-5s median %.0f tok/s over %d steps" % (k, med[k], len(xs)))
print("MoE / dense tokens/s: %.2fx" % (med["moe"] / med["dense"]))
last = [json.loads(l) for l in open("%s/moe.%d.jsonl" % (w, R))][-1]
pred = last["rss_baseline_bytes"] + last["arena_bytes"]
print("moe-small peak RSS: predicted %.1f MiB, measured %.1f MiB (%+.2f%%); ledger %s plan" % (
    pred / 2**20, last["rss_peak_bytes"] / 2**20, 100.0 * (last["rss_peak_bytes"] - pred) / pred,
    "==" if last["ledger_peak_bytes"] == last["planned_peak_bytes"] else "!="))
PY
