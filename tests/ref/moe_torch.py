#!/usr/bin/python3
"""Mixtral sparse MoE block in PyTorch: the reference memfit's MoE kernels are tested against.

Run with /usr/bin/python3 (Debian's python3-torch); no transformers. Written
from HF transformers' MixtralSparseMoeBlock and load_balancing_loss_func
semantics, not from memfit's C code. All fp32 (HF's router softmax is fp32).

  logits = x @ gate.weight^T                       (N,E)
  p = softmax(logits)                              (N,E)
  w, sel = topk(p, k)                              (N,k)  (ties: lower index)
  w /= w.sum(-1)                                   if --norm 1 (Mixtral)
  expert e: w2(silu(w1 x) * w3 x)                  nn.Linear (out,in)
  y[n] = sum_j w[n,j] * expert_{sel[n,j]}(x[n])
  capacity --cap c > 0: for each expert, only its first c slots in slot order
      (slot = n*k + j) run; later ones are dropped (contribute nothing)
  aux = E * sum_e (mean_n sum_j [sel[n,j]==e]) * mean_n p[n,e]
        (load_balancing_loss_func for one layer's logits)
  z = mean_n logsumexp(logits[n])^2                (ST-MoE router z-loss)
  loss = sum(y * dy) + aux_coef * aux + z_coef * z

Usage:
  /usr/bin/python3 tests/ref/moe_torch.py --out case.safetensors --N 24 --C 16 --F 12 --E 4 --k 2 --norm 1 \
      --cap 0 --aux_coef 0.02 --z_coef 0.001 --seed 1
writes inputs ("x", "dy", "gate", "w1" (E,F,C), "w3" (E,F,C), "w2" (E,C,F)),
outputs ("y", "sel" I32 (N,k), "routing" (N,k)), gradients ("grad.x",
"grad.gate", "grad.w1", "grad.w3", "grad.w2") and metadata aux, z, dropped.
Same arguments give byte-identical files.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as Fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_torch import save_safetensors  # noqa: E402


def moe_block(x, gate, w1, w3, w2, k, norm, cap):
    N, C = x.shape
    E = gate.shape[0]
    logits = x @ gate.t()
    p = Fn.softmax(logits, dim=-1, dtype=torch.float)
    w, sel = torch.topk(p, k, dim=-1)
    if norm:
        w = w / w.sum(dim=-1, keepdim=True)
    keep = torch.ones(N, k, dtype=torch.bool)
    if cap > 0:  # Switch-style capacity in slot order
        used = [0] * E
        for n in range(N):
            for j in range(k):
                e = int(sel[n, j])
                if used[e] >= cap:
                    keep[n, j] = False
                else:
                    used[e] += 1
    y = torch.zeros_like(x)
    # as MixtralSparseMoeBlock: per expert, the tokens that chose it, index_add_
    for e in range(E):
        tok, j = torch.where((sel == e) & keep)
        if tok.numel() == 0:
            continue
        h = x[tok]
        out = (Fn.silu(h @ w1[e].t()) * (h @ w3[e].t())) @ w2[e].t()
        y = y.index_add(0, tok, out * w[tok, j, None])
    mask = Fn.one_hot(sel, E).float()  # (N,k,E)
    tokens_per_expert = mask.mean(dim=0)  # (k,E)
    prob_per_expert = p.mean(dim=0)  # (E)
    aux = (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return y, sel, w, aux, z, int((~keep).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    for a, d in (("N", 24), ("C", 16), ("F", 12), ("E", 4), ("k", 2), ("norm", 1), ("cap", 0), ("seed", 1)):
        ap.add_argument("--" + a, type=int, default=d)
    ap.add_argument("--aux_coef", type=float, default=0.02)
    ap.add_argument("--z_coef", type=float, default=0.001)
    a = ap.parse_args()
    if a.k < 1 or a.k > a.E:
        sys.exit("moe_torch: need 1 <= k <= E (k %d, E %d)" % (a.k, a.E))
    g = torch.Generator().manual_seed(a.seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).float()

    x = rnd(a.N, a.C)
    dy = rnd(a.N, a.C)
    gate = rnd(a.E, a.C, s=0.5)
    w1 = rnd(a.E, a.F, a.C, s=a.C ** -0.5)
    w3 = rnd(a.E, a.F, a.C, s=a.C ** -0.5)
    w2 = rnd(a.E, a.C, a.F, s=a.F ** -0.5)
    leaves = {"x": x, "gate": gate, "w1": w1, "w3": w3, "w2": w2}
    req = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    y, sel, w, aux, z, dropped = moe_block(req["x"], req["gate"], req["w1"], req["w3"], req["w2"],
                                           a.k, a.norm, a.cap)
    loss = (y * dy).sum() + a.aux_coef * aux + a.z_coef * z
    loss.backward()
    out = dict(leaves)
    out["dy"] = dy
    out["y"] = y.detach()
    out["sel"] = sel.to(torch.int32)
    out["routing"] = w.detach()
    for n, t in req.items():
        out["grad." + n] = t.grad
    save_safetensors(a.out, out, {"aux": repr(float(aux)), "z": repr(float(z)), "dropped": dropped,
                                  "loss": repr(float(loss))})


if __name__ == "__main__":
    main()
