#!/usr/bin/env bash
# Two ranks forced onto Open MPI's TCP transport over loopback (--mca btl
# tcp,self), as a stand-in for two nodes: ZeRO stages 1 and 3 give the
# single-process losses within 1e-6 relative over 4 steps, and the same
# losses bit for bit as over shared memory (the collectives' arithmetic does
# not depend on the transport); each rank's ledger equals its plan.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
TCP=(mpirun --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
[ "$(id -u)" -eq 0 ] && TCP+=(--allow-run-as-root)
W=$(mktemp -d /tmp/memfit-tcp-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
base=(--model gpt2-1m --batch 4 --seq 64 --steps 4 --sample_tokens 0 --val_every 0 --threads 1 --progress 0)
"$M" train "${base[@]}" --out_dir "$W/single" --metrics "$W/single.jsonl" > "$W/single.log" 2>&1 \
  || { echo "FAIL single: train failed"; tail -3 "$W/single.log"; fail=1; }
for z in 1 3; do
  "${TCP[@]}" -np 2 "$M" train "${base[@]}" --zero $z --out_dir "$W/tcp$z" --metrics "$W/tcp$z.jsonl" > "$W/tcp$z.log" 2>&1 \
    || { echo "FAIL tcp zero $z: mpirun failed"; grep -m3 error "$W/tcp$z.log"; tail -5 "$W/tcp$z.log"; fail=1; continue; }
  "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero $z --out_dir "$W/shm$z" --metrics "$W/shm$z.jsonl" > "$W/shm$z.log" 2>&1 \
    || { echo "FAIL shm zero $z: mpirun failed"; grep -m3 error "$W/shm$z.log"; fail=1; continue; }
  /usr/bin/python3 - "$W" $z <<'PY' || fail=1
import json, sys
w, z = sys.argv[1], sys.argv[2]
rows = lambda f: [json.loads(l) for l in open(f"{w}/{f}")]
s, t, m = rows("single.jsonl"), rows(f"tcp{z}.jsonl"), rows(f"shm{z}.jsonl")
rel = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(s, t))
same = [a["loss"] for a in t] == [b["loss"] for b in m]
led = all(r[-1]["ledger_peak_bytes"] == r[-1]["planned_peak_bytes"] for r in (t, rows(f"tcp{z}.jsonl.rank1")))
ok = len(t) == len(s) == 4 and rel <= 1e-6 and same and led
print("%s TCP over loopback, zero %s: max rel loss diff vs one process %.2e; losses %s shared memory's; ledger %s plan" % (
    "ok  " if ok else "FAIL", z, rel, "identical to" if same else "DIFFER from", "==" if led else "!="))
sys.exit(0 if ok else 1)
PY
done
exit $fail
