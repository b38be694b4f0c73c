#!/usr/bin/env bash
# memfit against a minimal PyTorch GPT-2 (bench/torch_gpt2.py, Debian's
# python3-torch on the system OpenBLAS, libtcmalloc_minimal preloaded: see
# bench/torch_env.sh), same model, batch, data and thread count, alternating
# A B A B in one run. Prints each one's median tokens/s and peak RSS and the
# ratio.
#   bench/compare_torch.sh [MODEL] [BATCH] [SEQ]    (default gpt2-124m 4 256)
#   STEPS=8 ROUNDS=2 THREADS=2 bench/compare_torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-8}; ROUNDS=${ROUNDS:-2}; THREADS=${THREADS:-2}; WARM=2
M=build/memfit
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
TOK=$CACHE/moby-dick.gpt2.tok
[ -x "$M" ] || { echo "compare_torch: build memfit first (make)" >&2; exit 1; }
[ -f "$TOK" ] || "$M" tokenize "$CACHE/moby-dick.txt" "$TOK" >/dev/null
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT

# PyTorch in its best set-up (tcmalloc preloaded), OPENBLAS_* unset for both
source bench/torch_env.sh

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
echo "config:  $MODEL batch $B seq $T, $STEPS steps per run ($WARM untimed), $ROUNDS rounds, $THREADS threads, fp32 AdamW"
for r in $(seq "$ROUNDS"); do
  "${CLEAN[@]}" "$M" train --model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --data "$TOK" \
    --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --metrics "$W/memfit.$r.jsonl" > "$W/memfit.$r.log"
  env "${TORCH_ENV[@]}" /usr/bin/python3 bench/torch_gpt2.py --model "$MODEL" --batch "$B" --seq "$T" \
    --steps "$STEPS" --warmup-steps "$WARM" --threads "$THREADS" --tokens "$TOK" > "$W/torch.$r.json"
done
grep -h '^BLAS' "$W/memfit.1.log" | sed 's/^/memfit   /'
echo "pytorch  torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), env ${TORCH_ENV[*]}"
/usr/bin/python3 - "$W" "$ROUNDS" "$WARM" <<'PY'
import json, statistics, sys
w, rounds, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mf_tok, mf_rss, pt_tok, pt_rss = [], [], [], []
for r in range(1, rounds + 1):
    L = [json.loads(l) for l in open("%s/memfit.%d.jsonl" % (w, r))]
    mf_tok += [m["tok_s"] for m in L[warm:]]
    mf_rss.append(L[-1]["rss_peak_bytes"])
    t = json.loads(open("%s/torch.%d.json" % (w, r)).read().strip().splitlines()[-1])
    pt_tok += [t["tokens_per_s_median"]]
    pt_rss.append(t["peak_rss_bytes"])
m, p = statistics.median(mf_tok), statistics.median(pt_tok)
G = 2**30
print("%-8s %14s %14s" % ("system", "tokens/s (med)", "peak RSS"))
print("%-8s %14.1f %11.2f GiB" % ("memfit", m, max(mf_rss) / G))
print("%-8s %14.1f %11.2f GiB" % ("pytorch", p, max(pt_rss) / G))
print("ratio memfit/pytorch: tokens/s %.2fx, peak RSS %.2fx" % (m / p, max(mf_rss) / max(pt_rss)))
PY
