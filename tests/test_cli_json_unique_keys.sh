#!/usr/bin/env bash
# Every JSON document memfit prints or writes parses with a strict parser:
# one JSON value per document (one per line for .jsonl), no duplicate keys
# at any depth (Python's json keeps only the last of two equal keys, which
# is how `estimate --json` once lost the optimizer's name), and no NaN or
# Infinity (not JSON). Covered: estimate --json (plain, bf16, LoRA, budget
# with recompute auto, ZeRO), plan --json, train --metrics, --trace, and
# the config.json / adapter_config.json a run writes. Then every estimate,
# plan and --metrics line is validated against its schema under
# docs/schemas/ (python3-jsonschema, draft 2020-12; additionalProperties
# false, so a key memfit prints but the schema does not document fails).
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-json-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
PY=/usr/bin/python3

n=0
est() { n=$((n + 1)); "$M" estimate --json "$@" > "$W/est$n.json" || { echo "FAIL estimate --json $*"; fail=1; }; }
est
est --model gpt2-124m --batch 4 --seq 256
est --precision bf16 --master_weights 0
est --lora r=4 --base_dtype nf4
est --budget 300MiB --recompute auto
est --world_size 4 --zero 3
est --model llama-tiny --optimizer adamw8bit
# mixture of experts: n_active, the moe object (dropless, capacity), per-layer expert bytes
est --model moe-tiny --capacity_factor 1.25
est --model mixtral-8x7b --batch 1 --seq 2048 --lora r=16,targets=q_proj,v_proj --base_dtype nf4
"$M" plan --json --budget 1GiB > "$W/plan1.json" || { echo "FAIL plan --json"; fail=1; }
"$M" plan --json --all --budget 1GiB --allow lossy > "$W/plan2.json" || { echo "FAIL plan --json --all"; fail=1; }

head -c 20000 /dev/urandom | base64 > "$W/c.txt"
"$M" tokenize --tokenizer bytes "$W/c.txt" "$W/c.tok" > /dev/null
TINY="--n_layer 2 --n_embd 64 --n_head 4 --block_size 32 --seq 32 --batch 4 --data $W/c.tok --progress 0"
"$M" train --model gpt2-1m $TINY --steps 2 --val_every 1 --val_batches 1 --sample_tokens 0 \
  --metrics "$W/m.jsonl" --trace "$W/trace.json" > "$W/train.txt" 2>&1 || { echo "FAIL train"; cat "$W/train.txt"; fail=1; }
"$M" train --model llama-tiny $TINY --n_kv_head 2 --intermediate_size 128 --tokenizer bytes --steps 1 --val_every 0 \
  --sample_tokens 0 --out_dir "$W/out" --lora r=2 --save_adapter "$W/ad" > "$W/train2.txt" 2>&1 \
  || { echo "FAIL train llama-tiny"; cat "$W/train2.txt"; fail=1; }
# a mixture of experts with a capacity: moe_aux, moe_z, moe_dropped
"$M" train --model moe-tiny $TINY --n_head 8 --n_kv_head 2 --capacity_factor 1 --steps 2 --val_every 0 --sample_tokens 0 \
  --metrics "$W/m3.jsonl" > "$W/train4.txt" 2>&1 || { echo "FAIL train moe-tiny"; cat "$W/train4.txt"; fail=1; }
# fp16 with a budget: the metrics lines' loss-scaler and health keys
"$M" train --model gpt2-1m $TINY --steps 2 --val_every 0 --sample_tokens 0 --precision fp16 --budget 1GiB \
  --metrics "$W/m2.jsonl" > "$W/train3.txt" 2>&1 || { echo "FAIL train fp16"; cat "$W/train3.txt"; fail=1; }

