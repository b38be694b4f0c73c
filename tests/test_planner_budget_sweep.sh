#!/usr/bin/env bash
# memfit train --budget over a sweep of budgets, from below the smallest
# feasible one to generous, on gpt2-1m and gpt2-124m (one or two steps each):
# every run the planner accepts has peak RSS (VmHWM) <= the budget and the
# ledger equal to the plan; every budget it refuses is below the smallest
# feasible budget, which the refusal names in bytes. (Release build only:
# sanitizers change the process's memory.)
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-sweep-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0; n=0; viol=0
PY=/usr/bin/python3

smallest() {  # args...: prints the smallest feasible budget named by a refusal at 1 MiB
  "$M" train --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --budget 1MiB "$@" > "$W/ref" 2>&1
  grep -o 'smallest feasible budget is [^(]*([0-9]* bytes)' "$W/ref" | grep -o '([0-9]* bytes)' | tr -dc 0-9
}

one() {  # budget_bytes, args...
  local b=$1; shift
  n=$((n + 1))
  rm -f "$W/m.jsonl"
  if "$M" train --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 --budget "$b" --metrics "$W/m.jsonl" \
       --out_dir "$W/out" "$@" > "$W/log" 2>&1; then
    $PY - "$W/m.jsonl" "$b" "$W/log" <<'PY' || { fail=1; viol=$((viol + 1)); }
import json, sys, re
m = json.loads(open(sys.argv[1]).read().splitlines()[-1])
b = int(sys.argv[2])
log = open(sys.argv[3]).read()
choice = re.search(r"planner: (.*), the fastest of", log)
ok = m["rss_peak_bytes"] <= b and m["ledger_peak_bytes"] == m["planned_peak_bytes"]
print("%s budget %9.2f MiB: fits, peak RSS %9.2f MiB (%5.1f%% of budget), ledger %s plan; %s" % (
    "ok  " if ok else "FAIL", b / 2**20, m["rss_peak_bytes"] / 2**20, 100.0 * m["rss_peak_bytes"] / b,
    "==" if m["ledger_peak_bytes"] == m["planned_peak_bytes"] else "!=", choice.group(1) if choice else "?"))
sys.exit(0 if ok else 1)
PY
  else
    local s
    s=$(grep -o 'smallest feasible budget is [^(]*([0-9]* bytes)' "$W/log" | grep -o '([0-9]* bytes)' | tr -dc 0-9)
    if [ -n "$s" ] && [ "$s" -gt "$b" ]; then
      printf 'ok   budget %9.2f MiB: refused, smallest feasible named: %.2f MiB\n' "$($PY -c "print($b/2**20)")" "$($PY -c "print($s/2**20)")"
    else
      echo "FAIL budget $b: refused without naming a smallest feasible budget above it:"; tail -2 "$W/log"; fail=1
    fi
  fi
}

sweep() {  # name, count, args...
  local name=$1 count=$2; shift 2
  local s
  s=$(smallest "$@")
  if [ -z "$s" ]; then echo "FAIL $name: no smallest feasible budget in the refusal"; cat "$W/ref"; fail=1; return; fi
  echo "== $name: smallest feasible budget $s bytes"
  # budgets from 0.6x to 2.5x the smallest feasible one, geometric
  for b in $($PY -c "
s=$s; k=$count
print(' '.join(str(int(s * 0.6 * ((2.5 / 0.6) ** (i / (k - 1))))) for i in range(k)))"); do
    one "$b" "$@"
  done
}

sweep gpt2-1m 20 --model gpt2-1m --batch 8 --seq 128 --steps 2
sweep gpt2-124m 20 --model gpt2-124m --batch 1 --seq 64 --steps 1
echo "$n budgets, $viol violations"
[ "$n" -ge 40 ] || { echo "FAIL: only $n budgets ran"; fail=1; }
exit $fail
