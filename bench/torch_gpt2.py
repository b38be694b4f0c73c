#!/usr/bin/python3
"""PyTorch GPT-2 training-throughput baseline (CPU, fp32, or bf16 autocast).

Uses the reference model in tests/ref/gpt2_torch.py. Run with /usr/bin/python3.
Runs --steps AdamW steps in total (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
dim>=2 params, global-norm clip 1.0); the first --warmup-steps of them are not
timed into the result. --autocast bf16 runs the forward (and the loss) under
torch.autocast("cpu", dtype=torch.bfloat16), as PyTorch's mixed-precision
recipe does: matmuls in bf16 (oneDNN's AVX512_BF16 kernels where the CPU has
them), fp32 weights, gradients and AdamW step; the backward follows the
forward's dtypes. Without it (the default) everything is fp32, as before.
Prints one JSON line:
  {"system":"pytorch","torch":...,"tokens_per_s_median":...,"step_s":[...],
   "peak_rss_bytes":...,"threads":...,"n_params":...,"autocast":null|"bf16", ...}

Data: --tokens FILE reads a memfit token file (64-byte header "MFTOKENS",
u32 version (1 or 2), u32 kind, u32 vocab, u32 bytes_per_id (2 or 4), u64 n,
32 more header bytes, then n u16 or u32 ids; docs/formats.md) and walks it in consecutive B*T+1 windows; without it
the batches are random ids.
"""

import argparse
import json
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))

import torch  # noqa: E402
import gpt2_torch as ref  # noqa: E402

PRESETS = {  # name: (layers, embd, heads, vocab, max_seq)
    "gpt2-124m": (12, 768, 12, 50257, 1024),
    "gpt2-10m": (6, 160, 5, 50257, 256),
}


def read_tokens(path):
    """Returns (ids as an int64 tensor, vocab) from a memfit token file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 64 or raw[:8] != b"MFTOKENS":
        raise ValueError("%s: not a memfit token file" % path)
    version, kind, vocab, bpi, n = struct.unpack_from("<IIIIQ", raw, 8)
    if version not in (1, 2) or bpi not in (2, 4) or (version == 1 and bpi != 2):
        raise ValueError("%s: unsupported version %d / bytes_per_id %d" % (path, version, bpi))
    if len(raw) != 64 + bpi * n:
        raise ValueError("%s: size %d does not match n=%d" % (path, len(raw), n))
    if bpi == 2:
        ids = torch.frombuffer(bytearray(raw[64:]), dtype=torch.int16).to(torch.int64) & 0xFFFF
    else:
        ids = torch.frombuffer(bytearray(raw[64:]), dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF
    return ids, vocab


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def main():
    p = argparse.ArgumentParser(description="PyTorch GPT-2 training throughput baseline")
    p.add_argument("--model", choices=sorted(PRESETS), default=None,
                   help="preset dims (explicit --layers etc. override); default gpt2-10m")
    p.add_argument("--layers", type=int)
    p.add_argument("--embd", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--max-seq", type=int, help="wpe rows (default: preset's, else --seq)")
    p.add_argument("--seq", type=int, default=None, help="default min(256, max_seq)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="total steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default=None, help="memfit token file (default: random ids)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--autocast", choices=["bf16"], default=None,
                   help="run the forward under torch.autocast('cpu', dtype=torch.bfloat16); default fp32")
    a = p.parse_args()

    L, C, H, V, maxT = PRESETS[a.model or "gpt2-10m"]
    if a.model is None and a.max_seq is None and a.seq is not None:
        maxT = a.seq
    L = a.layers or L
    C = a.embd or C
    H = a.heads or H
    V = a.vocab or V
    maxT = a.max_seq or maxT
    T = a.seq or min(256, maxT)
    B = a.batch
    if T > maxT:
        p.error("--seq %d > max_seq %d" % (T, maxT))
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

    model = ref.GPT2(L, C, H, V, maxT)
    model.init_weights(reference=False)
    n_params = sum(p.numel() for p in model.parameters())
    opt = ref.make_optimizer(model, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, wd=0.1)

    def step_autocast(x, y):
        """ref.train_step with the forward under bf16 autocast; backward,
        clip and AdamW as there (fp32 weights, gradients and state)."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step_s, losses = [], []
    for step in range(a.steps):
        x, y = next_batch()
        t0 = time.perf_counter()
        if a.autocast:
            loss = step_autocast(x, y)
        else:
            loss = ref.train_step(model, opt, x, y, clip=1.0)
        dt = time.perf_counter() - t0
        losses.append(loss)
        if step >= a.warmup_steps:
            step_s.append(dt)

    med = statistics.median(step_s)
    print(json.dumps({
        "system": "pytorch",
        "torch": torch.__version__,
        "tokens_per_s_median": B * T / med,
        "step_s": step_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": a.threads,
        "n_params": n_params,
        "model": {"layers": L, "embd": C, "heads": H, "vocab": V, "max_seq": maxT},
        "batch": B, "seq": T, "steps": a.steps, "warmup_steps": a.warmup_steps,
        "data": a.tokens or "random",
        "loss_first": losses[0], "loss_last": losses[-1],
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "autocast": a.autocast,
        "ld_preload": os.environ.get("LD_PRELOAD"),
    }))


if __name__ == "__main__":
    main()
