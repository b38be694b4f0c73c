#!/usr/bin/env bash
# Bad input reaches a one-line error and exit status 1: never a crash
# (signal), never a stack trace, never a checkpoint left half-written.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-cli-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
tiny=(--model gpt2-1m --n_layer 1 --n_embd 32 --n_head 4 --block_size 16 --seq 16 --batch 2
      --sample_tokens 0 --val_every 0 --threads 2)

# a small byte-level corpus and its token file
head -c 20000 /dev/urandom | base64 > "$W/corpus.txt"
"$M" tokenize --tokenizer bytes "$W/corpus.txt" "$W/good.tok" >/dev/null || { echo "tokenize failed"; exit 1; }

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  "$@" >"$W/out" 2>"$W/err"
  local rc=$?
  local lines; lines=$(wc -l <"$W/err")
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit $rc (want 1)"; cat "$W/err"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -q -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  if ls "$W"/out_dir/* 2>/dev/null | grep -q .; then echo "FAIL $name: files left in out_dir"; ls "$W/out_dir"; fail=1; fi
  echo "ok   $name: $(cat "$W/err")"
}

expect_error unknown-key "unknown option --bogus" "$M" train "${tiny[@]}" --data "$W/good.tok" --bogus 1
expect_error bad-value "config key 'batch'" "$M" train "${tiny[@]}" --data "$W/good.tok" --batch 0
expect_error bad-size "budget" "$M" train "${tiny[@]}" --data "$W/good.tok" --budget 12parsecs
expect_error impossible-budget "over by" "$M" train "${tiny[@]}" --data "$W/good.tok" --budget 1MiB --out_dir "$W/out_dir"
expect_error estimate-budget "over by" "$M" estimate --model gpt2-124m --batch 4 --seq 256 --budget 1GiB
expect_error train-budget-smallest "smallest feasible budget is" "$M" train "${tiny[@]}" --data "$W/good.tok" --budget 1MiB --out_dir "$W/out_dir"
expect_error plan-budget-smallest "smallest feasible budget is" "$M" plan --model gpt2-1m --batch 4 --seq 64 --budget 1MiB
expect_error estimate-budget-hint "smallest feasible budget is" "$M" estimate --model gpt2-124m --batch 4 --seq 256 --budget 1GiB
expect_error estimate-budget-fits "fastest setting that fits" "$M" estimate --model gpt2-1m --batch 8 --seq 128 --budget 64MiB
expect_error plan-off-hint "fastest setting that fits" "$M" train --model gpt2-1m --batch 8 --seq 128 --steps 1 --plan off --budget 64MiB --sample_tokens 0
expect_error bad-allow "config key 'allow'" "$M" plan --model gpt2-1m --allow everything
expect_error bad-plan "config key 'plan'" "$M" train "${tiny[@]}" --data "$W/good.tok" --plan maybe
expect_error bad-health-levels "health_levels" "$M" train "${tiny[@]}" --data "$W/good.tok" --health_levels 0.9,0.8,0.95,0.97
expect_error bad-precision "config key 'precision'" "$M" train "${tiny[@]}" --data "$W/good.tok" --precision fp8
expect_error fp16-no-master "master_weights 0 needs precision bf16" "$M" train "${tiny[@]}" --data "$W/good.tok" --precision fp16 --master_weights=0
expect_error fp16-in-backward "precision fp16 cannot update in backward" "$M" train "${tiny[@]}" --data "$W/good.tok" --precision fp16 --update_in_backward --grad_clip 0
expect_error bf16-zero "ZeRO sharding of 16-bit weights" "$M" estimate --model gpt2-1m --precision bf16 --world_size 2 --zero 1
expect_error bad-isa "MEMFIT_ISA='bogus' is not auto, portable or avx512" env MEMFIT_ISA=bogus "$M" train "${tiny[@]}" --data "$W/good.tok"
expect_error bad-gemm "MEMFIT_GEMM='bogus' is not auto, onednn, matmul or openblas" env MEMFIT_GEMM=bogus "$M" train "${tiny[@]}" --data "$W/good.tok"
expect_error bad-gemm-split "MEMFIT_GEMM_SPLIT='2' is not 0 or 1" env MEMFIT_GEMM_SPLIT=2 "$M" train "${tiny[@]}" --data "$W/good.tok"
expect_error bad-omp-wait "config key 'omp_wait'" "$M" train "${tiny[@]}" --data "$W/good.tok" --omp_wait sometimes
expect_error effective-batch "not a multiple of batch" "$M" train "${tiny[@]}" --data "$W/good.tok" --effective_batch 3
expect_error plan-effective-batch "is not effective_batch" "$M" plan --model gpt2-1m --batch 2 --grad_accum 2 --effective_batch 6
# the arena cannot be mapped (address space limited): the plan by category
# and the smallest setting. (Not under AddressSanitizer, which needs far
# more address space than any limit that would stop the arena.)
if ! ldd "$M" 2>/dev/null | grep -q libasan; then
  expect_error arena-oom "smallest setting needs" bash -c "ulimit -v 600000; exec \"\$0\" \"\$@\"" "$M" train \
    --model gpt2-10m --batch 8 --seq 256 --steps 1 --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0
