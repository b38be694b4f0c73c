#!/usr/bin/env bash
# Does the planner choose well? For each budget: every setting on the Pareto
# frontier that fits is trained for a few steps with its settings given
# explicitly (--plan off), and the chosen one's measured tokens/s is compared
# with the best measured among them (the issue's target: >= 90%).
# Usage: bench/planner_choice.sh [steps] -- [budgets...]   (model flags below)
set -u
cd "$(dirname "$0")/.."
M=${MEMFIT_BIN:-build/memfit}
STEPS=${STEPS:-6}
RUN=${RUN:---model gpt2-10m --batch 8 --seq 256}
BUDGETS=${*:-250MiB 300MiB 400MiB}
W=$(mktemp -d /tmp/memfit-bench-choice-XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "run: $RUN, $STEPS steps each; machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for b in $BUDGETS; do
  "$M" plan $RUN --budget "$b" --json > "$W/plan.json" || { echo "$b: plan failed"; continue; }
  /usr/bin/python3 - "$W/plan.json" "$M" "$RUN" "$STEPS" "$b" "$W" <<'PY'
import json, re, shlex, subprocess, sys, statistics
plan, M, run, steps, budget, W = sys.argv[1], sys.argv[2], shlex.split(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
r = json.load(open(plan))
rows = []
for c in r["settings"]:
    if not (c["frontier"] or c["chosen"]) or not c["fits"]:
        continue
    args = [M, "train", *run, "--steps", steps, "--sample_tokens", "0", "--val_every", "0", "--val_batches", "1",
            "--progress", "0", "--plan", "off", "--metrics", W + "/m.jsonl",
            "--batch", str(c["batch"]), "--grad_accum", str(c["grad_accum"]), "--optimizer", c["optimizer"],
            "--update_in_backward=" + str(c["update_in_backward"])]
    rc = c["recompute"] if c["recompute"] != "auto" else "auto"
    args += ["--recompute", rc]
    if c["recompute"] == "auto":
        args += ["--budget", budget]
    if c["offload"]:
        args += ["--offload", "optimizer=disk:" + W + "/state.bin"]
    if subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        print("  %s: training failed" % c); continue
    ms = [json.loads(l) for l in open(W + "/m.jsonl")][1:]
    tok = statistics.median(m["tok_s"] for m in ms)
    rows.append((c, tok))
if not rows:
    print("%s: no feasible frontier setting" % budget); sys.exit(0)
best = max(t for _, t in rows)
for c, t in rows:
    print("%s %-9s %-55s predicted %7.0f tok/s, measured %7.0f tok/s (%5.1f%% of best)" % (
        "*" if c["chosen"] else " ", budget, "%s B%dx%d %s%s%s" % (c["recompute"], c["batch"], c["grad_accum"], c["optimizer"],
        " uib" if c["update_in_backward"] else "", " offload" if c["offload"] else ""),
        r["effective_batch"] * r["seq"] / c["pred_step_s"], t, 100 * t / best))
PY
done
