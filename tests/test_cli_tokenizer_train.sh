#!/usr/bin/env bash
# Training on tokenizer.json token files: Moby-Dick tokenized with Llama 3's
# tokenizer.json (version-2 file, u32 ids) trains llama-tiny with a 128256-row
# vocabulary and that tokenizer (loss falls, the sample decodes with it); the
# same file is refused, in one line naming both tokenizers, under
# --tokenizer bytes, under Qwen3's tokenizer.json and as validation data of
# a bytes run; a Hugging Face folder with its own tokenizer.json trains with
# --init DIR alone (and its out_dir gets the tokenizer.json back); a GPT-2
# run on a gpt2 token file has the losses it had before tokenizer.json
# training existed. Needs the cache filled by scripts/fetch_data.sh
# (moby-dick.txt, gpt2/, hf/llama3, hf/qwen3) and python3-torch.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
C=${MEMFIT_CACHE:-$HOME/.cache/memfit}
W=$(mktemp -d /tmp/memfit-toktrain-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

L3="$C/hf/llama3/tokenizer.json"
Q3="$C/hf/qwen3/tokenizer.json"
for f in "$C/moby-dick.txt" "$L3" "$Q3" "$C/gpt2/encoder.json"; do
  [ -f "$f" ] || { echo "FAIL $f is missing: run scripts/fetch_data.sh"; exit 1; }
done
common=(--batch 2 --seq 64 --threads 2 --val_every 0 --val_batches 1 --warmup 0)

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  "$@" >"$W/out" 2>"$W/err"
  local rc=$? lines
  lines=$(wc -l <"$W/err")
  if [ $rc -eq 0 ]; then echo "FAIL $name: exit 0 (want an error)"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -q -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  echo "ok   $name: $(cat "$W/err")"
}

# losses of the step lines, one per line
losses() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$1"; }

# (a) Llama 3 ids in a version-2 file: u32 ids, the tokenizer's hash at 32
"$M" tokenize --tokenizer "$L3" "$C/moby-dick.txt" "$W/md.tok" > "$W/tok.out" || { echo "FAIL tokenize"; cat "$W/tok.out"; exit 1; }
check "version 2, kind tokenizer.json, vocab 128256, 4 bytes per id" \
  "[ \"\$(od -An -tu4 -j8 -N16 "$W/md.tok" | tr -s ' ')\" = ' 2 2 128256 4' ]"
check "the header records a nonzero tokenizer hash" "[ \"\$(od -An -tx8 -j32 -N8 "$W/md.tok" | tr -d ' ')\" != 0000000000000000 ]"
"$M" train --model llama-tiny --vocab_size 128256 --tokenizer "$L3" --data "$W/md.tok" "${common[@]}" --steps 8 \
  --lr 3e-3 --sample_tokens 12 --prompt "Call me" > "$W/a.out" 2>&1
rc=$?
check "llama-tiny + Llama 3 tokenizer trains (exit $rc)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || tail -5 "$W/a.out"
first=$(losses "$W/a.out" | head -1) last=$(losses "$W/a.out" | tail -1)
check "loss falls ($first -> $last), from about ln 128256 = 11.76" \
  "awk -v a='$first' -v b='$last' 'BEGIN { exit !(a > 11.5 && a < 12.1 && b < a - 0.1) }'"
check "the report names the tokenizer.json" "grep -q 'vocab 128256.*llama3/tokenizer.json tokenizer' '$W/a.out'"
check "the sample decodes with the tokenizer: 'Call me' then text" \
  "grep -A1 -- '--- sample ---' '$W/a.out' | tail -1 | grep -q '^Call me..'"

# (b) the same file under other tokenizers: one line naming both
expect_error bytes-run "made with a tokenizer.json (hash 0x.*), but this run's tokenizer is bytes" \
  "$M" train --model llama-tiny --vocab_size 128256 --tokenizer bytes --data "$W/md.tok" "${common[@]}" --steps 1
