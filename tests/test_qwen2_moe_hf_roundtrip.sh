#!/usr/bin/env bash
# A Qwen2-MoE HF folder out and back in. 1) memfit trains qwen2-moe-tiny 2
# steps into --out_dir OUT (config.json: Qwen2MoeForCausalLM, num_experts,
# moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob
# false; model.safetensors with HF's names: mlp.gate, mlp.experts.{e}.*_proj
# one tensor each, mlp.shared_expert.*_proj, mlp.shared_expert_gate, q/k/v
# biases); --init OUT --steps 0 writes model.safetensors and config.json
# again byte for byte. 2) A folder PyTorch wrote (tests/ref/qwen2_moe_torch.py)
# through --init DIR --steps 0 --out_dir: every tensor back under the same
# name, shape and bytes.
set -u
M=${MEMFIT_BIN:?}
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/memfit-qwen2moe-hf-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
/usr/bin/python3 -c "import random; random.seed(3); open('$W/c.txt','w').write(''.join(random.choice('abcdefgh ') for _ in range(4000)))"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
run=(--data "$W/c.tok" --seq 32 --batch 2 --val_every 0 --sample_tokens 0 --progress 0 --threads 1)
"$M" train --model qwen2-moe-tiny "${run[@]}" --steps 2 --out_dir "$W/out" > "$W/a.txt" 2>&1 || { echo "FAIL: train"; cat "$W/a.txt"; exit 1; }
"$M" train --init "$W/out" "${run[@]}" --steps 0 --out_dir "$W/out2" > "$W/b.txt" 2>&1 || { echo "FAIL: --init OUT"; cat "$W/b.txt"; exit 1; }
for f in model.safetensors config.json; do
  cmp -s "$W/out/$f" "$W/out2/$f" || { echo "FAIL: $f differs after --init OUT --steps 0"; fail=1; }
done
/usr/bin/python3 - "$W/out" <<'PY' || fail=1
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
want = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "mlp_only_layers": []}
for k, v in want.items():
    if c.get(k) != v:
        print("FAIL: config.json %s = %r, want %r" % (k, c.get(k), v)); sys.exit(1)
b = open(d + "/model.safetensors", "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
for l in range(2):
    p = "model.layers.%d." % l
    exp = {p + "mlp.gate.weight": [4, 64], p + "mlp.shared_expert.gate_proj.weight": [64, 64],
           p + "mlp.shared_expert.up_proj.weight": [64, 64], p + "mlp.shared_expert.down_proj.weight": [64, 64],
           p + "mlp.shared_expert_gate.weight": [1, 64], p + "self_attn.q_proj.bias": [64],
           p + "self_attn.k_proj.bias": [16], p + "self_attn.v_proj.bias": [16]}
    for e in range(4):
        exp.update({p + "mlp.experts.%d.gate_proj.weight" % e: [32, 64], p + "mlp.experts.%d.up_proj.weight" % e: [32, 64],
                    p + "mlp.experts.%d.down_proj.weight" % e: [64, 32]})
    for n, s in exp.items():
        if h.get(n, {}).get("shape") != s:
            print("FAIL: %s is %r, want shape %r" % (n, h.get(n), s)); sys.exit(1)
if any(".experts.gate_proj" in n or ".experts.up_proj" in n or ".experts.down_proj" in n for n in h):
    print("FAIL: a stacked expert name in an HF folder"); sys.exit(1)
print("HF names and config keys ok")
PY
/usr/bin/python3 "$SRC/tests/ref/qwen2_moe_torch.py" make-case --out "$W/ref" --steps 1 --seq 32 --batch 2 >/dev/null || { echo "FAIL: reference"; exit 1; }
"$M" train --init "$W/ref/hf" "${run[@]}" --steps 0 --out_dir "$W/back" > "$W/c.txt" 2>&1 || { echo "FAIL: --init torch folder"; cat "$W/c.txt"; exit 1; }
/usr/bin/python3 - "$W/ref/hf/model.safetensors" "$W/back/model.safetensors" <<'PY' || fail=1
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
if set(a) != set(b):
    print("FAIL: names differ: torch only %s, memfit only %s" % (sorted(set(a) - set(b))[:4], sorted(set(b) - set(a))[:4])); sys.exit(1)
bad = [k for k in a if a[k] != b[k]]
if bad:
    print("FAIL: %d tensors differ, e.g. %s" % (len(bad), bad[:3])); sys.exit(1)
print("torch folder -> memfit -> folder: %d tensors bit-identical" % len(a))
PY
[ $fail = 0 ] && echo "test_qwen2_moe_hf_roundtrip: ok"
exit $fail
