#!/usr/bin/python3
"""Minimal GPT-2 in PyTorch: the reference the memfit C engine is tested against.

Run with /usr/bin/python3 (Debian's python3-torch); no pip packages needed.

Model: learned position embedding, pre-LayerNorm blocks (eps 1e-5), causal
multi-head attention (c_attn gives q|k|v along the last dim; head h is columns
h*hs:(h+1)*hs of each part; scale 1/sqrt(hs)), GELU tanh approximation, MLP 4C,
final ln_f, tied output head logits = ln_f(x) @ wte.T. Loss = mean
cross-entropy over all B*T positions. All fp32.

Parameter names and layouts are exactly Hugging Face GPT-2's (GPT2Model
without the "transformer." prefix); Conv1D weights are (in, out), y = x @ W + b:
  wte.weight (V,C)  wpe.weight (maxT,C)
  h.{i}.ln_1.weight/bias (C)
  h.{i}.attn.c_attn.weight (C,3C) .bias (3C)
  h.{i}.attn.c_proj.weight (C,C)  .bias (C)
  h.{i}.ln_2.weight/bias (C)
  h.{i}.mlp.c_fc.weight (C,4C)    .bias (4C)
  h.{i}.mlp.c_proj.weight (4C,C)  .bias (C)
  ln_f.weight/bias (C)

Subcommands:
  make-case  writes a complete reference case (weights, batch, logits, grads,
             AdamW loss trajectory, final weights) into a directory.
  forward    runs forward+backward on any weights/batch files (e.g. written by
             the C engine) and writes logits, loss and grads.
  compare    prints the max abs / max rel difference of the tensors two
             safetensors files have in common (exit 1 if any exceeds --tol).
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

LN_EPS = 1e-5

# ---------------------------------------------------------------------------
# safetensors (pure Python)
# ---------------------------------------------------------------------------

_DTYPES = {  # safetensors name -> (torch dtype, bytes per element)
    "F32": (torch.float32, 4),
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
}
_NAMES = {v[0]: k for k, v in _DTYPES.items()}

assert sys.byteorder == "little", "safetensors data is little-endian"


def save_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (an ordered {name: tensor}) to `path`.

    Layout: u64 LE header length N, N bytes of JSON (padded with spaces to a
    multiple of 8), then the tensors' bytes back to back in header order.
    The file is written to a temporary name and renamed into place.
    """
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise ValueError("%s: unsupported dtype %s" % (name, t.dtype))
        data = t.numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
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


def load_safetensors(path):
    """Returns ({name: tensor}, metadata) with tensors in header order.

    Validates dtypes, shapes and offsets (in range, sizes matching, data
    section fully covered without overlaps)."""
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
# model
# ---------------------------------------------------------------------------

