#!/usr/bin/python3
"""Minimal Llama-family model in PyTorch: the reference memfit's Llama path is tested against.

Run with /usr/bin/python3 (Debian's python3-torch); no pip packages, no
transformers: the model below is written from the Hugging Face semantics, not
from memfit's C code. All fp32.

Model (HF LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM):
  x = embed_tokens[ids]                               (no position embedding)
  per layer:
    h = RMSNorm(x) * input_layernorm.weight           x*rsqrt(mean(x^2)+eps)*w
    q = h Wq^T (+bq), k = h Wk^T (+bk), v = h Wv^T (+bv)   nn.Linear (out,in)
        query head h = rows h*hd:(h+1)*hd of Wq; kv head g likewise of Wk/Wv
    RoPE rotate-half on q and k: dimension d pairs with d + hd/2,
        inv_freq[i] = 1/theta^(2i/hd) (fp32; llama3 rope_scaling applied as
        transformers' _compute_llama3_parameters), ang = pos*inv_freq,
        cos/sin of cat(ang, ang); q' = q*cos + rotate_half(q)*sin,
        rotate_half(x) = cat(-x[hd/2:], x[:hd/2])
    grouped-query attention: query head h uses kv head h // (nh/nkv);
        scale 1/sqrt(hd); causal, and with a sliding window W query i sees
        keys j with i - W < j <= i
    x = x + o_proj(attn)                              (o_proj has no bias)
    x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),
        h2 = RMSNorm(x) * post_attention_layernorm.weight
  logits = RMSNorm(x) * model.norm.weight @ W^T, W = lm_head.weight, or
           model.embed_tokens.weight when tie_word_embeddings
  loss = mean cross-entropy over all B*T positions

Parameter names are exactly HF's:
  model.embed_tokens.weight                      (V, H)
  model.layers.{i}.self_attn.q_proj.weight       (nh*hd, H)   [.bias (nh*hd)]
  model.layers.{i}.self_attn.k_proj.weight       (nkv*hd, H)  [.bias (nkv*hd)]
  model.layers.{i}.self_attn.v_proj.weight       (nkv*hd, H)  [.bias (nkv*hd)]
  model.layers.{i}.self_attn.o_proj.weight       (H, nh*hd)
  model.layers.{i}.mlp.gate_proj.weight          (I, H)
  model.layers.{i}.mlp.up_proj.weight            (I, H)
  model.layers.{i}.mlp.down_proj.weight          (H, I)
  model.layers.{i}.input_layernorm.weight        (H)
  model.layers.{i}.post_attention_layernorm.weight (H)
  model.norm.weight                              (H)
  lm_head.weight                                 (V, H)  absent when tied
(q/k/v biases only for qwen2.)

Subcommands:
  make-hf    writes a Hugging Face model folder (config.json + model.safetensors,
             or N shards + model.safetensors.index.json), F32/BF16/F16.
  make-case  writes a complete reference case: DIR/hf (F32 HF folder),
             DIR/batch.safetensors, DIR/ref.safetensors (logits, grads, AdamW
             trajectory, final weights) and DIR/ref.json.
  make-lora-case  the same for LoRA (PEFT semantics, dropout 0) on a frozen
             base: DIR/hf (the base), DIR/adapter (adapter_model.safetensors
             with base_model.model.model.layers.{i}.<module>.lora_A.weight
             (r,in) / .lora_B.weight (out,r), adapter_config.json with
             fan_in_fan_out false), DIR/batch.safetensors, DIR/ref.safetensors
             (logits, loss, grad.<PEFT name> of every adapter tensor, losses of
             the AdamW steps on the adapters, final.<PEFT name>), DIR/ref.json.
             A and B are both non-zero (PEFT starts B at 0) so dA, dB and the
             low-rank forward term are all tested.
  forward    forward+backward on an HF folder (or other weights) and a batch,
             with --adapter DIR a PEFT LoRA adapter applied.
  compare    max abs / max rel difference of the tensors two safetensors files
             have in common (exit 1 if any exceeds --tol).
  selftest   checks the attention, RoPE and llama3 frequencies against
             independent scalar loops.
"""

import argparse
import json
import math
import os
import re
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# safetensors (pure Python)
# ---------------------------------------------------------------------------

_DTYPES = {  # safetensors name -> (torch dtype, bytes per element)
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
}
_NAMES = {v[0]: k for k, v in _DTYPES.items()}

assert sys.byteorder == "little", "safetensors data is little-endian"


