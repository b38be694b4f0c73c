#!/usr/bin/env bash
# Bit-identity of a refactor: runs short GPT-2 and llama-tiny trainings in
# each precision and technique with two memfit binaries (a baseline built
# from the commit before the change, and the current build) and compares
# the final model (or adapter) byte for byte, the per-step loss, gradient
# norm and planned/ledger bytes, text sampled from the fp32 models (a
# forward without targets), and `memfit estimate --json`.
#   scripts/check_identity.sh BASE_BIN NEW_BIN [CASE_FILTER]
# Exit 0 when every case is identical; prints one line per case.
set -u
BASE=${1:?usage: check_identity.sh BASE_BIN NEW_BIN [filter]}
NEW=${2:?usage: check_identity.sh BASE_BIN NEW_BIN [filter]}
FILTER=${3:-}
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
W=$(mktemp -d /tmp/memfit-identity-XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f "$CACHE/moby-dick.txt" ] || { echo "FAIL: $CACHE/moby-dick.txt missing (make data)"; exit 1; }
head -c 200000 "$CACHE/moby-dick.txt" > "$W/text.txt"
"$NEW" tokenize --tokenizer bytes "$W/text.txt" "$W/bytes.tok" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# name | model and shape | technique flags
CASES=(
  "g-fp32|--model gpt2-1m|"
  "g-bf16|--model gpt2-1m|--precision bf16"
  "g-fp16|--model gpt2-1m|--precision fp16"
  "g-bf16-nomaster|--model gpt2-1m|--precision bf16 --master_weights=0"
  "g-full|--model gpt2-1m|--recompute full"
  "g-selective|--model gpt2-1m|--recompute selective"
  "g-every2|--model gpt2-1m|--recompute every:2"
  "g-bf16-full|--model gpt2-1m|--precision bf16 --recompute full"
  "g-fp16-selective|--model gpt2-1m|--precision fp16 --recompute selective"
  "g-chunk|--model gpt2-1m|--loss_chunk 64"
  "g-uib|--model gpt2-1m|--update_in_backward=1 --grad_clip 0"
  "g-lora|--model gpt2-1m|--lora r=4,alpha=8,dropout=0.1,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"
  "g-lora-full|--model gpt2-1m|--lora r=4,alpha=8,targets=attn.c_attn,mlp.c_proj --recompute full"
  "g-qlora-nf4|--model gpt2-1m|--lora r=4,alpha=8,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj --base_dtype nf4"
  "g-qlora-int8|--model gpt2-1m|--lora r=4,alpha=8,targets=attn.c_attn,mlp.c_fc --base_dtype int8 --recompute selective"
  "l-fp32|--model llama-tiny|"
  "l-bf16|--model llama-tiny|--precision bf16"
  "l-fp16-selective|--model llama-tiny|--precision fp16 --recompute selective"
  "l-full|--model llama-tiny|--recompute full"
  "l-lora|--model llama-tiny|--lora r=4,alpha=8,dropout=0.1,targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
  "l-qlora-nf4|--model llama-tiny|--lora r=4,alpha=8,targets=q_proj,v_proj,down_proj --base_dtype nf4 --recompute full"
)
fail=0
for c in "${CASES[@]}"; do
  IFS='|' read -r name model flags <<< "$c"
  [ -n "$FILTER" ] && [[ "$name" != *$FILTER* ]] && continue
  for side in base new; do
    bin=$BASE; [ $side = new ] && bin=$NEW
    out="$W/$name.$side"
    save=""; [[ "$flags" == *--lora* ]] && save="--save_adapter $out/adapter"
    # shellcheck disable=SC2086
    "$bin" train $model --data "$W/bytes.tok" --batch 2 --seq 64 --steps 3 $flags --seed 7 --sample_tokens 0 \
      --val_every 0 --val_batches 1 --progress 0 --out_dir "$out" $save --metrics "$out.jsonl" > "$out.log" 2>&1 \
      || { echo "FAIL $name: $side train failed"; tail -3 "$out.log"; fail=1; continue 2; }
  done
  f="$W/$name"
  fields='"(step|loss|grad_norm|planned_peak_bytes|arena_bytes|ledger_peak_bytes|mem_[a-z]+)":[^,}]*'
  if ! cmp -s <(grep -oE "$fields" "$f.base.jsonl") <(grep -oE "$fields" "$f.new.jsonl"); then
    echo "FAIL $name: metrics differ"; diff <(grep -oE "$fields" "$f.base.jsonl") <(grep -oE "$fields" "$f.new.jsonl") | head -6
    fail=1; continue
  fi
  what=model.safetensors; [ -d "$f.base/adapter" ] && what=adapter/adapter_model.safetensors
  cmp -s "$f.base/$what" "$f.new/$what" || { echo "FAIL $name: $what differs"; fail=1; continue; }
  if [[ "$name" == *-fp32 ]]; then
    # sampling (a forward without targets) from the base build's model, with each binary
    init="$f.base/model.safetensors"; [ -f "$f.base/config.json" ] && init="$f.base"
    for side in base new; do
      bin=$BASE; [ $side = new ] && bin=$NEW
      # shellcheck disable=SC2086
      "$bin" sample $model --init "$init" --prompt "The whale" --sample_tokens 32 --seed 3 > "$f.$side.sample" 2>&1
    done
    cmp -s "$f.base.sample" "$f.new.sample" || { echo "FAIL $name: samples differ"; fail=1; continue; }
    what="$what and samples"
  fi
  echo "ok $name: $(grep -oE '"loss":[^,]*' "$f.new.jsonl" | tail -1), $what identical"
done
for p in gpt2-124m gpt2-1m llama-tiny smollm2-135m qwen2.5-0.5b llama-3.2-1b mistral-7b; do
  [ -n "$FILTER" ] && [[ "est-$p" != *$FILTER* ]] && continue
  for r in none full selective; do
    # "runtime"/"process" hold the binary's own measured start-up RSS: not compared
    strip='s/"(runtime|process)":[0-9]+//g'
    a=$("$BASE" estimate --model "$p" --batch 2 --seq 128 --recompute $r --json 2>&1 | sed -E "$strip")
    b=$("$NEW" estimate --model "$p" --batch 2 --seq 128 --recompute $r --json 2>&1 | sed -E "$strip")
    [ "$a" = "$b" ] || { echo "FAIL estimate $p $r differs"; fail=1; }
  done
done
[ "$fail" -eq 0 ] && echo "check_identity: all identical" || { echo "check_identity: DIFFERENCES"; exit 1; }
