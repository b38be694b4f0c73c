#!/usr/bin/env bash
# The budget planner on gpt2-124m, B4 T256, effective batch 16: for each
# budget, the setting `memfit train --budget` chooses, its predicted and
# measured peak (RSS) and its predicted and measured tokens/s (median of
# the steps after the first). Usage: bench/planner.sh [steps] [budgets...]
#   MODEL=gpt2-10m B=2 T=64 EB=4 bench/planner.sh 2 100MiB   (another run)
set -u
cd "$(dirname "$0")/.."
M=${MEMFIT_BIN:-build/memfit}
STEPS=${1:-3}; shift || true
BUDGETS=${*:-1GiB 1.5GiB 2GiB 3GiB 4GiB}
MODEL=${MODEL:-gpt2-124m}; B=${B:-4}; T=${T:-256}; EB=${EB:-16}
W=$(mktemp -d /tmp/memfit-bench-planner-XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "command: $M train --model $MODEL --batch $B --seq $T --effective_batch $EB --steps $STEPS --budget B"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| budget | chosen setting | predicted peak | measured peak RSS | predicted tok/s | measured tok/s |\n|---|---|---|---|---|---|\n'
for b in $BUDGETS; do
  if ! "$M" train --model "$MODEL" --batch "$B" --seq "$T" --effective_batch "$EB" --steps "$STEPS" --budget "$b" \
       --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 > "$W/log" 2>&1; then
    printf '| %s | refused: %s | | | | |\n' "$b" "$(tail -1 "$W/log" | sed 's/.*smallest feasible budget is \([^(]*\).*/smallest feasible \1/')"
    continue
  fi
  /usr/bin/python3 - "$W/log" "$b" "$EB" "$T" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
ch = re.search(r"planner: (.*), the fastest of", log).group(1)
pk = re.search(r"planner: predicted process (.*?), measured peak RSS (.*?) \(", log)
tm = re.search(r"planner: predicted ([0-9.]+) s/step, measured median ([0-9.]+) s", log)
tok = int(sys.argv[3]) * int(sys.argv[4])
print("| %s | %s | %s | %s | %.0f | %.0f |" % (sys.argv[2], ch, pk.group(1), pk.group(2),
      tok / float(tm.group(1)), tok / float(tm.group(2))))
PY
done