def _tensor_bytes(t):
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: same bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (an ordered {name: tensor}) to `path`.

    Layout: u64 LE header length N, N bytes of JSON (padded with spaces to a
    multiple of 8), then the tensors' bytes back to back in header order.
    `metadata` becomes "__metadata__" (string values). Written to a
    temporary name and renamed into place."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise ValueError("%s: unsupported dtype %s" % (name, t.dtype))
        data = _tensor_bytes(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return offset


def load_safetensors(path):
    """Returns ({name: tensor}, metadata) with tensors in header order, in
    their stored dtype. Validates dtypes, shapes and offsets (in range, sizes
    matching, data section fully covered without overlaps)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError("%s: header length %d past end of file" % (path, n))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError("%s: %s has unsupported dtype %s" % (path, name, dtype))
        tdtype, size = _DTYPES[dtype]
        shape = [int(s) for s in info["shape"]]
        b, e = (int(x) for x in info["data_offsets"])
        numel = 1
        for s in shape:
            numel *= s
        if not (0 <= b <= e <= len(data)) or e - b != numel * size:
            raise ValueError("%s: %s has bad data_offsets %r for %s %r"
                             % (path, name, info["data_offsets"], dtype, shape))
        spans.append((b, e))
        buf = bytearray(data[b:e])  # writable copy; frombuffer shares it
        if numel == 0:
            t = torch.empty(shape, dtype=tdtype)
        elif tdtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16).reshape(shape)
        else:
            t = torch.frombuffer(buf, dtype=tdtype).reshape(shape)
        tensors[name] = t
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            raise ValueError("%s: data section has a gap or overlap at %d" % (path, b))
        pos = e
    if pos != len(data):
        raise ValueError("%s: %d trailing bytes after the data" % (path, len(data) - pos))
    return tensors, metadata


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------

ARCHS = {  # arch -> (architectures[0], model_type)
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "mistral": ("MistralForCausalLM", "mistral"),
}
_ARCH_OF = {v[0]: k for k, v in ARCHS.items()}
_ARCH_OF.update({v[1]: k for k, v in ARCHS.items()})


class Cfg:
    """The model dims, read from / written to an HF config.json."""

    def __init__(self, arch="llama", layers=2, hidden=64, heads=8, kv_heads=None, head_dim=None,
                 inter=96, vocab=300, tied=True, qkv_bias=None, rope_theta=10000.0,
                 rope_scaling=None, window=0, eps=1e-5, max_pos=2048):
        if arch not in ARCHS:
            raise ValueError("arch must be one of %s" % sorted(ARCHS))
        self.arch = arch
        self.layers, self.hidden, self.heads = layers, hidden, heads
        self.kv_heads = kv_heads or heads
        self.head_dim = head_dim or hidden // heads
        self.inter, self.vocab, self.tied = inter, vocab, bool(tied)
        # Qwen2 always has q/k/v biases; HF Llama's attention_bias also gives
        # o_proj a bias, which is not this model, so llama/mistral have none.
        self.qkv_bias = bool(qkv_bias) if qkv_bias is not None else arch == "qwen2"
        if self.qkv_bias != (arch == "qwen2"):
            raise ValueError("q/k/v biases go with arch qwen2 (always) and only with it "
                             "(HF Llama attention_bias would also add an o_proj bias)")
        self.rope_theta = float(rope_theta)
        self.rope_scaling = rope_scaling  # None or dict (rope_type llama3)
        self.window = int(window or 0)
        if self.window and arch != "mistral":
            raise ValueError("--window needs --arch mistral (HF honours sliding_window there)")
        self.eps = float(eps)
        self.max_pos = int(max_pos)
        if hidden % heads and head_dim is None:
            raise ValueError("hidden %d is not a multiple of heads %d: give --head_dim" % (hidden, heads))
        if self.heads % self.kv_heads:
            raise ValueError("heads %d is not a multiple of kv_heads %d" % (self.heads, self.kv_heads))
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")

    def to_hf(self, dtype_name="float32"):
        archs, mtype = ARCHS[self.arch]
        c = {
            "architectures": [archs],
            "model_type": mtype,
            "hidden_size": self.hidden,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": self.max_pos,
            "initializer_range": 0.02,
            "attention_dropout": 0.0,
            "sliding_window": self.window or None,
            "torch_dtype": dtype_name,
            "use_cache": True,
            "bos_token_id": 0,
            "eos_token_id": 1,
        }
        if self.arch == "llama":
            c["attention_bias"] = False
            c["mlp_bias"] = False
        if self.arch == "qwen2":
            c["use_sliding_window"] = False
            c["max_window_layers"] = self.layers
        return c

    @staticmethod
    def from_hf(c):
        arch = None
        for a in (c.get("architectures") or []) + [c.get("model_type")]:
            if a in _ARCH_OF:
                arch = _ARCH_OF[a]
                break
        if arch is None:
            raise ValueError("config.json: unknown architectures/model_type %r/%r"
                             % (c.get("architectures"), c.get("model_type")))
        if arch == "llama" and (c.get("attention_bias") or c.get("mlp_bias")):
            raise ValueError("config.json: llama attention_bias/mlp_bias are not supported")
        if arch == "qwen2" and c.get("use_sliding_window"):
            raise ValueError("config.json: qwen2 use_sliding_window is not supported")
        rp = c.get("rope_parameters") or {}  # transformers v5 spelling
        theta = c.get("rope_theta", rp.get("rope_theta", 10000.0))
        scaling = c.get("rope_scaling")
        if scaling is None and rp.get("rope_type", rp.get("type", "default")) != "default":
            scaling = rp
        if scaling is not None:
            rt = scaling.get("rope_type", scaling.get("type"))
            if rt == "default":
                scaling = None
            elif rt != "llama3":
                raise ValueError("config.json: rope_type %r is not supported" % rt)
        H, nh = c["hidden_size"], c["num_attention_heads"]
        return Cfg(arch=arch, layers=c["num_hidden_layers"], hidden=H, heads=nh,
                   kv_heads=c.get("num_key_value_heads") or nh,
                   head_dim=c.get("head_dim") or H // nh, inter=c["intermediate_size"],
                   vocab=c["vocab_size"], tied=c.get("tie_word_embeddings", False),
                   qkv_bias=(arch == "qwen2"), rope_theta=theta, rope_scaling=scaling,
                   window=(c.get("sliding_window") or 0) if arch == "mistral" else 0,
                   eps=c.get("rms_norm_eps", 1e-6), max_pos=c.get("max_position_embeddings", 2048))


def parse_rope_scaling(s):
    """'none' or 'llama3:factor,low_freq_factor,high_freq_factor,original_max_pos'."""
    if s is None or s.lower() in ("", "none", "null"):
        return None
    m = re.fullmatch(r"llama3:([^,]+),([^,]+),([^,]+),(\d+)", s)
    if not m:
        raise argparse.ArgumentTypeError("rope_scaling must be none or llama3:factor,low,high,orig")
    return {"rope_type": "llama3", "factor": float(m.group(1)),
            "low_freq_factor": float(m.group(2)), "high_freq_factor": float(m.group(3)),
            "original_max_position_embeddings": int(m.group(4))}


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------

def rope_inv_freq(cfg):
    """fp32 (hd/2,) inverse frequencies, as transformers computes them."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = cfg.rope_scaling
    if rs is None:
        return inv_freq
    # transformers' _compute_llama3_parameters
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(cfg, T):
    """(T, hd) cos and sin tables in fp32, positions 0..T-1 (HF LlamaRotaryEmbedding)."""
    inv_freq = rope_inv_freq(cfg)
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = pos[:, None] @ inv_freq[None, :]  # (T, hd/2), fp32 matmul as HF
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x (B, heads, T, hd); cos/sin (T, hd)."""
    return x * cos + rotate_half(x) * sin


def attention_mask(T, window):
    """(T, T) bool, True where query i may see key j: j <= i and (no window or j > i - window)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    ok = j <= i
    if window:
        ok = ok & (j > i - window)
    return ok


def doc_mask(pos):
    """Packed documents: (B,1,T,T) bool, True where query i may see key j:
    j <= i and key j in i's document (j >= i - pos[i], pos restarting at 0
    at each document's first token) - the block-diagonal causal mask."""
    T = pos.shape[1]
    i = torch.arange(T)[None, :, None]
    j = torch.arange(T)[None, None, :]
    return ((j <= i) & (j >= i - pos.long()[:, :, None]))[:, None]


def attention_core(q, k, v, window, allowed=None):
    """q (B,nh,T,hd), k/v (B,nkv,T,hd) -> (B,nh,T,hd). GQA by repeating kv
    heads as HF's repeat_kv (kv head g serves query heads g*rep..g*rep+rep-1).
    allowed: a (B,1,T,T) mask to use instead of the causal/window one."""
    B, nh, T, hd = q.shape
    rep = nh // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    att = att.masked_fill(~(attention_mask(T, window) if allowed is None else allowed), float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, nh, nkv, hd = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(H, nh * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(H, nkv * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(H, nkv * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)

    def forward(self, x, cos, sin, allowed=None):
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        y = attention_core(q, k, v, c.window, allowed)
        y = y.transpose(1, 2).contiguous().view(B, T, c.heads * c.head_dim)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.inter, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.inter, bias=False)
        self.down_proj = nn.Linear(cfg.inter, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):  # member order = HF LlamaDecoderLayer's
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, x, cos, sin, allowed=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.eps)


