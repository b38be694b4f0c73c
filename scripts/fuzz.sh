#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with Debian's clang
# (-fsanitize=fuzzer,address,undefined) and runs each for a bounded time
# from its seed corpus (fuzz/corpus/<name>/; new inputs go to a scratch
# copy, the repository's corpus is not changed).
#   scripts/fuzz.sh [--seconds N] [--out DIR] [--only NAME] [--build-only]
#   make fuzz                      # FUZZ_SECONDS (default 60) per harness
# Prints one line per harness: executions, and "0 crashes" or the crash
# file; exits 1 if any harness crashed (or leaked, or hit UB), 77 if clang is
# missing. The config and checkpoint harnesses link the rest of memfit from
# the release build's libmemfit.a (MEMFIT_LIB, default build/libmemfit.a); the others
# build from their own sources only.
set -u
cd "$(dirname "$0")/.."
secs=60; out=build-fuzz; only=""; build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) secs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (--seconds N, --out DIR, --only NAME, --build-only)" >&2; exit 2 ;;
  esac
done
CC=${FUZZ_CC:-$(command -v clang-14 || command -v clang || true)}
[ -n "$CC" ] || { echo "fuzz.sh: clang not found (apt-get install clang-14)"; exit 77; }
mkdir -p "$out"
LIB=${MEMFIT_LIB:-build/libmemfit.a}
CFLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc"
LIBS="-lcjson -lyaml -lpcre2-8 -lxxhash -lm"
TOK="src/data/tokjson.c src/data/tokenizer.c src/data/unorm.c src/core/util.c"
declare -A SRC=(
  [safetensors]="src/io/safetensors.c src/io/atomic.c src/core/util.c"
  [tokfile]="src/data/tokfile.c src/core/util.c"
  [tokenizer_gpt2]="$TOK"
  [tokenizer_json]="$TOK"
  [chat]="src/data/chat.c $TOK"
  [config_yaml]="src/config/config.c"
  [checkpoint]="src/train/checkpoint.c src/io/safetensors.c src/io/atomic.c"
)
names="safetensors tokfile tokenizer_gpt2 tokenizer_json chat config_yaml checkpoint"
[ -n "$only" ] && names=$only
fail=0
for n in $names; do
  [ -n "${SRC[$n]:-}" ] || { echo "fuzz.sh: no harness '$n' (one of: ${!SRC[*]})" >&2; exit 2; }
  bin="$out/fuzz_$n"
  extra=""
  if [ "$n" = config_yaml ] || [ "$n" = checkpoint ]; then
    # config.c checks values with parsers from the whole library (recompute
    # policies, LoRA, quantisation, health levels), and the checkpoint
    # loader needs a trainer: the rest comes from the library, uninstrumented
    [ -f "$LIB" ] || { echo "fuzz.sh: $LIB not built (cmake --build build)"; exit 1; }
    extra="$LIB -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl $(mpicc -showme:link) -fopenmp"
  fi
  # rebuild when a source is newer than the binary
  need=1
  if [ -x "$bin" ]; then
    need=0
    for s in fuzz/fuzz_$n.c fuzz/fuzz_util.h ${SRC[$n]} include/memfit/*.h src/*/*.h ${extra:+$LIB}; do [ "$s" -nt "$bin" ] && need=1; done
  fi
  if [ $need -eq 1 ]; then
    $CC $CFLAGS -o "$bin" "fuzz/fuzz_$n.c" ${SRC[$n]} $extra $LIBS 2> "$out/build_$n.log" \
      || { echo "fuzz.sh: building $n failed:"; cat "$out/build_$n.log"; exit 1; }
  fi
  [ $build_only -eq 1 ] && continue
  work="$out/corpus_$n"
  rm -rf "$work" "$out/crash_$n"; mkdir -p "$work" "$out/crash_$n"
  cp -r "fuzz/corpus/$n/." "$work/" 2>/dev/null
  # -rss_limit_mb: a parser that tries to allocate what a hostile size field
  # says counts as a failure too; -timeout: one input taking 10 s is a hang
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" "$work" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
    -artifact_prefix="$out/crash_$n/" -print_final_stats=1 > "$out/log_$n.txt" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log_$n.txt" | tail -1)
  crashes=$(ls "$out/crash_$n" | wc -l)
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "fuzz $n: ${execs:-?} executions in ${secs}s, FAILED (exit $rc): $(ls "$out/crash_$n" | head -3 | tr '\n' ' ')"
    grep -m3 -E "ERROR: |runtime error|SUMMARY" "$out/log_$n.txt"
    fail=1
  else
    echo "fuzz $n: ${execs:-?} executions in ${secs}s, 0 crashes"
  fi
done
exit $fail
