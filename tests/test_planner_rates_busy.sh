#!/usr/bin/env bash
# A calibration taken while other processes use the cores its threads need
# measures a slower machine than the one that trains (here: GEMM 13-132
# against 191 GFLOP/s idle). memfit counts what the rest of the machine
# used during the calibration (/proc/stat less its own CPU time), keeps the
# figure in the rates cache (busy_cores), says so in `memfit plan`, and
# the next plan measures the rates again instead of reusing
# them. Here: one busy loop per core beside `plan --recalibrate`; then,
# the loops stopped, a plain `plan` must calibrate anew.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-busy-XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$W"' EXIT
export MEMFIT_CACHE=$W
fail=0
[ -r /proc/stat ] || { echo "SKIP no /proc/stat: busy calibrations cannot be told apart here"; exit 0; }
for _ in $(seq "$(nproc)"); do sh -c 'while :; do :; done' & pids+=($!); done
"$M" plan --model gpt2-1m --recalibrate > "$W/busy.txt" 2>&1 || { echo "FAIL plan under load"; cat "$W/busy.txt"; exit 1; }
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
busy=$(awk '/^busy_cores/ {print $2}' "$W"/rates-v12-*.txt)
if grep -q "^note: other processes used .* cores while the rates were measured" "$W/busy.txt" &&
   awk -v b="$busy" 'BEGIN {exit !(b > 0.25)}'; then
  echo "ok   under load: busy_cores $busy in the cache and the note printed"
else
  echo "FAIL under load: busy_cores '$busy', output:"; sed -n 1,3p "$W/busy.txt"; fail=1
fi
"$M" plan --model gpt2-1m > "$W/after.txt" 2>&1 || { echo "FAIL plan after"; cat "$W/after.txt"; exit 1; }
if grep -q "^rates (calibrated now" "$W/after.txt"; then
  echo "ok   the busy rates were measured again: $(awk '/^busy_cores/ {print "busy_cores " $2}' "$W"/rates-v12-*.txt)"
else
  echo "FAIL the next plan reused the busy rates:"; sed -n 2p "$W/after.txt"; fail=1
fi
exit $fail
