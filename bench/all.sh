#!/usr/bin/env bash
# make bench-all: re-runs every benchmark command docs/benchmarks.md quotes,
# one after another, each output saved under bench-results/<UTC time>/ with
# a header (command, date, commit, machine, load before and after), and
# prints one line per command (seconds, exit status). Paste the figures into
# docs/benchmarks.md with the header's date, machine and load: the timings
# move with the machine's load, so quote the ratios each script prints.
#   bash bench/all.sh            # all of them (an hour or more on 2 cores)
#   bash bench/all.sh --list     # the commands only
#   bash bench/all.sh NAME...    # those whose name (first column) matches
set -u
cd "$(dirname "$0")/.."
# name | command (run with bash -c from the repository root)
CMDS=(
  "compare_torch|bash bench/compare_torch.sh"
  "llama_throughput|ROUNDS=2 STEPS=8 WARM=2 bash bench/llama_throughput.sh"
  "throughput|bash bench/throughput"
  "zero_10m|bash bench/zero.sh gpt2-10m 8 256 2"
  "zero_124m|STEPS=5 bash bench/zero.sh gpt2-124m 4 256 2"
  "dist_collectives|ROUNDS=3 STAGES=\"0 1 2\" bash bench/dist_collectives.sh"
  "zero_prefetch|bash bench/zero_prefetch.sh"
  "planner|bash bench/planner.sh 3"
  "planner_choice|bash bench/planner_choice.sh"
  "recompute|bash bench/recompute.sh"
  "recompute_long|STEPS=4 ROUNDS=1 EXTRA=\"--block_size 2048\" bash bench/recompute.sh gpt2-124m 1 2048"
  "lora|bash bench/lora.sh"
  "optimizers|bash bench/optimizers.sh"
  "precision|ROUNDS=6 SPEED=fp32,bf16 bash bench/precision.sh"
  "docmask|build/bench_docmask"
  "gemm_backend|bash bench/gemm_backend.sh"
  "quant_gemm|bash bench/quant_gemm.sh"
  "tokenize_speed|bash bench/tokenize_speed.sh"
)
if [ "${1:-}" = "--list" ]; then
  for c in "${CMDS[@]}"; do printf '%-18s %s\n' "${c%%|*}" "${c#*|}"; done
  exit 0
fi
out=bench-results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
fails=0
for c in "${CMDS[@]}"; do
  name=${c%%|*}; cmd=${c#*|}
  if [ $# -gt 0 ]; then
    hit=0; for w in "$@"; do [[ $name == *$w* ]] && hit=1; done
    [ $hit -eq 1 ] || continue
  fi
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  t0=$(date +%s)
  {
    echo "\$ $cmd"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, $machine, load before $load0"
    bash -c "$cmd" 2>&1
    rc=$?
    echo "# exit $rc, load after $(cut -d' ' -f1-3 /proc/loadavg), $(( $(date +%s) - t0 )) s"
    exit $rc
  } > "$out/$name.txt"
  rc=$?
  [ $rc -eq 0 ] || fails=$((fails + 1))
  printf '%-18s exit %d  %5d s  %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$out/$name.txt"
done
echo "outputs in $out; $fails failed"
[ $fails -eq 0 ]
