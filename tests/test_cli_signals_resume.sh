#!/usr/bin/env bash
# Interrupted runs, on a real small training run:
#  - SIGTERM / SIGINT: the step in progress finishes, a checkpoint is
#    written, exit 0 with one line naming the signal and the step;
#  - a second signal stops at once (exit 128+signal);
#  - --resume auto resumes from --out_dir's checkpoint (losses after the
#    resume equal an uninterrupted run's) or starts fresh when there is none;
#  - kill -9 at random moments of a run that checkpoints every step, then
#    --resume auto: always resumes, start-up removes the dead writers' temp
#    files (one line), none is left, and the losses equal an uninterrupted run's;
#  - a temp file whose pid is a live memfit is kept.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-sig-XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
PY=/usr/bin/python3

head -c 60000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" > /dev/null
# constant lr (no warm-up, no decay): a run's losses do not depend on --steps,
# so a run stopped early and resumed compares with an uninterrupted one
TINY="--model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 32 --seq 32 --batch 4 --data $W/c.tok
      --progress 0 --val_every 0 --sample_tokens 0 --threads 1 --warmup 0 --min_lr_frac 1"

# waits until FILE has at least N lines (a run's metrics), at most 60 s, or
# until the run (pid, optional third argument) has exited
wait_lines() {
  for _ in $(seq 600); do
    [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ] && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && return 1
    sleep 0.1
  done; return 1
}
# the loss of every metrics line, "step loss" per line
losses() { $PY -c 'import json,sys; [print(d["step"], repr(d["loss"])) for d in map(json.loads, open(sys.argv[1])) if "loss" in d]' "$1"; }

# ---- SIGTERM: finish the step, checkpoint, exit 0 -------------------------
"$M" train $TINY --steps 100000 --out_dir "$W/a" --metrics "$W/a.jsonl" > "$W/a.txt" 2>&1 &
pa=$!; pids+=($pa)
wait_lines "$W/a.jsonl" 3
kill -TERM $pa; wait $pa; rc=$?
check "SIGTERM: exit 0" "[ $rc -eq 0 ]"
n=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\);.*/\1/p' "$W/a.txt")
check "SIGTERM: one line naming the signal and the step" "[ -n '$n' ] && [ \$(grep -c '^stopped by' '$W/a.txt') -eq 1 ]"
check "SIGTERM: the last step in the metrics is the one named" "[ \"\$(tail -1 '$W/a.jsonl' | $PY -c 'import json,sys; print(json.load(sys.stdin)[\"step\"])')\" = '$n' ]"
check "SIGTERM: checkpoint written, no final model, no temp file" \
  "[ -f '$W/a/checkpoint.safetensors' ] && [ ! -e '$W/a/model.safetensors' ] && [ -z \"\$(ls '$W/a' | grep '\.tmp\.')\" ]"

# ---- --resume auto continues it; losses equal an uninterrupted run ---------
N=${n:-0}
"$M" train $TINY --steps $((N + 3)) --out_dir "$W/a" --resume auto --metrics "$W/a2.jsonl" > "$W/a2.txt" 2>&1
check "resume auto: exit 0 and says where it resumes from" "[ $? -eq 0 ] && grep -q '^resume auto: resuming from $W/a/checkpoint.safetensors' '$W/a2.txt'"
"$M" train $TINY --steps $((N + 3)) --metrics "$W/ref.jsonl" > "$W/ref.txt" 2>&1
losses "$W/ref.jsonl" | tail -3 > "$W/ref.l"
losses "$W/a2.jsonl" > "$W/a2.l"
check "resume auto: steps $((N + 1))-$((N + 3)) have the uninterrupted run's losses" \
  "[ \$(wc -l < '$W/a2.l') -eq 3 ] && cmp -s '$W/ref.l' '$W/a2.l'"
check "resume auto: the finished run writes its model" "[ -f '$W/a/model.safetensors' ]"

# ---- --resume auto without a checkpoint starts fresh; without --out_dir is an error
"$M" train $TINY --steps 2 --out_dir "$W/fresh" --resume auto > "$W/f.txt" 2>&1
check "resume auto, empty folder: starts fresh" "[ $? -eq 0 ] && grep -q 'no checkpoint in $W/fresh, starting fresh' '$W/f.txt' && grep -q '^step *2/2' '$W/f.txt'"
"$M" train $TINY --steps 2 --resume auto > "$W/g.txt" 2>&1
check "resume auto without --out_dir: one-line error" "[ $? -ne 0 ] && [ \$(wc -l < '$W/g.txt') -eq 1 ] && grep -q 'give --out_dir' '$W/g.txt'"

# ---- SIGINT without --out_dir: stops cleanly, says no checkpoint -----------
"$M" train $TINY --steps 100000 --metrics "$W/b.jsonl" > "$W/b.txt" 2>&1 &
pb=$!; pids+=($pb)
wait_lines "$W/b.jsonl" 2
kill -INT $pb; wait $pb; rc=$?
check "SIGINT: exit 0, no checkpoint without --out_dir" "[ $rc -eq 0 ] && grep -q '^stopped by SIGINT after step [0-9]*; no --out_dir' '$W/b.txt'"

# ---- a second signal stops at once -----------------------------------------
# a slower step (seq 128, batch 128: a second or more) so both signals land in
# the same step (with batch 32 a fast machine finished the step, wrote the
# checkpoint and exited before the second signal came, 0.2 s later)
"$M" train --model gpt2-1m --seq 128 --batch 128 --data "$W/c.tok" --progress 0 --val_every 0 --sample_tokens 0 \
  --threads 1 --steps 100000 --out_dir "$W/c" --metrics "$W/c.jsonl" > "$W/c.txt" 2>&1 &
