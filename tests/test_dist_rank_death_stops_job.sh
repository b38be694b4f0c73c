#!/usr/bin/env bash
# A rank killed mid-step makes the others stop, non-zero, with a message,
# within 30 s; a rank that hangs (stopped, as an unreachable host looks)
# makes them stop after dist_timeout: never a hang in a collective.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-death-XXXXXX)
trap 'rm -rf "$W"' EXIT
trial() {  # signal, extra flags, expected message
  local sig=$1 extra=$2 want=$3
  "${MPIRUN[@]}" -np 2 "$M" train --model gpt2-1m --batch 4 --seq 128 --steps 100000 --zero 1 --threads 1 \
    --sample_tokens 0 --val_every 0 --progress 0 $extra > "$W/out" 2> "$W/err" &
  local job=$! victim="" p
  # wait for training to start, then signal rank 1 (the memfit whose launcher rank is 1)
  for _ in $(seq 1 100); do
    for p in $(pgrep -f "$M train --model gpt2-1m --batch 4 --seq 128 --steps 100000"); do
      [ "$p" = "$job" ] && continue
      tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
    done
    [ -n "$victim" ] && grep -q "step" "$W/out" && break
    sleep 0.1
  done
  [ -n "$victim" ] || { echo "FAIL $sig: rank 1 never started"; cat "$W/err"; kill "$job" 2>/dev/null; fail=1; return; }
  local t0; t0=$(date +%s.%N)
  kill -"$sig" "$victim"
  for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then
    echo "FAIL $sig: the job still runs 30 s after rank 1 got SIG$sig"; kill -9 "$victim" "$job"; fail=1; return
  fi
  wait "$job"; local rc=$?
  local dt; dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  if [ $rc -ne 0 ] && grep -q "$want" "$W/err"; then
    echo "ok   SIG$sig to rank 1: job exited $rc after ${dt}s with: $(grep "$want" "$W/err" | head -1)"
  else echo "FAIL SIG$sig: exit $rc after ${dt}s"; cat "$W/err"; fail=1; fi
}
fail=0
trial KILL "" "stopped by the MPI launcher"
trial STOP "--dist_timeout 5" "no progress for"
exit $fail
