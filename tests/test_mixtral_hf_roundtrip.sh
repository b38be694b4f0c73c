#!/usr/bin/env bash
# A Mixtral HF folder out and back in: memfit trains moe-tiny 2 steps into
# --out_dir OUT (config.json: MixtralForCausalLM, num_local_experts 4,
# num_experts_per_tok 2, router_aux_loss_coef; model.safetensors with
# experts one tensor each, HF's names); --init OUT --steps 0 reloads it and
# writes model.safetensors and config.json again byte for byte. (Loading a
# folder PyTorch wrote is test_mixtral_matches_torch.)
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-mixtral-hf-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
/usr/bin/python3 -c "import random; random.seed(3); open('$W/c.txt','w').write(''.join(random.choice('abcdefgh ') for _ in range(4000)))"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
run=(--data "$W/c.tok" --seq 32 --batch 2 --val_every 0 --sample_tokens 0 --progress 0 --threads 1)
"$M" train --model moe-tiny "${run[@]}" --steps 2 --out_dir "$W/out" > "$W/a.txt" 2>&1 || { echo "FAIL: train"; cat "$W/a.txt"; exit 1; }
"$M" train --init "$W/out" "${run[@]}" --steps 0 --out_dir "$W/out2" > "$W/b.txt" 2>&1 || { echo "FAIL: --init OUT"; cat "$W/b.txt"; exit 1; }
for f in model.safetensors config.json; do
  cmp -s "$W/out/$f" "$W/out2/$f" || { echo "FAIL: $f differs after --init OUT --steps 0"; fail=1; }
done
/usr/bin/python3 - "$W/out" <<'PY' || fail=1
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
want = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
for k, v in want.items():
    if c.get(k) != v:
        print("FAIL: config.json %s = %r, want %r" % (k, c.get(k), v)); sys.exit(1)
if abs(c.get("router_aux_loss_coef", -1) - 0.02) > 1e-6:
    print("FAIL: router_aux_loss_coef %r" % c.get("router_aux_loss_coef")); sys.exit(1)
b = open(d + "/model.safetensors", "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
for l in range(2):
    if h.get("model.layers.%d.block_sparse_moe.gate.weight" % l, {}).get("shape") != [4, 64]:
        print("FAIL: router of layer %d" % l); sys.exit(1)
    for e in range(4):
        for w, s in (("w1", [64, 64]), ("w3", [64, 64]), ("w2", [64, 64])):
            n = "model.layers.%d.block_sparse_moe.experts.%d.%s.weight" % (l, e, w)
            if h.get(n, {}).get("shape") != s:
                print("FAIL: %s is %r" % (n, h.get(n))); sys.exit(1)
if any(".experts.w" in n for n in h):
    print("FAIL: a stacked expert name in an HF folder"); sys.exit(1)
print("HF names and config keys ok")
PY
[ $fail = 0 ] && echo "test_mixtral_hf_roundtrip: ok"
exit $fail
