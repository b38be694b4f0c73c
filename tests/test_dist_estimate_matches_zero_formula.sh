#!/usr/bin/env bash
# memfit estimate --world-size N --zero S prints per-rank model states that
# match the ZeRO paper's formulas (Rajbhandari et al. 2020, section 5.1)
# with memfit's dtypes: 4 bytes per parameter, 4 per gradient, 8 of AdamW
# state (m and v in fp32). Psi is computed here from the preset's
# dimensions, not read from memfit; rows are 64-byte aligned and shards
# split by elements, so each row may differ by less than 64 bytes.
set -u
M=${MEMFIT_BIN:?}
fail=0
for n in 2 4; do
  for z in 0 1 2 3; do
    "$M" estimate --json --model gpt2-124m --batch 4 --seq 256 --world-size $n --zero $z > /tmp/memfit-est-$$.json \
      || { echo "FAIL estimate N=$n zero=$z"; fail=1; continue; }
    /usr/bin/python3 - /tmp/memfit-est-$$.json $n $z <<'PY' || fail=1
import json, sys
e = json.load(open(sys.argv[1]))
N, S = int(sys.argv[2]), int(sys.argv[3])
L, C, T, V = 12, 768, 1024, 50257          # gpt2-124m
Vp = (V + 63) // 64 * 64                   # memfit pads the vocabulary rows
psi = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
want = {"params": 4 * psi if S < 3 else 4 * psi / N,
        "grads": 4 * psi if S < 2 else 4 * psi / N,
        "optim": 8 * psi if S < 1 else 8 * psi / N}
ntensors = 2 + 12 * L + 2
tol = {"params": 64 * ntensors, "grads": 64 * ntensors, "optim": 2 * 64 * ntensors}
got = e["model_states"]
ok = e["world_size"] == N and e["zero"] == S and all(abs(got[k] - want[k]) <= tol[k] for k in want)
print("%s N=%d zero %d: per-rank params %d (formula %d), grads %d (%d), optimizer %d (%d)" % (
    "ok  " if ok else "FAIL", N, S, got["params"], want["params"], got["grads"], want["grads"], got["optim"], want["optim"]))
sys.exit(0 if ok else 1)
PY
  done
done
rm -f /tmp/memfit-est-$$.json
# the text form says which stage and how many ranks
"$M" estimate --model gpt2-10m --world-size 2 --zero 1 | grep -q "data parallel over 2 ranks, ZeRO stage 1" \
  && echo "ok   text estimate names the ranks and the stage" || { echo "FAIL text estimate"; fail=1; }
# stage 3 keeps at most 0.55x stage 0's model states per rank at N=2 (the formula's limit is 0.5x)
for z in 0 3; do "$M" estimate --json --model gpt2-124m --batch 4 --seq 256 --world-size 2 --zero $z > "/tmp/memfit-est-$$-$z.json"; done
/usr/bin/python3 - /tmp/memfit-est-$$-0.json /tmp/memfit-est-$$-3.json <<'PY' || fail=1
import json, sys
t = [sum(json.load(open(f))["model_states"].values()) for f in sys.argv[1:]]
ok = t[1] <= 0.55 * t[0]
print("%s gpt2-124m N=2: zero 3 model states %.3fx zero 0's" % ("ok  " if ok else "FAIL", t[1] / t[0]))
sys.exit(0 if ok else 1)
PY
rm -f /tmp/memfit-est-$$-*.json
# stage 3 gathers a layer's parameters for its own phases: block recompute is refused
out=$("$M" estimate --model gpt2-10m --world-size 2 --zero 3 --recompute full 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "use recompute none or selective with zero 3"; then echo "ok   zero 3 with recompute full refused"
else echo "FAIL zero 3 + recompute full: rc $rc: $out"; fail=1; fi
# world_size names the ranks for the estimate only: train takes mpirun's
out=$("$M" train --model gpt2-1m --steps 1 --world-size 2 --sample_tokens 0 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "world_size 2, but this process is one of 1 ranks"; then echo "ok   train --world-size without mpirun refused"
else echo "FAIL train --world-size: rc $rc: $out"; fail=1; fi
exit $fail