expect_error qwen3-run "made with a tokenizer.json (hash 0x.*), but this run's tokenizer is .*qwen3/tokenizer.json (hash 0x" \
  "$M" train --model llama-tiny --vocab_size 151936 --tokenizer "$Q3" --data "$W/md.tok" "${common[@]}" --steps 1
head -c 20000 "$C/moby-dick.txt" > "$W/small.txt"
"$M" tokenize --tokenizer bytes "$W/small.txt" "$W/small.bytes.tok" > /dev/null
expect_error val-data-other-tokenizer "small.bytes.tok was made with the bytes tokenizer, but this run's tokenizer is .*llama3" \
  "$M" train --model llama-tiny --vocab_size 128256 --tokenizer "$L3" --data "$W/md.tok" --val_data "$W/small.bytes.tok" \
  "${common[@]}" --steps 1
expect_error vocab-too-small "vocabulary (256 rows, the preset's) is smaller than the tokenizer's 128256 ids" \
  "$M" train --model llama-tiny --tokenizer "$L3" --data "$W/md.tok" "${common[@]}" --steps 1
expect_error not-a-tokenizer "is not gpt2, bytes or a path to a tokenizer.json" \
  "$M" train --model llama-tiny --tokenizer sentencepiece --data "$W/md.tok" --steps 1

# (c) a Hugging Face folder with its tokenizer.json: --init DIR, no --tokenizer
/usr/bin/python3 "$SRC/tests/ref/llama_torch.py" make-hf --out "$W/hf" --vocab 128256 --layers 1 --hidden 32 --heads 4 \
  --kv_heads 2 --inter 64 > /dev/null || { echo "FAIL make-hf (python3-torch)"; exit 1; }
expect_error hf-folder-without-tokenizer "this run's tokenizer is gpt2" \
  "$M" train --init "$W/hf" --data "$W/md.tok" "${common[@]}" --steps 1
cp "$L3" "$W/hf/tokenizer.json"
"$M" train --init "$W/hf" --data "$W/md.tok" "${common[@]}" --steps 3 --lr 1e-2 --sample_tokens 4 \
  --out_dir "$W/hf-out" > "$W/c.out" 2>&1
rc=$?
check "--init DIR trains with DIR/tokenizer.json (exit $rc)" "[ $rc -eq 0 ] && grep -q 'hf/tokenizer.json tokenizer' '$W/c.out'"
[ $rc -eq 0 ] || tail -5 "$W/c.out"
check "its out_dir is a model folder with the tokenizer.json" "cmp -s '$L3' '$W/hf-out/tokenizer.json'"
"$M" sample --init "$W/hf-out" --sample_tokens 4 --prompt "Ishmael" > "$W/s.out" 2>&1
rc=$?
check "memfit sample --init OUT_DIR uses it (exit $rc)" "[ $rc -eq 0 ] && head -1 '$W/s.out' | grep -q '^Ishmael.'"
"$M" eval --init "$W/hf-out" --data "$W/md.tok" --batch 2 --seq 64 --val_batches 2 > "$W/e.out" 2>&1
check "memfit eval --init OUT_DIR on the u32 file" "grep -q '^val loss [0-9.]* over 2 batches' '$W/e.out'"

# (d) GPT-2 on a gpt2 token file: the losses of the commit before this change
head -c 200000 "$C/moby-dick.txt" > "$W/g.txt"
"$M" tokenize --tokenizer gpt2 "$W/g.txt" "$W/g.tok" > /dev/null
"$M" train --model gpt2-1m --tokenizer gpt2 --data "$W/g.tok" "${common[@]}" --threads 1 --steps 3 --lr 1e-3 \
  --sample_tokens 0 > "$W/d.out" 2>&1
got=$(losses "$W/d.out" | tr '\n' ' ')
check "gpt2 losses unchanged: '$got' vs '10.8547 10.6709 10.5713'" \
  "echo '$got' | awk '{ exit !(NF == 3 && (\$1 - 10.8547)^2 < 4e-6 && (\$2 - 10.6709)^2 < 4e-6 && (\$3 - 10.5713)^2 < 4e-6) }'"
exit $fail
