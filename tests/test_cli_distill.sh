#!/usr/bin/env bash
# Distillation from the command line: a GPT-2 student (full, LoRA) and a
# Llama-family QLoRA student (nf4 base, bf16 head) learn from a GPT-2
# teacher (memfit weights file) and from a Llama-family teacher (HF folder,
# stored nf4), through flags and through YAML keys, with plan == ledger
# ("exact" in every row of the memory report) and a `teacher` category in
# estimate (its JSON, plan --json and --metrics against docs/schemas), the
# planner choosing a smaller teacher under --allow lossy; bad input
# (missing teacher, another tokenizer or vocabulary, alpha outside [0, 1],
# temperature <= 0, ...) gets a one-line error and exit status 1.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-distill-cli-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
tiny=(--model gpt2-1m --n_layer 1 --n_embd 32 --n_head 4 --block_size 16 --seq 16 --batch 2
      --sample_tokens 0 --val_every 0 --val_batches 1 --threads 2 --progress 0)
head -c 20000 /dev/urandom | base64 > "$W/corpus.txt"
"$M" tokenize --tokenizer bytes "$W/corpus.txt" "$W/d.tok" >/dev/null || { echo "tokenize failed"; exit 1; }

# teachers: a 2-layer GPT-2 (a weights file) and a Llama-family model (an HF folder)
"$M" train "${tiny[@]}" --n_layer 2 --n_embd 48 --data "$W/d.tok" --steps 2 --out_dir "$W/gt" >/dev/null 2>&1 ||
  { echo "FAIL teacher training"; exit 1; }
"$M" train --model llama-tiny --tokenizer bytes --vocab_size 256 --n_layer 1 --n_embd 32 --n_head 4 --n_kv_head 2 \
  --intermediate_size 64 --block_size 16 --seq 16 --batch 2 --sample_tokens 0 --val_every 0 --val_batches 1 \
  --threads 2 --progress 0 --data "$W/d.tok" --steps 2 --out_dir "$W/lt" >/dev/null 2>&1 ||
  { echo "FAIL llama teacher training"; exit 1; }

expect_ok() {  # name, command...
  local name=$1; shift
  if ! "$@" >"$W/out" 2>"$W/err"; then echo "FAIL $name: exit $?"; cat "$W/err"; fail=1; return; fi
  if ! grep -q "^  teacher " "$W/out"; then echo "FAIL $name: no teacher row"; cat "$W/out"; fail=1; return; fi
  if grep -E "^  [a-z]+ +[0-9]+ +[0-9]+ " "$W/out" | grep -vq "exact"; then
    echo "FAIL $name: plan != ledger"; cat "$W/out"; fail=1; return
  fi
  echo "ok   $name: $(grep '^  teacher ' "$W/out")"
}
expect_ok gpt2-teacher "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/gt/model.safetensors" \
  --distill alpha=0.5,temperature=2.0
expect_ok gpt2-teacher-int8 "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/gt/model.safetensors" \
  --teacher_dtype int8
expect_ok llama-teacher-nf4 "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/lt" --teacher_dtype nf4
expect_ok accum-seq-warmup "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 3 --teacher "$W/gt/model.safetensors" \
  --grad_accum 2 --seq_warmup 2 --seq_warmup_start 8
expect_ok lora-student "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/gt/model.safetensors" --lora r=2
expect_ok llama-student-qlora "$M" train --model llama-tiny --tokenizer bytes --vocab_size 256 --n_layer 1 --n_embd 32 \
  --n_head 4 --n_kv_head 2 --intermediate_size 64 --block_size 16 --seq 16 --batch 2 --sample_tokens 0 --val_every 0 \
  --val_batches 1 --threads 2 --progress 0 --data "$W/d.tok" --steps 2 --lora r=2 --base_dtype nf4 \
  --teacher "$W/gt/model.safetensors"
expect_ok checkpoint-teacher "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/gt/checkpoint.safetensors"
printf 'teacher: %s\ndistill: alpha=0.25,temperature=4\nteacher_dtype: bf16\n' "$W/gt/model.safetensors" > "$W/kd.yaml"
expect_ok yaml-keys "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --config "$W/kd.yaml"
if "$M" estimate "${tiny[@]}" --config "$W/kd.yaml" | grep -q "teacher"; then echo "ok   estimate shows the teacher"
else echo "FAIL estimate: no teacher"; fail=1; fi

# the documented shapes: estimate --json, plan --json and --metrics lines with a teacher
"$M" estimate --json "${tiny[@]}" --teacher "$W/lt" --teacher_dtype int8 > "$W/est.json" &&
  "$M" plan --json "${tiny[@]}" --teacher "$W/gt/model.safetensors" --allow lossy --budget 1GiB > "$W/plan.json" &&
  "$M" train "${tiny[@]}" --data "$W/d.tok" --steps 2 --teacher "$W/gt/model.safetensors" --metrics "$W/m.jsonl" \
    > /dev/null 2>&1 || { echo "FAIL json outputs"; fail=1; }
/usr/bin/python3 - "$W" "${MEMFIT_SRC:-$(dirname "$0")/..}/docs/schemas" <<'PY' || fail=1
import json, os, sys
import jsonschema
W, S = sys.argv[1], sys.argv[2]
def v(name):
    return jsonschema.Draft202012Validator(json.load(open(os.path.join(S, name + ".schema.json"))))
