#!/usr/bin/python3
"""Cross-layer parameter sharing (ALBERT) reference: a GPT-2 whose L blocks
are N PyTorch modules called in order, block i = module i % N (L=6, N=2:
m0 m1 m0 m1 m0 m1). Autograd sums each module's gradient over its calls,
which is what memfit's --share_layers must reproduce.

Written for this test, independent of memfit's C code: pre-LayerNorm blocks
(eps 1e-5), causal attention (c_attn = q|k|v, scale 1/sqrt(hd)), GELU tanh,
MLP 4C, ln_f, head tied to wte; Conv1D (in, out) weights under GPT-2's HF
names, only h.0 .. h.{N-1} exist. Run with /usr/bin/python3 (python3-torch).

  make-case --out DIR --layers L --share N ... writes weights.safetensors
  (with metadata dims "L,C,H,T,V;share=N"), batch.safetensors, ref.safetensors
  (loss and every gradient at the initial weights), ref.json (losses of
  --steps AdamW steps with clipping) and final.safetensors.
"""
import argparse, json, math, os, sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import save_safetensors  # the file format only


class SharedBlock(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        z = lambda *s: nn.Parameter(torch.zeros(*s))
        self.ln_1_w, self.ln_1_b = nn.Parameter(torch.ones(C)), z(C)
        self.c_attn_w, self.c_attn_b = z(C, 3 * C), z(3 * C)
        self.a_proj_w, self.a_proj_b = z(C, C), z(C)
        self.ln_2_w, self.ln_2_b = nn.Parameter(torch.ones(C)), z(C)
        self.c_fc_w, self.c_fc_b = z(C, 4 * C), z(4 * C)
        self.m_proj_w, self.m_proj_b = z(4 * C, C), z(C)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.H
        h = F.layer_norm(x, (C,), self.ln_1_w, self.ln_1_b, 1e-5)
        q, k, v = (h @ self.c_attn_w + self.c_attn_b).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, hd).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ self.a_proj_w + self.a_proj_b
        h = F.layer_norm(x, (C,), self.ln_2_w, self.ln_2_b, 1e-5)
        h = F.gelu(h @ self.c_fc_w + self.c_fc_b, approximate="tanh")
        return x + h @ self.m_proj_w + self.m_proj_b

    # memfit's (HF GPT-2's) names for this module's tensors
    NAMES = [("ln_1.weight", "ln_1_w"), ("ln_1.bias", "ln_1_b"), ("attn.c_attn.weight", "c_attn_w"),
             ("attn.c_attn.bias", "c_attn_b"), ("attn.c_proj.weight", "a_proj_w"), ("attn.c_proj.bias", "a_proj_b"),
             ("ln_2.weight", "ln_2_w"), ("ln_2.bias", "ln_2_b"), ("mlp.c_fc.weight", "c_fc_w"),
             ("mlp.c_fc.bias", "c_fc_b"), ("mlp.c_proj.weight", "m_proj_w"), ("mlp.c_proj.bias", "m_proj_b")]


class SharedGPT2(nn.Module):
    def __init__(self, L, N, C, H, V, T):
        super().__init__()
        assert L % N == 0
        self.L = L
        self.wte = nn.Parameter(torch.randn(V, C) * 0.02)
        self.wpe = nn.Parameter(torch.randn(T, C) * 0.01)
        self.sets = nn.ModuleList(SharedBlock(C, H) for _ in range(N))
        for b in self.sets:
            for hf, attr in SharedBlock.NAMES:
                p = getattr(b, attr)
                with torch.no_grad():
                    if p.dim() == 2: p.normal_(0, 0.02)
                    elif "ln" not in attr: p.normal_(0, 0.01)
        self.ln_f_w, self.ln_f_b = nn.Parameter(torch.ones(C)), nn.Parameter(torch.zeros(C))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte[idx.long()] + self.wpe[:T]
        for i in range(self.L):
            x = self.sets[i % len(self.sets)](x)  # block i uses set i % N
        x = F.layer_norm(x, (x.shape[-1],), self.ln_f_w, self.ln_f_b, 1e-5)
        logits = x @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1).long())

    def named(self):
        """[(memfit name, parameter)] in memfit's table order."""
        out = [("wte.weight", self.wte), ("wpe.weight", self.wpe)]
        for n, b in enumerate(self.sets):
            out += [("h.%d.%s" % (n, hf), getattr(b, attr)) for hf, attr in SharedBlock.NAMES]
        return out + [("ln_f.weight", self.ln_f_w), ("ln_f.bias", self.ln_f_b)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["make-case"])
    for k, d in [("layers", 6), ("share", 2), ("embd", 32), ("heads", 4), ("vocab", 256), ("seq", 16),
                 ("batch", 3), ("seed", 1), ("steps", 10)]:
        p.add_argument("--" + k, type=int, default=d)
    for k, d in [("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("wd", 0.1), ("clip", 1.0)]:
        p.add_argument("--" + k, type=float, default=d)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    m = SharedGPT2(a.layers, a.share, a.embd, a.heads, a.vocab, a.seq)
    seq = torch.randint(0, a.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs, targets = seq[:-1].reshape(a.batch, a.seq).contiguous(), seq[1:].reshape(a.batch, a.seq).contiguous()
    os.makedirs(a.out, exist_ok=True)
    dims = "%d,%d,%d,%d,%d;share=%d" % (a.layers, a.embd, a.heads, a.seq, a.vocab, a.share)
    save_safetensors(os.path.join(a.out, "weights.safetensors"), {n: t.detach().clone() for n, t in m.named()},
                     {"format": "memfit-weights-1", "dims": dims})
    save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": targets})
    loss = m(inputs, targets)
    loss.backward()
    ref = {"grad." + n: t.grad.detach().clone() for n, t in m.named()}
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref, {"loss": repr(loss.item())})
    m.zero_grad(set_to_none=True)
    named = m.named()
    decay = [t for n, t in named if t.dim() >= 2]
    nodecay = [t for n, t in named if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses = []
    for _ in range(a.steps):
        l = m(inputs, targets)
        l.backward()
        torch.nn.utils.clip_grad_norm_([t for _, t in named], a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(l.item())
    save_safetensors(os.path.join(a.out, "final.safetensors"), {n: t.detach().clone() for n, t in m.named()})
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump({"loss": loss.item(), "losses": losses, "dims": dims}, f)
    print("wrote %s: %s loss %.6f -> %.6f" % (a.out, dims, losses[0], losses[-1]))


if __name__ == "__main__":
    main()
