#!/usr/bin/python3
"""LoRA on the reference GPT-2, applied by PEFT's conventions, for memfit's tests.

Run with /usr/bin/python3 (Debian's python3-torch); the peft package is not
needed: this file reads the adapter the way PEFT does and applies it the way
peft.tuners.lora.Linear does, written from PEFT's documented behaviour, not
from memfit's C code:

  * adapter_config.json: peft_type "LORA", r, lora_alpha, lora_dropout,
    target_modules (a module is targeted when its name ends with
    "." + target), fan_in_fan_out (true for GPT-2's Conv1D), bias "none";
  * adapter_model.safetensors: "base_model.model.transformer.<module>.lora_A.weight"
    (r, in) and "...lora_B.weight" (out, r) for each targeted module;
  * forward: y = base(x) + lora_B(lora_A(dropout(x))) * (lora_alpha / r);
    the base is frozen (requires_grad False), only lora_A and lora_B train;
  * merge: W (in, out) += transpose(B @ A) * scaling (fan_in_fan_out).

Subcommand:
  forward --weights W.safetensors --adapter DIR --batch B.safetensors
          --heads H --out OUT.safetensors
      writes logits, the loss (metadata "loss") and the gradient of every
      adapter tensor under "grad.<peft name>", and the merged weights'
      logits under "merged_logits".
"""

import argparse
import json
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch as ref  # noqa: E402

PREFIX = "base_model.model.transformer."


class LoraConv1D(nn.Module):
    """A frozen HF Conv1D with a LoRA branch, as peft.tuners.lora.Linear."""

    def __init__(self, base, r, alpha, dropout):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        n_in, n_out = base.weight.shape  # Conv1D: (in, out)
        self.lora_A = nn.Linear(n_in, r, bias=False)
        self.lora_B = nn.Linear(r, n_out, bias=False)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def apply_adapter(model, adapter_dir):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    assert cfg["peft_type"] == "LORA", cfg["peft_type"]
    assert cfg["fan_in_fan_out"] is True, "GPT-2 Conv1D needs fan_in_fan_out"
    assert cfg["bias"] == "none"
    sd, _ = ref.load_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    used = set()
    wrapped = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, ref.Conv1D):
            continue
        if not any(name == t or name.endswith("." + t) for t in cfg["target_modules"]):
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        lm = LoraConv1D(mod, cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"])
        a, b = PREFIX + name + ".lora_A.weight", PREFIX + name + ".lora_B.weight"
        with torch.no_grad():
            lm.lora_A.weight.copy_(sd[a])
            lm.lora_B.weight.copy_(sd[b])
        used.update([a, b])
        setattr(parent, name.rsplit(".", 1)[1], lm)
        wrapped.append((name, lm))
    extra = set(sd) - used
    if extra:
        raise ValueError("adapter tensors that match no module: %s" % sorted(extra))
    for p in model.parameters():
        p.requires_grad_(False)
    for _, lm in wrapped:
        lm.lora_A.weight.requires_grad_(True)
        lm.lora_B.weight.requires_grad_(True)
    return wrapped


def cmd_forward(a):
    ref.set_deterministic(1)
    w, _ = ref.load_safetensors(a.weights)
    model = ref.GPT2.from_state_dict(w, a.heads)
    wrapped = apply_adapter(model, a.adapter)
    model.eval()  # dropout off
    batch, _ = ref.load_safetensors(a.batch)
    logits, loss = model(batch["inputs"], batch["targets"])
    loss.backward()
    out = {"logits": logits.detach()}
    for name, lm in wrapped:
        out["grad." + PREFIX + name + ".lora_A.weight"] = lm.lora_A.weight.grad
        out["grad." + PREFIX + name + ".lora_B.weight"] = lm.lora_B.weight.grad
    # merged weights (PEFT's merge with fan_in_fan_out): W += (B @ A)^T * scaling
    merged = ref.GPT2.from_state_dict(w, a.heads)
    with torch.no_grad():
        for name, lm in wrapped:
            conv = merged.get_submodule(name)
            conv.weight += (lm.lora_B.weight @ lm.lora_A.weight).t() * lm.scaling
        ml, _ = merged(batch["inputs"], batch["targets"])
    out["merged_logits"] = ml
    ref.save_safetensors(a.out, out, {"loss": repr(loss.item())})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--weights", required=True)
    f.add_argument("--adapter", required=True)
    f.add_argument("--batch", required=True)
    f.add_argument("--heads", type=int, required=True)
    f.add_argument("--out", required=True)
    a = p.parse_args(argv)
    cmd_forward(a)


if __name__ == "__main__":
    main()
