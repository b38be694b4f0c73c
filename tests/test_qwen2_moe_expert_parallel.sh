#!/usr/bin/env bash
# Expert parallelism with Qwen2-MoE's shared expert (replicated on every
# rank like attention, trained data parallel; the routed experts split):
# qwen2-moe-tiny, 5 AdamW steps, one process with batch 4 against
# mpirun -np 2 --expert_parallel 2 (capacity 0.5 too): loss, aux, z and the
# gradient norm within 1e-6 relative, dropped slots equal, ledger == plan on
# every rank.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-qwen2moe-ep-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
/usr/bin/python3 -c "import random; random.seed(5); open('$W/c.txt','w').write(''.join(random.choice('abcdefghij klm') for _ in range(20000)))"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
base=(--model qwen2-moe-tiny --data "$W/c.tok" --seq 32 --steps 5 --val_every 0 --sample_tokens 0 --progress 0 --threads 1
      --warmup 2 --router_aux_loss_coef 0.02 --router_z_loss_coef 0.001)
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
run1 one --batch 4
runN 2 ep --batch 4 --expert_parallel 2
compare one ep 2
run1 one-cap --batch 4 --capacity_factor 0.5
runN 2 ep-cap --batch 4 --expert_parallel 2 --capacity_factor 0.5
compare one-cap ep-cap 2
[ $fail = 0 ] && echo "test_qwen2_moe_expert_parallel: ok"
exit $fail