pc=$!; pids+=($pc)
wait_lines "$W/c.jsonl" 1 || echo "FAIL the slow run did not start: $(cat "$W/c.txt")"
kill -TERM $pc; sleep 0.2; kill -TERM $pc; wait $pc; rc=$?  # apart: two pending signals merge into one
check "second SIGTERM: exits at once with 143 and says so" "[ $rc -eq 143 ] && grep -q 'second signal: stopping at once' '$W/c.txt' && ! grep -q '^stopped by' '$W/c.txt'"

# ---- kill -9 at random moments, --ckpt_every 1, then --resume auto ---------
# enough steps that five kills at random moments never reach the end of the
# run (with 40, a fast machine finished the run in the third round, the last
# kills hit nothing and each such round waited out wait_lines' 60 s)
STEPS=200
"$M" train $TINY --steps $STEPS --metrics "$W/full.jsonl" > /dev/null 2>&1
kills=0; resumed=0; removed=0
for k in 1 2 3 4 5; do
  "$M" train $TINY --steps $STEPS --ckpt_every 1 --out_dir "$W/k" --resume auto --metrics "$W/k$k.jsonl" > "$W/k$k.txt" 2>&1 &
  pk=$!; pids+=($pk)
  # a random moment after step 1's checkpoint (mostly inside a checkpoint write: they dominate these steps)
  wait_lines "$W/k$k.jsonl" 2 $pk
  sleep "0.0$((RANDOM % 10))"
  kill -9 $pk 2>/dev/null && kills=$((kills + 1)); wait $pk 2>/dev/null
  # a writer killed between open and rename leaves its temp file; make sure one is there each round
  [ -n "$(ls "$W/k" | grep '\.tmp\.')" ] || head -c 1000 "$W/k/checkpoint.safetensors" > "$W/k/checkpoint.safetensors.tmp.$pk" 2>/dev/null
  [ $k -gt 1 ] && grep -q '^resume auto: resuming from' "$W/k$k.txt" && resumed=$((resumed + 1))
  grep -q '^removed [0-9]* stale temp file' "$W/k$k.txt" && removed=$((removed + 1))
done
"$M" train $TINY --steps $STEPS --ckpt_every 1 --out_dir "$W/k" --resume auto --metrics "$W/kend.jsonl" > "$W/kend.txt" 2>&1
check "kill -9 x$kills: the last run resumes and finishes" "[ $? -eq 0 ] && [ $kills -eq 5 ] && grep -q '^resume auto: resuming from' '$W/kend.txt'"
check "kill -9: every restart resumed ($resumed of 4)" "[ $resumed -eq 4 ]"
check "kill -9: start-up removed the dead writers' temp files, in one line" \
  "[ $removed -eq 4 ] && grep -c '^removed [0-9]* stale temp file.*left by processes that are gone' '$W/kend.txt' | grep -qx 1"
check "kill -9: no temp file left" "[ -z \"\$(ls '$W/k' | grep '\.tmp\.')\" ]"
# the loss of each step, from the run that completed it last, equals the uninterrupted run's
$PY - "$W/full.jsonl" "$W" <<'PY' || fail=1
import glob, json, sys
full = {d["step"]: d["loss"] for d in map(json.loads, open(sys.argv[1])) if "loss" in d}
got = {}
files = sorted(glob.glob(sys.argv[2] + "/k[0-9].jsonl")) + [sys.argv[2] + "/kend.jsonl"]
for f in files:
    for line in open(f):
        try: d = json.loads(line)
        except ValueError: continue  # a line cut by kill -9
        if "loss" in d: got[d["step"]] = d["loss"]
bad = [s for s in full if got.get(s) != full[s]]
print(("ok   " if not bad and len(got) == len(full) else "FAIL ") +
      "kill -9: losses of all %d steps equal the uninterrupted run's%s" % (len(full), " (differ: %s)" % bad[:5] if bad else ""))
sys.exit(1 if bad or len(got) != len(full) else 0)
PY

# ---- a temp file of a live memfit is kept; of a live other program, removed
"$M" train $TINY --steps 100000 --metrics "$W/l.jsonl" > /dev/null 2>&1 &
pl=$!; pids+=($pl)
sleep 30 & ps_=$!; pids+=($ps_)
wait_lines "$W/l.jsonl" 1
mkdir -p "$W/live"
echo x > "$W/live/checkpoint.safetensors.tmp.$pl"
echo x > "$W/live/model.safetensors.tmp.$ps_"
echo x > "$W/live/notes.tmp.txt"
"$M" train $TINY --steps 1 --out_dir "$W/live" > "$W/live.txt" 2>&1
check "live memfit's temp kept, a non-memfit pid's removed, other names untouched" \
  "[ -f '$W/live/checkpoint.safetensors.tmp.$pl' ] && [ ! -e '$W/live/model.safetensors.tmp.$ps_' ] && [ -f '$W/live/notes.tmp.txt' ] && grep -q 'removed 1 stale temp file in $W/live' '$W/live.txt'"
kill -TERM $pl; wait $pl 2>/dev/null
kill $ps_ 2>/dev/null; wait $ps_ 2>/dev/null

[ $fail -eq 0 ] && echo "test_cli_signals_resume: ok"
exit $fail