class Llama(nn.Module):
    """state_dict() keys are exactly the HF names listed in the module doc."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        if not cfg.tied:
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tied else self.lm_head.weight

    def forward(self, idx, targets=None, pos=None):
        """idx, targets: integer (B,T); targets of -100 are ignored
        (cross_entropy's ignore_index: the loss is the mean over the rest).
        pos (B,T): packed documents' positions (restarting at 0 per
        document): rotary angles by pos and the block-diagonal causal mask.
        Returns (logits (B,T,V), loss or None)."""
        B, T = idx.shape
        cos, sin = rope_cos_sin(self.cfg, T)
        allowed = None
        if pos is not None:
            cos, sin = cos[pos.long()][:, None], sin[pos.long()][:, None]  # (B,1,T,hd)
            allowed = doc_mask(pos)
        x = self.model.embed_tokens(idx.long())
        for layer in self.model.layers:
            x = layer(x, cos, sin, allowed)
        x = self.model.norm(x)
        logits = x @ self.head_weight().t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.long().reshape(B * T))
        return logits, loss

    def init_weights(self, norm_jitter=0.0):
        """Matrices (embedding, projections, lm_head) N(0, 0.02) (HF
        initializer_range); RMSNorm weights 1 (+ norm_jitter*randn when
        norm_jitter > 0); q/k/v biases 0.02*randn so they matter. Draws happen
        in named_parameters() order after torch.manual_seed (deterministic)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif name.endswith("norm.weight"):
                    p.fill_(1.0)
                    if norm_jitter > 0:
                        p.add_(norm_jitter * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.02 * torch.randn_like(p))
                else:
                    raise AssertionError(name)


def decay_param_names(model):
    """Parameters that get AdamW weight decay: dim >= 2 (embedding, matrices, lm_head)."""
    return [n for n, p in model.named_parameters() if p.dim() >= 2]


def make_optimizer(model, lr, betas, eps, wd):
    decay = set(decay_param_names(model))
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": wd},
        {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)


def train_step(model, opt, inputs, targets, clip):
    """One AdamW step; returns the loss before the update (a float)."""
    _, loss = model(inputs, targets)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def forward_backward(model, inputs, targets):
    """Returns (logits (B*T,V), loss float, {"grad.<name>": grad}) at the current weights."""
    model.zero_grad(set_to_none=True)
    logits, loss = model(inputs, targets)
    loss.backward()
    grads = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach().reshape(-1, logits.shape[-1]), loss.item(), grads


def set_deterministic(threads=1):
    torch.set_num_threads(threads)
    try:
        torch.use_deterministic_algorithms(True)
    except Exception:  # older builds: best effort
        pass


# ---------------------------------------------------------------------------
# HF folders
# ---------------------------------------------------------------------------

_SAVE_DTYPES = {"F32": (torch.float32, "float32"), "BF16": (torch.bfloat16, "bfloat16"),
                "F16": (torch.float16, "float16")}


