#!/usr/bin/env bash
# Hybrid sharding (--zero_group N, FSDP's hybrid shard): ZeRO shards within
# groups of N consecutive ranks and replicates across the groups. np 2 with
# zero_group 1 (pure replication: every rank holds whole shards) and np 4
# with zero_group 2 (two groups of two; more ranks than cores, gpt2-1m so
# it stays fast) give the single-process losses, validation losses and
# gradient norms within 1e-6 relative over 10 steps (weights within 1e-5,
# AdamW: see test_dist_zero_matches_single); each rank's ledger equals its
# plan. Per-rank optimizer state is 8 bytes x Psi / N (Psi from the
# estimate's n_params, N the group, not the world), and memfit estimate
# --world_size 4 --zero_group 2 predicts the ranks' plan bytes exactly. The
# bytes each rank's collectives move per step equal the hybrid formula
# computed here (reduce-scatter in the group (N-1)/N Psi, the shard's
# all-reduce across G groups 2 (G-1)/G Psi/N, all-gathers in the group).
# A zero_group that does not divide the ranks is refused with one line.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-hybrid-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
base=(--model gpt2-1m --batch 4 --seq 64 --steps 10 --sample_tokens 0 --val_every 5 --val_batches 2
      --threads 1 --progress 0 --warmup 2)
"$M" train "${base[@]}" --out_dir "$W/single" --metrics "$W/single.jsonl" > "$W/single.log" 2>&1 \
  || { echo "FAIL single: train failed"; tail -3 "$W/single.log"; exit 1; }
runN() {  # np, name, args...
  local np=$1 name=$2; shift 2
  "${MPIRUN[@]}" -np "$np" "$M" train "${base[@]}" --out_dir "$W/$name" --metrics "$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1 \
    || { echo "FAIL $name: mpirun failed"; grep -m3 "error" "$W/$name.log"; fail=1; return 1; }
  "$M" estimate --json "${base[@]}" --world_size "$np" "$@" > "$W/$name.est.json" \
    || { echo "FAIL $name: estimate failed"; fail=1; return 1; }
}
check() {  # name, world, group, zero
  /usr/bin/python3 - "$W" "$@" <<'PY' || fail=1
import glob, json, struct, sys
import numpy as np
w, name = sys.argv[1], sys.argv[2]
Wn, N, Z = (int(x) for x in sys.argv[3:6])
def metrics(n): return [json.loads(l) for l in open(f"{w}/{n}.jsonl")]
def weights(n):
    b = open(f"{w}/{n}/model.safetensors", "rb").read()
    k = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + k])
    return {x: np.frombuffer(b[8 + k + v["data_offsets"][0]:8 + k + v["data_offsets"][1]], np.float32)
            for x, v in h.items() if x != "__metadata__"}
