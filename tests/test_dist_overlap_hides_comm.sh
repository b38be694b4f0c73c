#!/usr/bin/env bash
# Every ZeRO stage has communication in flight while backward computes.
# Stages 0-2 reduce a block's gradients in a background thread while the
# backward of the block before it computes (DDP-style bucketed overlap: 0
# all-reduces, 1 reduce-scatters in place, in the step's last micro-batch;
# 2 reduce-scatters into the shard every micro-batch); stage 3 gathers the
# next block's parameters in the background (prefetch). Over 2 ranks: some
# communication ran while the main thread computed (the background
# collectives' seconds exceed the seconds the main thread waited for them:
# comm_bg_s > comm_wait_s in --metrics); with the overlap off
# (MEMFIT_ZERO_OVERLAP=0; MEMFIT_ZERO_PREFETCH=0 for stage 3) nothing runs in
# the background; on and off give the same losses and weights bit for bit
# (the same sums in the same order, only issued earlier), with gradient
# accumulation too (stage 1, grad_accum 2: only the last micro-batch
# reduces); each rank's ledger equals its plan.
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-overlap-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
trial() {  # zero, model, extra flags...
  local z=$1 model=$2; shift 2
  local var=MEMFIT_ZERO_OVERLAP; [ "$z" = 3 ] && var=MEMFIT_ZERO_PREFETCH
  for ov in 1 0; do
    env $var=$ov "${MPIRUN[@]}" -x $var -np 2 "$M" train --model "$model" --batch 4 --seq 128 \
      --steps 2 --threads 1 --zero "$z" --sample_tokens 0 --val_every 0 --progress 0 --out_dir "$W/z$z-ov$ov" \
      --metrics "$W/z$z-ov$ov.jsonl" "$@" > "$W/z$z-ov$ov.log" 2>&1 \
      || { echo "FAIL zero $z overlap=$ov: mpirun failed"; grep -m3 error "$W/z$z-ov$ov.log"; fail=1; return; }
  done
  /usr/bin/python3 - "$W" "$z" "$*" <<'PY' || fail=1
import json, sys
w, z, extra = sys.argv[1], sys.argv[2], sys.argv[3]
ok = True
for r in ("", ".rank1"):
    on = json.loads(open(f"{w}/z{z}-ov1.jsonl{r}").read().splitlines()[-1])
    off = json.loads(open(f"{w}/z{z}-ov0.jsonl{r}").read().splitlines()[-1])
    total = on["comm_sync_s"] + on["comm_bg_s"]
    hidden = (on["comm_bg_s"] - on["comm_wait_s"]) / total
    led = all(m["ledger_peak_bytes"] == m["planned_peak_bytes"] for m in (on, off))
    good = on["comm_bg_s"] > on["comm_wait_s"] and off["comm_bg_s"] == 0 and off["comm_wait_s"] == 0 and led
    ok &= good
    print("%s zero %s%s rank %s: overlap on: %.3f s collectives at once, %.3f s in the background, %.3f s waited: "
          "%.0f%% of the communication hidden; off: %.3f s at once, %.3f s background; ledger == plan: %s" % (
          "ok  " if good else "FAIL", z, " " + extra if extra else "", r[-1:] or "0", on["comm_sync_s"], on["comm_bg_s"],
          on["comm_wait_s"], 100 * hidden, off["comm_sync_s"], off["comm_bg_s"], led))
sys.exit(0 if ok else 1)
PY
  cmp <(grep -o '"loss":[^,]*' "$W/z$z-ov1.jsonl") <(grep -o '"loss":[^,]*' "$W/z$z-ov0.jsonl") >/dev/null \
    && cmp "$W/z$z-ov1/model.safetensors" "$W/z$z-ov0/model.safetensors" \
    && echo "ok   zero $z $*: overlap on and off: identical losses and weights" \
    || { echo "FAIL zero $z $*: the overlap changed the results"; fail=1; }
}
for z in 0 1 2 3; do trial $z gpt2-10m; done
trial 1 gpt2-1m --grad_accum 2
exit $fail
