#!/usr/bin/env bash
# Data parallel over Open MPI: one process against np ranks with ZeRO
# stages 0-3, on one model. Prints each rank's planned arena, its model
# states (persistent params + grads + optimizer, from memfit estimate), peak
# RSS of the largest rank, median tokens/s of the job (global batch), and
# the ratios to stage 0. Every run trains the same global batch.
#   bench/zero.sh [MODEL] [BATCH] [SEQ] [NP]      (default gpt2-10m 8 256 2)
# THREADS is per rank; on a machine with fewer cores than NP x THREADS the
# ranks share cores and tokens/s shows it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-10m}; B=${2:-8}; T=${3:-256}; NP=${4:-2}
STEPS=${STEPS:-4}; THREADS=${THREADS:-1}
M=build/memfit
. tests/mpi_env.sh
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS" --sample_tokens 0
        --val_every 0 --val_batches 1 --progress 0)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(mpirun --version | head -1)"
echo "config:  $MODEL global batch $B seq $T, $STEPS steps per run (first untimed), $THREADS thread(s) per rank, np=$NP"
echo "command: ${MPIRUN[*]} -np $NP $M train ${common[*]} --zero S"
"$M" train "${common[@]}" --threads $((THREADS * NP)) --metrics "$W/single.jsonl" > /dev/null
"$M" estimate "${common[@]}" --json > "$W/single.est"
for z in 0 1 2 3; do
  "${MPIRUN[@]}" -np "$NP" "$M" train "${common[@]}" --zero $z --metrics "$W/z$z.jsonl" > /dev/null
  "$M" estimate "${common[@]}" --world-size "$NP" --zero $z --json > "$W/z$z.est"
done
/usr/bin/python3 - "$W" "$NP" <<'PY'
import glob, json, statistics, sys
w, NP = sys.argv[1], int(sys.argv[2])
def run(name):
    files = sorted(glob.glob(f"{w}/{name}.jsonl*"))
    L = [json.loads(l) for l in open(files[0])]
    rss = max(json.loads(open(f).read().splitlines()[-1])["rss_peak_bytes"] for f in files)
    e = json.load(open(f"{w}/{name}.est"))
    return e["arena"], sum(e["model_states"].values()), rss, statistics.median(m["tok_s"] for m in L[1:])
rows = [("1 process", run("single"))] + [(f"np={NP} zero {z}", run(f"z{z}")) for z in range(4)]
base = rows[1][1]
print("%-14s %12s %14s %8s %14s %8s %10s %7s" % ("run", "arena/rank", "states/rank", "vs z0", "peak RSS/rank", "vs z0", "tokens/s", "vs z0"))
for n, (a, s, r, t) in rows:
    print("%-14s %8.1f MiB %10.1f MiB %7.3fx %10.1f MiB %7.3fx %10.1f %6.2fx" % (
        n, a / 2**20, s / 2**20, s / base[1], r / 2**20, r / base[2], t, t / base[3]))
PY
