#!/usr/bin/env bash
# docs/benchmarks.md is rendered from result files only (bench/render.py):
# from the fixture results in tests/data/bench-render/ the output has the
# run's header (command, dates, commit, machine, load), each bench's block
# (its command, date, commit, machine and load) and its tables as markdown
# with the fixtures' values, and no number that is not in a fixture. The
# renderer fails on a missing result file, an unfilled or unknown
# placeholder, a result file no placeholder uses, and a template whose
# prose quotes a figure; a quick run says so in its header and is refused as
# docs/benchmarks.md. bench/benchmarks.md.in renders from one result per
# `bench/all.sh --list` name (its placeholders are exactly those benches).
set -u
SRC=${MEMFIT_SRC:?}
PY=/usr/bin/python3
R=$SRC/bench/render.py
D=$SRC/tests/data/bench-render
W=$(mktemp -d /tmp/memfit-bench-render-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

"$PY" "$R" render "$D/results" --template "$D/template.md.in" > "$W/out.md" 2> "$W/err"
check "fixtures render (exit 0)" "[ $? -eq 0 ]" || cat "$W/err"
O=$W/out.md
check "header names the run's command and directory" \
  "grep -qF 'result files of \`bash bench/all.sh\` in \`bench-results/20261123-173700\`' '$O'"
check "header has the dates, commit, machine and load range" \
  "grep -qF '3 benchmarks run between 2026-11-23 18:20 UTC and 2026-11-23 19:40 UTC, commit abc1234, on AMD EPYC 9B45, 2 cores, 23 GiB; load average (1 min) 0.71 to 1.95' '$O'"
check "not marked as a quick run" "! grep -q 'QUICK RUN' '$O'"
for n in compare_torch planner lora; do
  mapfile -t f < <("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["command"]); print(r["date"]); print(r["load_before"])' "$D/results/$n.json")
  cmd=${f[0]}; date=${f[1]}; load=${f[2]}
  check "$n: block has its command" "grep -qxF -- '\$ $cmd' '$O'"
  check "$n: block has date, commit, machine, load" \
    "grep -qF -- '# $date, commit abc1234, AMD EPYC 9B45, 2 cores, 23 GiB; load $load before' '$O'"
  check "$n: listed in the commands" "grep -qE '^$n +$cmd\$' '$O'"
done
check "compare_torch's output in its code block" \
  "grep -qxF 'ratio memfit/pytorch: tokens/s 2.79x, peak RSS 0.72x' '$O' && grep -qxF 'memfit            426.5        2.52 GiB' '$O'"
check "planner's table as markdown with the fixture's row" \
  "grep -qxF '| budget | chosen setting | predicted peak | measured peak RSS | predicted tok/s | measured tok/s |' '$O' &&
   grep -qxF '| 3GiB | recompute none, batch 4 x accum 4, adamw | 2.53 GiB | 2.53 GiB | 441 | 423 |' '$O'"
check "lora's table and the text after it" \
  "grep -qxF '| LoRA r=8 | 706.5 MiB | 0.344 | 421.4 | 1.23 | 1,179,648 |' '$O' &&
   grep -qxF 'load after:  load average: 1.60, 1.10, 0.80' '$O'"
check "every table is a markdown table (header, rule, rows)" \
  "[ \$(grep -c '^|---|' '$O') -eq 2 ]"
check "prose from the template kept" "grep -qxF 'How to read it: the ratio from one alternating run is the one to quote.' '$O'"
check "no placeholder left" "! grep -q '{{' '$O'"
# every figure in the output is in a result file (the template has none)
"$PY" - "$O" "$D/results" > "$W/stray" <<'PY'
import glob, re, sys
out = open(sys.argv[1]).read()
fix = "".join(open(f).read() for f in glob.glob(sys.argv[2] + "/*.json"))
for x in sorted(set(re.findall(r"\d+(?:[.,:]\d+)+|\d+", out))):
    if x not in fix:
        print(x)
PY
check "every number in the output is in a fixture ($(tr '\n' ' ' < "$W/stray"))" "[ ! -s '$W/stray' ]"

fails_with() {  # name, expected message part, render args... (renderer: $RR, default the repository's)
  local name=$1; WANT=$2; shift 2
  "$PY" "${RR:-$R}" render "$@" > "$W/o" 2> "$W/e"; local rc=$?
  check "$name: fails ($(head -c 160 "$W/e"))" "[ $rc -ne 0 ] && grep -qF -- \"\$WANT\" '$W/e' && grep -q '^render: error: ' '$W/e'"
}
cp -r "$D/results" "$W/miss"; rm "$W/miss/lora.json"
fails_with "a missing result file" "no result file lora.json for {{bench:lora}}" "$W/miss" --template "$D/template.md.in"
sed 's/{{bench:lora}}/{{bench:lora}}\n{{tabel:lora}}/' "$D/template.md.in" > "$W/t1"
fails_with "an unknown placeholder" "placeholder {{tabel:lora}} left unfilled" "$D/results" --template "$W/t1"
sed 's/{{commands}}/{{commands}} {{ header }}/' "$D/template.md.in" > "$W/t2"
fails_with "a malformed placeholder" "placeholder {{ header }} left unfilled" "$D/results" --template "$W/t2"
grep -v '{{bench:lora}}' "$D/template.md.in" > "$W/t3"
fails_with "a result no placeholder uses" "result files without a {{bench:NAME}}" "$D/results" --template "$W/t3"
sed 's/^How to read it:.*/memfit ran at 426.5 tok\/s here./' "$D/template.md.in" > "$W/t4"
fails_with "a figure in the template's prose" "'426.5 tok/s' looks like a measured figure" "$D/results" --template "$W/t4"
echo '{"name": "lora", "command": "x"}' > "$W/miss/lora.json"
fails_with "a result file lacking fields" "result file lacks date" "$W/miss" --template "$D/template.md.in"
fails_with "no results directory" "is not a directory" "$W/none" --template "$D/template.md.in"

# a quick run: said in the header, refused as docs/benchmarks.md (a copy of
# the renderer in a scratch tree, so a broken guard cannot touch the repo)
cp -r "$D/results" "$W/quick"
sed -i 's/"quick": false/"quick": true/' "$W/quick/planner.json"
"$PY" "$R" render "$W/quick" --template "$D/template.md.in" > "$W/q.md"
check "a quick result marks the header" "grep -q '^> \*\*QUICK RUN' '$W/q.md'"
mkdir -p "$W/repo/bench" "$W/repo/docs"; cp "$R" "$W/repo/bench/"
echo original > "$W/repo/docs/benchmarks.md"
RR=$W/repo/bench/render.py fails_with "a quick run written as docs/benchmarks.md" "never written to docs/benchmarks.md" \
  "$W/quick" --template "$D/template.md.in" --out "$W/repo/docs/benchmarks.md"
check "... and docs/benchmarks.md is left as it was" "[ \"\$(cat '$W/repo/docs/benchmarks.md')\" = original ]"
"$PY" "$W/repo/bench/render.py" render "$D/results" --template "$D/template.md.in" --out "$W/repo/docs/benchmarks.md"
check "a full run is written as docs/benchmarks.md" "grep -q '^Generated by' '$W/repo/docs/benchmarks.md'"
check "the committed docs/benchmarks.md is not a quick run" "! grep -q 'QUICK RUN' '$SRC/docs/benchmarks.md'"

# the real template against bench/all.sh: one placeholder per bench, no figure in its prose
mkdir "$W/all"
for q in 0 1; do
  QUICK=$q bash "$SRC/bench/all.sh" --list > "$W/list"
  rm -f "$W/all"/*.json
  "$PY" - "$W/list" "$W/all" $q <<'PY'
import json, sys
for line in open(sys.argv[1]):
    name, cmd = line.rstrip("\n").split(None, 1)
    json.dump({"name": name, "command": cmd, "date": "2026-01-01 00:00 UTC", "commit": "c0ffee", "machine": "m",
               "load_before": "1.00 1.00 1.00", "load_after": "1.00 1.00 1.00", "exit": 0, "seconds": 1,
               "quick": sys.argv[3] == "1", "output": [{"text": ["output of " + name]}]},
              open("%s/%s.json" % (sys.argv[2], name), "w"))
PY
  "$PY" "$R" render "$W/all" > "$W/all.md" 2> "$W/e"; rc=$?
  check "bench/benchmarks.md.in renders from bench/all.sh's benches (QUICK=$q) $(cat "$W/e")" "[ $rc -eq 0 ]"
  check "... every QUICK=$q command is in it" "[ \$(grep -c '^\\$ ' '$W/all.md') -eq \$(wc -l < '$W/list') ]"
done
exit $fail
