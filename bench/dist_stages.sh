#!/usr/bin/env bash
# Data parallel per ZeRO stage: np 2 (one core and one thread each) against
# np 1 (two threads), over shared memory and over TCP (--mca btl tcp,self,
# loopback: the stand-in for two nodes). Per stage and transport: median
# tokens/s (steps after the first), rank 0's planned bytes, the bytes each
# rank's collectives moved per step (measured, --metrics comm_bytes) beside
# memfit plan's formula (mf_zero_comm_volume), and the share of the
# communication hidden behind compute ((comm_bg_s - comm_wait_s) /
# (comm_sync_s + comm_bg_s), the background thread's seconds not waited for).
#   bench/dist_stages.sh [MODEL] [BATCH] [SEQ]     (default gpt2-124m 4 256)
#   STEPS=4 STAGES="0 1 2 3" TRANSPORTS="shm tcp" bench/dist_stages.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2-124m}; B=${2:-4}; T=${3:-256}
STEPS=${STEPS:-4}; STAGES=${STAGES:-"0 1 2 3"}; TRANSPORTS=${TRANSPORTS:-"shm tcp"}
M=${MEMFIT_BIN:-build/memfit}
. tests/mpi_env.sh
TCP=(mpirun --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo)
[ "$(id -u)" -eq 0 ] && TCP+=(--allow-run-as-root)
W=$(mktemp -d /tmp/memfit-stages-XXXXXX)
trap 'rm -rf "$W"' EXIT
common=(--model "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --sample_tokens 0 --val_every 0 --progress 0)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(mpirun --version | head -1)"
echo "config:  $MODEL global batch $B seq $T, $STEPS steps per run (first untimed)"
echo "np 1:    $M train ${common[*]} --threads 2"
echo "np 2:    ${MPIRUN[*]} -np 2 $M train ${common[*]} --threads 1 --zero S   (tcp: ${TCP[*]})"
"$M" train "${common[@]}" --threads 2 --metrics "$W/np1.jsonl" > /dev/null
for z in $STAGES; do
  "$M" plan --json "${common[@]}" --world_size 2 --zero "$z" --threads 1 > "$W/plan$z.json"
  for tr in $TRANSPORTS; do
    if [ "$tr" = tcp ]; then run=("${TCP[@]}"); else run=("${MPIRUN[@]}"); fi
    "${run[@]}" -np 2 "$M" train "${common[@]}" --threads 1 --zero "$z" --metrics "$W/$tr-z$z.jsonl" > /dev/null
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$W" "$STAGES" "$TRANSPORTS" <<'PY'
import json, statistics, sys
w, stages, transports = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = lambda f: [json.loads(l) for l in open(f)]
def tok(m): return statistics.median(x["tok_s"] for x in m[1:]) if len(m) > 1 else m[0]["tok_s"]
one = rows(f"{w}/np1.jsonl")
print("np 1 (2 threads): %.0f tok/s, planned %.1f MiB" % (tok(one), one[-1]["planned_peak_bytes"] / 2**20))
print("%-5s %-4s %9s %7s %12s %14s %14s %7s %8s" % ("stage", "net", "tok/s", "vs np1", "MiB/rank", "comm B/step", "formula", "meas/f", "hidden"))
for z in stages:
    plan = json.load(open(f"{w}/plan{z}.json"))
    f = plan["settings"][plan["chosen"]]["comm_bytes"]
    for tr in transports:
        m = rows(f"{w}/{tr}-z{z}.jsonl")
        # steps 2..N-1: the first and the last step also gather the weights (start, checkpoint)
        d = [m[i]["comm_bytes"] - m[i - 1]["comm_bytes"] for i in range(1, len(m))]
        per = statistics.median(d[:-1] if len(d) > 1 else d)
        last = m[-1]
        tot = last["comm_sync_s"] + last["comm_bg_s"]
        hid = (last["comm_bg_s"] - last["comm_wait_s"]) / tot if tot > 0 else 0
        print("%-5s %-4s %9.0f %6.2fx %12.1f %14.0f %14.0f %7.3f %7.0f%%" % (z, tr, tok(m), tok(m) / tok(one),
              last["planned_peak_bytes"] / 2**20, per, f, per / f, 100 * hid))
PY