def save_hf(model, out, dtype="F32", shards=1):
    """Writes config.json and the weights (state_dict order) as one
    model.safetensors or, with shards > 1, model-0000i-of-0000N.safetensors
    (consecutive tensors, split to balance bytes) plus
    model.safetensors.index.json {"metadata": {"total_size": bytes},
    "weight_map": {name: file}}. Every file has __metadata__ {"format": "pt"}."""
    tdtype, tname = _SAVE_DTYPES[dtype]
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().to(tdtype).contiguous() for k, v in model.state_dict().items()}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(model.cfg.to_hf(tname), f, indent=2)
        f.write("\n")
    for fn in os.listdir(out):  # stale weights of an earlier save would confuse a loader
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out, fn))
    meta = {"format": "pt"}
    if shards <= 1:
        save_safetensors(os.path.join(out, "model.safetensors"), sd, meta)
        return ["model.safetensors"]
    names = list(sd)
    if shards > len(names):
        raise ValueError("--shards %d > %d tensors" % (shards, len(names)))
    sizes = [sd[n].numel() * sd[n].element_size() for n in names]
    total = sum(sizes)
    # greedy: cut when the running size passes k/N of the total, leaving at
    # least one tensor for each remaining shard
    groups, cur, acc = [], [], 0
    for i, n in enumerate(names):
        cur.append(n)
        acc += sizes[i]
        left_tensors = len(names) - i - 1
        left_shards = shards - len(groups) - 1
        if left_shards > 0 and (acc >= total * (len(groups) + 1) / shards
                                or left_tensors == left_shards):
            groups.append(cur)
            cur = []
    groups.append(cur)
    assert len(groups) == shards and all(groups)
    files, weight_map = [], {}
    for i, g in enumerate(groups):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        save_safetensors(os.path.join(out, fn), {n: sd[n] for n in g}, meta)
        files.append(fn)
        for n in g:
            weight_map[n] = fn
    index = {"metadata": {"total_size": total},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return files


def load_hf_weights(d):
    """{name: fp32 tensor} from DIR/model.safetensors or the sharded index."""
    idx = os.path.join(d, "model.safetensors.index.json")
    sd = {}
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        for fn in sorted(set(wm.values())):
            t, _ = load_safetensors(os.path.join(d, fn))
            for k, v in t.items():
                if wm.get(k) != fn:
                    raise ValueError("%s: %s is not mapped to this file in the index" % (fn, k))
                sd[k] = v
        missing = sorted(set(wm) - set(sd))
        if missing:
            raise ValueError("index names tensors no shard has: %s" % missing)
    else:
        sd, _ = load_safetensors(os.path.join(d, "model.safetensors"))
    return {k: v.float() for k, v in sd.items()}


def model_from_state_dict(cfg, sd):
    model = Llama(cfg)
    own = model.state_dict()
    sd = {k: v.float() for k, v in sd.items()}
    if cfg.tied and "lm_head.weight" in sd:  # some tied checkpoints store it; HF ignores it
        del sd["lm_head.weight"]
    missing = sorted(set(own) - set(sd))
    extra = sorted(set(sd) - set(own))
    if missing or extra:
        raise ValueError("weights do not match the config: missing %s, unexpected %s" % (missing, extra))
    for k, v in own.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise ValueError("%s: expected %s, got %s" % (k, list(v.shape), list(sd[k].shape)))
    model.load_state_dict(sd, strict=True)
    return model


def load_hf(d, weights=None):
    with open(os.path.join(d, "config.json")) as f:
        cfg = Cfg.from_hf(json.load(f))
    if weights:
        sd, _ = load_safetensors(weights)
    else:
        sd = load_hf_weights(d)
    return model_from_state_dict(cfg, sd)


# ---------------------------------------------------------------------------
# LoRA (PEFT semantics, written from PEFT's documented behaviour)
# ---------------------------------------------------------------------------

# PEFT's target_modules names for the Llama family, in block order (the order
# memfit lays the adapters out in: layer by layer, then this order, A then B)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."  # PeftModel(LlamaForCausalLM): the HF module name follows


class LoraLinear(nn.Module):
    """A frozen nn.Linear (with its bias, if any) plus a LoRA branch, as
    peft.tuners.lora.Linear with fan_in_fan_out False and dropout 0:
        y = base(x) + lora_B(lora_A(x)) * (alpha / r)
    lora_A.weight (r, in), lora_B.weight (out, r)."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        n_out, n_in = base.weight.shape  # nn.Linear: (out, in)
        self.lora_A = nn.Linear(n_in, r, bias=False)
        self.lora_B = nn.Linear(r, n_out, bias=False)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def parse_targets(s):
    ts = [t.strip() for t in s.split(",") if t.strip()]
    bad = [t for t in ts if t not in LORA_TARGETS]
    if bad or not ts:
        raise ValueError("--targets: %r are not Llama-family targets (%s)" % (bad, ",".join(LORA_TARGETS)))
    return [t for t in LORA_TARGETS if t in ts]  # block order


def apply_lora(model, targets, r, alpha):
    """Wraps every nn.Linear of a block whose name ends with "." + target;
    freezes everything else. Returns [(HF module name, LoraLinear)] in
    memfit's (and PEFT's state_dict) order."""
    wrapped = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or not name.startswith("model.layers."):
            continue
        if name.rsplit(".", 1)[1] not in targets:
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        lm = LoraLinear(mod, r, alpha)
        setattr(parent, name.rsplit(".", 1)[1], lm)
        wrapped.append((name, lm))
    for p in model.parameters():
        p.requires_grad_(False)
    for _, lm in wrapped:
        lm.lora_A.weight.requires_grad_(True)
        lm.lora_B.weight.requires_grad_(True)
    return wrapped


def lora_params(wrapped):
    """[(PEFT name, parameter)]: lora_A then lora_B of each wrapped module."""
    out = []
    for name, lm in wrapped:
        out.append((PEFT_PREFIX + name + ".lora_A.weight", lm.lora_A.weight))
        out.append((PEFT_PREFIX + name + ".lora_B.weight", lm.lora_B.weight))
    return out


def init_lora(wrapped, seed, b_std):
    """Deterministic, both halves non-zero (PEFT's init has B = 0, which
    would make dA and the low-rank forward term vanish): A ~ U(-1/sqrt(in),
    1/sqrt(in)) (PEFT's kaiming_uniform(a=sqrt(5)) bound), B ~ N(0, b_std),
    from their own generator so the base weights are make-case's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, lm in wrapped:
            a = lm.lora_A.weight
            bound = 1.0 / math.sqrt(a.shape[1])
            a.copy_((torch.rand(a.shape, generator=g) * 2 - 1) * bound)
            b = lm.lora_B.weight
            b.copy_(torch.randn(b.shape, generator=g) * b_std)


def save_adapter(out, wrapped, r, alpha, targets, base_name=""):
    """PEFT's layout, as memfit's --save_adapter writes it."""
    os.makedirs(out, exist_ok=True)
    save_safetensors(os.path.join(out, "adapter_model.safetensors"),
                     {n: p.detach().float() for n, p in lora_params(wrapped)}, {"format": "pt"})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_name,
           "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
           "target_modules": [t for t in LORA_TARGETS if t in targets],
           "fan_in_fan_out": False, "bias": "none", "inference_mode": True, "init_lora_weights": True,
           "modules_to_save": None, "use_rslora": False, "use_dora": False}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def load_adapter(model, d):
    """Applies DIR (adapter_config.json + adapter_model.safetensors) the way
    PEFT does; every tensor in the file must land on a module."""
    with open(os.path.join(d, "adapter_config.json")) as f:
        c = json.load(f)
    if c.get("peft_type") != "LORA":
        raise ValueError("%s: peft_type %r is not LORA" % (d, c.get("peft_type")))
    if c.get("fan_in_fan_out"):
        raise ValueError("%s: fan_in_fan_out must be false for nn.Linear" % d)
    if c.get("lora_dropout", 0.0):
        print("note: lora_dropout %g ignored (eval forward)" % c["lora_dropout"], file=sys.stderr)
    wrapped = apply_lora(model, parse_targets(",".join(c["target_modules"])), int(c["r"]), float(c["lora_alpha"]))
    sd, _ = load_safetensors(os.path.join(d, "adapter_model.safetensors"))
    params = lora_params(wrapped)
    missing = [n for n, _ in params if n not in sd]
    extra = sorted(set(sd) - {n for n, _ in params})
    if missing or extra:
        raise ValueError("%s: adapter tensors missing %s, unexpected %s" % (d, missing, extra))
    with torch.no_grad():
        for n, p in params:
            if tuple(sd[n].shape) != tuple(p.shape):
                raise ValueError("%s: expected %s, got %s" % (n, list(p.shape), list(sd[n].shape)))
            p.copy_(sd[n].float())
    return wrapped


