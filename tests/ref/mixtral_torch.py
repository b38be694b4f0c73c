#!/usr/bin/python3
"""Minimal Mixtral (HF MixtralForCausalLM) in PyTorch: the reference memfit's mixture-of-experts block is tested against.

Run with /usr/bin/python3 (Debian's python3-torch); no transformers. The
attention, RoPE, RMSNorm and head are llama_torch.py's (HF Llama semantics);
the MLP is Mixtral's block_sparse_moe, written from HF's
MixtralSparseMoeBlock semantics, not from memfit's C code. All fp32.

  h2 = post_attention_layernorm(x)                       (N,C), N = B*T
  logits_r = h2 gate.weight^T                            (N,E) router
  p = softmax(logits_r); top-k of p (by value, largest first)
  w = the k chosen p, divided by their sum (norm_topk_prob, Mixtral always)
  y[n] = sum_j w[n,j] * expert_{idx[n,j]}(h2[n]),
      expert_e(x) = w2_e (silu(w1_e x) * w3_e x)         experts.{e}.w1/w3 (F,C), w2 (C,F)
  x = x + y
Capacity (memfit's --capacity_factor cf; HF has none): slot s = n*k + j;
each expert keeps its first ceil(cf*N*k/E) slots in slot order, a dropped
slot adds nothing (its weight still counts in the renormalisation).
Losses (memfit's definitions, docs/moe.md): per layer
  aux_l = E * sum_e f_e * P_e, f_e = (slots routed to e before drops) / N,
          P_e = mean over tokens of p[:, e]            (HF load_balancing_loss_func on one layer)
  z_l   = mean over tokens of logsumexp(logits_r)^2    (ST-MoE)
  loss  = mean CE + aux_coef * mean_l aux_l + z_coef * mean_l z_l
(HF Mixtral computes one aux over all layers' logits concatenated; the mean
of per-layer values is what memfit implements.)

make-case writes an HF folder (config.json: MixtralForCausalLM with
num_local_experts, num_experts_per_tok, router_aux_loss_coef; weights
under HF's names, experts one tensor each), a batch, and ref.safetensors:
logits, loss, every gradient (under HF's names, and the experts' also
stacked expert after expert under memfit's names
model.layers.{i}.block_sparse_moe.experts.w1.weight (E*F,C) ...), the
losses of --steps AdamW steps (torch.optim.AdamW, clip_grad_norm_) and the
final weights; ref.json has the losses and the dropped slot counts.
With --lora_r R the base is frozen and PEFT-style adapters (LoraLinear:
base(x) + alpha/r * lora_B(lora_A(x)), no dropout, lora_B non-zero) sit on
--lora_targets (the experts' w1,w2,w3 and/or q_proj..o_proj); adapter/
holds them as PeftModel.save_pretrained writes them (per expert:
base_model.model.model.layers.{i}.block_sparse_moe.experts.{e}.w1.lora_A.weight),
and the gradients and final weights are the adapters' only, stacked expert
after expert under memfit's names (...experts.w1.lora_A.weight (E*r, in)).
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


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, Fh, E = cfg.hidden, cfg.inter, cfg.experts
        self.gate = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList()
        for _ in range(E):
            ex = nn.Module()
            ex.w1 = nn.Linear(C, Fh, bias=False)
            ex.w2 = nn.Linear(Fh, C, bias=False)
            ex.w3 = nn.Linear(C, Fh, bias=False)
            self.experts.append(ex)

    def forward(self, x, stats):
        B, T, C = x.shape
        c = self.cfg
        h = x.reshape(B * T, C)
        N, E, k = B * T, c.experts, c.top_k
        lg = h @ self.gate.weight.t()
        p = F.softmax(lg, dim=-1)
        w, idx = torch.topk(p, k, dim=-1)
        if c.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        # aux (HF's formula on this layer), z
        mask = F.one_hot(idx, E).float()                     # (N,k,E)
        f = mask.mean(dim=0).sum(dim=0)                       # (E): slots to e / N
        aux = E * (f * p.mean(dim=0)).sum()
        z = (torch.logsumexp(lg, dim=-1) ** 2).mean()
        # capacity: each expert keeps its first cap slots in slot order
        keep = torch.ones(N, k, dtype=torch.bool)
        dropped = 0
        if c.capacity_factor > 0:
            cap = math.ceil(c.capacity_factor * N * k / E)
            count = [0] * E
            for n in range(N):
                for j in range(k):
                    e = int(idx[n, j])
                    if count[e] >= cap:
                        keep[n, j] = False
                        dropped += 1
                    else:
                        count[e] += 1
        y = torch.zeros_like(h)
        for e in range(E):
            sel = ((idx == e) & keep).nonzero()
            if sel.numel() == 0:
                continue
            n_, j_ = sel[:, 0], sel[:, 1]
            ex = self.experts[e]
            xe = h[n_]
            ye = ex.w2(F.silu(ex.w1(xe)) * ex.w3(xe))
            y = y.index_add(0, n_, ye * w[n_, j_].unsqueeze(1))
        stats["aux"].append(aux)
        stats["z"].append(z)
        stats["dropped"] += dropped
        return y.reshape(B, T, C)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = lt.Attention(cfg)
        self.block_sparse_moe = MoE(cfg)
        self.input_layernorm = lt.RMSNorm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = lt.RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, x, cos, sin, stats):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x), stats)


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        self.norm = lt.RMSNorm(cfg.hidden, cfg.eps)


class Mixtral(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        cos, sin = lt.rope_cos_sin(self.cfg, T)
        stats = {"aux": [], "z": [], "dropped": 0}
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

    def init_weights(self, router_std):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("gate.weight"):
                    p.normal_(0.0, router_std)  # decisive routing: no near-ties for round-off to flip
                elif p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                else:
                    p.fill_(1.0)
                    p.add_(0.1 * torch.randn_like(p))


def stacked(model, sd_like, prefix):
    """memfit's stacked expert names: model.layers.{i}.block_sparse_moe.experts.wN.weight (E*rows, cols)."""
    out = {}
    E = model.cfg.experts
    for i in range(model.cfg.layers):
        for w in ("w1", "w2", "w3"):
            parts = [sd_like["%smodel.layers.%d.block_sparse_moe.experts.%d.%s.weight" % (prefix, i, e, w)]
                     for e in range(E)]
            out["%smodel.layers.%d.block_sparse_moe.experts.%s.weight" % (prefix, i, w)] = torch.cat(parts, 0)
    return out


