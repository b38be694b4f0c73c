#!/usr/bin/env bash
# The libFuzzer harnesses (fuzz/) build and run a few seconds each from
# their seed corpora without a crash, leak or undefined behaviour, so they
# stay alive between `make fuzz` runs. Skipped (77) without clang.
set -u
S=${MEMFIT_SRC:?}
secs=${MEMFIT_FUZZ_SECONDS:-10}
# the config harness links the rest of memfit from this build's library
MEMFIT_LIB="$PWD/libmemfit.a" bash "$S/scripts/fuzz.sh" --seconds "$secs" --out "$PWD/fuzz"
