#!/usr/bin/env bash
# Chat data (--data FILE.jsonl) on bad input: each kind of bad line stops
# the run with one line naming the file and the line, exit status 1, no
# output files; with --skip_bad_lines the same lines are counted and
# skipped and training runs on the rest.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-chat-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
tiny=(--model gpt2-1m --n_layer 1 --n_embd 32 --n_head 4 --block_size 128 --seq 128 --batch 2
      --sample_tokens 0 --val_every 0 --threads 2 --tokenizer bytes --chat_template chatml --steps 2)

good='{"prompt": "What is the capital of Ohio?", "completion": "Columbus"}'
for i in 1 2 3; do echo "$good"; done >"$W/good.jsonl"

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

# one bad line (line 2) among good ones; each case: name, line, expected message
bad_case() {  # name, bad line, expected substring
  local name=$1 line=$2 want=$3
  { echo "$good"; echo "$line"; echo "$good"; } >"$W/$name.jsonl"
  expect_error "$name" "$want" "$M" train "${tiny[@]}" --data "$W/$name.jsonl" --out_dir "$W/out_dir"
  # skipped: 2 examples from 3 lines, 1 skipped, and the run trains
  "$M" train "${tiny[@]}" --data "$W/$name.jsonl" --skip_bad_lines >"$W/out" 2>"$W/err"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL $name --skip_bad_lines: exit $rc"; cat "$W/err"; fail=1; return; fi
  if ! grep -q "2 examples from 3 lines (1 skipped" "$W/out"; then
    echo "FAIL $name --skip_bad_lines: no count"; grep "chat data" "$W/out"; fail=1; return; fi
  echo "ok   $name --skip_bad_lines: $(grep -o '2 examples from 3 lines ([^)]*)' "$W/out")"
}

bad_case malformed '{"prompt": "What is", "completion": ' "line 2"
bad_case unknown-role '{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]}' "line 2"
bad_case empty-assistant '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}' "line 2"
long=$(head -c 400 /dev/zero | tr '\0' a)
bad_case too-long "{\"prompt\": \"$long\", \"completion\": \"b\"}" "line 2: the example is"

expect_error no-template "needs --chat_template" "$M" train "${tiny[@]/chatml/}" --chat_template "" --data "$W/good.jsonl"
expect_error bad-template "config key 'chat_template'" "$M" train "${tiny[@]}" --data "$W/good.jsonl" --chat_template jinja
expect_error bad-packing "config key 'packing'" "$M" train "${tiny[@]}" --data "$W/good.jsonl" --packing maybe
expect_error bad-train-on "config key 'train_on'" "$M" train "${tiny[@]}" --data "$W/good.jsonl" --train_on everything
expect_error missing-file "cannot open" "$M" train "${tiny[@]}" --data "$W/none.jsonl"
: >"$W/empty.jsonl"
expect_error empty-file "no examples" "$M" train "${tiny[@]}" --data "$W/empty.jsonl"
{ echo '{"prompt": 1}'; } >"$W/allbad.jsonl"
expect_error all-skipped "no examples (1 lines, 1 skipped)" "$M" train "${tiny[@]}" --data "$W/allbad.jsonl" --skip_bad_lines

# the template from the tokenizer folder's tokenizer_config.json (cached by
# scripts/fetch_data.sh; skipped when absent)
HF=${MEMFIT_CACHE:-$HOME/.cache/memfit}/hf
if [ -f "$HF/llama3/tokenizer_config.json" ]; then
    "$M" train --model llama-tiny --tokenizer "$HF/llama3/tokenizer.json" --vocab_size 128256 --data "$W/good.jsonl" \
        --seq 64 --batch 1 --steps 1 --sample_tokens 0 --threads 2 >"$W/out" 2>"$W/err"
    if grep -q "(llama3 template, packing on" "$W/out"; then echo "ok   detected llama3 template"
    else echo "FAIL llama3 template not detected"; cat "$W/out" "$W/err"; fail=1; fi
    # Llama 2's tokenizer_config.json in that package has no chat_template
    expect_error no-chat-template "no chat_template (or give --chat_template)" "$M" train --model llama-tiny \
        --tokenizer "$HF/llama2/tokenizer.json" --vocab_size 32000 --data "$W/good.jsonl" --seq 64 --steps 1
else echo "skip template detection: $HF/llama3 not cached (scripts/fetch_data.sh)"; fi

# resume: the checkpoint records the next row, so steps 4-6 of a resumed
# run are those of an uninterrupted one
"$M" train "${tiny[@]}" --data "$W/good.jsonl" --steps 6 --metrics "$W/r1.jsonl" >/dev/null 2>&1
"$M" train "${tiny[@]}" --data "$W/good.jsonl" --steps 3 --out_dir "$W/r2" >/dev/null 2>&1
"$M" train "${tiny[@]}" --data "$W/good.jsonl" --steps 6 --resume "$W/r2/checkpoint.safetensors" --metrics "$W/r2.jsonl" \
    >/dev/null 2>&1
if cmp <(grep -o '"step":[4-6],"loss":[^,]*' "$W/r1.jsonl") <(grep -o '"step":[4-6],"loss":[^,]*' "$W/r2.jsonl") >/dev/null &&
   [ "$(grep -c '"step":[4-6],' "$W/r2.jsonl")" -eq 3 ]; then echo "ok   resume: steps 4-6 identical"
else echo "FAIL resume changed the losses"; fail=1; fi

# a run end to end: train a few steps, write the model, answer greedily
"$M" train "${tiny[@]}" --data "$W/good.jsonl" --out_dir "$W/run" >"$W/out" 2>"$W/err" || {
    echo "FAIL train for eval-chat"; cat "$W/err"; fail=1; }
"$M" eval-chat "${tiny[@]}" --init "$W/run/model.safetensors" --data "$W/good.jsonl" --sample_tokens 4 >"$W/out" 2>"$W/err"
if grep -qE "^eval-chat: .*: exact match [0-3]/3 \([0-9.]+%\); unit error rate [0-9]+/3 " "$W/out"; then
    echo "ok   eval-chat: $(tail -n 1 "$W/out")"
else echo "FAIL eval-chat"; cat "$W/out" "$W/err"; fail=1; fi
expect_error eval-chat-not-chat "must be a .jsonl chat file" "$M" eval-chat "${tiny[@]}" --init "$W/run/model.safetensors" --data "$W/x.tok"

exit $fail
