#!/usr/bin/env bash
# Expert parallelism (--expert_parallel N, docs/moe.md): moe-tiny over 2
# ranks with both experts' halves on different ranks (tokens exchanged with
# MPI_Alltoallv) equals one process with the same total batch: losses, the
# load-balancing aux loss, the z-loss and the gradient norm within 1e-6
# relative over 5 AdamW steps, top-2 and top-1 with the aux loss, and with a
# capacity factor that drops token-slots (the same drops every step); 4
# ranks in 2 expert groups of 2 (the experts' gradients summed over their 2
# replicas) likewise. Each rank's ledger equals its plan; a rank's expert
# params, grads and AdamW state are 1/N of the single process's (estimate);
# the combinations it does not support fail with one line.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-moe-ep-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
/usr/bin/python3 -c "import random; r = random.Random(21); open('$W/c.txt','w').write(''.join(r.choice('abcdefgh ') for _ in range(40000)))"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
base=(--model moe-tiny --data "$W/c.tok" --seq 32 --steps 5 --val_every 0 --sample_tokens 0 --progress 0 --threads 1
      --warmup 2 --router_aux_loss_coef 0.02)
run1() {  # name, args...: one process
  local name=$1; shift
  "$M" train "${base[@]}" --metrics "$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1 \
    || { echo "FAIL $name: train failed"; tail -3 "$W/$name.log"; fail=1; }
}
runN() {  # ranks, name, args...
  local np=$1 name=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$np" "$M" train "${base[@]}" --metrics "$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1 \
    || { echo "FAIL $name: mpirun failed"; grep -m3 "error" "$W/$name.log"; tail -3 "$W/$name.log"; fail=1; }
}
compare() {  # reference, candidate, ranks
  /usr/bin/python3 - "$W" "$1" "$2" "$3" <<'PY' || fail=1
import glob, json, sys
w, ref, cand, np_ = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def metrics(name):
    return [json.loads(l) for l in open(f"{w}/{name}.jsonl")]
a, b = metrics(ref), metrics(cand)
ok = len(a) == len(b) == 5
rel = {}
for k in ("loss", "moe_aux", "moe_z", "grad_norm"):
    rel[k] = max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b))
    ok = ok and rel[k] <= 1e-6
da, db = [x.get("moe_dropped") for x in a], [y.get("moe_dropped") for y in b]
ok = ok and da == db
ranks = [json.loads(open(f).read().splitlines()[-1]) for f in glob.glob(f"{w}/{cand}.jsonl*")]
led = len(ranks) == np_ and all(r["ledger_peak_bytes"] == r["planned_peak_bytes"] for r in ranks)
ok = ok and led
print("%s %s vs %s: max rel diff loss %.1e, aux %.1e, z %.1e, grad norm %.1e; dropped %s; ledger %s plan on %d ranks" % (
    "ok  " if ok else "FAIL", cand, ref, rel["loss"], rel["moe_aux"], rel["moe_z"], rel["grad_norm"],
    "equal " + str(db) if da == db else "%s vs %s" % (da, db), "==" if led else "!=", len(ranks)))
sys.exit(0 if ok else 1)
PY
}
# top-2 with the aux and z losses
run1 top2 --batch 4 --router_z_loss_coef 0.001
runN 2 ep-top2 --batch 4 --router_z_loss_coef 0.001 --expert_parallel 2
compare top2 ep-top2 2
# top-1
run1 top1 --batch 4 --num_experts_per_tok 1
runN 2 ep-top1 --batch 4 --num_experts_per_tok 1 --expert_parallel 2
compare top1 ep-top1 2
# a capacity that drops: the drops are decided on the tokens' ranks from the
# group's counts, in the single process's token order
run1 cap --batch 4 --capacity_factor 0.5
runN 2 ep-cap --batch 4 --capacity_factor 0.5 --expert_parallel 2
compare cap ep-cap 2
grep -q '"moe_dropped":[1-9]' "$W/ep-cap.jsonl" || { echo "FAIL capacity 0.5 dropped nothing"; fail=1; }
# 2 expert groups of 2 ranks: expert gradients summed over the replicas only
run1 b8 --batch 8
runN 4 ep-groups --batch 8 --expert_parallel 2
compare b8 ep-groups 4
# a rank's expert rows are 1/N of the single process's (params, grads,
# AdamW's 2 moments), the rest the same; the plan states the exchange bound
est() { "$M" estimate --model moe-tiny --batch 4 --seq 32 --json "$@"; }
est --world_size 2 > "$W/dp.json" && est --world_size 2 --expert_parallel 2 > "$W/ep.json" \
  && est --world_size 2 --expert_parallel 2 --capacity_factor 0.5 > "$W/epc.json" || { echo "FAIL estimate"; fail=1; }
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
dp, ep, epc = (json.load(open(f"{w}/{n}.json")) for n in ("dp", "ep", "epc"))
ok = True
for a, b in zip(dp["layers"][:-1], ep["layers"][:-1]):
    x = a["experts"]
    ok = ok and b["experts"] * 2 == x and a["params"] - b["params"] == x // 2 and a["grads"] - b["grads"] == x // 2 \
        and a["optim"] - b["optim"] == x
