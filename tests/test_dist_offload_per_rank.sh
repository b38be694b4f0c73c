#!/usr/bin/env bash
# Optimizer state offloaded to disk under mpirun: each rank streams a file
# of its own (PATH.rank<r>) holding only the state it keeps: the whole
# state at ZeRO 0, its shard at stages 1-3. np 2 with --offload gives the
# losses and weights of np 2 without it bit for bit at every stage (the
# offload streams the same element-wise AdamW over the same elements
# through its windows), each rank's ledger equals its plan with no
# optimizer state in the arena, both rank files existed during the run,
# each of the size of the optimizer state that rank holds without offload,
# and are removed at the end. A stage 3 run stopped after 2 steps and
# resumed with offload (the shard's state read back from the rank's
# checkpoint into its file) ends with the uninterrupted run's weights.
# A rank whose file is another rank's (PATH.rank1 a link to PATH.rank0) is
# refused with one line.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-dist-offload-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ARGS=(--model gpt2-1m --batch 4 --seq 64 --steps 3 --threads 1 --sample_tokens 0 --val_every 0 --progress 0)
for z in 0 1 2 3; do
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero $z --out_dir "$W/plain$z" --metrics "$W/plain$z.jsonl" \
    > "$W/plain$z.log" 2>&1 || { echo "FAIL np 2 zero $z without offload"; tail -3 "$W/plain$z.log"; fail=1; continue; }
  # a watcher records which files exist, and their sizes, while the run goes
  rm -f "$W/seen$z.txt"
  ( for i in $(seq 1 600); do (cd "$W" && stat -c '%n %s' state$z.bin* >> "$W/seen$z.txt" 2>/dev/null); sleep 0.05; done ) &
  watch=$!
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero $z --offload "optimizer=disk:$W/state$z.bin" --offload_window 64KiB \
    --out_dir "$W/off$z" --metrics "$W/off$z.jsonl" > "$W/off$z.log" 2>&1 \
    || { echo "FAIL np 2 zero $z with offload"; tail -3 "$W/off$z.log"; fail=1; }
  kill $watch 2>/dev/null; wait $watch 2>/dev/null
  if cmp <(grep -o '"loss":[^,]*' "$W/plain$z.jsonl") <(grep -o '"loss":[^,]*' "$W/off$z.jsonl") >/dev/null \
     && cmp "$W/plain$z/model.safetensors" "$W/off$z/model.safetensors" >/dev/null; then
    echo "ok   np 2 zero $z: offload on and off give identical losses and weights"
  else
    echo "FAIL np 2 zero $z: offload changed the results"; fail=1
  fi
  /usr/bin/python3 - "$W" "$z" <<'PY' || fail=1
import json, sys
w, z = sys.argv[1], sys.argv[2]
ok = True
sizes = {}
for line in open(f"{w}/seen{z}.txt"):
    name, size = line.split()
    sizes.setdefault(name, set()).add(int(size))
base0 = json.loads(open(f"{w}/plain0.jsonl").read().splitlines()[-1])["mem_optim"]
for r in range(2):
    sfx = f".rank{r}" if r else ""
    m = json.loads(open(f"{w}/off{z}.jsonl{sfx}").read().splitlines()[-1])
    p = json.loads(open(f"{w}/plain{z}.jsonl{sfx}").read().splitlines()[-1])
    f = sizes.get(f"state{z}.bin.rank{r}", set())
    # the state left the arena; the rank's file holds exactly the state it keeps (a shard at stages 1-3)
    good = (m["ledger_peak_bytes"] == m["planned_peak_bytes"] and m["mem_optim"] == 0 and p["mem_optim"] > 0
            and f == {p["mem_optim"]} and (z == "0" or p["mem_optim"] < base0))
    ok &= good
    print("%s zero %s rank %d with offload: ledger %d == plan %d; optimizer state in the arena %d bytes; file "
          "state%s.bin.rank%d %s bytes == the state it holds without offload %d (zero 0: %d)" % (
          "ok  " if good else "FAIL", z, r, m["ledger_peak_bytes"], m["planned_peak_bytes"], m["mem_optim"], z, r,
          "/".join(map(str, sorted(f))) or "never seen", p["mem_optim"], base0))
others = sorted(n for n in sizes if n not in (f"state{z}.bin.rank0", f"state{z}.bin.rank1"))
if others:
    print("FAIL zero %s: other offload files: %s" % (z, others))
    ok = False
sys.exit(0 if ok else 1)
PY
  if [ -e "$W/state$z.bin.rank0" ] || [ -e "$W/state$z.bin.rank1" ]; then
    echo "FAIL zero $z: a rank file was left behind"; fail=1
  else
    echo "ok   zero $z: the rank files are removed at the end"
  fi
done
# stage 3 stopped after 2 steps, resumed with offload to step 3: the shard's
# state goes from each rank's checkpoint into its file and back
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero 3 --steps 2 --offload "optimizer=disk:$W/res.bin" --offload_window 64KiB \
  --out_dir "$W/res" > "$W/res1.log" 2>&1 \
  && "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero 3 --resume auto --offload "optimizer=disk:$W/res.bin" \
       --offload_window 64KiB --out_dir "$W/res" > "$W/res2.log" 2>&1 \
  || { echo "FAIL zero 3 offload resume: a run failed"; tail -3 "$W/res1.log" "$W/res2.log"; fail=1; }
if cmp "$W/res/model.safetensors" "$W/plain3/model.safetensors" >/dev/null; then
  echo "ok   zero 3 with offload stopped after 2 steps and resumed: the weights of 3 uninterrupted steps"
else
  echo "FAIL zero 3 with offload resumed: weights differ from the uninterrupted run"; fail=1
fi
# two ranks on one file: refused with one line
touch "$W/shared.bin.rank0"; ln -s "$W/shared.bin.rank0" "$W/shared.bin.rank1"
"${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --zero 0 --offload "optimizer=disk:$W/shared.bin" > "$W/shared.log" 2>&1
if [ $? -ne 0 ] && grep -q "memfit: error: rank [01]: offload file .*shared.bin.rank[01] is the same file as rank [01]'s" "$W/shared.log"; then
  echo "ok   a rank whose offload file is another rank's is refused: $(grep -m1 'memfit: error' "$W/shared.log")"
else
  echo "FAIL shared offload file not refused"; tail -3 "$W/shared.log"; fail=1
fi
exit $fail
