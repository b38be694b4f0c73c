#!/usr/bin/env bash
# Peak RSS of real training runs is within max(1%, 24 MiB) of the measured
# baseline plus the planned arena, and the ledger equals the plan, for
# models from 1M to 124M parameters, every recompute policy, every
# optimizer, every precision (bf16 without master weights updated in
# backward or from disk too, bf16 gradients), LoRA on a frozen base (fp32 and NF4; fp32 and
# bf16 compute), and
# Llama-family models (from a preset and from a Hugging Face folder), a
# mixture of experts, and chat data (JSONL, packed and not).
# (Release build only: sanitizers change the process's memory.)
# The bound is what lets an unplanned 64 MiB touched in a step fail it, for
# every case here up to gpt2-124m's 2.5 GiB (measured: +64 MiB over the
# prediction, where the cases without it measure +0.0 to +10.7 MiB). It also
# needs the baseline to hold no free heap the step could take without
# faulting: the 16-bit GEMM warm-up's operands were calloc'd, and their
# ~65 MiB of freed, resident heap (glibc keeps up to M_TRIM_THRESHOLD)
# took such a malloc with no change in RSS (+0.1 MiB); they are mapped now.
set -u
M=${MEMFIT_BIN:?}
W=$(mktemp -d /tmp/memfit-rss-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
run() {  # name, args...
  local name=$1; shift
  if ! "$M" train --sample_tokens 0 --val_every 0 --val_batches 1 --metrics "$W/m.jsonl" "$@" > "$W/log" 2>&1; then
    echo "FAIL $name: train failed"; tail -3 "$W/log"; fail=1; return
  fi
  /usr/bin/python3 - "$W/m.jsonl" "$name" <<'PY' || fail=1
import json, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[-1])
pred = m["rss_baseline_bytes"] + m["arena_bytes"]
rss = m["rss_peak_bytes"]
tol = max(0.01 * pred, 24 * 2**20)
ok = abs(rss - pred) <= tol and m["ledger_peak_bytes"] == m["planned_peak_bytes"]
print("%s %s: predicted %.1f MiB, peak RSS %.1f MiB (%+.2f%%, %+.1f MiB; bound %.1f MiB), ledger %s plan" % (
    "ok  " if ok else "FAIL", sys.argv[2], pred / 2**20, rss / 2**20, 100.0 * (rss - pred) / pred,
    (rss - pred) / 2**20, tol / 2**20,
    "==" if m["ledger_peak_bytes"] == m["planned_peak_bytes"] else "!="))
sys.exit(0 if ok else 1)
PY
}
run gpt2-1m --model gpt2-1m --steps 3
run gpt2-10m-B8-T256 --model gpt2-10m --batch 8 --seq 256 --steps 2
run gpt2-10m-B2-T64-accum3 --model gpt2-10m --batch 2 --seq 64 --grad_accum 3 --steps 2
run gpt2-124m-B1-T128 --model gpt2-124m --batch 1 --seq 128 --steps 1
# every recompute policy: rebuilt rows share slots and scratch, and the
# process must still match the plan
for p in selective full sqrt every:2; do
  run "gpt2-10m-B8-T256-$p" --model gpt2-10m --batch 8 --seq 256 --steps 2 --recompute "$p"
done
run gpt2-124m-B2-T256-full --model gpt2-124m --batch 2 --seq 256 --steps 1 --recompute full
# auto under a budget between "full" and "none"
run gpt2-10m-B8-T256-auto --model gpt2-10m --batch 8 --seq 256 --steps 2 --recompute auto --budget 330MiB --plan off
# every optimizer's state, and gradients dropped as the update consumes them
for o in adamw8bit adafactor sgd; do
  run "gpt2-10m-B8-T256-$o" --model gpt2-10m --batch 8 --seq 256 --steps 2 --optimizer "$o" --momentum 0.9
done
run gpt2-124m-B2-T256-adamw8bit-uib --model gpt2-124m --batch 2 --seq 256 --steps 1 --optimizer adamw8bit \
  --update_in_backward --grad_clip 0 --recompute full
