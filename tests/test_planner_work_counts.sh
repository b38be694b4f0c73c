#!/usr/bin/env bash
# The planner's count of a step's work (`memfit plan --json`: gemm_flops,
# attn_flops) against the same counts written out here by hand from each
# preset's shapes, for recompute none and full, on a GPT-2 and a Llama
# preset. Pins what the time model assumes about the step:
# - forward + backward: every block product three times (forward, input
#   gradient, weight gradient), the tied head likewise;
# - recompute full: every block's forward once more, except the MLP's down
#   projection (a recomputed block whose output is not rebuilt stops before
#   it: blocks.c, write_out 0; every block is its own segment);
# - attention: causal, 2 x 2 B NH (T^2/2) hd forward, 2.5x that backward,
#   once more where recomputed.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-work-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
check() {  # name, arch, L C NH NKV hd ffn V B T recompute
  local name=$1 arch=$2 L=$3 C=$4 NH=$5 NKV=$6 hd=$7 F=$8 V=$9 B=${10} T=${11} rec=${12}
  if ! "$M" plan --model "$name" --batch "$B" --seq "$T" --recompute "$rec" --json > "$W/plan.json" 2> "$W/err"; then
    echo "FAIL $name $rec: plan failed"; cat "$W/err"; fail=1; return
  fi
  /usr/bin/python3 - "$W/plan.json" "$name" "$arch" "$L" "$C" "$NH" "$NKV" "$hd" "$F" "$V" "$B" "$T" "$rec" <<'PY' || fail=1
import json, sys
path, name, arch = sys.argv[1:4]
L, C, NH, NKV, hd, F, V, B, T = map(int, sys.argv[4:13])
rec = sys.argv[13]
s = next(x for x in json.load(open(path))["settings"]
         if x["batch"] == B and x["grad_accum"] == 1 and x["recompute"] == rec)
N = B * T
Vp = (V + 63) // 64 * 64
if arch == "gpt2":   # qkv C->3C, proj C->C, fc C->4C, fcproj 4C->C
    blk = C * 3 * C + C * C + C * 4 * C + 4 * C * C
    down = 4 * C * C
else:                # q, k, v, o; gate, up, down
    blk = C * NH * hd + 2 * C * NKV * hd + NH * hd * C + 3 * C * F
    down = F * C
nrec = L if rec == "full" else 0
gemm = 3 * (L * 2 * N * blk + 2 * N * C * Vp) + nrec * (2 * N * blk - 2 * N * down)
attn_f = 2 * 2 * B * NH * (T * T / 2) * hd
attn = 3.5 * L * attn_f + nrec * attn_f
ok = True
for key, want in (("gemm_flops", gemm), ("attn_flops", attn)):
    got = s[key]
    good = abs(got - want) <= 1e-9 * want + 1
    ok &= good
    print("%s %s %s %s: plan %.0f, by hand %.0f" % ("ok  " if good else "FAIL", name, rec, key, got, want))
sys.exit(0 if ok else 1)
PY
}
#     name          arch  L  C   NH NKV hd  ffn  V     B T   recompute
check gpt2-124m     gpt2  12 768 12 12  64  3072 50257 4 256 none
check gpt2-124m     gpt2  12 768 12 12  64  3072 50257 4 256 full
check smollm2-135m  llama 30 576 9  3   64  1536 49152 2 128 none
check smollm2-135m  llama 30 576 9  3   64  1536 49152 2 128 full
exit $fail
