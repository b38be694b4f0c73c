#!/usr/bin/env bash
# 16-bit precision on a Llama-family model: llama-tiny (GQA 8/2 heads,
# untied head) trained 150 steps on byte tokens of Moby-Dick in bf16 and in
# fp16 (fp32 master weights; fp16 with loss scaling) ends within 2% of
# fp32's validation loss, either way, and in every precision and recompute
# policy tried the ledger's peak equals the plan's to the byte ("exact" on
# every category line of the memory report).
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-llama-prec-XXXXXX)
trap 'rm -rf "$W"' EXIT
CACHE=${MEMFIT_CACHE:-$HOME/.cache/memfit}
[ -f "$CACHE/moby-dick.txt" ] || { echo "FAIL: $CACHE/moby-dick.txt missing (make data)"; exit 1; }
"$M" tokenize --tokenizer bytes "$CACHE/moby-dick.txt" "$W/moby.tok" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
fail=0
for p in fp32 bf16 fp16; do
  if ! "$M" train --model llama-tiny --data "$W/moby.tok" --batch 4 --seq 64 --steps 150 --precision "$p" \
       --sample_tokens 0 --val_every 0 --val_batches 8 --progress 0 --log_every 150 --metrics "$W/$p.jsonl" > "$W/$p.log" 2>&1; then
    echo "FAIL $p: train failed"; tail -3 "$W/$p.log"; exit 1
  fi
  grep -q "total .* exact" "$W/$p.log" || { echo "FAIL $p: ledger != plan"; grep -A8 "memory report" "$W/$p.log"; fail=1; }
done
for p in bf16 fp16; do
  for r in selective full; do
    "$M" train --model llama-tiny --n_layer 3 --data "$W/moby.tok" --batch 2 --seq 64 --steps 3 --precision "$p" \
        --recompute "$r" --sample_tokens 0 --val_every 0 --val_batches 1 --progress 0 > "$W/$p-$r.log" 2>&1 \
      || { echo "FAIL $p $r: train failed"; tail -3 "$W/$p-$r.log"; fail=1; continue; }
    grep -q "total .* exact" "$W/$p-$r.log" || { echo "FAIL $p $r: ledger != plan"; fail=1; }
  done
done
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
def last(p):
    v = [json.loads(l) for l in open("%s/%s.jsonl" % (w, p))]
    v = [m for m in v if m.get("val_loss") is not None]
    return v[-1]["val_loss"]
base = last("fp32")
ok = True
for p in ("bf16", "fp16"):
    g = (last(p) - base) / base
    print("%s val %.4f vs fp32 %.4f: %+.2f%% (bound 2%% either way)" % (p, last(p), base, 100 * g))
    ok &= abs(g) <= 0.02
sys.exit(0 if ok else 1)
PY
[ "$fail" -eq 0 ] && echo "test_llama_precision: ok" || { echo "test_llama_precision: FAILED"; exit 1; }
