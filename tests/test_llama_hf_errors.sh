#!/usr/bin/env bash
# A Hugging Face folder that memfit cannot load reaches one line on stderr
# naming the file (or the folder) and the problem, a non-zero exit that is
# not a crash, and nothing written into --out_dir (a previous run's files
# there stay as they were). The folders are the PyTorch reference's
# (tests/ref/llama_torch.py make-hf), each then broken in one way: the
# config (another architecture, not JSON, a missing key, KV heads that do not
# divide the heads) or the weights (a tensor missing, misshaped, unexpected,
# of another dtype; a shard the index names missing; no weights at all; a
# truncated or corrupt file). The unbroken folders train.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/memfit-hferr-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
shape=(--arch llama --layers 2 --hidden 64 --heads 8 --kv_heads 2 --head_dim 8 --inter 96 --vocab 256 --max_pos 256 --tied 0)
"$PY" "$SRC/tests/ref/llama_torch.py" make-hf --out "$W/good" "${shape[@]}" >/dev/null &
"$PY" "$SRC/tests/ref/llama_torch.py" make-hf --out "$W/good3" "${shape[@]}" --shards 3 >/dev/null &
wait
[ -f "$W/good/model.safetensors" ] && [ -f "$W/good3/model.safetensors.index.json" ] \
  || { echo "FAIL: the reference wrote no folders (needs /usr/bin/python3 with python3-torch)"; exit 1; }
head -c 30000 /dev/urandom | base64 > "$W/corpus.txt"
"$M" tokenize --tokenizer bytes "$W/corpus.txt" "$W/data.tok" >/dev/null || { echo "FAIL: tokenize"; exit 1; }
run=(--data "$W/data.tok" --batch 2 --seq 32 --steps 2 --sample_tokens 0 --val_every 0 --threads 1 --progress 0)