a, b = metrics("single"), metrics(name)
ok = len(a) == len(b) == 10
rel = lambda key: max((abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b) if key in x), default=0.0)
lrel, vrel, nrel = rel("loss"), rel("val_loss"), rel("grad_norm")
wa, wb = weights("single"), weights(name)
wdiff = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
ok = ok and wa.keys() == wb.keys() and max(lrel, vrel, nrel) <= 1e-6 and wdiff <= 1e-5
ranks = [json.loads(open(f).read().splitlines()[-1]) for f in sorted(glob.glob(f"{w}/{name}.jsonl*"))]
led = len(ranks) == Wn and all(r["ledger_peak_bytes"] == r["planned_peak_bytes"] for r in ranks)
est = json.load(open(f"{w}/{name}.est.json"))
# rank 0's plan is what estimate predicts (rank 0 holds the largest shard or ties)
pred = est["arena"] == ranks[0]["planned_peak_bytes"]
psi = est["n_params"]
opt = 8 * psi / N                           # AdamW's two fp32 moments on 1/N of the elements
sok = all(abs(r["mem_optim"] - opt) <= 1e-3 * opt for r in ranks)
# measured bytes per step (steps 2..9: the first and the last gather for
# the initial weights and the checkpoint) against the hybrid formula
m = metrics(name)
per = sorted(m[i]["comm_bytes"] - m[i - 1]["comm_bytes"] for i in range(1, len(m) - 1))[len(m) // 2 - 1]
G, B = Wn // N, psi * 4
want = 2 * B * (Wn - 1) / Wn if Z == 0 else \
       B * (N - 1) / N + 2 * B / N * (G - 1) / G + (2 if Z == 3 else 1) * B * (N - 1) / N
cok = abs(per - want) <= 0.02 * want
ok = ok and led and pred and sok and cok
print("%s %s (np %d, zero %d, zero_group %d): max rel diff loss %.2e, val %.2e, grad norm %.2e, weights %.2e; "
      "ledger %s plan on %d ranks; estimate %s rank 0's plan; optimizer state %d per rank (8 Psi/N = %.0f); "
      "comm %.0f B/step (formula %.0f)" % ("ok  " if ok else "FAIL", name, Wn, Z, N, lrel, vrel, nrel, wdiff,
      "==" if led else "!=", len(ranks), "==" if pred else "!=", ranks[0]["mem_optim"], opt, per, want))
sys.exit(0 if ok else 1)
PY
}
for z in 1 2 3; do runN 2 "np2-zero$z-g1" --zero $z --zero_group 1 && check "np2-zero$z-g1" 2 1 $z; done
for z in 2 3; do runN 4 "np4-zero$z-g2" --zero $z --zero_group 2 && check "np4-zero$z-g2" 4 2 $z; done
# checkpoints: np 4 zero_group 2 stopped after 3 steps resumes to the losses
# of an uninterrupted 5-step run bit for bit (constant lr); memfit convert
# refuses the hybrid shards (each group repeats them) with one line
ck=(--zero 2 --zero_group 2 --warmup 0 --min_lr_frac 1 --val_every 0)
"${MPIRUN[@]}" -np 4 "$M" train "${base[@]}" "${ck[@]}" --steps 3 --out_dir "$W/ck" > "$W/ck1.log" 2>&1 \
  && "${MPIRUN[@]}" -np 4 "$M" train "${base[@]}" "${ck[@]}" --steps 5 --out_dir "$W/ck" --resume auto --metrics "$W/ck2.jsonl" > "$W/ck2.log" 2>&1 \
  && "${MPIRUN[@]}" -np 4 "$M" train "${base[@]}" "${ck[@]}" --steps 5 --metrics "$W/ck3.jsonl" > "$W/ck3.log" 2>&1 \
  && cmp <(grep -o '"loss":[^,]*' "$W/ck2.jsonl") <(grep -o '"loss":[^,]*' "$W/ck3.jsonl" | tail -2) >/dev/null \
  && echo "ok   np 4 zero_group 2: resume after 3 steps gives steps 4-5 of an uninterrupted run bit for bit" \
  || { echo "FAIL np 4 zero_group 2 resume"; tail -3 "$W"/ck*.log; fail=1; }
"$M" convert "$W/ck/checkpoint.safetensors" "$W/joined.safetensors" > "$W/conv.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "hybrid-sharded checkpoint (zero_group 2 of 4 ranks)" "$W/conv.log" && [ ! -e "$W/joined.safetensors" ] \
  && echo "ok   convert refuses hybrid shards (exit $rc)" || { echo "FAIL convert of hybrid shards"; cat "$W/conv.log"; fail=1; }
# a group that does not divide the ranks: one line, non-zero exit, on train and estimate
"${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --zero 2 --zero_group 3 --out_dir "$W/bad" > "$W/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "zero_group 3 does not divide the 2 ranks" "$W/bad.log" && [ ! -e "$W/bad/model.safetensors" ] \
  && echo "ok   np 2 --zero_group 3 refused (exit $rc)" || { echo "FAIL np 2 --zero_group 3 (exit $rc)"; cat "$W/bad.log"; fail=1; }
"$M" estimate "${base[@]}" --world_size 4 --zero 2 --zero_group 3 > "$W/bad-est.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ "$(wc -l < "$W/bad-est.log")" -eq 1 ] && grep -q "does not divide the 4 ranks" "$W/bad-est.log" \
  && echo "ok   estimate --world_size 4 --zero_group 3 refused in one line" || { echo "FAIL estimate refusal"; cat "$W/bad-est.log"; fail=1; }
exit $fail
