#!/usr/bin/env bash
# make install's layout works for an embedder: `cmake --install` into a
# temporary prefix, then examples/will_it_fit.c is built with cc and
# nothing but `pkg-config --cflags --libs memfit` (shared libmemfit.so.N)
# and `pkg-config --static --libs memfit` (libmemfit.a), and its planned
# bytes per category, total and arena equal `memfit estimate --json`'s for
# the same config. Also: the soname is versioned, the budget verdict and
# exit status, and bad input gives one line and exit 2.
set -u
M=${MEMFIT_BIN:?}
SRC=${MEMFIT_SRC:?}
B=$(dirname "$M")
W=$(mktemp -d /tmp/memfit-install-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
command -v pkg-config >/dev/null || { echo "FAIL pkg-config missing: apt-get install pkg-config"; exit 1; }

cmake --install "$B" --prefix "$W/prefix" > "$W/install.log" 2>&1 || { cat "$W/install.log"; echo "FAIL cmake --install"; exit 1; }
P=$W/prefix
for f in bin/memfit lib/libmemfit.a lib/libmemfit.so lib/pkgconfig/memfit.pc include/memfit/memfit.h \
         share/bash-completion/completions/memfit; do
  check "installed $f" "[ -e '$P/$f' ]"
done
soname=$(objdump -p "$P/lib/libmemfit.so" | awk '/SONAME/ {print $2}')
check "soname is versioned (got '$soname')" "[[ '$soname' =~ ^libmemfit\.so\.[0-9]+$ ]] && [ -e '$P/lib/$soname' ]"
check "libmemfit.so.N points at the versioned file" "[[ \$(readlink '$P/lib/$soname') =~ ^libmemfit\.so\.[0-9]+\.[0-9]+\.[0-9]+$ ]]"

# every installed header compiles on its own with only the installed
# include folder: none includes an internal (src/) header
nh=0
for h in "$P"/include/memfit/*.h; do
  nh=$((nh + 1))
  printf '#include <memfit/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" > "$W/h.c"
  cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$P/include" "$W/h.c" 2> "$W/h.err" \
    || { echo "FAIL installed memfit/$(basename "$h") does not compile alone: $(head -c 300 "$W/h.err")"; fail=1; }
done
check "installed headers compile alone ($nh)" "[ $nh -ge 6 ]"
check "internal headers are not installed" "[ ! -e '$P/include/memfit/quant.h' ] && [ ! -e '$P/include/memfit/io.h' ]"

# a sanitizer build's library needs the sanitizer runtime in the example too
san=""
grep -q '^MEMFIT_SANITIZE:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
export PKG_CONFIG_PATH=$P/lib/pkgconfig
cp "$SRC/examples/will_it_fit.c" "$W/"
(cd "$W" && cc -std=c11 -Wall -Wextra -Werror $san will_it_fit.c $(pkg-config --cflags --libs memfit) -o wif_shared) \
  || { echo "FAIL example does not build against the shared library"; exit 1; }
(cd "$W" && cc -std=c11 -Wall -Wextra -Werror $san will_it_fit.c $(pkg-config --cflags memfit) \
   $(pkg-config --static --libs memfit | sed 's/-lmemfit\b/-l:libmemfit.a/') -o wif_static) \
  || { echo "FAIL example does not build against libmemfit.a with pkg-config --static"; exit 1; }
check "shared build loads the installed libmemfit.so" \
  "LD_LIBRARY_PATH='$P/lib' ldd '$W/wif_shared' | grep -q '$P/lib/libmemfit.so'"
check "static build needs no libmemfit.so" "! ldd '$W/wif_static' | grep -q libmemfit"

# the example's bytes against the CLI's, for a GPT-2 and a Llama-family config
cmpjson() {  # $1 example output, $2 estimate json
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
got = {}
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) >= 2 and w[1].isdigit():
        got[w[0]] = int(w[1])
est = json.load(open(sys.argv[2]))
want = dict(est["bytes"], total=est["total"], arena=est["arena"])
bad = [k for k in want if got.get(k) != int(want[k])]
if bad:
    sys.exit("differ: " + ", ".join("%s example %s estimate %s" % (k, got.get(k), want[k]) for k in bad))
PY
}
run=0
for cfg in "gpt2-10m|--batch 4 --seq 128" "smollm2-135m|--batch 2 --seq 256 --precision bf16 --recompute full" \
           "llama-tiny|--lora r=8,alpha=16 --batch 2 --seq 64"; do
  model=${cfg%%|*}; args=${cfg#*|}; run=$((run + 1))
  for v in shared static; do
    LD_LIBRARY_PATH=$P/lib "$W/wif_$v" "$model" 64 --threads 1 $args > "$W/ex$run$v.txt" 2> "$W/ex$run$v.err"
    check "$v example runs on $model $args (exit 0 = fits 64 GiB)" "[ $? -eq 0 ]"
  done
  "$P/bin/memfit" estimate --json --model "$model" --threads 1 $args > "$W/est$run.json"
  check "$model $args: example bytes == memfit estimate --json" "cmpjson '$W/ex${run}shared.txt' '$W/est$run.json'"
    # (the measured runtime and the need line that adds it differ by process)
  check "$model: shared and static examples print the same plan" \
    "diff <(grep -v -e runtime -e need '$W/ex${run}shared.txt') <(grep -v -e runtime -e need '$W/ex${run}static.txt')"
  check "$model: says fits: yes" "grep -q 'fits: yes' '$W/ex${run}shared.txt'"
done
LD_LIBRARY_PATH=$P/lib "$W/wif_shared" gpt2-124m 1 --threads 1 > "$W/no.txt" 2>&1
rc=$?
check "gpt2-124m in 1 GiB: fits: no, exit 1 (got $rc)" "[ $rc -eq 1 ] && grep -q 'fits: no' '$W/no.txt' && grep -q 'over by' '$W/no.txt'"
LD_LIBRARY_PATH=$P/lib "$W/wif_shared" no-such-model 4 > "$W/bad.txt" 2> "$W/bad.err"
rc=$?
check "unknown preset: exit 2, one error line naming it (got $rc: $(head -c 200 "$W/bad.err"))" \
  "[ $rc -eq 2 ] && [ \$(wc -l < '$W/bad.err') -eq 1 ] && grep -q 'no-such-model' '$W/bad.err' && [ ! -s '$W/bad.txt' ]"
LD_LIBRARY_PATH=$P/lib "$W/wif_shared" gpt2-10m lots > /dev/null 2> "$W/bad2.err"
rc=$?
check "bad budget: exit 2, one line" "[ $rc -eq 2 ] && [ \$(wc -l < '$W/bad2.err') -eq 1 ]"
exit $fail
