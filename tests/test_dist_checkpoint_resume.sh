#!/usr/bin/env bash
# Checkpoints under data parallelism: with ZeRO 0 rank 0 writes the one
# file; with ZeRO >= 1 each rank writes its own file atomically; resuming on the same number of ranks continues bit-identically
# (the same losses as an uninterrupted run); memfit convert joins the shards
# into one checkpoint that a single process resumes from; a shard given to
# the wrong run is refused with a message.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-zckpt-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
base=(--model gpt2-1m --batch 4 --seq 64 --sample_tokens 0 --val_every 0 --val_batches 1 --threads 1 --progress 0 --warmup 2)
losses() { grep -o '"loss":[^,]*' "$1" | tail -n "$2"; }
for z in 0 1 3; do
  "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero $z --steps 6 --metrics "$W/full$z.jsonl" > "$W/log" 2>&1 \
    || { echo "FAIL zero $z: uninterrupted run"; tail -3 "$W/log"; fail=1; continue; }
  "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero $z --steps 3 --out_dir "$W/ck$z" > "$W/log" 2>&1 \
    || { echo "FAIL zero $z: first half"; tail -3 "$W/log"; fail=1; continue; }
  if [ $z -eq 0 ]; then  # nothing sharded: rank 0 writes the one file every rank resumes from
    [ -s "$W/ck$z/checkpoint.safetensors" ] || { echo "FAIL zero 0: no checkpoint"; fail=1; }
  else
    for r in 0 1; do
      [ -s "$W/ck$z/checkpoint.rank$r-of-2.safetensors" ] || { echo "FAIL zero $z: no shard of rank $r"; fail=1; }
    done
    [ -e "$W/ck$z/checkpoint.safetensors" ] && { echo "FAIL zero $z: an unsharded checkpoint was written too"; fail=1; }
  fi
  [ -s "$W/ck$z/model.safetensors" ] || { echo "FAIL zero $z: no consolidated model.safetensors"; fail=1; }
  "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero $z --steps 6 --resume "$W/ck$z/checkpoint.safetensors" \
    --metrics "$W/res$z.jsonl" > "$W/log" 2>&1 || { echo "FAIL zero $z: resume"; tail -3 "$W/log"; fail=1; continue; }
  if [ "$(losses "$W/full$z.jsonl" 3)" = "$(losses "$W/res$z.jsonl" 3)" ]; then
    echo "ok   zero $z: resumed on 2 ranks, steps 4-6 bit-identical to the uninterrupted run"
  else echo "FAIL zero $z: resumed losses differ"; paste <(losses "$W/full$z.jsonl" 3) <(losses "$W/res$z.jsonl" 3); fail=1; fi
  [ $z -eq 0 ] && continue
  # join the shards; one process resumes from the joined file
  "$M" convert "$W/ck$z/checkpoint.safetensors" "$W/joined$z.safetensors" > "$W/log" 2>&1 \
    || { echo "FAIL zero $z: convert"; cat "$W/log"; fail=1; continue; }
  "$M" train "${base[@]}" --steps 6 --resume "$W/joined$z.safetensors" --metrics "$W/one$z.jsonl" > "$W/log" 2>&1 \
    || { echo "FAIL zero $z: single-process resume from the joined checkpoint"; tail -3 "$W/log"; fail=1; continue; }
  /usr/bin/python3 - "$W/full$z.jsonl" "$W/one$z.jsonl" $z <<'PY' || fail=1
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])][-3:]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])][-3:]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
ok = len(a) == len(b) == 3 and d <= 1e-6
print("%s zero %s: memfit convert, then one process resumes: steps 4-6 within %.2e relative of the 2-rank run" % (
    "ok  " if ok else "FAIL", sys.argv[3], d))
sys.exit(0 if ok else 1)
PY
done
# a shard resumed without its ranks, and a single file given to a sharded run
out=$("$M" train "${base[@]}" --steps 6 --resume "$W/ck1/checkpoint.rank0-of-2.safetensors" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "one shard of a checkpoint over 2 ranks"; then echo "ok   shard without mpirun refused: $out"
else echo "FAIL shard without mpirun: rc $rc: $out"; fail=1; fi
out=$("${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero 1 --steps 6 --resume "$W/joined1.safetensors" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "single-file checkpoint; this run shards its state over 2 ranks"; then
  echo "ok   single-file checkpoint under zero 1 refused"
else echo "FAIL single file under zero 1: rc $rc: $out"; fail=1; fi
out=$("$M" convert "$W/nothing.safetensors" "$W/x.safetensors" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "no shard files"; then echo "ok   convert without shards refused"
else echo "FAIL convert without shards: rc $rc: $out"; fail=1; fi
exit $fail