# rewrites a safetensors file: drop NAME | shorten NAME (one row less) |
# add NAME (an F32 [4]) | dtype NAME DT (same bytes, another dtype)
st() {
  "$PY" - "$@" <<'PY'
import json, struct, sys
op, path, name = sys.argv[1:4]
b = open(path, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__", None)
t = {k: [v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]] for k, v in h.items()}
if name not in t and op != "add":
    sys.exit("no tensor %s in %s" % (name, path))
if op == "drop":
    del t[name]
elif op == "shorten":
    dt, sh, data = t[name]
    t[name] = [dt, [sh[0] - 1] + sh[1:], data[:len(data) - len(data) // sh[0]]]
elif op == "add":
    t[name] = ["F32", [4], b"\0" * 16]
elif op == "dtype":
    t[name][0] = sys.argv[4]
h, off, blobs = {}, 0, []
for k, (dt, sh, data) in t.items():
    h[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(data)]}
    off += len(data)
    blobs.append(data)
if meta:
    h["__metadata__"] = meta
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
PY
}
# a copy of the good folder (or of the sharded one) to break
copy() { rm -rf "$W/$1"; cp -r "$W/${2:-good}" "$W/$1"; }

# the good folders train (and write an HF folder)
for g in good good3; do
  if "$M" train --init "$W/$g" "${run[@]}" --out_dir "$W/out-$g" >"$W/log" 2>&1 && [ -f "$W/out-$g/model.safetensors" ]; then
    echo "ok   $g: trains 2 steps from the reference's folder"
  else
    echo "FAIL $g: training from the good folder failed"; tail -3 "$W/log"; fail=1
  fi
done
# a previous run's output, which a failed run must leave alone
( cd "$W/out-good" && sha256sum ./* ) > "$W/prior.sum"

expect_error() {  # name, file the message names, the problem, [command args...] (default: train --init W/name)
  local name=$1 file=$2 want=$3; shift 3
  local cmd=("$@")
  [ ${#cmd[@]} -eq 0 ] && cmd=("$M" train --init "$W/$name" "${run[@]}" --out_dir "$W/out")
  rm -rf "$W/out"
  "${cmd[@]}" >"$W/stdout" 2>"$W/err"
  local rc=$?
  local lines; lines=$(wc -l <"$W/err")
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then echo "FAIL $name: exit $rc (want an error exit, not 0 or a signal)"; cat "$W/err"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -qF -- "$file" "$W/err"; then echo "FAIL $name: message does not name $file:"; cat "$W/err"; fail=1; return; fi
  if ! grep -qF -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  if ls -A "$W/out" 2>/dev/null | grep -q .; then echo "FAIL $name: files written into --out_dir:"; ls -A "$W/out"; fail=1; return; fi
  echo "ok   $name (exit $rc): $(cat "$W/err")"
}

# config.json
copy gpt2; sed -i 's/"LlamaForCausalLM"/"GPT2LMHeadModel"/; s/"model_type": "llama"/"model_type": "gpt2"/' "$W/gpt2/config.json"
expect_error gpt2 "$W/gpt2/config.json" "architecture 'GPT2LMHeadModel' is not supported"
copy bert; sed -i 's/"LlamaForCausalLM"/"BertForMaskedLM"/; s/"model_type": "llama"/"model_type": "bert"/' "$W/bert/config.json"
expect_error bert "$W/bert/config.json" "architecture 'BertForMaskedLM' is not supported"
copy notjson; printf '{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,\n' > "$W/notjson/config.json"
expect_error notjson "$W/notjson/config.json" "not a JSON object"
copy nohidden; sed -i '/"hidden_size"/d' "$W/nohidden/config.json"
expect_error nohidden "$W/nohidden/config.json" "'hidden_size' is missing"
copy kvheads; sed -i 's/"num_key_value_heads": 2/"num_key_value_heads": 3/' "$W/kvheads/config.json"
expect_error kvheads "$W/kvheads/config.json" "num_key_value_heads 3 does not divide num_attention_heads 8"
copy noconfig; rm "$W/noconfig/config.json"
expect_error noconfig "$W/noconfig/config.json" "No such file"
# the same refusals from eval and estimate (they read the folder the same way)
expect_error kvheads-estimate "$W/kvheads/config.json" "does not divide" "$M" estimate --init "$W/kvheads" --batch 2 --seq 32

# model.safetensors
copy missing; st drop "$W/missing/model.safetensors" model.layers.1.mlp.up_proj.weight
expect_error missing "$W/missing" "tensor 'model.layers.1.mlp.up_proj.weight' is missing"
expect_error missing-eval "$W/missing" "tensor 'model.layers.1.mlp.up_proj.weight' is missing" \
  "$M" eval --init "$W/missing" --data "$W/data.tok" --batch 2 --seq 32 --threads 1
copy nohead; st drop "$W/nohead/model.safetensors" lm_head.weight
expect_error nohead "$W/nohead" "tensor 'lm_head.weight' is missing"
copy misshaped; st shorten "$W/misshaped/model.safetensors" model.layers.0.self_attn.k_proj.weight
expect_error misshaped "$W/misshaped/model.safetensors" "'model.layers.0.self_attn.k_proj.weight' is F32 [15, 64], the model needs F32 [16, 64]"
copy extra; st add "$W/extra/model.safetensors" model.layers.0.mlp.gate_proj.bias
expect_error extra "$W/extra/model.safetensors" "unexpected tensor 'model.layers.0.mlp.gate_proj.bias'"
copy dtype; st dtype "$W/dtype/model.safetensors" model.norm.weight I32
expect_error dtype "$W/dtype/model.safetensors" "'model.norm.weight' is I32 [64], the model needs F32 [64]"
copy noweights; rm "$W/noweights/model.safetensors"
expect_error noweights "$W/noweights" "no model.safetensors or model.safetensors.index.json"
copy truncated; head -c 100000 "$W/good/model.safetensors" > "$W/truncated/model.safetensors"
expect_error truncated "$W/truncated/model.safetensors" "extend past the data section"
copy short; head -c 5 "$W/good/model.safetensors" > "$W/short/model.safetensors"
expect_error short "$W/short/model.safetensors" "too short"
copy corrupt; printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": broken json' > "$W/corrupt/model.safetensors"
expect_error corrupt "$W/corrupt/model.safetensors" "not valid JSON"

# shards: the index names a file that is not there; the index is not JSON;
# a shard lacks a tensor the index says it holds
copy noshard good3; rm "$W/noshard/model-00002-of-00003.safetensors"
expect_error noshard "$W/noshard/model.safetensors.index.json" "shard 'model-00002-of-00003.safetensors' named for"
copy badindex good3; printf '{"weight_map": ' > "$W/badindex/model.safetensors.index.json"
expect_error badindex "$W/badindex/model.safetensors.index.json" "weight_map"
copy shardlacks good3; st drop "$W/shardlacks/model-00002-of-00003.safetensors" model.layers.0.input_layernorm.weight
expect_error shardlacks "$W/shardlacks" "tensor 'model.layers.0.input_layernorm.weight' is missing"

# the failed runs into the previous run's folder leave it as it was
rm -rf "$W/out"
"$M" train --init "$W/missing" "${run[@]}" --out_dir "$W/out-good" >/dev/null 2>&1
"$M" train --init "$W/truncated" "${run[@]}" --out_dir "$W/out-good" >/dev/null 2>&1
if ( cd "$W/out-good" && sha256sum -c --quiet "$W/prior.sum" ) && ! ls -A "$W/out-good" | grep -q tmp; then
  echo "ok   a previous run's folder is unchanged by failed runs into it"
else
  echo "FAIL a failed run changed the previous run's folder"; ls -la "$W/out-good"; fail=1
fi
exit $fail
