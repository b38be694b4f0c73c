#!/usr/bin/python3
"""PyTorch Llama-family training-throughput baseline (CPU, fp32).

Uses the reference model in tests/ref/llama_torch.py (HF Llama semantics:
RMSNorm, RoPE, GQA by repeating kv heads, SwiGLU; plain matmul attention, as
torch 1.13 has no fused attention). Run with /usr/bin/python3.
Runs --steps AdamW steps in total (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
dim>=2 params, global-norm clip 1.0); the first --warmup-steps of them are not
timed into the result. Prints one line per step on stderr
("step i loss L tok/s N") and one JSON line on stdout:
  {"system":"pytorch","torch":...,"tokens_per_s_median":...,"tokens_per_s":[...],
   "step_s":[...],"peak_rss_bytes":...,"threads":...,"n_params":..., ...}
peak_rss_bytes is VmHWM of /proc/self/status. A tcmalloc preload, where
wanted, is the calling script's business (see bench/compare_torch.sh).

Data: --tokens FILE reads a memfit token file (format: bench/torch_gpt2.py)
and walks it in consecutive B*T+1 windows; without it the batches are random
ids.
"""

import argparse
import json
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests", "ref"))
sys.path.insert(0, _HERE)

import torch  # noqa: E402
import llama_torch as ref  # noqa: E402
from torch_gpt2 import peak_rss_bytes, read_tokens  # noqa: E402

PRESETS = {  # name: Cfg kwargs
    "smollm2-135m": dict(arch="llama", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64,
                         inter=1536, vocab=49152, tied=True, rope_theta=1e5, eps=1e-5, max_pos=8192),
    "qwen2.5-0.5b": dict(arch="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
                         inter=4864, vocab=151936, tied=True, rope_theta=1e6, eps=1e-6, max_pos=32768),
    "llama-tiny": dict(arch="llama", layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32,
                       inter=688, vocab=49152, tied=True, rope_theta=1e4, eps=1e-5, max_pos=2048),
}


def main():
    p = argparse.ArgumentParser(description="PyTorch Llama-family training throughput baseline")
    p.add_argument("--model", "--config", choices=sorted(PRESETS), default="smollm2-135m",
                   help="preset dims (explicit --layers etc. override); default smollm2-135m")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--inter", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--tied", type=int, choices=(0, 1))
    p.add_argument("--rope-theta", type=float)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="total steps, warm-up included")
    p.add_argument("--warmup-steps", "--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default=None, help="memfit token file (default: random ids)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    kw = dict(PRESETS[a.model])
    for k, v in (("layers", a.layers), ("hidden", a.hidden), ("heads", a.heads),
                 ("kv_heads", a.kv_heads), ("head_dim", a.head_dim), ("inter", a.inter),
                 ("vocab", a.vocab), ("tied", a.tied), ("rope_theta", a.rope_theta)):
        if v is not None:
            kw[k] = v
    if a.hidden is not None and a.head_dim is None and a.heads is not None:
        kw["head_dim"] = None  # recomputed as hidden/heads
    cfg = ref.Cfg(**kw)
    B, T, V = a.batch, a.seq, cfg.vocab
    if T > cfg.max_pos:
        p.error("--seq %d > max_position_embeddings %d" % (T, cfg.max_pos))
    if a.steps <= a.warmup_steps:
        p.error("--steps must exceed --warmup-steps")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    ids = None
    if a.tokens:
        ids, fvocab = read_tokens(a.tokens)
        if fvocab > V:
            p.error("token file vocab %d > model vocab %d" % (fvocab, V))
        if ids.numel() < B * T + 1:
            p.error("token file has %d ids, need at least %d" % (ids.numel(), B * T + 1))
    pos = 0

    def next_batch():
        nonlocal pos
        if ids is None:
            x = torch.randint(0, V, (B, T + 1))
            return x[:, :-1].contiguous(), x[:, 1:].contiguous()
        if pos + B * T + 1 > ids.numel():
            pos = 0
        w = ids[pos:pos + B * T + 1]
        pos += B * T
        return w[:-1].view(B, T), w[1:].view(B, T)

    model = ref.Llama(cfg)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    opt = ref.make_optimizer(model, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, wd=0.1)

    step_s, losses, tok_s = [], [], []
    for step in range(a.steps):
        x, y = next_batch()
        t0 = time.perf_counter()
        loss = ref.train_step(model, opt, x, y, clip=1.0)
        dt = time.perf_counter() - t0
        losses.append(loss)
        tok_s.append(B * T / dt)
        print("step %d loss %.4f tok/s %.1f%s" % (step, loss, B * T / dt,
              " (warm-up)" if step < a.warmup_steps else ""), file=sys.stderr, flush=True)
        if step >= a.warmup_steps:
            step_s.append(dt)

    med = statistics.median(step_s)
    print(json.dumps({
        "system": "pytorch",
        "torch": torch.__version__,
        "tokens_per_s_median": B * T / med,
        "tokens_per_s": tok_s[a.warmup_steps:],
        "step_s": step_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": a.threads,
        "n_params": n_params,
        "model": dict(cfg.to_hf(), preset=a.model),
        "batch": B, "seq": T, "steps": a.steps, "warmup_steps": a.warmup_steps,
        "data": a.tokens or "random",
        "loss_first": losses[0], "loss_last": losses[-1],
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "ld_preload": os.environ.get("LD_PRELOAD"),
    }))


if __name__ == "__main__":
    main()
