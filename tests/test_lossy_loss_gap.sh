#!/usr/bin/env bash
# The lossy settings' measured cost, one fp32 AdamW baseline for all:
# gpt2-10m trained 300 steps on the default corpus (B4 T128, the default lr
# 1e-3, same seed and data).
# - Mixed precision: bf16 and fp16 (fp32 master weights, loss scaling for
#   fp16) end within 2% of fp32's validation loss, either way. At lr 2e-3
#   (this test's setting until 2026-11-23) fp32 alone spread 6.26-6.56 over
#   seeds 2/1337/1, and bf16's gap was -2.6%/+1.2%/+1.3%: the noise of a
#   too-high lr, not precision. At 1e-3, measured 2026-11-23: bf16
#   +0.10%/-0.23%, fp16 +0.04%/+0.03% (seeds 1337/1).
# - The lossy optimizers: adamw8bit and adafactor end at most 3% above
#   AdamW's (the same fp32 run). They ran at lr 2e-3 in their own test until
#   2026-11-25; at 1e-3, measured that day: adamw 6.0467, adamw8bit 6.0545
#   (+0.13%), adafactor 5.9897 (-0.94%).
# - bf16 master-less with update_in_backward and pure bf16 against fp32,
#   all without clipping, 150 steps (below).
# - bf16 gradients (--grad_dtype bf16) against the same fp32 baseline, 300
#   steps, within 2% either way: with one micro-batch (each weight
#   gradient rounded once), and as batch 2 x grad_accum 2 (the second
#   micro-batch's gradient added to the bf16 row and rounded again: the
#   cost of accumulating in bf16; fp32 accumulation is exact, so fp32 B4
#   is its baseline too).
# - LoRA with bf16 compute against LoRA in fp32 on the same run: llama-tiny,
#   adapters on all seven projections (r 8, alpha 16), B4 T64, lr 3e-3,
#   150 steps (a few seconds in fp32, about 25 s in bf16 on an idle
#   machine: oneDNN's calls dominate these small GEMMs), within 1% either
#   way. Measured 2026-11-27 (machine loaded): fp32 5.1165, bf16 5.1157
#   (-0.02%).
# (Release build only: about 8.5 minutes on 2 cores.)
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-prec-gap-XXXXXX)
trap 'rm -rf "$W"' EXIT
# The runs are independent: they run side by side, one thread each, as
# many at once as there are cores (on 2 cores two single-thread 40-step
# runs of this small model finished in 0.72x the time of the same two with
# 2 threads one after the other: fewer barriers; the whole test took 507 s
# here, against 570 s run one after another in the suite an hour before).
# Every run, baseline included, uses one thread, so the comparisons stay
# like for like.
J=$(nproc)
start() {  # name, command...
  local p=$1; shift
  while [ "$(jobs -rp | wc -l)" -ge "$J" ]; do wait -n; done
  ( "$@" > "$W/$p.log" 2>&1; echo $? > "$W/$p.rc" ) &
}
run() {  # name, steps, args...
  local p=$1 n=$2; shift 2
  start "$p" "$M" train --model gpt2-10m --batch 4 --seq 128 --steps "$n" --lr 1e-3 "$@" --sample_tokens 0 \
       --val_every 0 --val_batches 16 --progress 0 --log_every "$n" --threads 1 --metrics "$W/$p.jsonl"
}
for p in fp32 bf16 fp16; do run "$p" 300 --precision "$p"; done
for o in adamw8bit adafactor; do run "$o" 300 --optimizer "$o"; done
# bf16 without master weights, updated in backward (stochastic rounding,
# the tied embedding split by rows), and --pure_bf16 (AdamW's moments bf16
# too), against fp32 with the same grad_clip 0 (update_in_backward cannot
# clip; it is exact in fp32). 150 steps, not the issue's 300, to keep the
# suite's time. Measured 2026-11-25 (seed 1337): fp32 6.6201, master-less
# +0.37%, pure +0.14%; at 300 steps fp32 without clipping ends at 6.4310
# and both bf16 runs lower, -2.35% / -2.13% (docs/precision.md).
run fp32-noclip 150 --precision fp32 --grad_clip 0
run bf16-nomaster-uib 150 --precision bf16 --master_weights 0 --update_in_backward 1 --grad_clip 0
run bf16-pure-uib 150 --precision bf16 --master_weights 0 --pure_bf16 1 --update_in_backward 1 --grad_clip 0
run bf16-g16 300 --precision bf16 --grad_dtype bf16
run bf16-g16-accum2 300 --precision bf16 --grad_dtype bf16 --batch 2 --grad_accum 2
LLORA=r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
for p in fp32 bf16; do
  start "lora-$p" "$M" train --model llama-tiny --batch 4 --seq 64 --steps 150 --lr 3e-3 --lora "$LLORA" --precision "$p" \
       --sample_tokens 0 --val_every 0 --val_batches 16 --progress 0 --log_every 150 --threads 1 --metrics "$W/lora-$p.jsonl"
done
wait
for f in "$W"/*.rc; do
  p=$(basename "$f" .rc)
  if [ "$(cat "$f")" != 0 ]; then echo "FAIL $p: train failed"; tail -3 "$W/$p.log"; exit 1; fi
done
[ "$(ls "$W"/*.rc | wc -l)" -eq 12 ] || { echo "FAIL: $(ls "$W"/*.rc | wc -l) of 12 runs finished"; exit 1; }
/usr/bin/python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def last(p):
    L = [json.loads(l) for l in open("%s/%s.jsonl" % (w, p))]
    v = [m for m in L if m.get("val_loss") is not None]
    return v[-1]["val_loss"], L[-1]["ledger_peak_bytes"], L[-1].get("skipped_total", 0)
base, bmem, _ = last("fp32")
ok = True
print("fp32 val %.4f, ledger peak %.1f MiB" % (base, bmem / 2**20))
for p, ref in (("bf16", "fp32"), ("fp16", "fp32"), ("bf16-nomaster-uib", "fp32-noclip"), ("bf16-pure-uib", "fp32-noclip"),
               ("bf16-g16", "fp32"), ("bf16-g16-accum2", "fp32")):
    base = last(ref)[0]
    v, mem, sk = last(p)
    gap = (v - base) / base
    good = abs(gap) <= 0.02
    ok &= good
    print("%s %s val %.4f (%+.2f%% vs %s %.4f), ledger peak %.1f MiB, skipped steps %d" % (
        "ok  " if good else "FAIL", p, v, 100 * gap, ref, base, mem / 2**20, sk))
for o in ("adamw8bit", "adafactor"):
    base = last("fp32")[0]
    v, mem, _ = last(o)
    gap = (v - base) / base
    good = gap <= 0.03
    ok &= good
    print("%s %s val %.4f (%+.2f%% vs fp32 adamw %.4f), ledger peak %.1f MiB" % (
        "ok  " if good else "FAIL", o, v, 100 * gap, base, mem / 2**20))
base, _, _ = last("lora-fp32")
v, mem, _ = last("lora-bf16")
gap = (v - base) / base
good = abs(gap) <= 0.01
ok &= good
print("%s lora-bf16 (llama-tiny) val %.4f (%+.2f%% vs lora-fp32 %.4f), ledger peak %.1f MiB" % (
    "ok  " if good else "FAIL", v, 100 * gap, base, mem / 2**20))
sys.exit(0 if ok else 1)
PY