# mixed precision: 16-bit rows, master rows, the GEMM library warmed up
# before the baseline (and the planner's choice of bf16 under a budget)
run gpt2-10m-B8-T256-bf16 --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16
run gpt2-10m-B8-T256-bf16-nomaster-full --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 --master_weights=0 --recompute full
# master_weights 0 with update_in_backward (the sliced stochastic-rounding
# update; the tied embedding's gradient split by rows) and with offload
run gpt2-10m-B8-T256-bf16-nomaster-uib-8bit --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 \
  --master_weights=0 --recompute full --optimizer adamw8bit --update_in_backward --grad_clip 0
run gpt2-10m-B8-T256-pure-bf16-uib --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 \
  --master_weights=0 --pure_bf16 1 --update_in_backward --grad_clip 0
# bf16 gradients (grad_dtype bf16): with master weights and accumulation,
# and the everything-on setting (master-less, update_in_backward, 8-bit AdamW)
run gpt2-10m-B8-T256-bf16-grads-accum2 --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 \
  --grad_dtype bf16 --grad_accum 2
run gpt2-10m-B8-T256-bf16-grads-everything --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 \
  --master_weights=0 --recompute full --optimizer adamw8bit --update_in_backward --grad_clip 0 --grad_dtype bf16
run gpt2-10m-B8-T256-bf16-nomaster-offload --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision bf16 \
  --master_weights=0 --offload "optimizer=disk:$W/state16.bin"
run gpt2-10m-B8-T256-fp16 --model gpt2-10m --batch 8 --seq 256 --steps 2 --precision fp16
run gpt2-124m-B2-T256-bf16 --model gpt2-124m --batch 2 --seq 256 --steps 1 --precision bf16
# optimizer state in a file: resident state is the two windows
run gpt2-10m-B8-T256-offload --model gpt2-10m --batch 8 --seq 256 --steps 2 --offload "optimizer=disk:$W/state.bin"
# loading a checkpoint after the arena exists must not add the file to the peak
run gpt2-10m-save --model gpt2-10m --batch 4 --seq 128 --steps 1 --out_dir "$W/ck"
run gpt2-10m-resume --model gpt2-10m --batch 4 --seq 128 --steps 2 --resume "$W/ck/checkpoint.safetensors"
# LoRA: a frozen base (no gradients or optimizer state), adapters in their
# own category, dropout scratch; and a frozen base loaded with --init
LORA=r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj
run gpt2-10m-B8-T256-lora --model gpt2-10m --batch 8 --seq 256 --steps 2 --lora "$LORA"
run gpt2-10m-B8-T256-lora-init --model gpt2-10m --batch 8 --seq 256 --steps 2 --lora "$LORA" --recompute selective \
  --init "$W/ck/model.safetensors"
run gpt2-124m-B2-T256-lora-full --model gpt2-124m --batch 2 --seq 256 --steps 1 --lora "$LORA" --recompute full
# QLoRA: an NF4 base, packed from a random init and from --init's file map
run gpt2-10m-B8-T256-qlora-init --model gpt2-10m --batch 8 --seq 256 --steps 2 --lora "$LORA" --base_dtype nf4 \
  --init "$W/ck/model.safetensors"
run gpt2-124m-B2-T256-qlora-full --model gpt2-124m --batch 2 --seq 256 --steps 1 --lora "$LORA" --base_dtype nf4 --recompute full
# Llama family (RMSNorm, GQA + RoPE, SwiGLU): llama-tiny widened until the
# arena dominates (2.95M params, 110 MiB arena at recompute none), on a
# byte-level token file of its own; recompute none and full; and weights
# loaded from a Hugging Face folder (bf16 in 2 shards, tied head, written by
# the PyTorch reference) after the arena exists, which must not add the files
# to the peak
head -c 300000 /dev/urandom | base64 > "$W/llama.txt"
"$M" tokenize --tokenizer bytes "$W/llama.txt" "$W/llama.tok" >/dev/null || { echo "FAIL llama: tokenize"; fail=1; }
LLAMA=(--model llama-tiny --n_layer 4 --n_embd 256 --n_head 8 --n_kv_head 2 --intermediate_size 704 --batch 4 --seq 256
       --data "$W/llama.tok")
