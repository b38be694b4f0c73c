#!/usr/bin/env bash
# SIGTERM or SIGINT to an mpirun job (np 2; mpirun turns either into SIGTERM
# to every rank, and SIGKILL odls_base_sigkill_timeout = 1 s later): every
# rank finishes the step in progress, the ranks agree on that step through a
# tiny all-reduce of the stop flag at the step boundary, the checkpoint is
# written (zero 0: by rank 0; zero 1: one shard file per rank), every rank
# exits 0, and the job prints one line naming the signal and the step;
# --resume auto then continues with the losses an uninterrupted np 2 run has.
# (mpirun itself exits non-zero: it was signalled.) The single-process
# version is test_cli_signals_resume; a rank that dies still stops the job
# with the launcher's message (test_dist_rank_death_stops_job).
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-dsig-XXXXXX)
job=""
trap '[ -n "$job" ] && kill -9 "$job" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
PY=/usr/bin/python3
head -c 60000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" > /dev/null
# constant lr: a run's losses do not depend on --steps
TINY="--model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 32 --seq 32 --batch 4 --data $W/c.tok
      --progress 0 --val_every 0 --sample_tokens 0 --threads 1 --warmup 0 --min_lr_frac 1"
# each rank under a shell that ignores SIGTERM (memfit installs its own
# handler) and records memfit's exit status; the ranks leave together after
# a barrier without MPI_Finalize (the signalled mpirun never completes it),
# and mpirun kills what is left once the first one has left
cat > "$W/rank.sh" <<'SH'
#!/bin/bash
trap '' TERM INT
"$@"
echo "rank $OMPI_COMM_WORLD_RANK exit $?" >> "$RANK_EXITS"
SH
chmod +x "$W/rank.sh"
losses() { $PY -c 'import json,sys; [print(d["step"], repr(d["loss"])) for d in map(json.loads, open(sys.argv[1])) if "loss" in d]' "$1"; }
stop_trial() {  # signal, name, zero
  local sig=$1 name=$2 z=$3
  export RANK_EXITS="$W/$name.exits"
  "${MPIRUN[@]}" -np 2 -x RANK_EXITS "$W/rank.sh" "$M" train $TINY --zero "$z" --steps 100000 --out_dir "$W/$name" \
    --metrics "$W/$name.jsonl" > "$W/$name.txt" 2> "$W/$name.err" &
  job=$!
  for _ in $(seq 600); do
    [ -f "$W/$name.jsonl" ] && [ "$(wc -l < "$W/$name.jsonl")" -ge 3 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  kill -"$sig" "$job"; wait "$job"; job=""
  n=$(sed -n "s/^stopped by SIGTERM after step \([0-9]*\);.*/\1/p" "$W/$name.txt")
  # (a rank's wrapper may be killed by mpirun's teardown before it records;
  # every status recorded must be 0)
  check "$name: SIG$sig to mpirun: ranks exit 0 ($(sort "$RANK_EXITS" 2>/dev/null | tr '\n' ' '))" \
    "[ -s '$RANK_EXITS' ] && ! grep -v 'exit 0\$' '$RANK_EXITS' && ! grep -q 'exited on signal\|non-zero' '$W/$name.txt' '$W/$name.err'"
  check "$name: one line naming the step ($n), no error" \
    "[ -n '$n' ] && [ \$(grep -c '^stopped by' '$W/$name.txt') -eq 1 ] && ! grep -q 'error' '$W/$name.err'"
  check "$name: every rank's last step is step $n" \
    "[ \"\$(for f in '$W/$name.jsonl' '$W/$name.jsonl.rank1'; do tail -1 \$f | $PY -c 'import json,sys; print(json.load(sys.stdin)[\"step\"])'; done | tr '\n' ' ')\" = '$n $n ' ]"
}
stop_trial TERM z0 0
check "z0: rank 0 wrote the checkpoint, no final model, no temp file" \
  "[ -f '$W/z0/checkpoint.safetensors' ] && [ ! -e '$W/z0/model.safetensors' ] && [ -z \"\$(ls '$W/z0' | grep '\.tmp\.')\" ]"
N=${n:-0}
"${MPIRUN[@]}" -np 2 "$M" train $TINY --zero 0 --steps $((N + 3)) --out_dir "$W/z0" --resume auto --metrics "$W/z0r.jsonl" > "$W/z0r.txt" 2>&1
check "z0: resume auto under mpirun: exit 0, resumes from the checkpoint" \
  "[ $? -eq 0 ] && grep -q '^resume auto: resuming from $W/z0/checkpoint.safetensors' '$W/z0r.txt'"
"${MPIRUN[@]}" -np 2 "$M" train $TINY --zero 0 --steps $((N + 3)) --metrics "$W/ref.jsonl" > "$W/ref.txt" 2>&1
check "z0: steps $((N + 1))-$((N + 3)) have the uninterrupted np 2 run's losses" \
  "[ \$(losses '$W/z0r.jsonl' | wc -l) -eq 3 ] && cmp -s <(losses '$W/ref.jsonl' | tail -3) <(losses '$W/z0r.jsonl')"
stop_trial INT z1 1
check "z1: one checkpoint shard per rank, no final model" \
  "[ -f '$W/z1/checkpoint.rank0-of-2.safetensors' ] && [ -f '$W/z1/checkpoint.rank1-of-2.safetensors' ] && [ ! -e '$W/z1/model.safetensors' ]"
exit $fail
