#!/usr/bin/env bash
# The planner's precision axis: without --allow lossy every setting is
# fp32; with it, bf16 (with and without master weights) settings appear,
# are marked lossy, and the bf16 setting without master weights is smaller
# than the fp32 one with the same other keys (its bytes are the real
# plan's, equal to memfit estimate's); --precision set explicitly pins it;
# bf16 gradients are offered the same way and are smaller.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-plan-prec-XXXXXX)
trap 'rm -rf "$W"' EXIT
args=(--model gpt2-1m --batch 4 --seq 64 --budget 4GiB --json)
"$M" plan "${args[@]}" > "$W/exact.json" 2> "$W/err" || { echo "FAIL plan: $(cat "$W/err")"; exit 1; }
"$M" plan "${args[@]}" --allow lossy > "$W/lossy.json" 2> "$W/err" || { echo "FAIL plan lossy: $(cat "$W/err")"; exit 1; }
"$M" plan "${args[@]}" --allow lossy --precision bf16 > "$W/pinned.json" 2> "$W/err" || { echo "FAIL plan pinned: $(cat "$W/err")"; exit 1; }
"$M" estimate --model gpt2-1m --batch 4 --seq 64 --precision bf16 --master_weights=0 --json > "$W/est.json" || exit 1
/usr/bin/python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
ex = json.load(open(w + "/exact.json"))["settings"]
lo = json.load(open(w + "/lossy.json"))["settings"]
pi = json.load(open(w + "/pinned.json"))["settings"]
est = json.load(open(w + "/est.json"))
ok = True
def check(c, msg):
    global ok
    print(("ok   " if c else "FAIL ") + msg)
    ok &= bool(c)
check(all(s["precision"] == "fp32" for s in ex), "without --allow lossy every setting is fp32 (%d)" % len(ex))
b = [s for s in lo if s["precision"] == "bf16"]
check(b and all(s["lossy"] for s in b), "with --allow lossy: %d bf16 settings, all marked lossy" % len(b))
check(any(not s["master_weights"] for s in b) and any(s["master_weights"] for s in b), "bf16 with and without master weights")
key = lambda s: (s["recompute"], s["batch"], s["grad_accum"], s["optimizer"], s["update_in_backward"], s["offload"])
f32 = {key(s): s for s in lo if s["precision"] == "fp32"}
nm = [s for s in b if not s["master_weights"] and key(s) in f32]
check(nm and all(s["arena_bytes"] < f32[key(s)]["arena_bytes"] for s in nm), "bf16 without master weights is smaller than fp32 in every pair (%d)" % len(nm))
plain = [s for s in nm if key(s) == ("none", 4, 1, "adamw", 0, 0)]
check(plain and plain[0]["arena_bytes"] == est["arena"], "the plan's bytes equal memfit estimate's (%s vs %s)" % (plain[0]["arena_bytes"] if plain else None, est.get("arena")))
check(all(s["precision"] == "bf16" and s["master_weights"] and not s["pure_bf16"] for s in pi), "--precision bf16 pins the axis (%d settings)" % len(pi))
# bf16 gradients (--grad_dtype bf16): offered under --allow lossy, marked
# lossy, each smaller than its twin with fp32 gradients; never without it
k2 = lambda s: key(s) + (s["master_weights"], s["pure_bf16"])
g32 = {k2(s): s for s in b if s["grad_dtype"] == "fp32"}
g16 = [s for s in b if s["grad_dtype"] == "bf16" and k2(s) in g32]
check(g16 and all(s["lossy"] and s["arena_bytes"] < g32[k2(s)]["arena_bytes"] for s in g16),
      "bf16 gradients offered, lossy, smaller than fp32 gradients in every pair (%d)" % len(g16))
check(all(s["grad_dtype"] == "fp32" for s in ex), "without --allow lossy every setting has fp32 gradients")
sys.exit(0 if ok else 1)
PY
