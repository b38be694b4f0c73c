#!/usr/bin/env bash
# Expert parallelism's files (docs/moe.md, "Expert parallel"): --init from a
# Mixtral HF folder (tests/ref/mixtral_torch.py), each rank reading only its
# experts, gives one process's losses (within 1e-6 relative, ledger == plan
# per rank); --out_dir writes the checkpoint as rank 0's file plus one
# experts file per other group rank, and the weights as an HF folder
# (model-0000g-of-0000N.safetensors + index) holding every expert once, equal
# within 1e-5 to one process's after the same steps; --resume continues
# bit-identically to an uninterrupted expert-parallel run, and refuses a
# checkpoint whose files are of different steps or of another layout.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-moe-ep-io-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
/usr/bin/python3 "$(dirname "$0")/ref/mixtral_torch.py" make-case --out "$W/case" --steps 1 --batch 1 --seq 8 > "$W/ref.log" 2>&1 \
  || { echo "FAIL mixtral_torch.py make-case"; cat "$W/ref.log"; exit 1; }
/usr/bin/python3 -c "import random; r = random.Random(21); open('$W/c.txt','w').write(''.join(r.choice('abcdefgh ') for _ in range(40000)))"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
base=(--init "$W/case/hf" --tokenizer bytes --data "$W/c.tok" --seq 16 --batch 4 --val_every 0 --sample_tokens 0
      --progress 0 --threads 1 --warmup 2)
losses() { grep -o '"loss":[^,]*' "$1" | tail -n "$2"; }
run1() {  # name, args...: one process
  local name=$1; shift
  "$M" train "${base[@]}" --metrics "$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1 \
    || { echo "FAIL $name: train failed"; tail -3 "$W/$name.log"; fail=1; }
}
run2() {  # name, args...: 2 ranks, one expert group
  local name=$1; shift
  timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --expert_parallel 2 --metrics "$W/$name.jsonl" "$@" \
    > "$W/$name.log" 2>&1 || { echo "FAIL $name: mpirun failed"; grep -m3 "error" "$W/$name.log"; fail=1; }
}
# 1. --init: 6 steps from the HF folder, one process and 2 ranks
run1 one --steps 6
run2 full --steps 6
/usr/bin/python3 - "$W" <<'PY' || fail=1
import glob, json, sys
w = sys.argv[1]
a = [json.loads(l) for l in open(f"{w}/one.jsonl")]
b = [json.loads(l) for l in open(f"{w}/full.jsonl")]
ok = len(a) == len(b) == 6
rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
ok = ok and rel <= 1e-6
ranks = [json.loads(open(f).read().splitlines()[-1]) for f in glob.glob(f"{w}/full.jsonl*")]
led = len(ranks) == 2 and all(r["ledger_peak_bytes"] == r["planned_peak_bytes"] for r in ranks)
print("%s --init HF Mixtral folder on 2 ranks (each its 2 of 4 experts) vs 1 process: max rel loss diff %.1e "
      "(first loss %.6f), ledger %s plan on %d ranks" % ("ok  " if ok and led else "FAIL", rel, b[0]["loss"] if b else 0,
                                                        "==" if led else "!=", len(ranks)))
sys.exit(0 if ok and led else 1)
PY
# 2. checkpoints: 3 steps with --out_dir, then resume to 6
run2 half --steps 3 --out_dir "$W/ck"
for f in checkpoint.safetensors checkpoint.experts1-of-2.safetensors model-00001-of-00002.safetensors \
         model-00002-of-00002.safetensors model.safetensors.index.json config.json; do
  [ -s "$W/ck/$f" ] || { echo "FAIL out_dir: no $f"; fail=1; }
done
run2 res --steps 6 --resume "$W/ck/checkpoint.safetensors"
if [ "$(losses "$W/full.jsonl" 3)" = "$(losses "$W/res.jsonl" 3)" ] && [ -n "$(losses "$W/res.jsonl" 3)" ]; then
  echo "ok   resumed on 2 ranks from the expert-parallel checkpoint: steps 4-6 bit-identical to the uninterrupted run"