def lora_forward_backward(model, wrapped, inputs, targets):
    """(logits (B*T,V), loss, {"grad.<PEFT name>": grad}) at the current adapters."""
    params = lora_params(wrapped)
    for _, p in params:
        p.grad = None
    logits, loss = model(inputs, targets)
    loss.backward()
    grads = {"grad." + n: p.grad.detach().clone() for n, p in params}
    for _, p in params:
        p.grad = None
    return logits.detach().reshape(-1, logits.shape[-1]), loss.item(), grads


def lora_train_step(model, opt, params, inputs, targets, clip):
    _, loss = model(inputs, targets)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def merged_logits(model, wrapped, inputs):
    """Logits with every adapter folded into its base (W += scaling * B @ A),
    on a copy: the check that the branch is the low-rank update it claims."""
    import copy
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, _ in wrapped:
            lm = m.get_submodule(name)
            lm.base.weight += (lm.lora_B.weight @ lm.lora_A.weight) * lm.scaling
            lm.lora_B.weight.zero_()
        return m(inputs)[0].reshape(-1, m.cfg.vocab)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def cfg_from_args(a):
    return Cfg(arch=a.arch, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
               head_dim=a.head_dim, inter=a.inter, vocab=a.vocab, tied=a.tied,
               qkv_bias=a.qkv_bias, rope_theta=a.rope_theta, rope_scaling=a.rope_scaling,
               window=a.window, eps=a.rms_eps, max_pos=a.max_pos)


def cmd_make_hf(a):
    set_deterministic(1)
    torch.manual_seed(a.seed)
    model = Llama(cfg_from_args(a))
    model.init_weights(a.norm_jitter)
    files = save_hf(model, a.out, a.dtype, a.shards)
    n = sum(p.numel() for p in model.parameters())
    print("wrote %s: %s, %d params, %s %s" % (a.out, model.cfg.arch, n, a.dtype, " ".join(files)))


def cmd_make_case(a):
    set_deterministic(1)
    cfg = cfg_from_args(a)
    torch.manual_seed(a.seed)
    model = Llama(cfg)
    model.init_weights(a.norm_jitter)
    # one random sequence of B*T+1 ids, split into shifted inputs/targets, as
    # a language-model loader reads a token stream
    seq = torch.randint(0, cfg.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs = seq[:-1].reshape(a.batch, a.seq).contiguous()
    targets = seq[1:].reshape(a.batch, a.seq).contiguous()

    os.makedirs(a.out, exist_ok=True)
    save_hf(model, os.path.join(a.out, "hf"), "F32", a.shards)
    save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": targets})

    logits, loss, grads = forward_backward(model, inputs, targets)

    opt = make_optimizer(model, a.lr, (a.beta1, a.beta2), a.eps, a.wd)
    losses = [train_step(model, opt, inputs, targets, a.clip) for _ in range(a.steps)]
    with torch.no_grad():
        _, final_loss = model(inputs, targets)
    final_loss = final_loss.item()

    ref = {"logits": logits, "loss": torch.tensor([loss], dtype=torch.float32),
           "losses": torch.tensor(losses, dtype=torch.float32)}
    ref.update(grads)
    ref.update({"final." + n: p.detach() for n, p in model.named_parameters()})
    meta = {"loss": repr(loss), "losses": json.dumps(losses), "final_loss": repr(final_loss)}
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref, meta)

    config = {k: v for k, v in vars(a).items() if k not in ("func", "out", "cmd")}
    info = {
        "loss": loss,
        "losses": losses,
        "final_loss": final_loss,
        "config": config,
        "hf_config": cfg.to_hf(),
        "weight_decay_params": decay_param_names(model),
        "torch_version": torch.__version__,
        "notes": "losses[i] = loss before update i (losses[0] == loss at the initial "
                 "weights); final_loss = loss after all updates. Each step: mean CE "
                 "loss, backward, clip_grad_norm_ if clip>0 (g *= min(1, clip/(norm+1e-6)), "
                 "norm = global L2 over all grads), torch AdamW (p *= 1-lr*wd; m,v updates; "
                 "p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)), constant LR; "
                 "weight decay only on weight_decay_params (the 2-D tensors).",
    }
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    print("wrote %s: %s loss %.6f -> %.6f after %d steps" % (a.out, cfg.arch, loss, final_loss, a.steps))


