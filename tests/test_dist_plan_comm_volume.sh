#!/usr/bin/env bash
# memfit plan --world_size W --zero Z --net_gbps B predicts each rank's
# communication per step from the ZeRO paper's volumes (Rajbhandari et al.
# 2020, section 7: 2 Psi for stages 0-2, 3 Psi for stage 3; fp32, and
# bandwidth-optimal collectives send (W-1)/W of each buffer) and adds its
# time at B Gbit/s to the step. Psi is computed here from gpt2-124m's
# dimensions, not read from memfit. Then the measured side: np 2 runs count
# the bytes their collectives move per step (--metrics comm_bytes), which
# equal the plan's for stages 0-2 and are within 2% for stage 3 (the
# position embedding's backward needs no gathered parameter). The
# predicted and measured step times are printed, not checked (this
# machine's load varies more than the bound would allow).
set -u
M=${MEMFIT_BIN:?}
. "$(dirname "$0")/mpi_env.sh"
W=$(mktemp -d /tmp/memfit-plancomm-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
for n in 2 4; do
  for z in 0 3; do
    "$M" plan --json --model gpt2-124m --batch 4 --seq 256 --world_size $n --zero $z --net_gbps 10 > "$W/p$n$z.json" \
      || { echo "FAIL plan N=$n zero=$z"; fail=1; continue; }
    /usr/bin/python3 - "$W/p$n$z.json" $n $z <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
N, S = int(sys.argv[2]), int(sys.argv[3])
L, C, T, V = 12, 768, 1024, 50257          # gpt2-124m
Vp = (V + 63) // 64 * 64                   # memfit pads the vocabulary rows
psi = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
want = (3 if S == 3 else 2) * psi * 4 * (N - 1) / N
c = r["settings"][r["chosen"]]
ok = r["world_size"] == N and r["zero"] == S and abs(c["comm_bytes"] - want) <= 1 \
     and abs(c["comm_s"] - want * 8 / 10e9) <= 1e-6 and c["pred_step_s"] > c["comm_s"]
print("%s plan N=%d zero %d: %.0f bytes per rank per step (formula %.0f), %.4f s at 10 Gbit/s of %.3f s/step" % (
    "ok  " if ok else "FAIL", N, S, c["comm_bytes"], want, c["comm_s"], c["pred_step_s"]))
sys.exit(0 if ok else 1)
PY
  done
done
# without --net_gbps the volume is given, its time is not added
"$M" plan --model gpt2-10m --batch 4 --seq 64 --world_size 2 --zero 2 | grep -q "per rank per step .* of collectives (ZeRO's 2 Psi x (2-1)/2 = 1 Psi" \
  && echo "ok   text plan names the volume" || { echo "FAIL text plan"; fail=1; }
# hybrid sharding (--zero_group): the text names the hybrid formula, not
# ZeRO's 2 Psi / 3 Psi, and its coefficient is the planned bytes / 4 Psi
for z in 2 3; do
  "$M" plan --model gpt2-10m --batch 4 --seq 64 --world_size 4 --zero $z --zero_group 2 > "$W/h$z.txt" \
    && "$M" plan --json --model gpt2-10m --batch 4 --seq 64 --world_size 4 --zero $z --zero_group 2 > "$W/h$z.json" \
    || { echo "FAIL plan hybrid zero $z"; fail=1; continue; }
  /usr/bin/python3 - "$W/h$z.txt" "$W/h$z.json" $z <<'PY' || fail=1
import json, re, sys
text = open(sys.argv[1]).read()
r = json.load(open(sys.argv[2]))
S = int(sys.argv[3])
c = r["settings"][r["chosen"]]
line = [l for l in text.splitlines() if "of collectives" in l][0]
m = re.search(r"= ([0-9.]+) Psi fp32 values, Psi = ([0-9]+) parameters", line)
# N = 2 of W = 4: b/2 + 2 (b/2)(1/2) + k b/2, k = 1 (stage 2) or 2 (stage 3)
want = 0.5 + 0.5 + (2 if S == 3 else 1) * 0.5
ok = m is not None and "hybrid shard, 2 groups of 2" in line and "2 Psi x" not in line and "3 Psi x" not in line \
     and abs(float(m.group(1)) - want) < 1e-3 and abs(c["comm_bytes"] / (4 * float(m.group(2))) - want) < 1e-3
print("%s plan hybrid W=4 N=2 zero %d: %s" % ("ok  " if ok else "FAIL", S, line.split("(", 1)[1].split(")")[0]))
sys.exit(0 if ok else 1)
PY
done
# measured on 2 ranks: the bytes each rank's collectives moved per step
for z in 1 3; do
  "$M" plan --json --model gpt2-1m --batch 4 --seq 64 --world_size 2 --zero $z --net_gbps 10 --threads 1 > "$W/m$z.json" \
    || { echo "FAIL plan gpt2-1m zero $z"; fail=1; }
  "${MPIRUN[@]}" -np 2 "$M" train --model gpt2-1m --batch 4 --seq 64 --steps 5 --threads 1 --zero $z --sample_tokens 0 \
    --val_every 0 --progress 0 --out_dir "$W/o$z" --metrics "$W/m$z.jsonl" > "$W/log" 2>&1 \
    || { echo "FAIL zero $z: mpirun failed"; grep -m3 error "$W/log"; fail=1; continue; }
  /usr/bin/python3 - "$W/m$z.json" "$W/m$z.jsonl" $z <<'PY' || fail=1
import json, statistics, sys
r = json.load(open(sys.argv[1]))
c = r["settings"][r["chosen"]]
S = int(sys.argv[3])
m = [json.loads(l) for l in open(sys.argv[2])]
# steps 2..N-1: the first and the last also gather the parameters for the
# initial weights and the final checkpoint
mid = range(1, len(m) - 1)
per = statistics.median(m[i]["comm_bytes"] - m[i - 1]["comm_bytes"] for i in mid)
t = lambda x: x["comm_sync_s"] + x["comm_bg_s"]
secs = statistics.median(t(m[i]) - t(m[i - 1]) for i in mid)
step = statistics.median(m[i]["step_s"] for i in mid)
tol = 0 if S < 3 else 0.02 * c["comm_bytes"]
ok = abs(per - c["comm_bytes"]) <= tol
gbps = per * 8 / secs / 1e9 if secs > 0 else float("nan")
print("%s np 2 zero %d: measured %.0f bytes per rank per step, planned %.0f (%+.2f%%); measured %.2f Gbit/s here, "
      "step %.4f s measured vs %.4f s predicted (compute %.4f + the planned bytes at that bandwidth)" % (
      "ok  " if ok else "FAIL", S, per, c["comm_bytes"], 100 * (per - c["comm_bytes"]) / c["comm_bytes"], gbps, step,
      c["pred_step_s"] - c["comm_s"] + c["comm_bytes"] * 8 / (gbps * 1e9), c["pred_step_s"] - c["comm_s"]))
sys.exit(0 if ok else 1)
PY
done
exit $fail
