#!/usr/bin/env bash
# bf16 against PyTorch's bf16 autocast (issue 22's targets), in one run:
# memfit fp32, memfit bf16, PyTorch bf16 autocast, PyTorch fp32 and a 2048^3
# sgemm, alternating in that order every round, on the same model, batch,
# data, thread count and AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
# matrices, clip 1.0). PyTorch (bench/torch_gpt2.py, Debian's python3-torch)
# runs in its best set-up here (bench/torch_env.sh, as compare_torch.sh):
# libtcmalloc_minimal preloaded (LD_PRELOAD, PyTorch only); its bf16 is torch.autocast("cpu", dtype=torch.bfloat16)
# around the forward (oneDNN's AVX512_BF16 matmuls; fp32 weights, gradients
# and optimizer step, as autocast does). OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE are unset for every run.
#
# Prints each run's median tokens/s (every step after the first WARM of a
# run, pooled over the rounds) and peak RSS, the ratios against the issue's
# goals (memfit bf16 >= 1.5x PyTorch autocast, >= 1.7x memfit fp32) and
# memfit fp32's model GFLOP/s as a share of the same run's oneDNN sgemm rate
# (goal >= 85%; model FLOPs as bench/throughput counts them). Then the
# everything-on runs (bf16, recompute full, adamw8bit, update_in_backward,
# grad_clip 0, no master weights; with and without bf16 gradients), a few
# steps each: planned (arena + measured baseline) and measured peak RSS
# against the 1.0 GiB goal, and whether the ledger equals the plan.
#
#   bench/bf16_torch.sh [MODEL] [BATCH] [SEQ]      (default gpt2-124m 4 256)
#   ROUNDS=3 STEPS=6 WARM=2 THREADS=2 TORCH_FP32=1 RSS_STEPS=3 bench/bf16_torch.sh
#   (TORCH_FP32=0 skips PyTorch fp32; MODEL gpt2-124m or gpt2-10m: the
#   presets bench/torch_gpt2.py knows)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-6}; WARM=${WARM:-2}; THREADS=${THREADS:-2}
TORCH_FP32=${TORCH_FP32:-1}; RSS_STEPS=${RSS_STEPS:-3}
M=build/memfit; S=build/bench_sgemm
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
[ -x "$M" ] && [ -x "$S" ] || { echo "bf16_torch: build first (cmake --build build)" >&2; exit 1; }
source bench/torch_env.sh   # CLEAN, TORCH_ENV (the unsets and the preload), TCMALLOC
[ "$STEPS" -gt "$WARM" ] || { echo "bf16_torch: STEPS ($STEPS) must exceed WARM ($WARM)" >&2; exit 1; }
[ -f "$CACHE/moby-dick.txt" ] || bash scripts/fetch_data.sh
W=$(mktemp -d /tmp/memfit-bf16-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
# tokenized here by this memfit (the cache is shared with other builds whose
# token-file version may differ)
TOK=$W/moby-dick.gpt2.tok
"$M" tokenize "$CACHE/moby-dick.txt" "$TOK" >/dev/null

MF_CMD=("$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --data "$TOK"
        --optimizer adamw --lr 3e-4 --warmup 0 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight_decay 0.1 --grad_clip 1.0
        --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0)
PT_CMD=(/usr/bin/python3 bench/torch_gpt2.py --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS"
        --warmup-steps "$WARM" --threads "$THREADS" --tokens "$TOK")
# everything on: the issue's least-memory bf16 run, with and without bf16 gradients
ALL_CMD=("$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$RSS_STEPS" --threads "$THREADS" --data "$TOK"
         --precision bf16 --master_weights 0 --recompute full --optimizer adamw8bit --update_in_backward 1 --grad_clip 0
         --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0)
SYSTEMS="memfit-fp32 memfit-bf16 torch-autocast$([ "$TORCH_FP32" = 1 ] && echo ' torch-fp32' || true)"

echo "command: ROUNDS=$ROUNDS STEPS=$STEPS WARM=$WARM THREADS=$THREADS TORCH_FP32=$TORCH_FP32 RSS_STEPS=$RSS_STEPS bench/bf16_torch.sh $MODEL $B $T"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, avx512_bf16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
echo "config:  $MODEL batch $B seq $T, AdamW, $STEPS steps per run ($WARM untimed), $ROUNDS rounds of: $SYSTEMS sgemm"
echo "memfit:  ${CLEAN[*]} ${MF_CMD[*]} --precision fp32|bf16 --metrics M.jsonl"
echo "pytorch: env ${TORCH_ENV[*]} ${PT_CMD[*]} [--autocast bf16]"
echo "sgemm:   ${CLEAN[*]} $S 2048 5 $THREADS"
for r in $(seq "$ROUNDS"); do
  for p in fp32 bf16; do
    "${CLEAN[@]}" "${MF_CMD[@]}" --precision "$p" --metrics "$W/memfit-$p.$r.jsonl" > "$W/memfit-$p.$r.log" 2>&1 ||
      { cat "$W/memfit-$p.$r.log" >&2; exit 1; }
  done
  for p in autocast fp32; do
    [ "$p" = fp32 ] && [ "$TORCH_FP32" != 1 ] && continue
    env "${TORCH_ENV[@]}" "${PT_CMD[@]}" $([ "$p" = autocast ] && echo --autocast bf16) \
      > "$W/torch-$p.$r.json" 2> "$W/torch-$p.$r.err" || { cat "$W/torch-$p.$r.err" >&2; exit 1; }
  done
  "${CLEAN[@]}" "$S" 2048 5 "$THREADS" > "$W/sgemm.$r.txt"
done
echo "load after speed runs: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h '^model \|^BLAS' "$W/memfit-fp32.1.log" | sed 's/^/memfit:  /'
echo "pytorch: torch $(/usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["torch"])' "$W/torch-autocast.1.json")"
for g in fp32 bf16; do
  "${CLEAN[@]}" "${ALL_CMD[@]}" --grad_dtype "$g" --metrics "$W/all-$g.jsonl" > "$W/all-$g.log" 2>&1 ||
    { cat "$W/all-$g.log" >&2; exit 1; }
done
echo "everything on: ${ALL_CMD[*]} --grad_dtype fp32|bf16"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$W" "$ROUNDS" "$WARM" "$TORCH_FP32" "$MODEL" "$T" <<'PY'
import json, re, statistics, sys
w, rounds, warm, tfp32, model, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5], int(sys.argv[6])
G, MiB = 2**30, 2**20
def last_json(path):
    return json.loads(open(path).read().strip().splitlines()[-1])
