#!/usr/bin/python3
"""Minimal Qwen2-MoE (HF Qwen2MoeForCausalLM) in PyTorch: the reference memfit's shared-expert block is tested against.

Run with /usr/bin/python3 (Debian's python3-torch); no transformers. The
attention (q/k/v biases, as Qwen2), RoPE, RMSNorm and head are
llama_torch.py's; the MLP is written from HF Qwen2MoeSparseMoeBlock's
semantics, not from memfit's C code. All fp32.

  h2 = post_attention_layernorm(x)                       (N,C), N = B*T
  logits_r = h2 mlp.gate.weight^T                        (N,E) router
  p = softmax(logits_r); top-k of p (largest first)
  w = the k chosen p, divided by their sum only with norm_topk_prob
      (Qwen1.5-MoE / Qwen2-MoE: false)
  y[n] = sum_j w[n,j] * expert_{idx[n,j]}(h2[n])
  expert(x) = down_proj(silu(gate_proj x) * up_proj x)   experts.{e}: (F,C) (F,C) (C,F), F = moe_intermediate_size
  y += sigmoid(h2 shared_expert_gate.weight^T) * shared_expert(h2)
                                                         shared_expert: S = shared_expert_intermediate_size,
                                                         shared_expert_gate.weight (1,C)
  x = x + y
Losses as mixtral_torch.py: loss = mean CE + aux_coef * mean_l aux_l + z_coef * mean_l z_l.

make-case writes an HF folder (config.json: Qwen2MoeForCausalLM with
num_experts, num_experts_per_tok, moe_intermediate_size,
shared_expert_intermediate_size, norm_topk_prob, router_aux_loss_coef;
experts one tensor each), a batch, and ref.safetensors: logits, loss, every
gradient (HF names, and the routed experts also stacked expert after expert
under memfit's names model.layers.{i}.mlp.experts.gate_proj.weight (E*F,C)
...), the losses of --steps AdamW steps and the final weights; ref.json the
losses. With --lora_r R the base is frozen and PEFT-style adapters (no
dropout, lora_B non-zero) sit on --lora_targets (the shared expert's
gate_proj, up_proj, down_proj and/or q_proj..o_proj); adapter/ holds them
under PEFT's names (base_model.model.model.layers.{i}.mlp.shared_expert.gate_proj.lora_A.weight).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch as lt  # noqa: E402


class SwiGLU(nn.Module):
    """HF Qwen2MoeMLP: down_proj(silu(gate_proj x) * up_proj x)."""

    def __init__(self, C, width):
        super().__init__()
        self.gate_proj = nn.Linear(C, width, bias=False)
        self.up_proj = nn.Linear(C, width, bias=False)
        self.down_proj = nn.Linear(width, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, E = cfg.hidden, cfg.experts
        self.gate = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList([SwiGLU(C, cfg.moe_inter) for _ in range(E)])
        self.shared_expert = SwiGLU(C, cfg.shared_inter)
        self.shared_expert_gate = nn.Linear(C, 1, bias=False)

    def forward(self, x, stats):
        B, T, C = x.shape
        c = self.cfg
        h = x.reshape(B * T, C)
        E, k = c.experts, c.top_k
        lg = h @ self.gate.weight.t()
        p = F.softmax(lg, dim=-1)
        w, idx = torch.topk(p, k, dim=-1)
        if c.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        mask = F.one_hot(idx, E).float()
        f = mask.mean(dim=0).sum(dim=0)
        stats["aux"].append(E * (f * p.mean(dim=0)).sum())
        stats["z"].append((torch.logsumexp(lg, dim=-1) ** 2).mean())
        y = torch.zeros_like(h)
        for e in range(E):
            sel = (idx == e).nonzero()
            if sel.numel() == 0:
                continue
            n_, j_ = sel[:, 0], sel[:, 1]
            y = y.index_add(0, n_, self.experts[e](h[n_]) * w[n_, j_].unsqueeze(1))
        y = y + torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
        return y.reshape(B, T, C)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = lt.Attention(cfg)
        self.mlp = SparseMoe(cfg)
        self.input_layernorm = lt.RMSNorm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = lt.RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, x, cos, sin, stats):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x), stats)


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        self.norm = lt.RMSNorm(cfg.hidden, cfg.eps)


class Qwen2Moe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        cos, sin = lt.rope_cos_sin(self.cfg, T)
        stats = {"aux": [], "z": []}
        x = self.model.embed_tokens(idx.long())
        for layer in self.model.layers:
            x = layer(x, cos, sin, stats)
        x = self.model.norm(x)
        logits = x @ self.lm_head.weight.t()
        loss = None
        if targets is not None:
            c = self.cfg
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.long().reshape(B * T))
            loss = loss + c.aux_coef * torch.stack(stats["aux"]).mean() + c.z_coef * torch.stack(stats["z"]).mean()
        self.last_stats = stats
        return logits, loss

    def init_weights(self, router_std, shared_gate_std):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, router_std)  # decisive routing: no near-ties for round-off to flip
                elif name.endswith("shared_expert_gate.weight"):
                    p.normal_(0.0, shared_gate_std)  # a gate away from 1/2, so its gradient counts
                elif name.endswith(".bias"):
                    p.normal_(0.0, 0.02)
                elif p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                else:
                    p.fill_(1.0)
                    p.add_(0.1 * torch.randn_like(p))


PROJ = ("gate_proj", "up_proj", "down_proj")


def stacked(model, sd_like, prefix):
    """memfit's stacked names: model.layers.{i}.mlp.experts.gate_proj.weight (E*rows, cols)."""
    out = {}
    for i in range(model.cfg.layers):
        for w in PROJ:
            parts = [sd_like["%smodel.layers.%d.mlp.experts.%d.%s.weight" % (prefix, i, e, w)]
                     for e in range(model.cfg.experts)]
            out["%smodel.layers.%d.mlp.experts.%s.weight" % (prefix, i, w)] = torch.cat(parts, 0)
    return out


