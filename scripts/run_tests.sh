#!/usr/bin/env bash
# Runs the suite twice: the release build, then the AddressSanitizer +
# UBSan build (minus the fuzz smoke run, which has its own sanitizers, the
# RSS and planner sweep/timing tests, whose numbers sanitizers change, and
# the lossy settings' 8-minute loss-gap run), and
# prints one closing line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
pass=0; failn=0
count() {  # parses ctest's "N tests failed out of M"
  local log=$1 f t
  f=$(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$log" | awk '{print $1}')
  t=$(grep -Eo 'tests failed out of [0-9]+' "$log" | awk '{print $5}')
  [ -n "$t" ] || { failn=$((failn + 1)); return; }
  pass=$((pass + t - f)); failn=$((failn + f))
}
echo "== release build"
(cd build && ctest --output-on-failure --timeout 900) 2>&1 | tee build/ctest.log
count build/ctest.log
echo "== AddressSanitizer + UBSan build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && MEMFIT_BIN=$PWD/memfit ctest --output-on-failure --timeout 1200 -E 'test_fuzz_smoke|test_rss_matches_plan|test_lossy_loss_gap|test_planner_budget_sweep|test_planner_time_predicts') 2>&1 | tee build-asan/ctest.log
count build-asan/ctest.log
echo "$pass passed, $failn failed"
[ "$failn" -eq 0 ]