est = json.load(open(os.path.join(W, "est.json")))
v("estimate").validate(est)
assert est["teacher"] > 0 and est["max"]["teacher"] > 0, "estimate --json: no teacher bytes"
v("plan").validate(json.load(open(os.path.join(W, "plan.json"))))
lines = [json.loads(l) for l in open(os.path.join(W, "m.jsonl"))]
for l in lines:
    v("metrics-line").validate(l)
assert any(l.get("mem_teacher", 0) > 0 for l in lines), "metrics: no mem_teacher"
print("ok   estimate/plan --json and metrics lines with a teacher match docs/schemas (teacher %d bytes)" % est["teacher"])
PY

# the planner stores the teacher in fewer bytes (lossy) when fp32 does not fit
"$M" train --model gpt2-1m --n_layer 4 --n_embd 256 --n_head 4 --block_size 64 --seq 64 --batch 2 --steps 1 \
  --sample_tokens 0 --val_every 0 --val_batches 1 --threads 2 --progress 0 --data "$W/d.tok" --out_dir "$W/big" \
  >/dev/null 2>&1 || { echo "FAIL big teacher training"; exit 1; }
P=(plan --model gpt2-1m --n_layer 1 --n_embd 64 --n_head 4 --block_size 64 --seq 64 --batch 4 --grad_accum 1
   --recompute none --teacher "$W/big/model.safetensors")
# the "needs" column (process + headroom) of a setting's row
needs() { grep "accum 1, adamw, teacher $1 " | head -1 | sed -E 's/.*teacher [a-z0-9]+ +[0-9.]+ MiB +([0-9.]+) MiB.*/\1/'; }
n32=$("$M" "${P[@]}" | needs fp32); n4=$("$M" "${P[@]}" --allow lossy | needs nf4)
b=$(awk -v a="$n32" -v c="$n4" 'BEGIN {printf "%.2f", (a + c) / 2}')
if [ -z "$n32" ] || [ -z "$n4" ]; then echo "FAIL planner rows: fp32 '$n32' nf4 '$n4'"; fail=1
elif "$M" "${P[@]}" --allow lossy --budget "${b}MiB" | grep "^chosen" | grep -Eq "teacher (bf16|int8|nf4)"; then
  echo "ok   planner: teacher fp32 needs $n32 MiB, nf4 $n4 MiB; at ${b} MiB with --allow lossy it stores the teacher in fewer bits"
  if "$M" "${P[@]}" --budget "${b}MiB" 2>/dev/null | grep "^chosen" | grep -Eq "teacher (bf16|int8|nf4)"; then
    echo "FAIL planner chose a lossy teacher dtype without --allow lossy"; fail=1; fi
else echo "FAIL planner at ${b} MiB:"; "$M" "${P[@]}" --allow lossy --budget "${b}MiB"; fail=1; fi

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  "$@" >"$W/out" 2>"$W/err"
  local rc=$?
  local lines; lines=$(wc -l <"$W/err")
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit $rc (want 1)"; cat "$W/err"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -qF -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  echo "ok   $name: $(cat "$W/err")"
}
T=(--teacher "$W/gt/model.safetensors")
expect_error missing-teacher "No such file" "$M" train "${tiny[@]}" --data "$W/d.tok" --teacher "$W/nope.safetensors"
expect_error not-a-model "teacher $W/d.tok" "$M" train "${tiny[@]}" --data "$W/d.tok" --teacher "$W/d.tok"
expect_error vocab "has a vocabulary of 256, the student 320" "$M" train "${tiny[@]}" --data "$W/d.tok" --vocab_size 320 "${T[@]}"
if [ -f "${MEMFIT_CACHE:-$HOME/.cache/memfit}/gpt2/encoder.json" ]; then
  expect_error tokenizer "uses the tokenizer 'bytes', the student 'gpt2'" "$M" estimate "${tiny[@]}" --tokenizer gpt2 "${T[@]}"
fi
expect_error alpha "alpha 1.5 is outside [0, 1]" "$M" train "${tiny[@]}" --data "$W/d.tok" "${T[@]}" --distill alpha=1.5
expect_error temperature "temperature 0 must be > 0" "$M" train "${tiny[@]}" --data "$W/d.tok" "${T[@]}" --distill temperature=0
expect_error distill-key "unknown key 'beta'" "$M" train "${tiny[@]}" --data "$W/d.tok" "${T[@]}" --distill beta=1
expect_error no-teacher "distill needs --teacher" "$M" train "${tiny[@]}" --data "$W/d.tok" --distill alpha=0.3
expect_error teacher-dtype "config key 'teacher_dtype'" "$M" train "${tiny[@]}" --data "$W/d.tok" "${T[@]}" --teacher_dtype fp8
expect_error dtype-no-teacher "teacher_dtype int8 needs --teacher" "$M" train "${tiny[@]}" --data "$W/d.tok" --teacher_dtype int8
expect_error bf16-student "not supported with a teacher" "$M" train "${tiny[@]}" --data "$W/d.tok" "${T[@]}" --precision bf16
exit $fail