class LoraLinear(nn.Module):
    """PEFT's lora.Linear without dropout: base(x) + (alpha/r) * lora_B(lora_A(x)); the base is frozen."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base, self.scale = base, alpha / r
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        with torch.no_grad():
            bound = 1.0 / math.sqrt(base.in_features)
            self.lora_A.weight.uniform_(-bound, bound)
            self.lora_B.weight.normal_(0.0, 0.05)  # PEFT starts at 0; non-zero so dA and the forward term count

    def forward(self, x):
        return self.base(x) + self.scale * self.lora_B(self.lora_A(x))


def add_lora(model, r, alpha, targets):
    """Adapters on the shared expert (gate/up/down_proj) and attention; returns {name: tensor} of the adapters
    under PEFT's names (peft) or memfit's (memfit, with a prefix): the same names but PEFT's base_model.model."""
    for p in model.parameters():
        p.requires_grad_(False)
    mods = []
    for i, layer in enumerate(model.model.layers):
        for t in targets:
            parent, path = (layer.mlp.shared_expert, "mlp.shared_expert") if t in PROJ else (layer.self_attn, "self_attn")
            setattr(parent, t, LoraLinear(getattr(parent, t), r, alpha))
            mods.append(("model.layers.%d.%s.%s" % (i, path, t), getattr(parent, t)))

    def names(get, prefix):
        return {"%s%s.%s.weight" % (prefix, n, ab): get(getattr(m, ab).weight).contiguous()
                for n, m in mods for ab in ("lora_A", "lora_B")}
    return names


