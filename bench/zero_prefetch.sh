#!/usr/bin/env bash
# ZeRO stage 3: the next block's parameter gather overlapped with this
# block's compute (default) against gathering each block when it starts
# (MEMFIT_ZERO_PREFETCH=0). Alternates A B A B for ROUNDS rounds and prints
# each one's median tokens/s, the ratio, and peak RSS of the largest rank.
#   bench/zero_prefetch.sh [MODEL] [BATCH] [SEQ] [NP]   (default gpt2-10m 8 256 2)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-10m}; B=${2:-8}; T=${3:-256}; NP=${4:-2}
STEPS=${STEPS:-6}; ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-1}
M=build/memfit
. tests/mpi_env.sh
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --sample_tokens 0
        --val_every 0 --val_batches 1 --progress 0 --zero 3)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: ${MPIRUN[*]} -np $NP $M train ${common[*]}  (B: MEMFIT_ZERO_PREFETCH=0)"
for r in $(seq "$ROUNDS"); do
  "${MPIRUN[@]}" -np "$NP" "$M" train "${common[@]}" --metrics "$W/on$r.jsonl" > /dev/null
  MEMFIT_ZERO_PREFETCH=0 "${MPIRUN[@]}" -np "$NP" "$M" train "${common[@]}" --metrics "$W/off$r.jsonl" > /dev/null
done
/usr/bin/python3 - "$W" "$ROUNDS" <<'PY'
import glob, json, statistics, sys
w, R = sys.argv[1], int(sys.argv[2])
def stats(kind):
    tok, rss, arena = [], 0, 0
    for r in range(1, R + 1):
        files = sorted(glob.glob(f"{w}/{kind}{r}.jsonl*"))
        L = [json.loads(l) for l in open(files[0])]
        tok += [m["tok_s"] for m in L[1:]]          # the first step is untimed
        for f in files:
            last = json.loads(open(f).read().splitlines()[-1])
            rss, arena = max(rss, last["rss_peak_bytes"]), max(arena, last["arena_bytes"])
    return statistics.median(tok), rss, arena
a, b = stats("on"), stats("off")
print("%-22s %10s %14s %12s" % ("stage 3", "tokens/s", "peak RSS/rank", "arena/rank"))
for n, (t, r, ar) in (("prefetch (A)", a), ("gather at use (B)", b)):
    print("%-22s %10.1f %10.1f MiB %8.1f MiB" % (n, t, r / 2**20, ar / 2**20))
print("A/B tokens/s: %.3fx; arena +%.1f MiB (one block's parameters)" % (a[0] / b[0], (a[2] - b[2]) / 2**20))
PY