fi
expect_error missing-data "No such file" "$M" train "${tiny[@]}" --data "$W/nope.tok"
head -c 1000 "$W/good.tok" > "$W/trunc.tok"
expect_error truncated-tokens "truncated" "$M" train "${tiny[@]}" --data "$W/trunc.tok" --out_dir "$W/out_dir"
printf 'not a token file at all, just some text padding it out to sixty-four bytes and more' > "$W/text.tok"
expect_error not-token-file "token file" "$M" train "${tiny[@]}" --data "$W/text.tok"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": broken json' > "$W/corrupt.safetensors"
expect_error corrupt-safetensors "corrupt.safetensors" "$M" train "${tiny[@]}" --data "$W/good.tok" --init "$W/corrupt.safetensors" --out_dir "$W/out_dir"
# weights of another shape
"$M" train --model gpt2-1m --n_layer 1 --n_embd 48 --n_head 4 --block_size 16 --seq 16 --batch 2 --sample_tokens 0 \
  --val_every 0 --threads 2 --steps 1 --data "$W/good.tok" --out_dir "$W/other" >/dev/null 2>&1 || { echo "FAIL: training the other model"; fail=1; }
expect_error wrong-shapes "the model needs F32" "$M" train "${tiny[@]}" --data "$W/good.tok" --init "$W/other/model.safetensors" --out_dir "$W/out_dir"
expect_error resume-not-checkpoint "not a memfit checkpoint" "$M" train "${tiny[@]}" --data "$W/good.tok" --resume "$W/other/model.safetensors"
printf 'batch: [1, 2\n' > "$W/bad.yaml"
expect_error bad-yaml "bad.yaml" "$M" train --config "$W/bad.yaml"
printf 'batchsize: 4\n' > "$W/unknown.yaml"
expect_error unknown-yaml-key "unknown config key 'batchsize'" "$M" train --config "$W/unknown.yaml"
expect_error bad-heads "does not divide" "$M" estimate --model gpt2-1m --n_head 3
expect_error seq-too-long "exceeds the model's block_size" "$M" estimate --model gpt2-1m --seq 4096
expect_error unknown-preset "unknown model preset" "$M" estimate --model gpt5
expect_error sample-no-weights "--init" "$M" sample --model gpt2-1m
expect_error tokenize-args "tokenize needs" "$M" tokenize only-one-arg
expect_error missing-tokenizer "tokenizer files not found" "$M" train --model gpt2-10m --tokenizer_dir "$W/none" --data "$W/good.tok"
"$M" frobnicate >/dev/null 2>&1; rc=$?
if [ $rc -ne 2 ]; then echo "FAIL unknown-command: exit $rc"; fail=1; else echo "ok   unknown-command: exit 2"; fi

# LoRA: bad settings, refused combinations, adapters that do not fit
expect_error lora-no-r "r=N is required" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora alpha=16
expect_error lora-bad-r "r must be a whole number" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=0
expect_error lora-bad-target "unknown target 'attn.q'" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,targets=attn.q
expect_error lora-bad-dropout "dropout must be in" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,dropout=1
expect_error lora-bad-key "unknown key 'beta'" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,beta=2
expect_error lora-bad-alpha "alpha expects a number" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,alpha=x
expect_error lora-twice "given twice" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,targets=mlp.c_fc,mlp.c_fc
expect_error lora-uib "update_in_backward is not supported" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8 --update_in_backward=1 --grad_clip 0
expect_error lora-offload "offload is not supported" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8 --offload "optimizer=disk:$W/state.bin"
expect_error base-dtype-bad "base_dtype" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8 --base_dtype fp8
expect_error base-dtype-no-lora "needs --lora" "$M" train "${tiny[@]}" --data "$W/good.tok" --base_dtype nf4
expect_error lora-precision "not supported with LoRA yet" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8 --precision fp16
expect_error adapter-no-config "adapter_config.json: cannot open" "$M" train "${tiny[@]}" --data "$W/good.tok" --adapter "$W/none"
expect_error save-adapter-no-lora "needs --lora" "$M" train "${tiny[@]}" --data "$W/good.tok" --save-adapter "$W/none"
expect_error adapter-missing "adapter_config.json" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8 --adapter "$W/none"
"$M" train "${tiny[@]}" --n_layer 2 --data "$W/good.tok" --steps 1 --lora r=4,targets=attn.c_attn --save-adapter "$W/ad4" >/dev/null 2>&1 \
  || { echo "FAIL: saving an adapter"; fail=1; }
