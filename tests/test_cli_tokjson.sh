#!/usr/bin/env bash
# memfit tokenize with a Hugging Face tokenizer.json: --encode TEXT prints
# the reference's ids, --decode IDS (commas or spaces) gives the text back,
# stdin still works, and a file of an unsupported model type (WordPiece) or
# a bad id is one line on stderr with exit status 1. Needs the cache filled
# by scripts/fetch_data.sh (hf/llama3, hf/llama2); missing data fails.
set -u
M=${MEMFIT_BIN:?}
C=${MEMFIT_CACHE:-$HOME/.cache/memfit}
W=$(mktemp -d /tmp/memfit-tokjson-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

for f in "$C/hf/llama3/tokenizer.json" "$C/hf/llama2/tokenizer.json"; do
  [ -f "$f" ] || { echo "FAIL $f is missing: run scripts/fetch_data.sh"; exit 1; }
done
L3="$C/hf/llama3/tokenizer.json"
L2="$C/hf/llama2/tokenizer.json"

# ids from transformers.js (tests/ref/tokjson_ref.js), add_special_tokens false
out=$("$M" tokenize --tokenizer "$L3" --encode "Hello world <|begin_of_text|> it'S 12345")
check "llama3 --encode -> '$out'" "[ '$out' = '9906 1917 220 128000 433 13575 220 4513 1774' ]"
out=$(printf 'Hello world' | "$M" tokenize --encode --tokenizer "$L3")
check "llama3 --encode from stdin -> '$out'" "[ '$out' = '9906 1917' ]"
out=$("$M" tokenize --tokenizer "$L3" --decode "9906,1917, 220 128000")
check "llama3 --decode -> '$out'" "[ \"\$out\" = 'Hello world <|begin_of_text|>' ]"
ids=$("$M" tokenize --tokenizer="$L2" --encode "Hello world </s>")
check "llama2 --encode -> '$ids'" "[ '$ids' = '22557 1526 28705 2' ]"
out=$("$M" tokenize --tokenizer "$L2" --decode "$ids")
check "llama2 --decode drops the SentencePiece prefix space -> '$out'" "[ \"\$out\" = 'Hello world </s>' ]"

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  "$@" >"$W/out" 2>"$W/err"
  local rc=$? lines
  lines=$(wc -l <"$W/err")
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit $rc (want 1)"; cat "$W/err"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -q -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  echo "ok   $name: $(cat "$W/err")"
}
printf '{"version":"1.0","added_tokens":[],"model":{"type":"WordPiece","vocab":{"a":0}}}' > "$W/wp.json"
expect_error wordpiece "$W/wp.json: tokenizer model type 'WordPiece' is not supported" \
  "$M" tokenize --tokenizer "$W/wp.json" --encode hi
printf '{"version":"1.0","added_tokens":[],"model":{"type":"Unigram","vocab":[["a",0.0]]}}' > "$W/ug.json"
expect_error unigram "'Unigram' is not supported" "$M" tokenize --tokenizer "$W/ug.json" --encode hi
expect_error bad-id "not in \[0, 128256)" "$M" tokenize --tokenizer "$L3" --decode "1,999999"
expect_error bad-id-text "is not a token id" "$M" tokenize --tokenizer "$L3" --decode "1,x"
expect_error missing-file "/nonexistent/tokenizer.json" "$M" tokenize --tokenizer /nonexistent/tokenizer.json --encode hi
# a token file from a tokenizer.json: u32 ids (vocab 128256), version 2; the 9
# ids are the reference's for this text
printf 'Call me Ishmael. <|end_of_text|>\n' > "$W/c.txt"
out=$("$M" tokenize --tokenizer "$L3" "$W/c.txt" "$W/c.tok")
check "tokenize to a file -> '$out'" "echo '$out' | grep -q 'wrote .*c.tok: 9 tokens (tokenizer.json tokenizer)'"
size=$(stat -c %s "$W/c.tok")
check "9 u32 ids after the 64-byte header ($size bytes)" "[ $size = $((64 + 4 * 9)) ]"
check "version 2, kind 2, vocab 128256, 4 bytes per id in the header" \
  "[ \"\$(od -An -tu4 -j8 -N16 "$W/c.tok" | tr -s ' ')\" = ' 2 2 128256 4' ]"
# gpt2-1m's tokenizer is bytes: the file's tokenizer.json is not the run's
expect_error train-on-tokjson-file "made with a tokenizer.json (hash 0x.*), but this run's tokenizer is bytes" \
  "$M" train --model gpt2-1m --data "$W/c.tok" --steps 1
exit $fail
