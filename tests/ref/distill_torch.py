#!/usr/bin/python3
"""Knowledge distillation on the reference GPT-2 (gpt2_torch.py), for memfit's tests.

Run with /usr/bin/python3 (Debian's python3-torch). Written from the
definition (Hinton et al. 2015, section 2, and torch.nn.functional's
kl_div / cross_entropy semantics), not from memfit's C code:

  q_t = softmax(teacher_logits / T), q_s = softmax(student_logits / T)
  loss = mean over targets != -1 of
         alpha * T^2 * KL(q_t || q_s) + (1 - alpha) * cross_entropy(student_logits, target)

KL(q_t || q_s) is F.kl_div(log q_s, log q_t, log_target=True) summed over the
vocabulary (kl_div(input, target) = sum target * (log target - input)).
The teacher runs under no_grad; the gradients are the student's.

Subcommand:
  forward --student S.safetensors --student_heads H --teacher T.safetensors
          --teacher_heads H2 --batch B.safetensors --alpha A --temperature T
          --out OUT.safetensors
      writes the student's gradients ("grad.<name>") and the loss (metadata
      "loss"), and the same for the reversed direction KL(q_s || q_t)
      ("rev.grad.<name>", metadata "loss_rev"), so a test can show that it
      tells the two apart.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch as ref  # noqa: E402


def distill_loss(z, u, targets, alpha, temp, reverse=False):
    V = z.shape[-1]
    z = z.reshape(-1, V)
    u = u.reshape(-1, V)
    y = targets.reshape(-1).long()
    keep = y != -1
    ls = F.log_softmax(z / temp, dim=-1)
    lt = F.log_softmax(u / temp, dim=-1)
    if reverse:
        kl = F.kl_div(lt, ls, log_target=True, reduction="none").sum(-1)  # KL(q_s || q_t)
    else:
        kl = F.kl_div(ls, lt, log_target=True, reduction="none").sum(-1)  # KL(q_t || q_s)
    ce = F.cross_entropy(z, y, ignore_index=-1, reduction="none")
    per = alpha * temp * temp * kl + (1.0 - alpha) * ce
    return per[keep].sum() / keep.sum()


def cmd_forward(a):
    ref.set_deterministic(1)
    ssd, _ = ref.load_safetensors(a.student)
    tsd, _ = ref.load_safetensors(a.teacher)
    student = ref.GPT2.from_state_dict(ssd, a.student_heads)
    teacher = ref.GPT2.from_state_dict(tsd, a.teacher_heads)
    batch, _ = ref.load_safetensors(a.batch)
    inputs, targets = batch["inputs"], batch["targets"]
    with torch.no_grad():
        u, _ = teacher(inputs)
    out, meta = {}, {}
    for prefix, rev in (("", False), ("rev.", True)):
        student.zero_grad(set_to_none=True)
        z, _ = student(inputs)
        loss = distill_loss(z, u, targets, a.alpha, a.temperature, rev)
        loss.backward()
        for n, p in student.named_parameters():
            out[prefix + "grad." + n] = p.grad.detach().clone()
        meta["loss_rev" if rev else "loss"] = repr(loss.item())
    ref.save_safetensors(a.out, out, meta)
    print("distill alpha %g T %g: loss %s, reversed KL %s -> %s"
          % (a.alpha, a.temperature, meta["loss"], meta["loss_rev"], a.out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward", help="distillation loss and student gradients")
    f.add_argument("--student", required=True)
    f.add_argument("--student_heads", type=int, required=True)
    f.add_argument("--teacher", required=True)
    f.add_argument("--teacher_heads", type=int, required=True)
    f.add_argument("--batch", required=True)
    f.add_argument("--alpha", type=float, required=True)
    f.add_argument("--temperature", type=float, required=True)
    f.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.cmd == "forward":
        cmd_forward(a)


if __name__ == "__main__":
    main()
