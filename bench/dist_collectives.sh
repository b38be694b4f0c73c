#!/usr/bin/env bash
# Open MPI's collectives (the default) against memfit's former rings of
# MPI_Sendrecv (MEMFIT_DIST_RING=1), same job, alternating A B A B in one
# run, per ZeRO stage. Prints the median tokens/s of each (steps after the
# first, over all rounds) and the ratio MPI / ring.
#   bench/dist_collectives.sh [MODEL] [BATCH] [SEQ] [NP]   (default gpt2-10m 8 128 2)
#   ROUNDS=3 STEPS=5 STAGES="0 2" BTL=tcp,self bench/dist_collectives.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-10m}; B=${2:-8}; T=${3:-128}; NP=${4:-2}
STEPS=${STEPS:-5}; ROUNDS=${ROUNDS:-3}; STAGES=${STAGES:-"0 1 2 3"}
M=${MEMFIT_BIN:-build/memfit}
. tests/mpi_env.sh
[ -n "${BTL:-}" ] && MPIRUN=(mpirun --oversubscribe --mca btl "$BTL") && [ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
W=$(mktemp -d /tmp/memfit-bench-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --threads 1 --sample_tokens 0
        --val_every 0 --progress 0)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(mpirun --version | head -1)"
echo "config:  $MODEL global batch $B seq $T, $STEPS steps per run (first untimed), np=$NP, 1 thread per rank, $ROUNDS rounds"
echo "command: ${MPIRUN[*]} -np $NP $M train ${common[*]} --zero S   [MEMFIT_DIST_RING=1 for the ring]"
for r in $(seq "$ROUNDS"); do
  for z in $STAGES; do
    for impl in mpi ring; do
      ring=0; [ $impl = ring ] && ring=1
      "${MPIRUN[@]}" -x MEMFIT_DIST_RING=$ring -np "$NP" "$M" train "${common[@]}" --zero "$z" \
        --metrics "$W/$impl-z$z-r$r.jsonl" > /dev/null
    done
  done
done
/usr/bin/python3 - "$W" "$STAGES" <<'PY'
import glob, json, statistics, sys
w, stages = sys.argv[1], sys.argv[2].split()
def tok(impl, z):
    v = []
    for f in glob.glob(f"{w}/{impl}-z{z}-r*.jsonl"):  # rank 0's file (others get .rankN)
        v += [json.loads(l)["tok_s"] for l in open(f).read().splitlines()[1:]]
    return statistics.median(v), len(v)
print("%-8s %14s %14s %10s" % ("stage", "MPI tok/s", "ring tok/s", "MPI/ring"))
for z in stages:
    (a, n), (b, _) = tok("mpi", z), tok("ring", z)
    print("zero %-3s %14.1f %14.1f %9.3fx   (median of %d steps each)" % (z, a, b, a / b, n))
PY