expect_error adapter-rank "was made with r=4" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=8,targets=attn.c_attn --adapter "$W/ad4"
cp -r "$W/ad4" "$W/ad4x"; sed -i 's/"r": 4/"r": 8/' "$W/ad4x/adapter_config.json"
expect_error adapter-shape "this run expects" "$M" train "${tiny[@]}" --data "$W/good.tok" --adapter "$W/ad4x"
expect_error adapter-targets "targets=attn.c_attn but this run" "$M" train "${tiny[@]}" --data "$W/good.tok" --lora r=4,targets=mlp.c_fc --adapter "$W/ad4"
expect_error adapter-extra "unexpected tensor" "$M" train "${tiny[@]}" --data "$W/good.tok" --adapter "$W/ad4"
expect_error adapter-deeper "no tensor" "$M" train "${tiny[@]}" --n_layer 3 --data "$W/good.tok" --adapter "$W/ad4"
"$M" train "${tiny[@]}" --data "$W/good.tok" --steps 1 --out_dir "$W/base1" >/dev/null 2>&1 || { echo "FAIL: base model"; fail=1; }
expect_error merge-args "merge needs --model-file" "$M" merge --adapter "$W/ad4"
expect_error merge-mismatch "match no weight" "$M" merge --model-file "$W/base1/model.safetensors" --adapter "$W/ad4" --out "$W/m.safetensors"
expect_error merge-no-adapter "adapter_config.json" "$M" merge --model-file "$W/base1/model.safetensors" --adapter "$W/none" --out "$W/m.safetensors"
# a finite but huge weight (3e38, near float's largest) overflows in the
# forward: the loaders accept it (finite, checksum dropped as another tool's
# file would have none), the step's loss is NaN, and the message names the
# first non-finite tensor and the huge weight instead of blaming the lr
python3 - "$W/base1/model.safetensors" "$W/huge.safetensors" h.0.ln_1.weight 3e38 <<'PY' || { echo "FAIL: writing huge.safetensors"; fail=1; }
import json, struct, sys
src, dst, name, val = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
lo, hi = h[name]['data_offsets']
data[lo:hi] = struct.pack('<%df' % ((hi - lo) // 4), *([val] * ((hi - lo) // 4)))
h['__metadata__'].pop('xxh3_64:' + name, None)
hj = json.dumps(h).encode()
open(dst, 'wb').write(struct.pack('<Q', len(hj)) + hj + bytes(data))
PY
expect_error huge-weight-names-tensor "first non-finite tensor (weights, activations, gradients): gradient grad\.[a-z0-9_.]* element [0-9]* is .*nan; weights all finite, largest h\.0\.ln_1\.weight element" \
  "$M" train "${tiny[@]}" --data "$W/good.tok" --steps 3 --init "$W/huge.safetensors" --out_dir "$W/out_dir"

# a failed run after good checkpoints leaves them intact: train, then ask to
# write into a read-only place is hard as root, so corrupt the resume input
"$M" train "${tiny[@]}" --data "$W/good.tok" --steps 2 --out_dir "$W/ck" >/dev/null 2>&1 || { echo "FAIL: training"; fail=1; }
sum1=$(sha256sum "$W/ck/checkpoint.safetensors" | cut -d' ' -f1)
"$M" train "${tiny[@]}" --data "$W/trunc.tok" --steps 4 --resume "$W/ck/checkpoint.safetensors" --out_dir "$W/ck" >/dev/null 2>&1
sum2=$(sha256sum "$W/ck/checkpoint.safetensors" | cut -d' ' -f1)
if [ "$sum1" != "$sum2" ] || ls "$W/ck" | grep -q tmp; then echo "FAIL checkpoint changed by a failed run"; fail=1; else echo "ok   checkpoint intact after a failed run"; fi
exit $fail
