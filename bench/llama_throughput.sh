#!/usr/bin/env bash
# memfit against PyTorch on a Llama-family model (default smollm2-135m, batch
# 4, seq 256, fp32, full training with AdamW), alternating memfit, PyTorch,
# memfit, PyTorch ... in one run. The PyTorch side is bench/torch_llama.py
# (tests/ref/llama_torch.py, Debian's python3-torch on the system OpenBLAS) in
# its best set-up on this machine: libtcmalloc_minimal preloaded (LD_PRELOAD,
# PyTorch only), same thread count, same byte-token data, same AdamW
# (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on matrices, clip 1.0).
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for both (memfit then picks
# its kernels itself, PyTorch's OpenBLAS autodetects).
#
# Builds nothing: expects ./build/memfit (cmake --build build --target memfit_cli).
#
#   bench/llama_throughput.sh [MODEL] [BATCH] [SEQ]   (default smollm2-135m 4 256)
#   ROUNDS=2 STEPS=8 WARM=2 THREADS=2 bench/llama_throughput.sh
#
# tokens/s is B*T / step time for each step after the first WARM of a run
# (both count a step the same way: forward, backward, clip, optimizer step);
# the medians pool every timed step of every round. Peak RSS is VmHWM
# (memfit: rss_peak_bytes of its last metrics line; PyTorch: /proc/self/status
# at exit), the max over rounds. Prints the command, the machine, each round,
# the medians, the ratios memfit/PyTorch, and memfit's predicted-vs-measured
# peak from its memory report.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2-135m}; B=${2:-4}; T=${3:-256}
ROUNDS=${ROUNDS:-2}; STEPS=${STEPS:-8}; WARM=${WARM:-2}; THREADS=${THREADS:-2}
M=build/memfit
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
[ -x "$M" ] || { echo "llama_throughput: expects ./$M; build it first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target memfit_cli" >&2; exit 1; }
source bench/torch_env.sh   # TCMALLOC, CLEAN
[ "$STEPS" -gt "$WARM" ] || { echo "llama_throughput: STEPS ($STEPS) must exceed WARM ($WARM)" >&2; exit 1; }
[ -f "$CACHE/moby-dick.txt" ] || bash scripts/fetch_data.sh
W=$(mktemp -d /tmp/memfit-llama-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
# tokenized here by this memfit, not cached: the cache is shared with other
# memfit builds whose token-file version may differ
TOK=$W/moby-dick.bytes.tok
"$M" tokenize --tokenizer bytes "$CACHE/moby-dick.txt" "$TOK" >/dev/null

MF_CMD=("$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --data "$TOK"
        --optimizer adamw --precision fp32 --lr 3e-4 --warmup 0 --beta1 0.9 --beta2 0.95 --eps 1e-8
        --weight_decay 0.1 --grad_clip 1.0
        --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0)
PT_CMD=(/usr/bin/python3 bench/torch_llama.py --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS"
        --warmup-steps "$WARM" --threads "$THREADS" --tokens "$TOK")

echo "command: ROUNDS=$ROUNDS STEPS=$STEPS WARM=$WARM THREADS=$THREADS bench/llama_throughput.sh $MODEL $B $T"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
echo "config:  $MODEL batch $B seq $T, fp32 AdamW full training, $STEPS steps per run ($WARM untimed), $ROUNDS rounds, $THREADS threads"
echo "memfit:  ${CLEAN[*]} ${MF_CMD[*]} --metrics M.jsonl"
echo "pytorch: ${CLEAN[*]} LD_PRELOAD=$TCMALLOC ${PT_CMD[*]}"
for r in $(seq "$ROUNDS"); do
  "${CLEAN[@]}" "${MF_CMD[@]}" --metrics "$W/memfit.$r.jsonl" > "$W/memfit.$r.log" 2>&1 ||
    { cat "$W/memfit.$r.log" >&2; exit 1; }
  "${CLEAN[@]}" LD_PRELOAD="$TCMALLOC" "${PT_CMD[@]}" > "$W/torch.$r.json" 2> "$W/torch.$r.err" ||
    { cat "$W/torch.$r.err" >&2; exit 1; }
  /usr/bin/python3 - "$W" "$r" "$WARM" <<'PY'
import json, statistics, sys
w, r, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
L = [json.loads(l) for l in open("%s/memfit.%d.jsonl" % (w, r))]
t = json.loads(open("%s/torch.%d.json" % (w, r)).read().strip().splitlines()[-1])
mf = [m["tok_s"] for m in L[warm:]]
print("round %d: memfit  %8.1f tok/s (steps %s) peak RSS %.2f GiB" % (
    r, statistics.median(mf), " ".join("%.1f" % x for x in mf), L[-1]["rss_peak_bytes"] / 2**30))
print("round %d: pytorch %8.1f tok/s (steps %s) peak RSS %.2f GiB" % (
    r, statistics.median(t["tokens_per_s"]), " ".join("%.1f" % x for x in t["tokens_per_s"]), t["peak_rss_bytes"] / 2**30))
PY
done
echo "pytorch: torch $(/usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["torch"])' "$W/torch.1.json"), LD_PRELOAD $TCMALLOC"
grep -h '^model \|^BLAS' "$W/memfit.1.log" | sed 's/^/memfit:  /'
/usr/bin/python3 - "$W" "$ROUNDS" "$WARM" <<'PY'
import json, statistics, sys
w, rounds, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mf_tok, mf_rss, pt_tok, pt_rss = [], [], [], []
for r in range(1, rounds + 1):
    L = [json.loads(l) for l in open("%s/memfit.%d.jsonl" % (w, r))]
    mf_tok += [m["tok_s"] for m in L[warm:]]
    mf_rss.append(L[-1]["rss_peak_bytes"])
    t = json.loads(open("%s/torch.%d.json" % (w, r)).read().strip().splitlines()[-1])
    pt_tok += t["tokens_per_s"]
    pt_rss.append(t["peak_rss_bytes"])
m, p = statistics.median(mf_tok), statistics.median(pt_tok)
G = 2**30
print("%-8s %14s %14s" % ("system", "tokens/s (med)", "peak RSS"))
print("%-8s %14.1f %11.2f GiB" % ("memfit", m, max(mf_rss) / G))
print("%-8s %14.1f %11.2f GiB" % ("pytorch", p, max(pt_rss) / G))
sr, rr = m / p, max(mf_rss) / max(pt_rss)
print("ratio memfit/pytorch: tokens/s %.2fx (goal >= 1.5x: %s), peak RSS %.2fx (goal <= 0.75x: %s)" % (
    sr, "met" if sr >= 1.5 else "NOT met", rr, "met" if rr <= 0.75 else "NOT met"))
PY
echo "memfit memory report (round 1):"
sed -n '/^memory report/,$p' "$W/memfit.1.log" | grep -E 'memory report|predicted peak RSS|total|arena' | sed 's/^/  /'
