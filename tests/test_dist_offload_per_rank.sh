#!/usr/bin/env bash
# Optimizer state offloaded to disk under mpirun: each rank streams a file
# of its own (PATH.rank<r>). np 2 --zero 0 with --offload gives the losses
# and weights of np 2 without it bit for bit (every rank runs the same
# update on the same all-reduced gradient; the offload streams the same
# element-wise AdamW through its windows), each rank's ledger equals its
# plan, both rank files existed during the run and are removed at the end.
# A rank whose file is another rank's (PATH.rank1 a link to PATH.rank0) is
# refused with one line; so is offload with ZeRO stages 1-3 (the file holds
# whole tensors' state, not shards).
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-dist-offload-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ARGS=(--model gpt2-1m --batch 4 --seq 64 --steps 3 --threads 1 --zero 0 --sample_tokens 0 --val_every 0 --progress 0)
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --out_dir "$W/plain" --metrics "$W/plain.jsonl" > "$W/plain.log" 2>&1 \
  || { echo "FAIL np 2 without offload"; tail -3 "$W/plain.log"; fail=1; }
# a watcher records which files exist while the run goes
( for i in $(seq 1 600); do ls "$W" >> "$W/seen.txt" 2>/dev/null; sleep 0.05; done ) &
watch=$!
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --offload "optimizer=disk:$W/state.bin" --offload_window 64KiB \
  --out_dir "$W/off" --metrics "$W/off.jsonl" > "$W/off.log" 2>&1 \
  || { echo "FAIL np 2 with offload"; tail -3 "$W/off.log"; fail=1; }
kill $watch 2>/dev/null; wait $watch 2>/dev/null
if cmp <(grep -o '"loss":[^,]*' "$W/plain.jsonl") <(grep -o '"loss":[^,]*' "$W/off.jsonl") >/dev/null \
   && cmp "$W/plain/model.safetensors" "$W/off/model.safetensors" >/dev/null; then
  echo "ok   np 2 zero 0: offload on and off give identical losses and weights"
else
  echo "FAIL np 2 zero 0: offload changed the results"; fail=1
fi
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
ok = True
for r in ("", ".rank1"):
    m = json.loads(open(f"{w}/off.jsonl{r}").read().splitlines()[-1])
    p = json.loads(open(f"{w}/plain.jsonl{r}").read().splitlines()[-1])
    # the state left the arena: no optim bytes at the peak with offload
    good = m["ledger_peak_bytes"] == m["planned_peak_bytes"] and m["mem_optim"] == 0 and p["mem_optim"] > 0
    ok &= good
    print("%s rank %s with offload: ledger %d == plan %d; optimizer state in the arena %d bytes (without offload %d)" % (
        "ok  " if good else "FAIL", r[-1:] or "0", m["ledger_peak_bytes"], m["planned_peak_bytes"], m["mem_optim"],
        p["mem_optim"]))
sys.exit(0 if ok else 1)
PY
if grep -qx "state.bin.rank0" "$W/seen.txt" && grep -qx "state.bin.rank1" "$W/seen.txt" && ! grep -qx "state.bin" "$W/seen.txt" \
   && [ ! -e "$W/state.bin.rank0" ] && [ ! -e "$W/state.bin.rank1" ]; then
  echo "ok   each rank streamed its own file (state.bin.rank0, state.bin.rank1), removed at the end"
else
  echo "FAIL rank files: seen $(sort -u "$W/seen.txt" | grep state | tr '\n' ' ')"; fail=1
fi
# two ranks on one file: refused with one line
touch "$W/shared.bin.rank0"; ln -s "$W/shared.bin.rank0" "$W/shared.bin.rank1"
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --offload "optimizer=disk:$W/shared.bin" > "$W/shared.log" 2>&1
if [ $? -ne 0 ] && grep -q "memfit: error: rank [01]: offload file .*shared.bin.rank[01] is the same file as rank [01]'s" "$W/shared.log"; then
  echo "ok   a rank whose offload file is another rank's is refused: $(grep -m1 'memfit: error' "$W/shared.log")"
else
  echo "FAIL shared offload file not refused"; tail -3 "$W/shared.log"; fail=1
fi
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero 1 --offload "optimizer=disk:$W/z1.bin" > "$W/z1.log" 2>&1
if [ $? -ne 0 ] && grep -q "memfit: error: offload with zero 1 over 2 ranks" "$W/z1.log"; then
  echo "ok   offload with zero 1 is refused with one line"
else
  echo "FAIL offload with zero 1 not refused"; tail -3 "$W/z1.log"; fail=1
fi
exit $fail