for p in none full; do
  run "llama-L4-C256-kv2-B4-T256-$p" "${LLAMA[@]}" --steps 2 --recompute "$p"
done
# ... in bf16 compute, with LoRA on all seven projections, and QLoRA on an
# NF4 base (its frozen embedding and head then bf16)
run llama-L4-C256-kv2-B4-T256-bf16 "${LLAMA[@]}" --steps 2 --precision bf16
LLORA=r=8,alpha=16,dropout=0.05,targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
run llama-L4-C256-kv2-B4-T256-lora "${LLAMA[@]}" --steps 2 --lora "$LLORA"
run llama-L4-C256-kv2-B4-T256-qlora-full "${LLAMA[@]}" --steps 2 --lora "$LLORA" --base_dtype nf4 --recompute full
# LoRA with bf16 compute: the frozen base's bf16 rows (no master), the
# widened-input rows work.lora_x32.*, on an fp32 and an NF4 base
run llama-L4-C256-kv2-B4-T256-lora-bf16 "${LLAMA[@]}" --steps 2 --lora "$LLORA" --precision bf16
run llama-L4-C256-kv2-B4-T256-qlora-bf16-selective "${LLAMA[@]}" --steps 2 --lora "$LLORA" --base_dtype nf4 \
  --precision bf16 --recompute selective
# mixture of experts (Mixtral block): moe-tiny widened (8 experts, top-2;
# the routing and permutation rows sized for the dropless worst case, or
# for a capacity factor), recompute none and full
MOE=(--model moe-tiny --n_layer 4 --n_embd 256 --n_head 8 --n_kv_head 2 --intermediate_size 384 --num_local_experts 8
     --batch 4 --seq 256 --data "$W/llama.tok")
run moe-L4-C256-E8k2-B4-T256-none "${MOE[@]}" --steps 2
run moe-L4-C256-E8k2-B4-T256-full-cf1.25 "${MOE[@]}" --steps 2 --recompute full --capacity_factor 1.25
# update_in_backward: each layer's expert gradients in rows of one expert
run moe-L4-C256-E8k2-B4-T256-uib "${MOE[@]}" --steps 2 --update_in_backward 1 --grad_clip 0
# chat data (--data FILE.jsonl): the tokenized store (~24 MiB here) is heap
# allocated before the baseline is read, packing adds the data.pos row
awk 'BEGIN { for (i = 0; i < 60000; i++) printf "{\"prompt\": \"question %d about %d things\", \"completion\": \"answer %d\"}\n", i, i % 97, i * 7 }' \
    >"$W/chat.jsonl"
LCHAT=("${LLAMA[@]:0:$((${#LLAMA[@]} - 2))}" --data "$W/chat.jsonl" --tokenizer bytes --chat_template chatml)
run llama-L4-C256-kv2-B4-T256-chat-packed "${LCHAT[@]}" --steps 2
run llama-L4-C256-kv2-B4-T256-chat-unpacked "${LCHAT[@]}" --packing off --steps 2
if /usr/bin/python3 "${MEMFIT_SRC:-$(dirname "$0")/..}/tests/ref/llama_torch.py" make-hf --out "$W/llama-hf" --arch llama \
    --layers 4 --hidden 256 --heads 8 --kv_heads 2 --inter 704 --vocab 256 --max_pos 256 --tied 1 --dtype BF16 --shards 2 \
    >/dev/null 2>&1; then
  run llama-L4-C256-tied-hf-bf16-B4-T256-selective --init "$W/llama-hf" --batch 4 --seq 256 --data "$W/llama.tok" \
    --steps 2 --recompute selective
else
  echo "FAIL llama-hf: the PyTorch reference (/usr/bin/python3 with python3-torch) wrote no folder"; fail=1