def cmd_make_sft_case(a):
    """A chat batch: each row packs documents (--packed 1; positions restart
    per document) or is one sequence (--packed 0); in each document the
    first ~40% of targets (the "prompt") and its last target (the next
    document's first token) are -100. Writes hf/, batch.safetensors
    (inputs, targets with -1 for ignored, pos) and ref.safetensors (loss,
    grad.<name>) from cross_entropy(ignore_index=-100)."""
    set_deterministic(1)
    cfg = cfg_from_args(a)
    torch.manual_seed(a.seed)
    model = Llama(cfg)
    model.init_weights(a.norm_jitter)
    B, T = a.batch, a.seq
    g = torch.Generator().manual_seed(a.seed + 7)
    inputs = torch.randint(0, cfg.vocab, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, cfg.vocab, (B, T), generator=g, dtype=torch.int32)
    pos = torch.zeros(B, T, dtype=torch.int32)
    for b in range(B):
        t = 0
        while t < T:
            n = int(torch.randint(3, T // 2, (1,), generator=g)) if a.packed else T
            n = min(n, T - t)
            pos[b, t:t + n] = torch.arange(n, dtype=torch.int32)
            prompt = max(1, (4 * n) // 10)
            targets[b, t:t + prompt] = -100
            if a.packed:
                targets[b, t + n - 1] = -100
            t += n
    os.makedirs(a.out, exist_ok=True)
    save_hf(model, os.path.join(a.out, "hf"), "F32", 1)
    tg = targets.clone()
    tg[tg == -100] = -1
    save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": tg, "pos": pos})
    model.zero_grad(set_to_none=True)
    _, loss = model(inputs, targets, pos if a.packed else None)
    loss.backward()
    ref = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
    ref["loss"] = torch.tensor([loss.item()], dtype=torch.float32)
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref,
                     {"loss": repr(loss.item()), "counted": str(int((targets != -100).sum()))})
    print("wrote %s: loss %.6f over %d of %d targets" % (a.out, loss.item(), int((targets != -100).sum()), B * T))


def cmd_make_lora_case(a):
    set_deterministic(1)
    cfg = cfg_from_args(a)
    targets = parse_targets(a.targets)
    torch.manual_seed(a.seed)
    model = Llama(cfg)
    model.init_weights(a.norm_jitter)
    seq = torch.randint(0, cfg.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs = seq[:-1].reshape(a.batch, a.seq).contiguous()
    targets_ids = seq[1:].reshape(a.batch, a.seq).contiguous()

    os.makedirs(a.out, exist_ok=True)
    save_hf(model, os.path.join(a.out, "hf"), "F32", a.shards)  # the base, before wrapping
    save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": targets_ids})

    wrapped = apply_lora(model, targets, a.r, a.alpha)
    init_lora(wrapped, a.lora_seed, a.b_std)
    save_adapter(os.path.join(a.out, "adapter"), wrapped, a.r, a.alpha, targets, "hf")
    params = lora_params(wrapped)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}

    logits, loss, grads = lora_forward_backward(model, wrapped, inputs, targets_ids)
    ml = merged_logits(model, wrapped, inputs)
    merge_err = (ml - logits).abs().max().item()
    if merge_err > 1e-4:
        raise ValueError("self-check: merged logits differ from the adapter branch's by %g" % merge_err)

    # AdamW on the adapters only; memfit decays 2-D tensors (decay_on 2d),
    # and every lora_A / lora_B is 2-D
    opt = torch.optim.AdamW([p for _, p in params], lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.wd, foreach=False)
    plist = [p for _, p in params]
    losses = [lora_train_step(model, opt, plist, inputs, targets_ids, a.clip) for _ in range(a.steps)]
    with torch.no_grad():
        _, final_loss = model(inputs, targets_ids)
    final_loss = final_loss.item()
    for n, p in model.named_parameters():
        if n in base_before and not torch.equal(p, base_before[n]):
            raise ValueError("self-check: frozen %s changed" % n)

    ref = {"logits": logits, "loss": torch.tensor([loss], dtype=torch.float32),
           "losses": torch.tensor(losses, dtype=torch.float32)}
    ref.update(grads)
    ref.update({"final." + n: p.detach().clone() for n, p in params})
    meta = {"loss": repr(loss), "losses": json.dumps(losses), "final_loss": repr(final_loss),
            "merge_err": repr(merge_err)}
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref, meta)
    config = {k: v for k, v in vars(a).items() if k not in ("func", "out", "cmd")}
    info = {
        "loss": loss, "losses": losses, "final_loss": final_loss, "config": config,
        "hf_config": cfg.to_hf(), "adapters": [n for n, _ in params], "merge_err": merge_err,
        "torch_version": torch.__version__,
        "notes": "PEFT LoRA, dropout 0: y = base(x) + lora_B(lora_A(x)) * alpha/r on the targets, base "
                 "frozen. losses[i] = loss before update i; each step: mean CE, backward, "
                 "clip_grad_norm_ over the adapters if clip>0, torch AdamW over the adapters only with "
                 "weight decay wd on all of them (all 2-D), constant LR.",
    }
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    print("wrote %s: %s lora r=%d alpha=%g targets=%s (%d adapter tensors) loss %.6f -> %.6f after %d steps"
          % (a.out, cfg.arch, a.r, a.alpha, ",".join(targets), len(params), loss, final_loss, a.steps))


def cmd_forward(a):
    set_deterministic(1)
    model = load_hf(a.hf, a.weights)
    cfg = model.cfg
    wrapped = load_adapter(model, a.adapter) if a.adapter else None
    batch, _ = load_safetensors(a.batch)
    inputs, targets = batch["inputs"], batch["targets"]
    for nm, t in (("inputs", inputs), ("targets", targets)):
        if t.dim() != 2 or t.shape != inputs.shape:
            raise ValueError("%s must be (B,T) like inputs, got %s" % (nm, list(t.shape)))
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= cfg.vocab):
            raise ValueError("%s has ids outside [0,%d)" % (nm, cfg.vocab))
    if wrapped is not None:
        logits, loss, grads = lora_forward_backward(model, wrapped, inputs, targets)
    else:
        logits, loss, grads = forward_backward(model, inputs, targets)
    out = {"logits": logits, "loss": torch.tensor([loss], dtype=torch.float32)}
    out.update(grads)
    save_safetensors(a.out, out, {"loss": repr(loss)})
    print("%s L=%d H=%d heads=%d/%d hd=%d I=%d V=%d tied=%d window=%d B=%d T=%d loss %r -> %s"
          % (cfg.arch, cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter,
             cfg.vocab, cfg.tied, cfg.window, inputs.shape[0], inputs.shape[1], loss, a.out))


