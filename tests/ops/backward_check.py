#!/usr/bin/python3
"""Checks the dense references' gradients (numesh/ops/reference/backward.hpp) against PyTorch.

    backward_check.py DIR

DIR holds what backward_check_main wrote. Each case's forward is written here with torch
operations in float64 (RMSNorm, a linear layer, the SwiGLU MLP, an embedding lookup, the LM
head with torch.nn.functional.cross_entropy's mean), torch.autograd computes the gradients,
and numesh's (float64 inside, rounded to fp32) must agree: max |numesh - torch| / max |torch|
<= 1e-6 per gradient, the loss within 1e-12 relative.
Exit status: 0 all agree; 1 a mismatch; 2 torch or numpy missing (77 with
NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
np, torch = require("numpy", "torch")
import torch.nn.functional as F  # noqa: E402

BOUND = 1e-6


def main():
    d = sys.argv[1]

    def load(case, name, grad=False):
        t = torch.from_numpy(np.load(os.path.join(d, f"{case}_{name}.npy"))).double()
        return t.requires_grad_(grad)

    failed = False
    for c in json.load(open(os.path.join(d, "cases.json"))):
        n = c["name"]
        loss_error = None
        if n == "rmsnorm":
            x, w, dy = load(n, "x", True), load(n, "w", True), load(n, "dy")
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * w
            y.backward(dy)
            grads = {"dx": x.grad, "dw": w.grad}
        elif n == "linear":
            x, w, dy = load(n, "x", True), load(n, "w", True), load(n, "dy")
            (x @ w).backward(dy)
            grads = {"dx": x.grad, "dw": w.grad}
        elif n == "swiglu":
            x, g, u, dn, dy = (load(n, "x", True), load(n, "gate", True), load(n, "up", True),
                               load(n, "down", True), load(n, "dy"))
            ((F.silu(x @ g) * (x @ u)) @ dn).backward(dy)
            grads = {"dx": x.grad, "dgate": g.grad, "dup": u.grad, "ddown": dn.grad}
        elif n == "gelu":
            x, u, dn, dy = load(n, "x", True), load(n, "up", True), load(n, "down", True), load(n, "dy")
            (F.gelu(x @ u) @ dn).backward(dy)
            grads = {"dx": x.grad, "dup": u.grad, "ddown": dn.grad}
        elif n == "embedding":
            table = torch.zeros(c["vocab"], load(n, "dy").shape[1], dtype=torch.float64, requires_grad=True)
            F.embedding(torch.tensor(c["ids"]), table).backward(load(n, "dy"))
            grads = {"dtable": table.grad}
        elif n == "cross_entropy":
            x, w = load(n, "x", True), load(n, "w", True)
            loss = F.cross_entropy(x @ w, torch.tensor(c["targets"]))
            loss.backward()
            grads = {"dx": x.grad, "dw": w.grad}
            loss_error = abs(c["loss"] - float(loss)) / abs(float(loss))
        else:
            print(f"{n}: FAILED: unknown case")
            failed = True
            continue
        errors = {}
        for key, want in grads.items():
            got = np.load(os.path.join(d, f"{n}_{key}.npy")).astype(np.float64)
            want = want.numpy()
            errors[key] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        ok = max(errors.values()) <= BOUND and (loss_error is None or loss_error <= 1e-12)
        failed |= not ok
        text = ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
        if loss_error is not None:
            text += f", loss {loss_error:.2e}"
        print(f"{n}: {text}: {'ok' if ok else 'FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