else echo "FAIL resumed losses differ"; paste <(losses "$W/full.jsonl" 3) <(losses "$W/res.jsonl" 3); fail=1; fi
# the HF folder holds every expert once and equals one process's weights
run1 one3 --steps 3 --out_dir "$W/ck1"
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, struct, sys
w = sys.argv[1]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
idx = json.load(open(f"{w}/ck/model.safetensors.index.json"))["weight_map"]
ep, ok_dup = {}, True
for f in sorted(set(idx.values())):
    t = tensors(f"{w}/ck/{f}")
    dup = set(t) & set(ep)
    ep.update(t)
    ok_dup = ok_dup and not dup
one = tensors(f"{w}/ck1/model.safetensors")
experts = [k for k in one if ".experts." in k]
ok = ok_dup and set(ep) == set(one) == set(idx) and len(experts) == 2 * 4 * 3
ok = ok and all(idx[k] == "model-%05d-of-00002.safetensors" % (int(k.split(".experts.")[1].split(".")[0]) // 2 + 1)
                for k in experts)
d = max(max(abs(x - y) for x, y in zip(ep[k], one[k])) for k in one) if ok else float("nan")
ok = ok and d <= 1e-5
print("%s out_dir HF folder from 2 ranks: %d tensors (%d experts' each once, in their owner's shard) equal one "
      "process's after 3 steps within %.1e" % ("ok  " if ok else "FAIL", len(ep), len(experts), d))
sys.exit(0 if ok else 1)
PY
# the folder loads back (one process and 2 ranks: the same first loss)
"$M" train --init "$W/ck" --tokenizer bytes --data "$W/c.tok" --seq 16 --batch 4 --val_every 0 --sample_tokens 0 --progress 0 \
  --threads 1 --steps 1 --metrics "$W/back1.jsonl" > "$W/back1.log" 2>&1 || { echo "FAIL --init out_dir, one process"; fail=1; }
timeout 300 "${MPIRUN[@]}" -np 2 "$M" train --init "$W/ck" --tokenizer bytes --data "$W/c.tok" --seq 16 --batch 4 --val_every 0 \
  --sample_tokens 0 --progress 0 --threads 1 --steps 1 --expert_parallel 2 --metrics "$W/back2.jsonl" > "$W/back2.log" 2>&1 \
  || { echo "FAIL --init out_dir, 2 ranks"; fail=1; }
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
a, b = (json.loads(open(f"{w}/{n}.jsonl").readline())["loss"] for n in ("back1", "back2"))
ok = abs(a - b) / abs(a) <= 1e-6
print("%s --init the out_dir folder: first loss %.8f (1 process) vs %.8f (2 ranks)" % ("ok  " if ok else "FAIL", a, b))
sys.exit(0 if ok else 1)
PY
# refusals: files of different steps, a layout the run does not have
cp "$W/ck/checkpoint.experts1-of-2.safetensors" "$W/x1"
run2 later --steps 4 --out_dir "$W/ck" > /dev/null
cp "$W/x1" "$W/ck/checkpoint.experts1-of-2.safetensors"
out=$(timeout 120 "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --expert_parallel 2 --steps 6 --resume "$W/ck/checkpoint.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q "memfit: error: .*experts1-of-2.safetensors is not group rank 1's experts of .*step 4 (step 3)" \
  && echo "ok   refused: experts file of another step" || { echo "FAIL mixed-step checkpoint: rc $rc"; printf '%s\n' "$out" | tail -3; fail=1; }
out=$("$M" train "${base[@]}" --steps 6 --resume "$W/ck/checkpoint.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q "memfit: error: .*holds the experts of an expert-parallel run (expert_parallel 2" \
  && echo "ok   refused: expert-parallel checkpoint in one process" || { echo "FAIL EP checkpoint in one process: rc $rc: $out"; fail=1; }
out=$(timeout 120 "${MPIRUN[@]}" -np 2 "$M" train "${base[@]}" --expert_parallel 2 --steps 6 --resume "$W/ck1/checkpoint.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q "memfit: error: .*a checkpoint without expert parallelism; this run has expert_parallel 2" \
  && echo "ok   refused: single-process checkpoint under expert_parallel" || { echo "FAIL plain checkpoint under EP: rc $rc"; printf '%s\n' "$out" | tail -3; fail=1; }
exit $fail