def cmd_compare(a):
    ta, ma = load_safetensors(a.a)
    tb, mb = load_safetensors(a.b)
    worst = 0.0
    common = [k for k in ta if k in tb]
    for k in common:
        x, y = ta[k].double(), tb[k].double()
        if x.shape != y.shape:
            if x.numel() == y.numel():  # e.g. logits (B,T,V) vs (B*T,V)
                x = x.reshape(y.shape)
            else:
                print("%-50s shape %s vs %s" % (k, list(x.shape), list(y.shape)))
                worst = float("inf")
                continue
        d = (x - y).abs()
        mad = d.max().item() if d.numel() else 0.0
        rel = (d / (y.abs() + a.floor)).max().item() if d.numel() else 0.0
        worst = max(worst, rel)
        print("%-50s max_abs %.3e max_rel %.3e" % (k, mad, rel))
    for k in sorted(set(ta) ^ set(tb)):
        print("%-50s only in %s" % (k, a.a if k in ta else a.b))
    if "loss" in ma and "loss" in mb:
        print("loss %s vs %s" % (ma["loss"], mb["loss"]))
    print("worst max_rel %.3e over %d tensors (floor %g)" % (worst, len(common), a.floor))
    if a.tol is not None and worst > a.tol:
        sys.exit(1)


