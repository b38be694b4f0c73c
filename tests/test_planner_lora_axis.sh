#!/usr/bin/env bash
# The planner's LoRA axis: LoRA r=8 (fp32, bf16, int8 and NF4 bases) is a
# candidate only for a run that fine-tunes loaded weights (--init) under
# --allow lossy; its settings are marked lossy and planned exactly (equal to
# memfit estimate with the same --lora/--base_dtype); an NF4 base is smaller
# than an fp32 one with the same other keys; a budget that a full
# fine-tuning setting fits never gets LoRA, one that only LoRA fits does,
# and memfit train --budget then trains adapters inside it (peak RSS checked
# in the release build); --lora given explicitly pins the axis, and then
# bf16 compute is offered with it and chosen when only it fits.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-plan-lora-XXXXXX)
trap 'rm -rf "$W"' EXIT
"$M" train --model gpt2-1m --batch 4 --seq 64 --steps 1 --out_dir "$W/base" --sample_tokens 0 --val_every 0 \
  --progress 0 > "$W/log" 2>&1 || { echo "FAIL base model: $(tail -1 "$W/log")"; exit 1; }
init="$W/base/model.safetensors"
args=(--model gpt2-1m --batch 4 --seq 64 --json)
plan() { "$M" plan "${args[@]}" "$@" 2> "$W/err" || { echo "FAIL plan $*: $(cat "$W/err")"; exit 1; }; }
plan --budget 4GiB --allow lossy > "$W/scratch.json"
plan --budget 4GiB --init "$init" > "$W/exact.json"
plan --budget 4GiB --init "$init" --allow lossy > "$W/lossy.json"
LORA="r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"
plan --budget 4GiB --init "$init" --allow lossy --lora "r=4,alpha=8" > "$W/pinned.json"
"$M" estimate --model gpt2-1m --batch 4 --seq 64 --lora "$LORA" --base_dtype nf4 --json > "$W/est.json" || exit 1
# a budget between the smallest LoRA setting and the smallest full fine-tuning one
b=$(/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["settings"]
lo = min(x["need_bytes"] for x in s if x["lora"])
full = min(x["need_bytes"] for x in s if not x["lora"])
print((lo + full) // 2 if lo < full else 0)' "$W/lossy.json")
[ "$b" -gt 0 ] || { echo "FAIL no LoRA setting is smaller than every full fine-tuning one"; exit 1; }
plan --budget "$b" --init "$init" --allow lossy > "$W/tight.json"
# bf16 compute with LoRA (docs/lora.md): a pinned --lora under --allow
# lossy offers bf16 too, and a budget between the smallest bf16 LoRA setting
# and the smallest fp32 LoRA one gets bf16
plan --budget 4GiB --init "$init" --allow lossy --lora "$LORA" > "$W/pin16.json"
b16=$(/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["settings"]
h = [x["need_bytes"] for x in s if x["precision"] == "bf16"]
f = [x["need_bytes"] for x in s if x["precision"] == "fp32"]
print((min(h) + min(f)) // 2 if h and f and min(h) < min(f) else 0)' "$W/pin16.json")
[ "$b16" -gt 0 ] || { echo "FAIL no bf16 LoRA setting is smaller than every fp32 LoRA one"; exit 1; }
plan --budget "$b16" --init "$init" --allow lossy --lora "$LORA" > "$W/tight16.json"
# memfit train measures its own runtime (above plan's, far above under
# AddressSanitizer): its refusal of a 1 MiB budget names its smallest
# feasible budget, a LoRA one; 1 MiB over that fits only LoRA settings
# (the smallest full fine-tuning setting needs 5 MiB more here)
"$M" train --model gpt2-1m --batch 4 --seq 64 --steps 3 --init "$init" --allow lossy --budget 1MiB \
  --sample_tokens 0 --val_every 0 --progress 0 > "$W/refused.log" 2>&1 && { echo "FAIL train --budget 1MiB was not refused"; exit 1; }
small=$(sed -n 's/.*smallest feasible budget is [^(]*(\([0-9]*\) bytes), with .*LoRA.*/\1/p' "$W/refused.log")
[ -n "$small" ] || { echo "FAIL train's refusal names no LoRA setting as the smallest: $(tail -1 "$W/refused.log")"; exit 1; }
bt=$((small + (1 << 20)))
"$M" train --model gpt2-1m --batch 4 --seq 64 --steps 3 --init "$init" --allow lossy --budget "$bt" \
  --sample_tokens 0 --val_every 0 --progress 0 > "$W/train.log" 2>&1 || { echo "FAIL train --budget $bt: $(tail -1 "$W/train.log")"; exit 1; }
/usr/bin/python3 - "$W" "$b" "$bt" <<'PY'
import json, os, re, sys
w, b, bt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ld = lambda n: json.load(open("%s/%s.json" % (w, n)))
sc, ex, lo, pi, ti = ld("scratch")["settings"], ld("exact")["settings"], ld("lossy")["settings"], ld("pinned")["settings"], ld("tight")
est = ld("est")
ok = True
def check(c, msg):
    global ok
    print(("ok   " if c else "FAIL ") + msg)
    ok &= bool(c)
check(not any(s["lora"] for s in sc), "no --init: no LoRA setting, even with --allow lossy (%d settings)" % len(sc))
check(not any(s["lora"] for s in ex), "--init without --allow lossy: no LoRA setting (%d settings)" % len(ex))
lr = [s for s in lo if s["lora"]]
check(lr and all(s["lossy"] for s in lr), "--init --allow lossy: %d LoRA settings, all marked lossy" % len(lr))
check({s["base_dtype"] for s in lr} == {"fp32", "bf16", "int8", "nf4"}, "bases offered: %s" % sorted({s["base_dtype"] for s in lr}))
key = lambda s: (s["recompute"], s["batch"], s["grad_accum"], s["optimizer"], s["precision"], s["update_in_backward"], s["offload"])
f32 = {key(s): s for s in lr if s["base_dtype"] == "fp32"}
nf4 = [s for s in lr if s["base_dtype"] == "nf4" and key(s) in f32]
check(nf4 and all(s["arena_bytes"] < f32[key(s)]["arena_bytes"] for s in nf4), "an NF4 base is smaller than an fp32 base in every pair (%d)" % len(nf4))
check(all(s["trainable_params"] < 0.2 * max(x["trainable_params"] for x in lo) for s in lr), "LoRA settings train a fraction of the parameters")
plain = [s for s in nf4 if (s["recompute"], s["batch"], s["grad_accum"], s["optimizer"], s["precision"]) == ("none", 4, 1, "adamw", "fp32")]
check(plain and plain[0]["arena_bytes"] == est["arena"], "the plan's bytes equal memfit estimate's (%s vs %s)" % (plain[0]["arena_bytes"] if plain else None, est.get("arena")))
ch = [s for s in lo if s["chosen"]]
check(ch and not ch[0]["lora"], "4 GiB: a full fine-tuning setting is chosen (%s)" % (ch[0]["lora"] or "full" if ch else None))
tc = [s for s in ti["settings"] if s["chosen"]]
check(tc and tc[0]["lora"] and tc[0]["need_bytes"] <= b, "budget %d (only LoRA fits): LoRA chosen (%s base)" % (b, tc[0]["base_dtype"] if tc else None))
check(all(s["lora"] == "r=4,alpha=8" for s in pi), "--lora given pins the axis (%d settings)" % len(pi))
p16 = ld("pin16")["settings"]
check(any(s["precision"] == "bf16" for s in p16) and all(s["lora"] for s in p16) and all(s["lossy"] for s in p16 if s["precision"] == "bf16"),
      "--lora pinned, --allow lossy: bf16 LoRA settings offered (%d), marked lossy" % sum(s["precision"] == "bf16" for s in p16))
t16 = [s for s in ld("tight16")["settings"] if s["chosen"]]
check(t16 and t16[0]["lora"] and t16[0]["precision"] == "bf16",
      "a budget only bf16 LoRA fits: bf16 chosen (%s)" % (t16[0]["precision"] if t16 else None))
log = open(w + "/train.log").read()
m = re.search(r"planner: (.*?), the fastest of", log)
check(m and "LoRA" in m.group(1), "train --budget %d trains adapters: %s" % (bt, m.group(1) if m else None))
pk = re.search(r"measured peak RSS \(VmHWM\) ([0-9.]+) MiB", log)
if os.environ.get("ASAN_OPTIONS"):
    print("skip the peak RSS check under AddressSanitizer (its shadow memory is outside every plan)")
else:
    check(pk and float(pk.group(1)) * 2**20 <= bt, "its peak RSS (%s MiB) is within the budget" % (pk.group(1) if pk else None))
sys.exit(0 if ok else 1)
PY
