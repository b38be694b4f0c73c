#!/usr/bin/env bash
# The CLI's documented outputs: estimate --json fields, the 124M parameter
# count, tokenize --encode ids, --help listing every key, a short training
# run's metrics file.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-out-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

"$M" estimate --model gpt2-124m --batch 4 --seq 256 --json > "$W/est.json"
check "estimate --json has n_params 124439808 and categories" \
  "/usr/bin/python3 -c 'import json,sys; d=json.load(open(\"$W/est.json\")); assert d[\"n_params\"]==124439808; assert all(k in d for k in (\"params\",\"grads\",\"optimizer\",\"optimizer_state\",\"activations\",\"scratch\",\"data\",\"total\")); assert d[\"params\"]>=124439808*4' "
"$M" estimate --model gpt2-124m --batch 4 --seq 256 > "$W/est.txt"
check "estimate table has a per-layer section" "grep -q 'per layer' '$W/est.txt' && grep -q 'h.11' '$W/est.txt'"
if [ -f "${MEMFIT_CACHE:-$HOME/.cache/memfit}/gpt2/encoder.json" ]; then
  out=$(printf 'Hello world' | "$M" tokenize --encode)
  check "tokenize --encode 'Hello world' -> 15496 995 (got '$out')" "[ '$out' = '15496 995' ]"
else
  echo "FAIL tokenizer files missing: run scripts/fetch_data.sh"; fail=1
fi
out=$(printf 'Hi' | "$M" tokenize --encode --tokenizer bytes)
check "bytes tokenizer encodes 'Hi' -> 72 105" "[ '$out' = '72 105' ]"
"$M" train --help > "$W/help.txt"
for k in model batch seq steps lr grad_accum budget metrics resume init out_dir blas_coretype; do
  check "train --help lists --$k" "grep -q -- '--$k ' '$W/help.txt'"
done
head -c 30000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" > /dev/null
"$M" train --model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 32 --seq 32 --batch 4 --steps 6 \
  --val_every 3 --sample_tokens 0 --data "$W/c.tok" --metrics "$W/m.jsonl" > "$W/train.txt" 2>&1
check "train exits 0" "[ $? -eq 0 ]"
check "metrics has one line per step with required fields" \
  "/usr/bin/python3 -c 'import json; L=[json.loads(l) for l in open(\"$W/m.jsonl\")]; assert len(L)==6; assert all(k in L[-1] for k in (\"step\",\"loss\",\"lr\",\"tok_s\",\"planned_peak_bytes\",\"ledger_peak_bytes\",\"rss_peak_bytes\")); assert \"val_loss\" in L[2] and \"val_loss\" in L[5]; assert L[-1][\"planned_peak_bytes\"]==L[-1][\"ledger_peak_bytes\"]' "
check "train prints the memory report" "grep -q 'memory report' '$W/train.txt' && grep -q 'exact' '$W/train.txt'"
# sequence-length warm-up: the guard splits the early steps' batches within the plan
"$M" train --model gpt2-1m --n_layer 2 --n_embd 64 --n_head 4 --block_size 64 --seq 64 --batch 4 --grad_accum 2 --steps 5 \
  --seq_warmup 4 --seq_warmup_start 16 --log_every 1 --progress 0 --val_every 0 --val_batches 1 --sample_tokens 0 \
  --data "$W/c.tok" --metrics "$W/w.jsonl" > "$W/warm.txt" 2>&1
check "seq_warmup: train exits 0" "[ $? -eq 0 ]"
check "seq_warmup: step 2 logs its batch 21 x 24 in 3 micro-batches" "grep -q 'step     2/5 .*batch 21 x 24 in 3 micro-batches' '$W/warm.txt'"
check "seq_warmup: metrics rows/seq/micro per step, ledger == plan" \
  "/usr/bin/python3 -c 'import json; L=[json.loads(l) for l in open(\"$W/w.jsonl\")]; assert [(m[\"rows\"],m[\"seq\"],m[\"micro\"]) for m in L]==[(32,16,2),(21,24,3),(12,40,2),(10,48,2),(8,64,2)], L; assert all(m[\"planned_peak_bytes\"]==m[\"ledger_peak_bytes\"] for m in L)' "
exit $fail
