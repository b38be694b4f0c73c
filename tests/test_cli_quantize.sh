#!/usr/bin/env bash
# memfit quantize (docs/quantize.md): a small GPT-2 trained here for a few
# seconds on Moby-Dick, quantised to int8 and nf4; memfit eval from each
# file is within 1% (int8) and 5% (nf4) of the fp32 model's validation loss
# (the issue's bounds); eval and sample from a quantised file report
# planned == ledger and a smaller planned arena than the fp32 model's;
# bad input (unknown dtype, missing file, truncated file, a corrupted
# quantised file, quantising twice) stops with one line and exit 1, and
# leaves no output file.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-quant-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
shape=(--model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 64 --seq 64 --batch 8 --threads 2)
"$M" train "${shape[@]}" --steps 400 --lr 3e-3 --warmup 10 --val_every 0 --sample_tokens 0 \
  --out_dir "$W/fp32" >"$W/train.log" 2>&1 || { echo "FAIL train"; tail -3 "$W/train.log"; exit 1; }
for dt in int8 nf4; do
  "$M" quantize --in "$W/fp32/model.safetensors" --out "$W/$dt" --dtype $dt >"$W/q.log" 2>&1 ||
    { echo "FAIL quantize $dt"; cat "$W/q.log"; fail=1; }
  echo "ok   $(cat "$W/q.log")"
done
loss() { "$M" eval "${shape[@]}" --init "$1" >"$W/eval.log" 2>&1 || { echo "FAIL eval $1"; cat "$W/eval.log"; return 1; }
         awk '/^val loss/ {print $3}' "$W/eval.log"; }
l32=$(loss "$W/fp32/model.safetensors") || exit 1
for dt in int8 nf4; do
  lq=$(loss "$W/$dt/model.safetensors") || { fail=1; continue; }
  bound=$([ $dt = int8 ] && echo 0.01 || echo 0.05)
  res=$(grep '^resident' "$W/eval.log")
  if awk -v a="$lq" -v b="$l32" -v t="$bound" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= t) }'; then
    echo "ok   $dt val loss $lq vs fp32 $l32 (bound $bound relative)"
  else echo "FAIL $dt val loss $lq vs fp32 $l32: more than $bound relative"; fail=1; fi
  # planned == ledger, and a smaller arena than the fp32 model's
  if echo "$res" | grep -q "== planned" &&
     echo "$res" | awk '{ for (i = 1; i <= NF; i++) if ($i == "arena") { a[++n] = $(i + 1) } } END { exit !(n == 2 && a[1] < a[2]) }'; then
    echo "ok   eval $res"
  else echo "FAIL $dt eval: $res"; fail=1; fi
  "$M" sample "${shape[@]}" --init "$W/$dt/model.safetensors" --sample_tokens 16 >"$W/s.out" 2>"$W/s.err"
  if [ $? -eq 0 ] && grep -q "^resident $dt: .*== planned" "$W/s.err"; then echo "ok   sample $dt: $(cat "$W/s.err")"
  else echo "FAIL sample $dt"; cat "$W/s.err"; fail=1; fi
done

# eval --compare: the fp32 source's loss on the same batches, beside the quantised one's
"$M" eval "${shape[@]}" --init "$W/nf4/model.safetensors" --compare "$W/fp32/model.safetensors" >"$W/cmp.log" 2>&1
if grep -q "^compare fp32 .*val loss $l32,.*== planned.*; nf4 loss" "$W/cmp.log"; then echo "ok   $(grep '^compare' "$W/cmp.log")"
else echo "FAIL eval --compare"; cat "$W/cmp.log"; fail=1; fi

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  "$@" >"$W/out" 2>"$W/err"
  local rc=$? lines; lines=$(wc -l <"$W/err")
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit $rc (want 1)"; cat "$W/err"; fail=1; return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr"; cat "$W/err"; fail=1; return; fi
  if ! grep -q -- "$want" "$W/err"; then echo "FAIL $name: message lacks '$want':"; cat "$W/err"; fail=1; return; fi
  if [ -e "$W/bad/model.safetensors" ]; then echo "FAIL $name: wrote $W/bad/model.safetensors"; fail=1; fi
  echo "ok   $name: $(cat "$W/err")"
}
expect_error "unknown dtype" "not int8 or nf4" "$M" quantize --in "$W/fp32/model.safetensors" --out "$W/bad" --dtype int4
expect_error "missing file" "No such file" "$M" quantize --in "$W/none.safetensors" --out "$W/bad" --dtype int8
head -c 5000 "$W/fp32/model.safetensors" >"$W/trunc.safetensors"
expect_error "truncated file" "trunc.safetensors" "$M" quantize --in "$W/trunc.safetensors" --out "$W/bad" --dtype int8
expect_error "quantised twice" "already quantised" "$M" quantize --in "$W/int8/model.safetensors" --out "$W/bad" --dtype nf4
cp "$W/int8/model.safetensors" "$W/corrupt.safetensors"
size=$(stat -c %s "$W/corrupt.safetensors")
printf '\x55\xaa\x55' | dd of="$W/corrupt.safetensors" bs=1 seek=$((size - 3000)) conv=notrunc status=none
expect_error "corrupt quantised file" "corrupt" "$M" eval "${shape[@]}" --init "$W/corrupt.safetensors"
expect_error "dtype disagrees" "disagrees" "$M" eval "${shape[@]}" --init "$W/int8/model.safetensors" --base_dtype nf4
[ $fail -eq 0 ] && echo "test_cli_quantize: ok" || echo "test_cli_quantize: FAILED"
exit $fail
