#!/usr/bin/env bash
# Checkpoints and model files carry a checksum per tensor; the CLI refuses
# a damaged one in one line naming the tensor, and never blames the
# learning rate for a NaN that came from the file:
#  - one flipped bit in a weight of checkpoint.safetensors: --resume fails,
#    naming the tensor and "corrupt";
#  - one flipped bit in an optimizer state row: the same;
#  - a NaN weight in model.safetensors: eval --init fails naming the tensor;
#  - the same files untouched load (resume, eval) and every tensor memfit
#    wrote has a checksum entry.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-ck-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
PY=/usr/bin/python3

head -c 30000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" > /dev/null
TINY="--model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 32 --seq 32 --batch 4 --data $W/c.tok
      --progress 0 --val_every 0 --sample_tokens 0 --threads 1"
"$M" train $TINY --steps 2 --out_dir "$W/out" > "$W/train.txt" 2>&1 || { cat "$W/train.txt"; exit 1; }

# edit FILE TENSOR MODE OUT: copies FILE to OUT with tensor TENSOR changed
# (MODE flip: one bit of its middle byte; nan: its first element set to NaN)
edit() {
  $PY - "$@" <<'PY'
import json, struct, sys
src, name, mode, out = sys.argv[1:5]
b = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
lo, hi = h[name]["data_offsets"]
at = 8 + n + lo
if mode == "flip": b[at + (hi - lo) // 2] ^= 0x10
else: b[at:at + 4] = struct.pack("<f", float("nan"))
open(out, "wb").write(b)
PY
}

$PY - "$W/out/checkpoint.safetensors" "$W/out/model.safetensors" <<'PY' || fail=1
import json, struct, sys
for f in sys.argv[1:]:
    b = open(f, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__")
    miss = [k for k in h if "xxh3_64:" + k not in meta or len(meta["xxh3_64:" + k]) != 16]
    print(("ok   " if not miss else "FAIL ") + "%s: a checksum for each of its %d tensors%s" % (f.split("/")[-1], len(h), miss[:3] if miss else ""))
    if miss: sys.exit(1)
PY

"$M" train $TINY --steps 3 --resume "$W/out/checkpoint.safetensors" > "$W/ok.txt" 2>&1
check "untouched checkpoint resumes" "[ $? -eq 0 ]"
"$M" eval $TINY --init "$W/out/model.safetensors" > "$W/ok2.txt" 2>&1
check "untouched model file evaluates" "[ $? -eq 0 ]"

edit "$W/out/checkpoint.safetensors" h.1.attn.c_proj.weight flip "$W/flip.safetensors"
"$M" train $TINY --steps 3 --resume "$W/flip.safetensors" > "$W/flip.txt" 2>&1
check "flipped bit in a weight: one-line error naming the tensor" \
  "[ $? -ne 0 ] && [ \$(wc -l < '$W/flip.txt') -eq 1 ] && grep -q \"tensor 'h.1.attn.c_proj.weight' is corrupt\" '$W/flip.txt'"

edit "$W/out/checkpoint.safetensors" adam.v.h.0.mlp.c_fc.weight flip "$W/flip2.safetensors"
"$M" train $TINY --steps 3 --resume "$W/flip2.safetensors" > "$W/flip2.txt" 2>&1
check "flipped bit in optimizer state: one-line error naming it" \
  "[ $? -ne 0 ] && [ \$(wc -l < '$W/flip2.txt') -eq 1 ] && grep -q \"tensor 'adam.v.h.0.mlp.c_fc.weight' is corrupt\" '$W/flip2.txt'"

edit "$W/out/model.safetensors" h.0.ln_2.weight nan "$W/nan.safetensors"
"$M" eval $TINY --init "$W/nan.safetensors" > "$W/nan.txt" 2>&1
check "NaN weight: one-line error naming the tensor, not the learning rate" \
  "[ $? -ne 0 ] && [ \$(wc -l < '$W/nan.txt') -eq 1 ] && grep -q \"tensor 'h.0.ln_2.weight' holds a non-finite value (NaN) at element 0\" '$W/nan.txt' && ! grep -q ' lr' '$W/nan.txt'"

[ $fail -eq 0 ] && echo "test_cli_checksums: ok"
exit $fail