class Conv1D(nn.Module):
    """HF GPT-2 Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight) \
            .reshape(*x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        assert C % H == 0, "n_embd must be a multiple of n_head"
        self.H = H
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x, allowed=None):
        """allowed: (B,1,T,T) bool mask to use instead of the causal one."""
        B, T, C = x.shape
        H, hs = self.H, C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B,T,C) -> (B,H,T,hs): head h = columns h*hs:(h+1)*hs
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, H, hs).transpose(1, 2)
        v = v.view(B, T, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if allowed is None else allowed
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=LN_EPS)
        self.attn = Attention(C, H)
        self.ln_2 = nn.LayerNorm(C, eps=LN_EPS)
        self.mlp = MLP(C)

    def forward(self, x, allowed=None):
        x = x + self.attn(self.ln_1(x), allowed)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """state_dict() keys are exactly the HF GPT-2 names listed above."""

    def __init__(self, n_layer, n_embd, n_head, vocab, max_seq):
        super().__init__()
        self.n_layer, self.n_embd, self.n_head = n_layer, n_embd, n_head
        self.vocab, self.max_seq = vocab, max_seq
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(max_seq, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=LN_EPS)

    def forward(self, idx, targets=None, docpos=None):
        """idx, targets: integer (B,T); targets of -100 are ignored
        (cross_entropy's ignore_index). docpos (B,T): packed documents'
        positions, restarting at 0 per document: the learned positions
        by docpos and a block-diagonal causal mask. Returns (logits
        (B,T,V), loss or None)."""
        B, T = idx.shape
        if T > self.max_seq:
            raise ValueError("sequence length %d > max_seq %d" % (T, self.max_seq))
        allowed = None
        if docpos is None:
            pos = torch.arange(T, device=idx.device)
        else:
            pos = docpos.long()
            i = torch.arange(T)[None, :, None]
            j = torch.arange(T)[None, None, :]
            allowed = ((j <= i) & (j >= i - pos[:, :, None]))[:, None]
        x = self.wte(idx.long()) + self.wpe(pos)
        for block in self.h:
            x = block(x, allowed)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.long().reshape(B * T))
        return logits, loss

    def init_weights(self, reference=False):
        """GPT-2 init: weights N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2L)),
        biases 0, LN weight 1 bias 0. With reference=True the biases and LN
        params get random non-trivial values too (LN weight 1 + 0.1*randn,
        LN bias and biases 0.02*randn) so their gradients are really tested.
        Draws happen in named_parameters() order (deterministic)."""
        proj_std = 0.02 / math.sqrt(2 * self.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".weight") and p.dim() >= 2:
                    std = proj_std if name.endswith("c_proj.weight") else 0.02
                    p.normal_(0.0, std)
                elif re.search(r"ln_\w+\.weight$", name):
                    if reference:
                        p.copy_(1.0 + 0.1 * torch.randn_like(p))
                    else:
                        p.fill_(1.0)
                else:  # biases (LN and Conv1D)
                    if reference:
                        p.copy_(0.02 * torch.randn_like(p))
                    else:
                        p.zero_()

    @staticmethod
    def from_state_dict(sd, n_head):
        """Builds a model from HF-named tensors, inferring L, C, V, maxT."""
        V, C = sd["wte.weight"].shape
        maxT = sd["wpe.weight"].shape[0]
        layers = {int(m.group(1)) for k in sd for m in [re.match(r"h\.(\d+)\.", k)] if m}
        L = len(layers)
        if layers != set(range(L)):
            raise ValueError("layer indices are not 0..L-1: %s" % sorted(layers))
        model = GPT2(L, C, n_head, V, maxT)
        own = model.state_dict()
        # HF checkpoints also carry the causal-mask buffers; they are not parameters.
        sd = {k: v for k, v in sd.items() if not re.match(r"h\.\d+\.attn\.(masked_)?bias$", k)}
        missing = sorted(set(own) - set(sd))
        extra = sorted(set(sd) - set(own))
        if missing or extra:
            raise ValueError("weights do not match the model: missing %s, unexpected %s"
                             % (missing, extra))
        for k, v in own.items():
            if tuple(sd[k].shape) != tuple(v.shape) or sd[k].dtype != torch.float32:
                raise ValueError("%s: expected F32 %s, got %s %s"
                                 % (k, list(v.shape), sd[k].dtype, list(sd[k].shape)))
        model.load_state_dict(sd, strict=True)
        return model


def decay_param_names(model):
    """Parameters that get AdamW weight decay: dim >= 2 (wte, wpe, matrices)."""
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
    """Returns (logits, loss float, {"grad.<name>": grad}) at the current weights."""
    model.zero_grad(set_to_none=True)
    logits, loss = model(inputs, targets)
    loss.backward()
    grads = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach(), loss.item(), grads


def set_deterministic(threads=1):
    torch.set_num_threads(threads)
    try:
        torch.use_deterministic_algorithms(True)
    except Exception:  # older builds: best effort
        pass


def ref_tensors(logits, grads):
    out = {"logits": logits}
    out.update(grads)
    return out


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def cmd_make_case(a):
    set_deterministic(1)
    torch.manual_seed(a.seed)
    model = GPT2(a.layers, a.embd, a.heads, a.vocab, a.seq)
    model.init_weights(reference=True)
    # one random sequence of B*T+1 ids, split into shifted inputs/targets, as
    # a language-model loader reads a token stream (memfit rebuilds its token
    # file from it)
    seq = torch.randint(0, a.vocab, (a.batch * a.seq + 1,), dtype=torch.int32)
    inputs = seq[:-1].reshape(a.batch, a.seq).contiguous()
    targets = seq[1:].reshape(a.batch, a.seq).contiguous()

    os.makedirs(a.out, exist_ok=True)
    save_safetensors(os.path.join(a.out, "weights.safetensors"), model.state_dict())
    save_safetensors(os.path.join(a.out, "batch.safetensors"),
                     {"inputs": inputs, "targets": targets})

    logits, loss, grads = forward_backward(model, inputs, targets)
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref_tensors(logits, grads),
                     {"loss": repr(loss)})

    opt = make_optimizer(model, a.lr, (a.beta1, a.beta2), a.eps, a.wd)
    losses = [train_step(model, opt, inputs, targets, a.clip) for _ in range(a.steps)]
    with torch.no_grad():
        _, final_loss = model(inputs, targets)
    save_safetensors(os.path.join(a.out, "final.safetensors"), model.state_dict())

    config = {k: v for k, v in vars(a).items() if k not in ("func", "out", "cmd")}
    ref = {
        "loss": loss,
        "losses": losses,
        "final_loss": final_loss.item(),
        "config": config,
        "weight_decay_params": decay_param_names(model),
        "torch_version": torch.__version__,
        "notes": "losses[i] = loss before update i (losses[0] == loss at the initial "
                 "weights); final_loss = loss after all updates. Each step: mean CE "
                 "loss, backward, clip_grad_norm_ if clip>0 (g *= min(1, clip/(norm+1e-6)), "
                 "norm = global L2 over all grads), torch AdamW (p *= 1-lr*wd; m,v updates; "
                 "p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)), constant LR; "
                 "weight decay only on weight_decay_params.",
    }
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote %s: loss %.6f -> %.6f after %d steps" % (a.out, loss, final_loss.item(), a.steps))


def cmd_make_sft_case(a):
    """A packed chat batch: documents of random lengths in each row
    (positions restart per document), the first ~40% of each document's
    targets and its last target -100. Writes weights.safetensors,
    batch.safetensors (inputs, targets with -1 for ignored, pos) and
    ref.safetensors (loss, grad.<name>) from cross_entropy(ignore_index=-100)."""
    set_deterministic(1)
    torch.manual_seed(a.seed)
    model = GPT2(a.layers, a.embd, a.heads, a.vocab, a.seq)
    model.init_weights(reference=True)
    B, T = a.batch, a.seq
    g = torch.Generator().manual_seed(a.seed + 7)
    inputs = torch.randint(0, a.vocab, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, a.vocab, (B, T), generator=g, dtype=torch.int32)
    pos = torch.zeros(B, T, dtype=torch.int32)
    for b in range(B):
        t = 0
        while t < T:
            n = min(int(torch.randint(3, T // 2, (1,), generator=g)), T - t)
            pos[b, t:t + n] = torch.arange(n, dtype=torch.int32)
            targets[b, t:t + max(1, (4 * n) // 10)] = -100
            targets[b, t + n - 1] = -100
            t += n
    os.makedirs(a.out, exist_ok=True)
    save_safetensors(os.path.join(a.out, "weights.safetensors"), model.state_dict())
    tg = targets.clone()
    tg[tg == -100] = -1
    save_safetensors(os.path.join(a.out, "batch.safetensors"), {"inputs": inputs, "targets": tg, "pos": pos})
    model.zero_grad(set_to_none=True)
    _, loss = model(inputs, targets, pos)
    loss.backward()
    ref = {"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()}
    ref["loss"] = torch.tensor([loss.item()], dtype=torch.float32)
    save_safetensors(os.path.join(a.out, "ref.safetensors"), ref,
                     {"loss": repr(loss.item()), "counted": str(int((targets != -100).sum()))})
    print("wrote %s: loss %.6f over %d of %d targets" % (a.out, loss.item(), int((targets != -100).sum()), B * T))


def cmd_forward(a):
    set_deterministic(1)
    sd, _ = load_safetensors(a.weights)
    model = GPT2.from_state_dict(sd, a.heads)
    batch, _ = load_safetensors(a.batch)
    inputs, targets = batch["inputs"], batch["targets"]
    for nm, t in (("inputs", inputs), ("targets", targets)):
        if t.dim() != 2 or t.shape != inputs.shape:
            raise ValueError("%s must be (B,T) like inputs, got %s" % (nm, list(t.shape)))
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= model.vocab):
            raise ValueError("%s has ids outside [0,%d)" % (nm, model.vocab))
    logits, loss, grads = forward_backward(model, inputs, targets)
    save_safetensors(a.out, ref_tensors(logits, grads), {"loss": repr(loss)})
    print("L=%d C=%d H=%d V=%d maxT=%d B=%d T=%d loss %r -> %s"
          % (model.n_layer, model.n_embd, model.n_head, model.vocab, model.max_seq,
             inputs.shape[0], inputs.shape[1], loss, a.out))


def cmd_compare(a):
    ta, ma = load_safetensors(a.a)
    tb, mb = load_safetensors(a.b)
    worst = 0.0
    common = [k for k in ta if k in tb]
    for k in common:
        x, y = ta[k].double(), tb[k].double()
        if x.shape != y.shape:
            print("%-40s shape %s vs %s" % (k, list(x.shape), list(y.shape)))
            worst = float("inf")
            continue
        d = (x - y).abs()
        mad = d.max().item() if d.numel() else 0.0
        rel = (d / (y.abs() + a.floor)).max().item() if d.numel() else 0.0
        worst = max(worst, rel)
        print("%-40s max_abs %.3e max_rel %.3e" % (k, mad, rel))
    for k in sorted(set(ta) ^ set(tb)):
        print("%-40s only in %s" % (k, a.a if k in ta else a.b))
    if "loss" in ma and "loss" in mb:
        print("loss %s vs %s" % (ma["loss"], mb["loss"]))
    print("worst max_rel %.3e over %d tensors (floor %g)" % (worst, len(common), a.floor))
    if a.tol is not None and worst > a.tol:
        sys.exit(1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make-case", help="write a reference case directory")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--embd", type=int, default=64)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--vocab", type=int, default=97)
    m.add_argument("--seq", type=int, default=16)
    m.add_argument("--batch", type=int, default=3)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--lr", type=float, default=1e-3)
    m.add_argument("--beta1", type=float, default=0.9)
    m.add_argument("--beta2", type=float, default=0.95)
    m.add_argument("--eps", type=float, default=1e-8)
    m.add_argument("--wd", type=float, default=0.1)
    m.add_argument("--clip", type=float, default=1.0)
    m.set_defaults(func=cmd_make_case)

    sc = sub.add_parser("make-sft-case", help="write a masked-loss / packed-documents reference case")
    sc.add_argument("--out", required=True)
    sc.add_argument("--layers", type=int, default=2)
    sc.add_argument("--embd", type=int, default=32)
    sc.add_argument("--heads", type=int, default=4)
    sc.add_argument("--vocab", type=int, default=256)
    sc.add_argument("--seq", type=int, default=32)
    sc.add_argument("--batch", type=int, default=2)
    sc.add_argument("--seed", type=int, default=1)
    sc.set_defaults(func=cmd_make_sft_case)

    f = sub.add_parser("forward", help="forward+backward on given weights and batch")
    f.add_argument("--weights", required=True)
    f.add_argument("--batch", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--heads", type=int, required=True)
    f.set_defaults(func=cmd_forward)

    c = sub.add_parser("compare", help="max abs/rel differences of common tensors")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--floor", type=float, default=1e-6,
                   help="relative difference is |a-b| / (|b| + floor)")
    c.add_argument("--tol", type=float, default=None,
                   help="exit 1 if the worst relative difference exceeds this")
    c.set_defaults(func=cmd_compare)

    a = p.parse_args(argv)
    a.func(a)


if __name__ == "__main__":
    main()
