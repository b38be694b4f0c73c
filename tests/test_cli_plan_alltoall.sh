#!/usr/bin/env bash
# memfit plan --world_size W --expert_parallel N prints each rank's
# all-to-all bytes per step beside the data-parallel collectives:
# L x grad_accum x S x C x 4 B x 2 directions x 2 (forward, backward), S =
# the rank's slot rows per micro-batch (batch x seq x top-k dropless; at
# most E x capacity with --capacity_factor). moe-tiny (L 2, C 64, E 4,
# top-2), batch 4 x seq 32: 2 x 1 x 256 x 64 x 16 = 524288; capacity 0.25
# (cap = ceil(0.25 x 256 x 2 / 4) = 32 of the group's 256 tokens): S = 4 x
# 32 = 128, 262144; effective batch 8: 1048576 whatever the split;
# qwen2-moe-tiny (the same L, C, top-2): 524288. Without --expert_parallel
# no line.
set -u
M=${MEMFIT_BIN:?}
fail=0
check() {  # want-bytes args...
  local want=$1; shift
  local out
  out=$("$M" plan --seq 32 --world_size 2 "$@" 2>&1) || { echo "FAIL: memfit plan $*: $out"; fail=1; return; }
  local line
  line=$(grep '^expert parallel over groups of 2 ranks: per rank per step' <<<"$out")
  local got
  got=$(sed -n 's/.* of all-to-all (\([0-9]*\) bytes = .*/\1/p' <<<"$line")
  if [ "$got" != "$want" ]; then echo "FAIL: plan $*: all-to-all '$got', want $want: $line"; fail=1;
  else echo "plan $*: $got bytes"; fi
  grep -q '^data parallel over 2 ranks' <<<"$out" || { echo "FAIL: plan $*: no data-parallel line"; fail=1; }
}
check 524288 --model moe-tiny --batch 4 --expert_parallel 2
check 262144 --model moe-tiny --batch 4 --expert_parallel 2 --capacity_factor 0.25
check 1048576 --model moe-tiny --batch 4 --effective-batch 8 --expert_parallel 2
check 524288 --model qwen2-moe-tiny --batch 4 --expert_parallel 2
out=$("$M" plan --model moe-tiny --seq 32 --batch 4 --world_size 2 2>&1)
grep -q 'all-to-all' <<<"$out" && { echo "FAIL: an all-to-all line without --expert_parallel"; fail=1; }
[ $fail = 0 ] && echo "test_cli_plan_alltoall: ok"
exit $fail
