#!/usr/bin/env bash
# make bench-all: re-runs every benchmark docs/benchmarks.md quotes, one
# after another, and regenerates docs/benchmarks.md from what they print.
# Each output is saved under bench-results/<UTC time>/ as NAME.txt (with a
# header: command, date, commit, machine, load before and after) and as
# NAME.json (the same fields and the output, its markdown tables parsed;
# bench/render.py result); run.json names the run. At the end
# bench/render.py fills bench/benchmarks.md.in from those files: every
# table with its command, date, commit, machine and load. One line per
# command is printed (seconds, exit status).
#   bash bench/all.sh            # all of them (an hour or more on 2 cores),
#                                # then docs/benchmarks.md if all passed
#   QUICK=1 bash bench/all.sh    # fewer steps and rounds, smallest models: a
#                                # check of the pipeline in minutes, rendered to
#                                # bench-results/<time>/benchmarks.md only
#   bash bench/all.sh --list     # the commands only (QUICK=1: the quick ones)
#   bash bench/all.sh NAME...    # those whose name (first column) matches;
#                                # rendered only when every bench ran
set -u
cd "$(dirname "$0")/.."
QUICK=${QUICK:-0}
PY=/usr/bin/python3
# name | command | quick command (run with bash -c from the repository root)
CMDS=(
  "compare_torch|bash bench/compare_torch.sh|STEPS=3 ROUNDS=1 bash bench/compare_torch.sh gpt2-10m 2 64"
  "llama_throughput|ROUNDS=2 STEPS=8 WARM=2 bash bench/llama_throughput.sh|ROUNDS=1 STEPS=3 WARM=1 bash bench/llama_throughput.sh smollm2-135m 1 32"
  "throughput|bash bench/throughput|ROUNDS=1 STEPS_SMALL=3 bash bench/throughput bytes"
  "zero_10m|bash bench/zero.sh gpt2-10m 8 256 2|STEPS=2 bash bench/zero.sh gpt2-10m 2 64 2"
  "zero_124m|STEPS=5 bash bench/zero.sh gpt2-124m 4 256 2|STEPS=2 bash bench/zero.sh gpt2-10m 4 64 2"
  "dist_collectives|ROUNDS=3 STAGES=\"0 1 2\" bash bench/dist_collectives.sh|ROUNDS=1 STEPS=2 STAGES=\"0 2\" bash bench/dist_collectives.sh gpt2-10m 2 64 2"
  "zero_prefetch|bash bench/zero_prefetch.sh|STEPS=2 ROUNDS=1 bash bench/zero_prefetch.sh gpt2-10m 2 64 2"
  "planner|bash bench/planner.sh 3|MODEL=gpt2-10m B=2 T=64 EB=4 bash bench/planner.sh 2 100MiB 250MiB"
  "time_model|bash bench/time_model.sh|QUICK=1 bash bench/time_model.sh"
  "planner_choice|bash bench/planner_choice.sh|STEPS=2 RUN=\"--model gpt2-10m --batch 2 --seq 64\" bash bench/planner_choice.sh 200MiB"
  "recompute|bash bench/recompute.sh|STEPS=2 ROUNDS=1 bash bench/recompute.sh gpt2-10m 2 64"
  "recompute_long|STEPS=4 ROUNDS=1 EXTRA=\"--block_size 2048\" bash bench/recompute.sh gpt2-124m 1 2048|STEPS=2 ROUNDS=1 EXTRA=\"--block_size 512\" bash bench/recompute.sh gpt2-10m 1 512"
  "lora|bash bench/lora.sh|STEPS=2 ROUNDS=1 bash bench/lora.sh gpt2-10m 2 64"
  "optimizers|bash bench/optimizers.sh|STEPS=2 ROUNDS=1 bash bench/optimizers.sh gpt2-10m 2 64"
  "precision|ROUNDS=6 SPEED=fp32,bf16 bash bench/precision.sh|ROUNDS=1 STEPS=2 RSS_STEPS=1 SPEED=fp32,bf16 bash bench/precision.sh gpt2-10m 2 64"
  "moe_throughput|bash bench/moe_throughput.sh|ROUNDS=1 STEPS=2 WARM=1 B=2 T=32 bash bench/moe_throughput.sh"
  "bf16_torch|bash bench/bf16_torch.sh|ROUNDS=1 STEPS=3 WARM=1 RSS_STEPS=2 bash bench/bf16_torch.sh gpt2-10m 2 64"
  "docmask|build/bench_docmask|build/bench_docmask 1"
  "gemm_backend|bash bench/gemm_backend.sh|STEPS=2 ROUNDS=1 bash bench/gemm_backend.sh gpt2-10m 2 64"
  "quant_gemm|bash bench/quant_gemm.sh|bash bench/quant_gemm.sh 1"
  "tokenize_speed|bash bench/tokenize_speed.sh|ROUNDS=1 bash bench/tokenize_speed.sh"
)
pick() { local c=$1; local name=${c%%|*} rest=${c#*|}; if [ "$QUICK" = 1 ]; then echo "${rest#*|}"; else echo "${rest%%|*}"; fi; }
if [ "${1:-}" = "--list" ]; then
  for c in "${CMDS[@]}"; do printf '%-18s %s\n' "${c%%|*}" "$(pick "$c")"; done
  exit 0
fi
out=bench-results/$(date -u +%Y%m%d-%H%M%S)$([ "$QUICK" = 1 ] && echo -quick)
mkdir -p "$out"
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
# the memfit/OpenMP environment the run was given is part of its command
envset=$(env | grep -E '^(MEMFIT_[A-Z_]*|OMP_[A-Z_]*)=' | sort | tr '\n' ' ')
runcmd="${envset}$([ "$QUICK" = 1 ] && echo 'QUICK=1 ')bash bench/all.sh${*:+ $*}"
$PY -c 'import json, sys; json.dump({"command": sys.argv[1], "dir": sys.argv[2], "quick": sys.argv[3] == "1"}, open(sys.argv[2] + "/run.json", "w"))' \
  "$runcmd" "$out" "$QUICK"
fails=0; ran=0
for c in "${CMDS[@]}"; do
  name=${c%%|*}; cmd=$(pick "$c")
  if [ $# -gt 0 ]; then
    hit=0; for w in "$@"; do [[ $name == *$w* ]] && hit=1; done
    [ $hit -eq 1 ] || continue
  fi
  ran=$((ran + 1))
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)   # at each bench: the tree may move
  git diff --quiet HEAD 2>/dev/null || commit="$commit (modified)"
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  date0=$(date -u '+%Y-%m-%d %H:%M UTC')
  t0=$(date +%s)
  bash -c "$cmd" > "$out/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 )); load1=$(cut -d' ' -f1-3 /proc/loadavg)
  {
    echo "\$ $cmd"
    echo "# $date0, commit $commit, $machine, load before $load0"
    cat "$out/$name.log"
    echo "# exit $rc, load after $load1, $secs s"
  } > "$out/$name.txt"
  $PY bench/render.py result --name "$name" --command "$cmd" --date "$date0" --commit "$commit" --machine "$machine" \
    --load-before "$load0" --load-after "$load1" --exit "$rc" --seconds "$secs" --quick "$QUICK" "$out/$name.log" \
    > "$out/$name.json" || rc=1
  rm -f "$out/$name.log"
  [ $rc -eq 0 ] || fails=$((fails + 1))
  printf '%-18s exit %d  %5d s  %s\n' "$name" "$rc" "$secs" "$out/$name.txt"
done
echo "outputs in $out; $fails failed"
if [ $ran -lt ${#CMDS[@]} ]; then
  echo "not rendered: $ran of ${#CMDS[@]} benchmarks ran (render those with: $PY bench/render.py render $out --template FILE)"
elif [ "$QUICK" = 1 ] || [ $fails -gt 0 ]; then
  # a quick run, or one with failures, never replaces docs/benchmarks.md
  $PY bench/render.py render "$out" --out "$out/benchmarks.md" && echo "rendered $out/benchmarks.md (not docs/benchmarks.md: $([ "$QUICK" = 1 ] && echo 'quick run' || echo "$fails failed"))" || fails=$((fails + 1))
else
  $PY bench/render.py render "$out" --out docs/benchmarks.md && echo "rendered docs/benchmarks.md from $out" || fails=$((fails + 1))
fi
[ $fails -eq 0 ]
