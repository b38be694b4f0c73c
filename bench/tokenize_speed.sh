#!/usr/bin/env bash
# Tokenizer throughput on Moby Dick (1.2 MB): memfit's GPT-2 BPE, memfit's
# tokenizer.json path on Llama 3's file, and the reference JavaScript encoder
# (transformers.js's tokenizers, @lenml/tokenizers@3.7.2, on the same Llama 3
# file). Same machine, same text, one thread each, all timed in process with
# the tokenizer already loaded: memfit by build/bench_tokenize_speed (best of
# ROUNDS encodes of the whole book), the reference by tokjson_ref.js --bench
# (its second encode, JIT warm; best of ROUNDS processes). Prints the
# commands, the machine, MB/s and the ratios.
#   bench/tokenize_speed.sh   (ROUNDS=3; needs build/bench_tokenize_speed
#                             (cmake --build build --target bench_tokenize_speed),
#                             node and scripts/fetch_data.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
B=${BENCH_BIN:-build/bench_tokenize_speed}
C=${MEMFIT_CACHE:-$HOME/.cache/memfit}
TEXT=$C/moby-dick.txt
L3=$C/hf/llama3/tokenizer.json
[ -x "$B" ] || { echo "tokenize_speed: build it first (cmake --build build --target bench_tokenize_speed)" >&2; exit 1; }
for f in "$TEXT" "$L3" "$C/gpt2/encoder.json" "$C/hf/js/dist/main.js"; do
  [ -f "$f" ] || { echo "tokenize_speed: $f is missing: run scripts/fetch_data.sh" >&2; exit 1; }
done
command -v node >/dev/null || { echo "tokenize_speed: node not found" >&2; exit 1; }
bytes=$(stat -c %s "$TEXT")

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; node $(node --version)"
echo "text:    $TEXT ($bytes bytes), best of $ROUNDS"
echo "cmd:     $B gpt2 moby-dick.txt $ROUNDS"
read -r g_mbs g_n g_load < <("$B" gpt2 "$TEXT" "$ROUNDS")
echo "cmd:     $B $L3 moby-dick.txt $ROUNDS"
read -r l_mbs l_n l_load < <("$B" "$L3" "$TEXT" "$ROUNDS")
echo "cmd:     node tests/ref/tokjson_ref.js $C/hf/js $C/hf/llama3 --bench moby-dick.txt"
js_best=0
for _ in $(seq "$ROUNDS"); do
  read -r mbs js_n < <(node tests/ref/tokjson_ref.js "$C/hf/js" "$C/hf/llama3" --bench "$TEXT" 2>/dev/null)
  js_best=$(awk -v a="$mbs" -v b="$js_best" 'BEGIN{print (a > b) ? a : b}')
done
printf '%-34s %9s %9s %8s\n' "tokenizer" "MB/s" "ids" "load s"
printf '%-34s %9.2f %9d %8.3f\n' "memfit gpt2 (encoder.json)" "$g_mbs" "$g_n" "$g_load"
printf '%-34s %9.2f %9d %8.3f\n' "memfit llama3 tokenizer.json" "$l_mbs" "$l_n" "$l_load"
printf '%-34s %9.2f %9d %8s\n' "transformers.js llama3 (reference)" "$js_best" "$js_n" "-"
awk -v l="$l_mbs" -v g="$g_mbs" -v j="$js_best" \
  'BEGIN{printf "ratio:   memfit llama3 / reference llama3 = %.2fx; memfit llama3 / memfit gpt2 = %.2fx\n", l/j, l/g}'
[ "$l_n" = "$js_n" ] && echo "ids:     memfit llama3 and the reference give the same number of ids ($l_n)" \
  || echo "ids:     COUNTS DIFFER: memfit $l_n, reference $js_n"