$PY - "$W" <<'PY' || fail=1
import glob, json, os, sys
W = sys.argv[1]
def strict(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup: raise ValueError("duplicate key(s) %s" % dup)
    return dict(pairs)
def no_const(c): raise ValueError("%s is not JSON" % c)
def parse(text): return json.loads(text, object_pairs_hook=strict, parse_constant=no_const)
# the parser itself must refuse what it is here to refuse
for bad in ('{"a":1,"a":2}', '{"x":{"b":1,"b":1}}', '[NaN]'):
    try: parse(bad)
    except ValueError: pass
    else: print("FAIL strict parser accepted " + bad); sys.exit(1)
files = sorted(glob.glob(W + "/*.json") + glob.glob(W + "/*.jsonl") + glob.glob(W + "/out/*.json") + glob.glob(W + "/ad/*.json"))
bad = 0
for f in files:
    name = os.path.relpath(f, W)
    if name.endswith("tokenizer.json"): continue  # a copy of the user's file, not memfit's output
    text = open(f).read()
    docs = [l for l in text.splitlines() if l.strip()] if f.endswith(".jsonl") else [text]
    try:
        for d in docs: parse(d)
        print("ok   %s (%d document%s)" % (name, len(docs), "s" * (len(docs) != 1)))
    except ValueError as e:
        print("FAIL %s: %s" % (name, e)); bad = 1
need = ["est1.json", "plan1.json", "plan2.json", "m.jsonl", "trace.json", "out/config.json", "ad/adapter_config.json"]
for x in need:
    if not os.path.exists(os.path.join(W, x)): print("FAIL %s was not written" % x); bad = 1
e = parse(open(W + "/est1.json").read())
if not (e.get("optimizer") == "adamw" and isinstance(e.get("optimizer_state"), (int, float)) and e["optimizer_state"] == e["bytes"]["optim"]):
    print("FAIL estimate: optimizer is the name, optimizer_state the bytes"); bad = 1
sys.exit(bad)
PY

# the documented shape: each output against its schema
SCHEMAS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../docs/schemas" && pwd)
$PY - "$W" "$SCHEMAS" <<'PY' || fail=1
import copy, glob, json, os, sys
try:
    import jsonschema
except ImportError:
    print("FAIL python3-jsonschema is missing (scripts/install_deps.sh test installs it)"); sys.exit(1)
W, S = sys.argv[1], sys.argv[2]
def validator(name):
    s = json.load(open(os.path.join(S, name + ".schema.json")))
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)
groups = [("estimate", sorted(glob.glob(W + "/est*.json"))), ("plan", sorted(glob.glob(W + "/plan*.json"))),
          ("metrics-line", sorted(glob.glob(W + "/m*.jsonl")))]
bad = 0
for schema, files in groups:
    v = validator(schema)
    if not files: print("FAIL no output for schema %s" % schema); bad = 1
    for f in files:
        docs = [json.loads(l) for l in open(f) if l.strip()] if f.endswith(".jsonl") else [json.load(open(f))]
        errs = [e for d in docs for e in v.iter_errors(d)]
        for e in errs[:3]: print("FAIL %s against %s.schema.json: %s at %s" % (os.path.basename(f), schema, e.message, list(e.path)))
        if errs: bad = 1
        else: print("ok   %s matches docs/schemas/%s.schema.json" % (os.path.basename(f), schema))
# the schemas must refuse what they are here to refuse: an undocumented key
# (top level and nested), a missing key, a wrong type
def refuses(schema, doc, what):
    global bad
    if validator(schema).is_valid(doc): print("FAIL %s.schema.json accepted %s" % (schema, what)); bad = 1
e = json.load(open(W + "/est1.json"))
x = copy.deepcopy(e); x["undocumented"] = 1; refuses("estimate", x, "an undocumented key")
x = copy.deepcopy(e); x["bytes"]["undocumented"] = 1; refuses("estimate", x, "an undocumented category")
x = copy.deepcopy(e); x["layers"][0]["undocumented"] = 1; refuses("estimate", x, "an undocumented layer key")
x = copy.deepcopy(e); del x["arena"]; refuses("estimate", x, "a missing key")
x = copy.deepcopy(e); x["total"] = "1 GiB"; refuses("estimate", x, "a string for bytes")
p = json.load(open(W + "/plan1.json"))
x = copy.deepcopy(p); x["settings"][0]["undocumented"] = 1; refuses("plan", x, "an undocumented setting key")
m = json.loads(open(W + "/m.jsonl").readline())
x = dict(m, undocumented=1); refuses("metrics-line", x, "an undocumented key")
x = dict(m); del x["seq"]; refuses("metrics-line", x, "rows without seq")
x = json.loads(open(W + "/m3.jsonl").readline())
if not all(k in x for k in ("moe_aux", "moe_z", "moe_dropped")): print("FAIL moe metrics keys missing"); bad = 1
x["moe_dropped"] = -1; refuses("metrics-line", x, "a negative dropped count")
for f in ("est8.json", "est9.json"):
    x = json.load(open(W + "/" + f))
    if not ("moe" in x and x["n_active"] < x["n_params"] and all("experts" in l for l in x["layers"])):
        print("FAIL %s: no moe object, n_active or per-layer experts" % f); bad = 1
if json.load(open(W + "/est1.json"))["n_active"] != json.load(open(W + "/est1.json"))["n_params"]:
    print("FAIL dense n_active != n_params"); bad = 1
sys.exit(bad)
PY
[ $fail -eq 0 ] && echo "test_cli_json_unique_keys: ok"
exit $fail