e, c = ep["moe"]["expert_parallel"], epc["moe"]["expert_parallel"]
# 64 tokens per rank: it sends 64 x top-2 rows at most; dropless, every
# token of both ranks (2 x 64) could pick both of this rank's 2 experts;
# capacity 0.5 of the group's 128 tokens x 2 / 4 experts = 32 slots each
ok = ok and e == {"group_ranks": 2, "experts_per_rank": 2, "send_rows": 128, "recv_rows": 256} \
    and epc["moe"]["bound"] == "capacity" and epc["moe"]["capacity"] == 32 and c["recv_rows"] == 64
print("%s estimate: expert rows per rank %d of %d bytes per layer (params, grads, 2x optimizer 1/2); exchange %s, "
      "with capacity 0.5 %s" % ("ok  " if ok else "FAIL", ep["layers"][0]["experts"], dp["layers"][0]["experts"], e, c))
sys.exit(0 if ok else 1)
PY
"$M" estimate --model moe-tiny --batch 4 --seq 32 --world_size 2 --expert_parallel 2 | grep -q "expert parallel over groups of 2 ranks: this rank holds experts 0-1.*dropless bound" \
  && echo "ok   estimate states the expert group and the dropless bound" || { echo "FAIL estimate's expert parallel line"; fail=1; }
# what it refuses, one line each
bad() {  # expected message part, command...
  local want=$1; shift
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c '^memfit: error: ')" -ge 1 ] && printf '%s' "$out" | grep -q -- "$want"; then
    echo "ok   refused: $(printf '%s\n' "$out" | grep -m1 '^memfit: error: ')"
  else echo "FAIL expected an error with '$want', got rc $rc: $out"; fail=1; fi
}
e2=(estimate --model moe-tiny --batch 4 --seq 32 --world_size 2 --expert_parallel 2)
bad "does not divide the 3 ranks" "$M" estimate --model moe-tiny --batch 6 --seq 32 --world_size 3 --expert_parallel 2
bad "does not divide the 4 experts" "$M" estimate --model moe-tiny --batch 6 --seq 32 --world_size 3 --expert_parallel 3
bad "with zero 1 is not supported" "$M" "${e2[@]}" --zero 1
bad "with zero 3 is not supported" "$M" "${e2[@]}" --zero 3
bad "base_dtype nf4 and expert_parallel 2 is not supported" "$M" "${e2[@]}" --lora r=4 --base_dtype nf4
bad "recompute 'full' is not supported" "$M" "${e2[@]}" --recompute full
bad "needs a mixture-of-experts model" "$M" estimate --model gpt2-1m --batch 4 --seq 32 --world_size 2 --expert_parallel 2
bad "needs MPI" "$M" train "${base[@]}" --batch 4 --expert_parallel 2
# (--init, --out_dir and --resume work: tests/test_moe_ep_io.sh; LoRA: tests/test_moe_ep_lora.sh)
out=$(timeout 120 "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --batch 4 --expert_parallel 4 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q "memfit: error: expert_parallel 4 does not divide the 2 ranks" \
  && echo "ok   refused under mpirun: expert_parallel 4 on 2 ranks" || { echo "FAIL expert_parallel 4 on 2 ranks: rc $rc"; printf '%s\n' "$out" | tail -3; fail=1; }
exit $fail
