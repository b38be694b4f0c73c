#!/usr/bin/env bash
# docs/cli.md and contrib/memfit.bash are what the binary prints
# (`memfit help --markdown`, `memfit help --bash-completion`, both from the
# one config table): the checked-in files must not drift (`make docs`
# regenerates them). Independently of the generator: every key and preset
# that `memfit train --help` lists is in docs/cli.md, and the completion
# completes commands, keys and preset names when sourced into bash.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:?}
W=$(mktemp -d /tmp/memfit-docs-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

"$M" help --markdown > "$W/cli.md"
"$M" help --bash-completion > "$W/memfit.bash"
check "docs/cli.md is what 'memfit help --markdown' prints (else: make docs)" "diff -u '$SRC/docs/cli.md' '$W/cli.md' | head -20; cmp -s '$SRC/docs/cli.md' '$W/cli.md'"
check "contrib/memfit.bash is what 'memfit help --bash-completion' prints (else: make docs)" \
  "diff -u '$SRC/contrib/memfit.bash' '$W/memfit.bash' | head -20; cmp -s '$SRC/contrib/memfit.bash' '$W/memfit.bash'"

"$M" train --help > "$W/help.txt"
nkeys=0
for k in $(sed -n 's/^  --\([a-z0-9_]*\) .*/\1/p' "$W/help.txt"); do
  nkeys=$((nkeys + 1))
  grep -q "^| \`--$k\` |" "$SRC/docs/cli.md" || { echo "FAIL docs/cli.md has no row for --$k"; fail=1; }
done
check "train --help lists keys ($nkeys) and docs/cli.md has a row for each" "[ $nkeys -gt 40 ]"
npre=0
for p in $(sed -n '/^Model presets/,$ s/^  \([a-z0-9.-]*\) .*/\1/p' "$W/help.txt"); do
  npre=$((npre + 1))
  grep -q "^| \`$p\` |" "$SRC/docs/cli.md" || { echo "FAIL docs/cli.md has no row for preset $p"; fail=1; }
done
check "train --help lists presets ($npre) and docs/cli.md has a row for each" "[ $npre -ge 5 ]"

check "the completion is valid bash" "bash -n '$SRC/contrib/memfit.bash'"
comp() {  # completions for the words given, the last being completed
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _memfit; echo "${COMPREPLY[*]}"' _ "$SRC/contrib/memfit.bash" "$@"
}
check "memfit tr<TAB> -> train" "[ \"\$(comp memfit tr)\" = train ]"
check "memfit train --budg<TAB> -> --budget" "[ \"\$(comp memfit train --budg)\" = --budget ]"
check "memfit train --model smol<TAB> -> smollm2-135m" "[ \"\$(comp memfit train --model smol)\" = smollm2-135m ]"
check "memfit estimate --model=gpt2-12<TAB> -> gpt2-124m" "[ \"\$(comp memfit estimate --model = gpt2-12)\" = gpt2-124m ]"
check "memfit plan --js<TAB> -> --json" "[ \"\$(comp memfit plan --js)\" = --json ]"
check "memfit train --config <TAB> completes file names" "(cd '$SRC' && comp memfit train --config configs/de | grep -q 'configs/demo.yaml')"

"$M" help --no-such-flag > "$W/out" 2> "$W/err"
rc=$?
check "help with an unknown flag: exit 2, one line naming it" "[ $rc -eq 2 ] && [ \$(wc -l < '$W/err') -eq 1 ] && grep -q no-such-flag '$W/err'"
exit $fail
