#!/usr/bin/env bash
# ZeRO 2 reduce-scatters a block's gradients in a background thread while
# the backward of the block before it computes (DDP-style overlap). Over 2
# ranks: some communication ran while the main thread computed (the
# background collectives' seconds exceed the seconds the main thread waited
# for them: comm_bg_s > comm_wait_s in --metrics); with
# MEMFIT_ZERO_OVERLAP=0 nothing runs in the background; both give the same
# losses and weights bit for bit (the same sums in the same order, only
# issued earlier); each rank's ledger equals its plan (the gradient rows the
# overlap reads live one phase longer in the plan).
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-overlap-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
for ov in 1 0; do
  MEMFIT_ZERO_OVERLAP=$ov "${MPIRUN[@]}" -x MEMFIT_ZERO_OVERLAP -np 2 "$M" train --model gpt2-10m --batch 4 --seq 128 \
    --steps 3 --threads 1 --zero 2 --sample_tokens 0 --val_every 0 --progress 0 --out_dir "$W/ov$ov" \
    --metrics "$W/ov$ov.jsonl" > "$W/ov$ov.log" 2>&1 || { echo "FAIL overlap=$ov: mpirun failed"; grep -m3 error "$W/ov$ov.log"; fail=1; }
done
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
ok = True
for r in ("", ".rank1"):
    on = json.loads(open(f"{w}/ov1.jsonl{r}").read().splitlines()[-1])
    off = json.loads(open(f"{w}/ov0.jsonl{r}").read().splitlines()[-1])
    total = on["comm_sync_s"] + on["comm_bg_s"]
    hidden = (on["comm_bg_s"] - on["comm_wait_s"]) / total
    good = on["comm_bg_s"] > on["comm_wait_s"] and off["comm_bg_s"] == 0 and off["comm_wait_s"] == 0
    good = good and all(m["ledger_peak_bytes"] == m["planned_peak_bytes"] for m in (on, off))
    ok &= good
    print("%s rank %s: overlap on: %.3f s collectives at once, %.3f s in the background, %.3f s waited: %.0f%% of the "
          "communication hidden; off: %.3f s at once, %.3f s background; ledger == plan: %s" % (
          "ok  " if good else "FAIL", r[-1:] or "0", on["comm_sync_s"], on["comm_bg_s"], on["comm_wait_s"], 100 * hidden,
          off["comm_sync_s"], off["comm_bg_s"], all(m["ledger_peak_bytes"] == m["planned_peak_bytes"] for m in (on, off))))
sys.exit(0 if ok else 1)
PY
cmp <(grep -o '"loss":[^,]*' "$W/ov1.jsonl") <(grep -o '"loss":[^,]*' "$W/ov0.jsonl") >/dev/null \
  && cmp "$W/ov1/model.safetensors" "$W/ov0/model.safetensors" \
  && echo "ok   overlap on and off: identical losses and weights" \
  || { echo "FAIL the overlap changed the results"; fail=1; }
exit $fail
