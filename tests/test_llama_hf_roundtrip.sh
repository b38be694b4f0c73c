#!/usr/bin/env bash
# Hugging Face folders in and out, against the PyTorch reference
# (tests/ref/llama_torch.py, written from transformers' semantics):
#  (a) a BF16 folder in 3 shards that the reference wrote loads exactly:
#      every weight memfit holds is the bf16 value widened to fp32 (bit for
#      bit), and memfit's first-step loss and eval loss on a batch equal the
#      reference's forward on the same folder and batch within 1e-5;
#  (b) memfit trains 3 steps from an F32 folder into --out_dir OUT (an HF
#      folder: config.json + model.safetensors); --init OUT --steps 0 reloads
#      it and writes model.safetensors and config.json again byte for byte;
#  (c) the reference's own reader opens memfit's OUT (config.json keys,
#      tensor names, (out, in) layout) and its loss on a batch equals
#      memfit's eval loss on the same batch within 1e-5.
#  (d) config.json as transformers reads it: without tie_word_embeddings the
#      head is untied (LlamaConfig, Qwen2Config and MistralConfig default it
#      to False; PretrainedConfig's True does not apply), so lm_head.weight
#      is the head, not silently dropped; and the run's report does not call
#      a Llama folder by a GPT-2 preset's name.
# (a)-(c) for a Llama (untied, GQA) and a Qwen2 (q/k/v biases, tied) folder.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
REF="$SRC/tests/ref/llama_torch.py"
W=$(mktemp -d /tmp/memfit-hfrt-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
B=2 T=32
shape=(--layers 2 --hidden 64 --heads 8 --kv_heads 2 --head_dim 8 --inter 96 --vocab 256 --max_pos 256 --norm_jitter 0.1)
"$PY" "$REF" make-hf --out "$W/llama-bf16" --arch llama --tied 0 "${shape[@]}" --seed 5 --dtype BF16 --shards 3 >/dev/null &
"$PY" "$REF" make-hf --out "$W/llama-f32" --arch llama --tied 0 "${shape[@]}" --seed 6 >/dev/null &
"$PY" "$REF" make-hf --out "$W/qwen2-bf16" --arch qwen2 --tied 1 --rms_eps 1e-6 --rope_theta 1000000 "${shape[@]}" --seed 7 --dtype BF16 --shards 3 >/dev/null &
"$PY" "$REF" make-hf --out "$W/qwen2-f32" --arch qwen2 --tied 1 --rms_eps 1e-6 --rope_theta 1000000 "${shape[@]}" --seed 8 >/dev/null &
wait
for d in llama-bf16 llama-f32 qwen2-bf16 qwen2-f32; do
  [ -f "$W/$d/config.json" ] || { echo "FAIL: the reference wrote no $d (needs /usr/bin/python3 with python3-torch)"; exit 1; }
done
ls "$W"/llama-bf16/model-0000?-of-00003.safetensors >/dev/null 2>&1 || { echo "FAIL: no 3 shards in llama-bf16"; fail=1; }

# one batch of B x T: B*T+1 printable bytes as a token file (the loader
# reads inputs ids[0..BT), targets ids[1..BT]) and as the reference's
# batch.safetensors (inputs/targets I32 (B, T))
"$PY" -c "import random; random.seed(11); open('$W/batch.txt','w').write(''.join(random.choice('the whale swam under the ship; ') for _ in range($B*$T+1)))"
"$M" tokenize --tokenizer bytes "$W/batch.txt" "$W/batch.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
"$PY" - "$W/batch.tok" "$W/batch.safetensors" "$B" "$T" <<'PY' || { echo "FAIL: batch file"; exit 1; }
import json, struct, sys
tok, out, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = open(tok, "rb").read()
n = struct.unpack("<Q", b[24:32])[0]
assert n == B * T + 1, n
ids = struct.unpack("<%dH" % n, b[len(b) - 2 * n:])
assert bytes(ids).decode() == open(tok[:-4] + ".txt").read()   # bytes tokenizer: id = byte
blobs = [struct.pack("<%di" % (B * T), *ids[:-1]), struct.pack("<%di" % (B * T), *ids[1:])]
h = {"inputs": {"dtype": "I32", "shape": [B, T], "data_offsets": [0, 4 * B * T]},
     "targets": {"dtype": "I32", "shape": [B, T], "data_offsets": [4 * B * T, 8 * B * T]}}
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(out, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
PY
one=(--data "$W/batch.tok" --val_data "$W/batch.tok" --val_batches 1 --batch $B --seq $T --threads 1 --progress 0
      --sample_tokens 0)

ref_loss() {  # folder -> the reference's loss on the batch
  "$PY" "$REF" forward --hf "$1" --batch "$W/batch.safetensors" --out "$W/fwd.safetensors" >"$W/fwd.log" 2>&1 \
    || { echo "FAIL: reference forward on $1:" >&2; tail -3 "$W/fwd.log" >&2; echo nan; return; }
  sed -n 's/.* loss \([0-9.e+-]*\) -> .*/\1/p' "$W/fwd.log"
}
eval_loss() {  # folder -> memfit's eval loss on the batch
  "$M" eval --init "$1" "${one[@]}" >"$W/eval.log" 2>&1 || { echo "FAIL: memfit eval $1:" >&2; cat "$W/eval.log" >&2; echo nan; return; }
  sed -n 's/^val loss \([0-9.]*\) over 1 batches.*/\1/p' "$W/eval.log"
}
close() {  # name, a, b, tol: |a-b| <= tol*|b|
  if "$PY" -c "import sys, math; a, b, t = map(float, sys.argv[1:4]); sys.exit(0 if math.isfinite(a) and abs(a - b) <= t * abs(b) else 1)" "$2" "$3" "$4"; then
    echo "ok   $1: memfit $2, reference $3 (tolerance $4 relative)"
  else
    echo "FAIL $1: memfit $2, reference $3 (tolerance $4 relative)"; fail=1
  fi
}

for arch in llama qwen2; do
  # (a) bf16 shards: the weights memfit loaded, written back as F32, equal
  # the bf16 tensors of every shard exactly; the losses equal the reference's
  bf=$W/$arch-bf16
  if "$M" train --init "$bf" "${one[@]}" --steps 0 --out_dir "$W/$arch-bf16-loaded" >"$W/log" 2>&1; then
    # bf16 widened to fp32 is the bf16 bits in the high half: compare the bytes
    if "$PY" - "$W/$arch-bf16-loaded/model.safetensors" "$bf"/model-0000?-of-00003.safetensors <<'PY'
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
got = tensors(sys.argv[1])
want = {}
for s in sys.argv[2:]:
    want.update(tensors(s))
bad = [k for k in set(got) | set(want) if k not in got or k not in want]
for k in got.keys() & want.keys():
    gd, gs, gb = got[k]
    wd, ws, wb = want[k]
    widened = b"".join(b"\0\0" + wb[i:i + 2] for i in range(0, len(wb), 2))
    if gd != "F32" or wd != "BF16" or gs != ws or gb != widened:
        bad.append(k)
print("%d tensors, %d differ %s" % (len(got), len(bad), sorted(bad)[:3]))
sys.exit(1 if bad or not got else 0)
PY
    then ok=1; else ok=0; fi
    if [ $ok = 1 ]; then echo "ok   $arch bf16 3 shards: every weight memfit loaded is the bf16 value widened exactly"
    else echo "FAIL $arch bf16 3 shards: loaded weights differ from the shards' bf16 values"; fail=1; fi
  else
    echo "FAIL $arch bf16: memfit could not load the folder"; tail -3 "$W/log"; fail=1
  fi
  want=$(ref_loss "$bf")
  "$M" train --init "$bf" "${one[@]}" --steps 1 --val_every 0 --metrics "$W/m.jsonl" >"$W/log" 2>&1 \
    || { echo "FAIL $arch bf16: one training step"; tail -3 "$W/log"; fail=1; }
  got=$("$PY" -c "import json; print(repr(json.loads(open('$W/m.jsonl').readline())['loss']))" 2>/dev/null || echo nan)
  close "$arch bf16 3 shards, first-step loss" "$got" "$want" 1e-5
  close "$arch bf16 3 shards, eval loss" "$(eval_loss "$bf")" "$want" 1e-5

  # (b) train 3 steps from the F32 folder, reload what memfit wrote, write it again
  out=$W/$arch-out out2=$W/$arch-out2
  "$M" train --init "$W/$arch-f32" "${one[@]}" --steps 3 --warmup 1 --lr 1e-2 --val_every 0 --out_dir "$out" >"$W/log" 2>&1 \
    || { echo "FAIL $arch: training 3 steps into $out"; tail -3 "$W/log"; fail=1; }
  "$M" train --init "$out" "${one[@]}" --steps 0 --out_dir "$out2" >"$W/log" 2>&1 \
    || { echo "FAIL $arch: reloading $out"; tail -3 "$W/log"; fail=1; }
  if cmp -s "$out/model.safetensors" "$out2/model.safetensors" && cmp -s "$out/config.json" "$out2/config.json"; then
    echo "ok   $arch: trained 3 steps, reloaded: model.safetensors and config.json written again byte for byte"
  else
    echo "FAIL $arch: reloading memfit's folder changed it"; cmp "$out/model.safetensors" "$out2/model.safetensors"
    diff "$out/config.json" "$out2/config.json"; fail=1
  fi
  # the weights did move (the round trip is not of the initial folder)
  if "$PY" -c "
import json, struct, sys
def t(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = t(sys.argv[1]), t(sys.argv[2])
sys.exit(0 if a.keys() == b.keys() and all(a[k] == b[k] for k in a) else 1)" "$out/model.safetensors" "$W/$arch-f32/model.safetensors"; then
    echo "FAIL $arch: 3 steps left the weights as the folder had them"; fail=1
  fi

  # (c) the reference reads memfit's folder; its loss is memfit's
  close "$arch: reference forward on memfit's folder vs memfit eval" "$(eval_loss "$out")" "$(ref_loss "$out")" 1e-5
done

# (d) no tie_word_embeddings key: untied, as transformers loads it. The
# folder's lm_head.weight is then the head, and the loss is that of the same
# folder with the key false (a tied reading would use embed_tokens instead)
rm -rf "$W/nokey"; cp -r "$W/llama-f32" "$W/nokey"
sed -i '/"tie_word_embeddings"/d' "$W/nokey/config.json"
if grep -q tie_word_embeddings "$W/nokey/config.json" || ! grep -q '"tie_word_embeddings": false' "$W/llama-f32/config.json"; then
  echo "FAIL: could not remove tie_word_embeddings from the folder's config.json"; fail=1
fi
a=$(eval_loss "$W/llama-f32") b=$(eval_loss "$W/nokey")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
  echo "ok   config.json without tie_word_embeddings loads untied (lm_head.weight used): eval loss $b"
else
  echo "FAIL config.json without tie_word_embeddings: eval loss $b, but $a with the key false (transformers'"
  echo "     LlamaConfig/Qwen2Config/MistralConfig default tie_word_embeddings to False: lm_head.weight is the head)"; fail=1
fi
# the report names what runs: not a GPT-2 preset for a Llama folder
"$M" train --init "$W/llama-f32" "${one[@]}" --steps 1 --val_every 0 >"$W/log" 2>&1
"$M" estimate --init "$W/llama-f32" --batch $B --seq $T >>"$W/log" 2>&1
if grep -q '^model gpt2' "$W/log"; then
  echo "FAIL report: a LlamaForCausalLM folder is reported as a GPT-2 preset:"; grep '^model' "$W/log"; fail=1
else
  echo "ok   report: $(grep -m1 '^model' "$W/log")"
fi
exit $fail