class LoraLinear(nn.Module):
    """PEFT's lora.Linear without dropout: base(x) + (alpha/r) * lora_B(lora_A(x)); the base is frozen."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base, self.scale = base, alpha / r
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        with torch.no_grad():
            bound = 1.0 / math.sqrt(base.in_features)  # PEFT: kaiming_uniform_(a=sqrt(5))
            self.lora_A.weight.uniform_(-bound, bound)
            self.lora_B.weight.normal_(0.0, 0.05)  # PEFT starts at 0; non-zero so dA and the forward term count

    def forward(self, x):
        return self.base(x) + self.scale * self.lora_B(self.lora_A(x))


EXPERT_TARGETS = ("w1", "w2", "w3")


def add_lora(model, r, alpha, targets):
    """Wraps the targeted modules (PEFT target_modules names); returns {PEFT adapter name: tensor} and
    {memfit name: tensor} functions of the current adapter weights or gradients."""
    for p in model.parameters():
        p.requires_grad_(False)
    for i, layer in enumerate(model.model.layers):
        for t in targets:
            if t in EXPERT_TARGETS:
                for ex in layer.block_sparse_moe.experts:
                    setattr(ex, t, LoraLinear(getattr(ex, t), r, alpha))
            else:
                setattr(layer.self_attn, t, LoraLinear(getattr(layer.self_attn, t), r, alpha))

    def peft(get):
        out = {}
        for i, layer in enumerate(model.model.layers):
            for t in targets:
                if t in EXPERT_TARGETS:
                    for e, ex in enumerate(layer.block_sparse_moe.experts):
                        m = getattr(ex, t)
                        for ab in ("lora_A", "lora_B"):
                            out["base_model.model.model.layers.%d.block_sparse_moe.experts.%d.%s.%s.weight"
                                % (i, e, t, ab)] = get(getattr(m, ab).weight).contiguous()
                else:
                    m = getattr(layer.self_attn, t)
                    for ab in ("lora_A", "lora_B"):
                        out["base_model.model.model.layers.%d.self_attn.%s.%s.weight" % (i, t, ab)] = \
                            get(getattr(m, ab).weight).contiguous()
        return out

    def memfit(get, prefix):
        """memfit's names: an expert target's adapters stacked expert after expert, (E*r, in) and (E*out, r)."""
        out = {}
        for i, layer in enumerate(model.model.layers):
            for t in targets:
                for ab in ("lora_A", "lora_B"):
                    if t in EXPERT_TARGETS:
                        parts = [get(getattr(getattr(ex, t), ab).weight) for ex in layer.block_sparse_moe.experts]
                        out["%smodel.layers.%d.block_sparse_moe.experts.%s.%s.weight" % (prefix, i, t, ab)] = \
                            torch.cat(parts, 0).contiguous()
                    else:
                        out["%smodel.layers.%d.self_attn.%s.%s.weight" % (prefix, i, t, ab)] = \
                            get(getattr(getattr(layer.self_attn, t), ab).weight).contiguous()
        return out

    return peft, memfit


def cmd_make_case(a):
    lt.set_deterministic(1)
    cfg = lt.Cfg(arch="mistral", layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                 head_dim=a.head_dim, inter=a.inter, vocab=a.vocab, tied=0, qkv_bias=0, rope_theta=a.rope_theta,
                 rope_scaling=None, window=0, eps=1e-5, max_pos=a.max_pos)
    cfg.experts, cfg.top_k, cfg.norm_topk_prob = a.experts, a.top_k, 1
    cfg.aux_coef, cfg.z_coef, cfg.capacity_factor = a.aux_coef, a.z_coef, a.capacity_factor
    torch.manual_seed(a.seed)
    model = Mixtral(cfg)
    model.init_weights(a.router_std)
    seq = torch.randint(0, cfg.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs = seq[:-1].reshape(a.batch, a.seq).contiguous()
    targets = seq[1:].reshape(a.batch, a.seq).contiguous()
    os.makedirs(os.path.join(a.out, "hf"), exist_ok=True)
    hfc = cfg.to_hf("float32")
    hfc.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": a.experts,
                "num_experts_per_tok": a.top_k, "router_aux_loss_coef": a.aux_coef, "output_router_logits": True,
                "sliding_window": None})
    if a.z_coef > 0:
        hfc["router_z_loss_coef"] = a.z_coef
    with open(os.path.join(a.out, "hf", "config.json"), "w") as f:
        json.dump(hfc, f, indent=2)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    lt.save_safetensors(os.path.join(a.out, "hf", "model.safetensors"), sd, {"format": "pt"})
    lt.save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": targets})
    lora = None
    if a.lora_r > 0:
        # LoRA on a frozen base (PEFT semantics): the adapter as PeftModel.save_pretrained writes it
        targets_ = a.lora_targets.split(",")
        torch.manual_seed(a.seed + 1000)
        lora = add_lora(model, a.lora_r, a.lora_alpha, targets_)
        os.makedirs(os.path.join(a.out, "adapter"), exist_ok=True)
        lt.save_safetensors(os.path.join(a.out, "adapter", "adapter_model.safetensors"),
                            lora[0](lambda w: w.detach()), {"format": "pt"})
        with open(os.path.join(a.out, "adapter", "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.lora_r, "lora_alpha": a.lora_alpha,
                       "lora_dropout": 0.0, "target_modules": targets_, "fan_in_fan_out": False, "bias": "none"},
                      f, indent=2)

    model.zero_grad(set_to_none=True)
    logits, loss = model(inputs, targets)
    loss.backward()
    st0 = model.last_stats
    if lora:
        grads = lora[1](lambda w: w.grad.detach().clone(), "grad.")
    else:
        grads = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
        grads.update(stacked(model, grads, "grad."))
    model.zero_grad(set_to_none=True)
    aux0 = float(torch.stack(st0["aux"]).mean()), float(torch.stack(st0["z"]).mean())
    dropped0 = st0["dropped"]

    opt = lt.make_optimizer(model, a.lr, (a.beta1, a.beta2), a.eps, a.wd)
    losses, dropped = [], []
    for _ in range(a.steps):
        losses.append(lt.train_step(model, opt, inputs, targets, a.clip))
        dropped.append(model.last_stats["dropped"])
    ref = {"logits": logits.detach().reshape(-1, cfg.vocab), "loss": torch.tensor([loss.item()])}
    ref.update(grads)
    if lora:
        fin = lora[1](lambda w: w.detach(), "final.")
    else:
        fin = {"final." + n: p.detach() for n, p in model.named_parameters()}
        fin.update(stacked(model, fin, "final."))
    ref.update(fin)
    lt.save_safetensors(os.path.join(a.out, "ref.safetensors"), ref, {"loss": repr(loss.item())})
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump({"loss": loss.item(), "aux": aux0[0], "z": aux0[1], "dropped": dropped0, "losses": losses,
                   "dropped_steps": dropped, "torch_version": torch.__version__}, f, indent=1)
        f.write("\n")
    print("wrote %s: loss %.6f aux %.4f z %.4f dropped %d" % (a.out, loss.item(), aux0[0], aux0[1], dropped0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-case", help="write a Mixtral reference case directory")
    m.add_argument("--out", required=True)
    for k, v in (("layers", 2), ("hidden", 64), ("heads", 8), ("kv_heads", 2), ("head_dim", 8), ("inter", 48),
                 ("vocab", 256), ("max_pos", 256), ("experts", 4), ("top_k", 2), ("seq", 24), ("batch", 2),
                 ("steps", 10), ("seed", 1), ("lora_r", 0)):
        m.add_argument("--" + k, type=int, default=v)
    for k, v in (("rope_theta", 1e6), ("aux_coef", 0.02), ("z_coef", 0.0), ("capacity_factor", 0.0),
                 ("router_std", 0.3), ("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("wd", 0.1),
                 ("clip", 1.0), ("lora_alpha", 8.0)):
        m.add_argument("--" + k, type=float, default=v)
    m.add_argument("--lora_targets", default="w1,w2,w3", help="PEFT target_modules (with --lora_r > 0)")
    m.set_defaults(func=cmd_make_case)
    a = p.parse_args(argv)
    if not 1 <= a.top_k <= a.experts:
        print("mixtral_torch: error: top_k %d must be between 1 and experts %d" % (a.top_k, a.experts), file=sys.stderr)
        sys.exit(2)
    a.func(a)


if __name__ == "__main__":
    main()