tok, rss = {}, {}
for s in ["memfit-fp32", "memfit-bf16", "torch-autocast"] + (["torch-fp32"] if tfp32 else []):
    tok[s], rss[s] = [], []
    for r in range(1, rounds + 1):
        if s.startswith("memfit"):
            L = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (w, s, r))]
            tok[s] += [m["tok_s"] for m in L[warm:]]
            rss[s].append(L[-1]["rss_peak_bytes"])
        else:
            t = last_json("%s/%s.%d.json" % (w, s, r))
            tok[s] += [t["batch"] * t["seq"] / x for x in t["step_s"]]
            rss[s].append(t["peak_rss_bytes"])
med = {s: statistics.median(v) for s, v in tok.items()}
print()
print("| run | tokens/s (median) | min..max | steps | peak RSS |")
print("|---|---|---|---|---|")
for s in tok:
    print("| %s | %.1f | %.1f..%.1f | %d | %.2f GiB |" % (s, med[s], min(tok[s]), max(tok[s]), len(tok[s]), max(rss[s]) / G))
print()
# model FLOPs per token as bench/throughput counts them (PaLM appendix B)
m = re.search(r"L(\d+) C(\d+) H\d+, block \d+, vocab \d+ padded to (\d+)", open("%s/memfit-fp32.1.log" % w).read())
L, C, V = int(m.group(1)), int(m.group(2)), int(m.group(3))
flop_tok = 6 * (L * 12 * C * C + V * C) + 12 * L * T * C
sg = [open("%s/sgemm.%d.txt" % (w, r)).read() for r in range(1, rounds + 1)]
dnn = statistics.median(float(x.split("onednn=")[1].split()[0]) for x in sg)
gf = med["memfit-fp32"] * flop_tok / 1e9
def goal(v, g, ge=True):
    return "met" if (v >= g if ge else v <= g) else "NOT met"
print("| ratio | value | goal |")
print("|---|---|---|")
a = med["memfit-bf16"] / med["torch-autocast"]
b = med["memfit-bf16"] / med["memfit-fp32"]
print("| memfit bf16 / PyTorch bf16 autocast | %.2fx | >= 1.5x: %s |" % (a, goal(a, 1.5)))
print("| memfit bf16 / memfit fp32 | %.2fx | >= 1.7x: %s |" % (b, goal(b, 1.7)))
f = gf / dnn
print("| memfit fp32 model GFLOP/s / oneDNN sgemm 2048^3 | %.1f / %.1f = %.0f%% | >= 85%%: %s |" % (gf, dnn, 100 * f, goal(f, 0.85)))
if tfp32:
    print("| memfit fp32 / PyTorch fp32 | %.2fx | - |" % (med["memfit-fp32"] / med["torch-fp32"]))
    print("| PyTorch autocast / PyTorch fp32 | %.2fx | - |" % (med["torch-autocast"] / med["torch-fp32"]))
print()
print("| everything on | planned arena | predicted peak RSS | measured peak RSS | RSS-pred | ledger | goal <= 1.0 GiB |")
print("|---|---|---|---|---|---|---|")
for g in ("fp32", "bf16"):
    x = [json.loads(l) for l in open("%s/all-%s.jsonl" % (w, g))][-1]
    pred = x["arena_bytes"] + x["rss_baseline_bytes"]
    pk = x["rss_peak_bytes"]
    print("| grad_dtype %s | %.1f MiB | %.1f MiB | %.1f MiB | %+.2f%% | %s | %s |" % (
        g, x["planned_peak_bytes"] / MiB, pred / MiB, pk / MiB, 100.0 * (pk - pred) / pred,
        "== plan" if x["ledger_peak_bytes"] == x["planned_peak_bytes"] else "DIFF", goal(pk, G, ge=False)))
PY