def cmd_selftest(a):
    """Independent scalar-loop checks of the pieces HF semantics hinge on."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ok = True

    def check(what, got, want, tol):
        nonlocal ok
        err = (got.double() - want.double()).abs().max().item()
        good = err <= tol
        ok &= good
        print("%-52s max_abs %.2e %s" % (what, err, "ok" if good else "FAIL (tol %g)" % tol))

    # llama3 inverse frequencies, element by element in double
    cfg = Cfg(hidden=64, heads=4, head_dim=16, rope_theta=500000.0,
              rope_scaling=parse_rope_scaling("llama3:8,1,4,64"))
    want = []
    for i in range(0, cfg.head_dim, 2):
        f = 1.0 / cfg.rope_theta ** (i / cfg.head_dim)
        wl = 2 * math.pi / f
        if wl < 64 / 4:
            g = f
        elif wl > 64 / 1:
            g = f / 8
        else:
            s = (64 / wl - 1) / (4 - 1)
            g = (1 - s) * f / 8 + s * f
        want.append(g)
    got = rope_inv_freq(cfg)
    regions = sorted({("high" if 2 * math.pi / (1 / cfg.rope_theta ** (i / 16)) < 16 else
                       "low" if 2 * math.pi / (1 / cfg.rope_theta ** (i / 16)) > 64 else "mid")
                      for i in range(0, 16, 2)})
    check("llama3 inv_freq vs scalar formula (%s)" % "/".join(regions),
          (got.double() - torch.tensor(want)) / torch.tensor(want), torch.zeros(8), 1e-6)

    # RoPE on one vector: pairs (d, d+hd/2) rotated by pos*inv_freq[d]
    T, hd = 7, cfg.head_dim
    x = torch.randn(1, 1, T, hd)
    cos, sin = rope_cos_sin(cfg, T)
    y = apply_rope(x, cos, sin)
    ref = torch.zeros(T, hd, dtype=torch.float64)
    for t in range(T):
        for d in range(hd // 2):
            ang = t * want[d]
            a0, a1 = x[0, 0, t, d].item(), x[0, 0, t, d + hd // 2].item()
            ref[t, d] = a0 * math.cos(ang) - a1 * math.sin(ang)
            ref[t, d + hd // 2] = a1 * math.cos(ang) + a0 * math.sin(ang)
    check("rope rotate-half vs pair rotation loop", y[0, 0], ref, 2e-5)

    # attention: GQA + window vs a per-query softmax loop
    for window in (0, 3):
        B, nh, nkv, T, hd = 2, 6, 2, 9, 5
        q = torch.randn(B, nh, T, hd)
        k = torch.randn(B, nkv, T, hd)
        v = torch.randn(B, nkv, T, hd)
        y = attention_core(q, k, v, window)
        ref = torch.zeros(B, nh, T, hd, dtype=torch.float64)
        for b in range(B):
            for h in range(nh):
                g = h // (nh // nkv)
                for i in range(T):
                    js = [j for j in range(T) if j <= i and (window == 0 or i - j < window)]
                    s = [sum(q[b, h, i, d].item() * k[b, g, j, d].item() for d in range(hd)) / math.sqrt(hd)
                         for j in js]
                    m = max(s)
                    e = [math.exp(z - m) for z in s]
                    tot = sum(e)
                    for d in range(hd):
                        ref[b, h, i, d] = sum(e[n] / tot * v[b, g, j, d].item() for n, j in enumerate(js))
        check("attention GQA 6/2 window=%d vs loop" % window, y, ref, 1e-5)

    # RMSNorm vs loop
    x = torch.randn(3, 10)
    n = RMSNorm(10, 1e-5)
    with torch.no_grad():
        n.weight.copy_(torch.randn(10))
    ref = torch.tensor([[x[r, c].item() / math.sqrt(sum(x[r, cc].item() ** 2 for cc in range(10)) / 10 + 1e-5)
                         * n.weight[c].item() for c in range(10)] for r in range(3)], dtype=torch.float64)
    check("rmsnorm vs loop", n(x).detach(), ref, 1e-5)

    # whole model: one position at a time with causal prefix == full sequence
    cfg = Cfg(arch="qwen2", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, inter=40, vocab=50,
              tied=False, rope_scaling=parse_rope_scaling("llama3:8,1,4,16"))
    m = Llama(cfg)
    m.init_weights(0.1)
    ids = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        full, _ = m(ids)
        pref = torch.stack([m(ids[:, :t + 1])[0][0, t] for t in range(12)])
    check("model causality: prefix logits == full logits", full[0], pref, 1e-5)

    # bf16/f16 safetensors round trip
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        t = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(4).half(), "c": torch.randn(2, 2)}
        save_safetensors(os.path.join(d, "x.safetensors"), t, {"format": "pt"})
        r, meta = load_safetensors(os.path.join(d, "x.safetensors"))
        same = all(r[k].dtype == t[k].dtype and torch.equal(r[k], t[k]) for k in t) and meta == {"format": "pt"}
        ok &= same
        print("%-52s %s" % ("safetensors F32/BF16/F16 round trip", "ok" if same else "FAIL"))
    print("selftest", "passed" if ok else "FAILED")
    sys.exit(0 if ok else 1)


def add_model_args(p):
    p.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=None, help="default --heads")
    p.add_argument("--head_dim", type=int, default=None, help="default hidden/heads")
    p.add_argument("--inter", type=int, default=96)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--tied", type=int, choices=(0, 1), default=1)
    p.add_argument("--qkv_bias", type=int, choices=(0, 1), default=None,
                   help="default 1 for qwen2, 0 otherwise (only qwen2 has them)")
    p.add_argument("--rope_theta", type=float, default=10000.0)
    p.add_argument("--rope_scaling", type=parse_rope_scaling, default=None,
                   help="none or llama3:factor,low_freq_factor,high_freq_factor,original_max_pos")
    p.add_argument("--window", type=int, default=0, help="sliding window (mistral); 0 none")
    p.add_argument("--rms_eps", "--norm_eps", type=float, default=1e-5, dest="rms_eps",
                   help="rms_norm_eps (make-case's --eps is AdamW's)")
    p.add_argument("--max_pos", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--norm_jitter", type=float, default=0.0,
                   help="RMSNorm weights 1 + this * randn (default 0: all ones, as HF)")
    p.add_argument("--shards", type=int, default=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    h = sub.add_parser("make-hf", help="write a Hugging Face model folder")
    h.add_argument("--out", required=True)
    add_model_args(h)
    h.add_argument("--dtype", choices=sorted(_SAVE_DTYPES), default="F32")
    h.add_argument("--eps", type=float, dest="rms_eps", default=argparse.SUPPRESS,
                   help="alias of --rms_eps here (make-case's --eps is AdamW's)")
    h.set_defaults(func=cmd_make_hf)

    m = sub.add_parser("make-case", help="write a reference case directory")
    m.add_argument("--out", required=True)
    add_model_args(m)
    m.add_argument("--seq", type=int, default=24)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--lr", type=float, default=1e-3)
    m.add_argument("--beta1", type=float, default=0.9)
    m.add_argument("--beta2", type=float, default=0.95)
    m.add_argument("--eps", type=float, default=1e-8, help="AdamW eps")
    m.add_argument("--wd", type=float, default=0.1)
    m.add_argument("--clip", type=float, default=1.0)
    m.set_defaults(func=cmd_make_case)

    sc = sub.add_parser("make-sft-case", help="write a masked-loss / packed-documents reference case")
    sc.add_argument("--out", required=True)
    add_model_args(sc)
    sc.add_argument("--seq", type=int, default=32)
    sc.add_argument("--batch", type=int, default=2)
    sc.add_argument("--packed", type=int, choices=(0, 1), default=1)
    sc.set_defaults(func=cmd_make_sft_case)

    lc = sub.add_parser("make-lora-case", help="write a LoRA reference case directory")
    lc.add_argument("--out", required=True)
    add_model_args(lc)
    lc.add_argument("--seq", type=int, default=24)
    lc.add_argument("--batch", type=int, default=2)
    lc.add_argument("--steps", type=int, default=10)
    lc.add_argument("--lr", type=float, default=1e-3)
    lc.add_argument("--beta1", type=float, default=0.9)
    lc.add_argument("--beta2", type=float, default=0.95)
    lc.add_argument("--eps", type=float, default=1e-8, help="AdamW eps")
    lc.add_argument("--wd", type=float, default=0.1)
    lc.add_argument("--clip", type=float, default=1.0)
    lc.add_argument("--r", type=int, default=4)
    lc.add_argument("--alpha", type=float, default=8.0)
    lc.add_argument("--targets", default="q_proj,v_proj",
                    help="comma-separated PEFT target_modules (PEFT's Llama default q_proj,v_proj)")
    lc.add_argument("--lora_seed", type=int, default=1234, help="seed of the adapters' A and B")
    lc.add_argument("--b_std", type=float, default=0.05, help="lora_B ~ N(0, b_std) (PEFT would start at 0)")
    lc.set_defaults(func=cmd_make_lora_case)

    f = sub.add_parser("forward", help="forward+backward on an HF folder and a batch")
    f.add_argument("--hf", required=True, help="HF folder (config.json + weights)")
    f.add_argument("--weights", default=None,
                   help="a safetensors file of HF-named weights to use instead of the folder's")
    f.add_argument("--adapter", default=None,
                   help="a PEFT LoRA adapter folder to apply (grads are then the adapters': grad.<PEFT name>)")
    f.add_argument("--batch", required=True)
    f.add_argument("--out", required=True)
    f.set_defaults(func=cmd_forward)

    c = sub.add_parser("compare", help="max abs/rel differences of common tensors")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--floor", type=float, default=1e-6,
                   help="relative difference is |a-b| / (|b| + floor)")
    c.add_argument("--tol", type=float, default=None,
                   help="exit 1 if the worst relative difference exceeds this")
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser("selftest", help="check attention/RoPE/llama3/RMSNorm against scalar loops")
    s.set_defaults(func=cmd_selftest)

    a = p.parse_args(argv)
    try:
        a.func(a)
    except ValueError as e:  # bad options or files: one line, not a traceback
        print("llama_torch: error: %s" % e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