fi
# data parallel over 2 ranks: each rank's peak RSS is its baseline plus its
# own plan (the arena and the comm.mpi.* rows outside it: the MPI library's
# scratch for the collectives, measured after the baseline), and falls from
# stage to stage as the plan says. The model is
# 10.7M parameters of layers (byte vocabulary, width 384): with GPT-2's
# vocabulary the tied embedding's whole gradient and parameter sit at the
# head's peak, and stages 2 and 3 plan more than stage 1 (docs/memory.md).
# The MPI rows must be the measurement (comm_mpi_bytes == the mpi_scratch_*
# it was measured as, and not 0).
. "$(dirname "$0")/mpi_env.sh"
for z in 0 1 2 3; do
  if ! "${MPIRUN[@]}" -np 2 "$M" train --model gpt2-10m --tokenizer bytes --n_embd 384 --n_head 6 --batch 4 --seq 128 --steps 2 --threads 1 --zero $z \
      --sample_tokens 0 --val_every 0 --val_batches 1 --metrics "$W/z$z.jsonl" > "$W/log" 2>&1; then
    echo "FAIL zero $z: mpirun failed"; tail -3 "$W/log"; fail=1
  fi
done
# LoRA data parallel (zero 0): the frozen base and the adapters on each rank
if ! "${MPIRUN[@]}" -np 2 "$M" train --model gpt2-10m --tokenizer bytes --n_embd 384 --n_head 6 --batch 4 --seq 128 --steps 2 --threads 1 \
    --lora "$LORA" --sample_tokens 0 --val_every 0 --val_batches 1 --metrics "$W/lora.jsonl" > "$W/log" 2>&1; then
  echo "FAIL lora np=2: mpirun failed"; tail -3 "$W/log"; fail=1
fi
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
ok = True
for r, suffix in enumerate(("", ".rank1")):
    m = json.loads(open(f"{w}/lora.jsonl{suffix}").read().splitlines()[-1])
    mpi = m["comm_mpi_bytes"]
    pred = m["rss_baseline_bytes"] + m["arena_bytes"] + mpi
    rss = m["rss_peak_bytes"]
    good = abs(rss - pred) <= max(0.03 * pred, 32 * 2**20) and m["ledger_peak_bytes"] == m["planned_peak_bytes"] and mpi > 0
    ok &= good
    print("%s L6-C384-bytes-B4-T128 np=2 lora rank %d: predicted %.1f MiB, peak RSS %.1f MiB (%+.2f%%)" % (
        "ok  " if good else "FAIL", r, pred / 2**20, rss / 2**20, 100.0 * (rss - pred) / pred))
sys.exit(0 if ok else 1)
PY
/usr/bin/python3 - "$W" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
ok = True
rows = {}
for z in range(4):
    for r, suffix in enumerate(("", ".rank1")):
        m = json.loads(open(f"{w}/z{z}.jsonl{suffix}").read().splitlines()[-1])
        mpi = m["comm_mpi_bytes"]
        measured = m["mpi_scratch_allreduce_bytes"] + m["mpi_scratch_reduce_scatter_bytes"] + m["mpi_scratch_allgather_bytes"]
        pred = m["rss_baseline_bytes"] + m["arena_bytes"] + mpi
        rss = m["rss_peak_bytes"]
        good = abs(rss - pred) <= max(0.03 * pred, 32 * 2**20) and m["ledger_peak_bytes"] == m["planned_peak_bytes"] \
            and mpi > 0 and mpi == measured
        ok &= good
        rows[(z, r)] = (m["arena_bytes"], rss)
        print("%s L6-C384-bytes-B4-T128 np=2 zero %d rank %d: predicted %.1f MiB (comm outside the arena %.2f MiB), "
              "peak RSS %.1f MiB (%+.2f%%, %+.2f MiB)" % ("ok  " if good else "FAIL", z, r, pred / 2**20, mpi / 2**20,
              rss / 2**20, 100.0 * (rss - pred) / pred, (rss - pred) / 2**20))
for z in (1, 2, 3):
    for r in range(2):
        dplan = rows[(z - 1, r)][0] - rows[(z, r)][0]
        drss = rows[(z - 1, r)][1] - rows[(z, r)][1]
        good = dplan > 0 and abs(drss - dplan) <= max(0.1 * abs(dplan), 8 * 2**20)
        ok &= good
        print("%s zero %d -> %d rank %d: plan falls %.1f MiB, peak RSS falls %.1f MiB" % (
            "ok  " if good else "FAIL", z - 1, z, r, dplan / 2**20, drss / 2**20))
sys.exit(0 if ok else 1)
PY
exit $fail
