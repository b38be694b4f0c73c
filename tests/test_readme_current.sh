#!/usr/bin/env bash
# The README shows what a fresh clone prints. `make demo` takes minutes, so
# this runs the demo's config for 2 steps (same plan: steps do not change
# it) and checks the lines the README quotes that do not depend on the
# machine: the model line, the plan line's arena and categories, and the
# memory report's predicted and ledger bytes (all 'exact'). Also: the two
# set-up commands are stated as they are, the Makefile's demo runs the
# command the README names, the README's `memfit estimate` table has this
# binary's bytes, its local links exist, it stays a newcomer's page (under
# 250 lines, no issue numbers, no dated logs), and docs/benchmarks.md lists
# every command `make bench-all` runs.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:?}
R=$SRC/README.md
W=$(mktemp -d /tmp/memfit-readme-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

n=$(wc -l < "$R")
check "README is under 250 lines ($n)" "[ $n -lt 250 ]"
check "README has no issue numbers" "! grep -nE '(^|[^[:alnum:]&])#[0-9]+|[Ii]ssue [0-9]' '$R'"
check "README has no dated logs" "! grep -nE '20[0-9]{2}-[01][0-9]-[0-3][0-9]' '$R'"
check "set-up states 'make demo' and 'make test'" "grep -q '^make demo    # ' '$R' && grep -q '^make test    # ' '$R'"
check "Makefile's demo runs the README's command" \
  "grep -q 'runs \`build/memfit train --config configs/demo.yaml\`' '$R' && grep -qx $'\t./build/memfit train --config configs/demo.yaml' '$SRC/Makefile'"
for l in $(grep -oE '\]\([^)#:]+' "$R" | sed 's/^](//' | sort -u); do
  [ -e "$SRC/$l" ] || { echo "FAIL README links to a missing $l"; fail=1; }
done

# the demo: 2 steps of configs/demo.yaml
if [ ! -f "${MEMFIT_CACHE:-$HOME/.cache/memfit}/moby-dick.txt" ]; then
  echo "FAIL Moby-Dick is not in the cache: run scripts/fetch_data.sh"; exit 1
fi
(cd "$SRC" && "$M" train --config configs/demo.yaml --steps 2 --val_every 0 --val_batches 1 --sample_tokens 0 \
   --out_dir "$W/demo" --metrics "$W/m.jsonl" --progress 0) > "$W/demo.txt" 2>&1
check "demo config runs (2 steps)" "[ $? -eq 0 ]"
want=$(grep -m1 '^model gpt2-10m:' "$R")
check "model line as in the README" "grep -qxF '$want' '$W/demo.txt'"
want=$(grep -m1 '^plan: arena' "$R" | sed 's/ + runtime.*//')
got=$(grep -m1 '^plan: arena' "$W/demo.txt" | sed 's/ + runtime.*//')
check "plan line's arena and categories as in the README ('$got')" "[ -n '$want' ] && [ '$want' = '$got' ]"
for c in params grads optim acts work data total; do
  want=$(sed -n '/^memory report/,/^```/p' "$R" | awk -v c=$c '$1 == c {print $2, $3, $4}')
  got=$(sed -n '/^memory report/,$p' "$W/demo.txt" | awk -v c=$c '$1 == c {print $2, $3, $4}')
  check "memory report $c: README '$want', run '$got'" "[ -n '$want' ] && [ '$want' = '$got' ]"
done

# the README's estimate table
"$M" estimate --model gpt2-124m --batch 4 --seq 256 > "$W/est.txt"
for c in params grads optimizer activations scratch data total arena; do
  want=$(sed -n '/^\$ build\/memfit estimate --model gpt2-124m --batch 4 --seq 256$/,/^```/p' "$R" | awk -v c=$c '$1 == c {print $2; exit}')
  got=$(awk -v c=$c '$1 == c {print $2; exit}' "$W/est.txt")
  check "estimate $c: README $want, binary $got" "[ -n '$want' ] && [ '$want' = '$got' ]"
done

while read -r name cmd; do
  grep -qF -- "$cmd" "$SRC/docs/benchmarks.md" || { echo "FAIL docs/benchmarks.md does not list bench-all's $name: $cmd"; fail=1; }
done < <(bash "$SRC/bench/all.sh" --list)
exit $fail