def cmd_make_case(a):
    lt.set_deterministic(1)
    cfg = lt.Cfg(arch="qwen2", layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                 head_dim=a.head_dim, inter=a.shared_inter, vocab=a.vocab, tied=0, rope_theta=a.rope_theta,
                 rope_scaling=None, window=0, eps=1e-6, max_pos=a.max_pos)
    cfg.experts, cfg.top_k, cfg.norm_topk_prob = a.experts, a.top_k, a.norm_topk_prob
    cfg.moe_inter, cfg.shared_inter = a.moe_inter, a.shared_inter
    cfg.aux_coef, cfg.z_coef = a.aux_coef, a.z_coef
    torch.manual_seed(a.seed)
    model = Qwen2Moe(cfg)
    model.init_weights(a.router_std, a.shared_gate_std)
    seq = torch.randint(0, cfg.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs = seq[:-1].reshape(a.batch, a.seq).contiguous()
    targets = seq[1:].reshape(a.batch, a.seq).contiguous()
    os.makedirs(os.path.join(a.out, "hf"), exist_ok=True)
    hfc = cfg.to_hf("float32")
    hfc.update({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": a.experts,
                "num_experts_per_tok": a.top_k, "moe_intermediate_size": a.moe_inter,
                "shared_expert_intermediate_size": a.shared_inter, "norm_topk_prob": bool(a.norm_topk_prob),
                "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": a.aux_coef,
                "output_router_logits": True})
    if a.z_coef > 0:
        hfc["router_z_loss_coef"] = a.z_coef
    with open(os.path.join(a.out, "hf", "config.json"), "w") as f:
        json.dump(hfc, f, indent=2)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    lt.save_safetensors(os.path.join(a.out, "hf", "model.safetensors"), sd, {"format": "pt"})
    lt.save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": targets})
    lora = None
    if a.lora_r > 0:
        targets_ = a.lora_targets.split(",")
        torch.manual_seed(a.seed + 1000)
        lora = add_lora(model, a.lora_r, a.lora_alpha, targets_)
        os.makedirs(os.path.join(a.out, "adapter"), exist_ok=True)
        lt.save_safetensors(os.path.join(a.out, "adapter", "adapter_model.safetensors"),
                            lora(lambda w: w.detach(), "base_model.model."), {"format": "pt"})
        with open(os.path.join(a.out, "adapter", "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.lora_r, "lora_alpha": a.lora_alpha,
                       "lora_dropout": 0.0, "target_modules": targets_, "fan_in_fan_out": False, "bias": "none"},
                      f, indent=2)
    model.zero_grad(set_to_none=True)
    logits, loss = model(inputs, targets)
    loss.backward()
    st0 = model.last_stats
    if lora:
        grads = lora(lambda w: w.grad.detach().clone(), "grad.")
    else:
        grads = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
        grads.update(stacked(model, grads, "grad."))
    model.zero_grad(set_to_none=True)
    aux0, z0 = float(torch.stack(st0["aux"]).mean()), float(torch.stack(st0["z"]).mean())
    opt = lt.make_optimizer(model, a.lr, (a.beta1, a.beta2), a.eps, a.wd)
    losses = [lt.train_step(model, opt, inputs, targets, a.clip) for _ in range(a.steps)]
    ref = {"logits": logits.detach().reshape(-1, cfg.vocab), "loss": torch.tensor([loss.item()])}
    ref.update(grads)
    if lora:
        ref.update(lora(lambda w: w.detach(), "final."))
    else:
        fin = {"final." + n: p.detach() for n, p in model.named_parameters()}
        fin.update(stacked(model, fin, "final."))
        ref.update(fin)
    lt.save_safetensors(os.path.join(a.out, "ref.safetensors"), ref, {"loss": repr(loss.item())})
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump({"loss": loss.item(), "aux": aux0, "z": z0, "losses": losses, "torch_version": torch.__version__},
                  f, indent=1)
        f.write("\n")
    print("wrote %s: loss %.6f aux %.4f z %.4f" % (a.out, loss.item(), aux0, z0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-case", help="write a Qwen2-MoE reference case directory")
    m.add_argument("--out", required=True)
    for k, v in (("layers", 2), ("hidden", 64), ("heads", 8), ("kv_heads", 2), ("head_dim", 8), ("moe_inter", 32),
                 ("shared_inter", 48), ("vocab", 256), ("max_pos", 256), ("experts", 4), ("top_k", 2), ("seq", 24),
                 ("batch", 2), ("steps", 10), ("seed", 1), ("lora_r", 0), ("norm_topk_prob", 0)):
        m.add_argument("--" + k, type=int, default=v)
    for k, v in (("rope_theta", 1e6), ("aux_coef", 0.02), ("z_coef", 0.0), ("router_std", 0.3),
                 ("shared_gate_std", 0.3), ("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("wd", 0.1),
                 ("clip", 1.0), ("lora_alpha", 8.0)):
        m.add_argument("--" + k, type=float, default=v)
    m.add_argument("--lora_targets", default="gate_proj,up_proj,down_proj",
                   help="PEFT target_modules (with --lora_r > 0): the shared expert's and attention's")
    m.set_defaults(func=cmd_make_case)
    a = p.parse_args(argv)
    if not 1 <= a.top_k <= a.experts:
        print("qwen2_moe_torch: error: top_k %d must be between 1 and experts %d" % (a.top_k, a.experts),
              file=sys.stderr)
        sys.exit(2)
    a.func(a)


if __name__ == "__main__":
    main()
