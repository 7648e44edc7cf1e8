#!/usr/bin/python3
"""Checks numesh's AdamW, gradient clip and learning-rate schedule against PyTorch in float64.

    optimizer_check.py DIR

DIR holds what optimizer_check_main wrote (initial parameters, every step's gradients, and per
mesh the parameters after the last step, the clip's total norms and the learning rates).
PyTorch replays the same steps: torch.nn.utils.clip_grad_norm_(params, max_norm), then
torch.optim.AdamW with the step's learning rate, the rate computed here from the published
warm-up + cosine formula (transformers' get_cosine_schedule_with_warmup). Compares each mesh's
norms and rates (relative 1e-6) and final parameters (max |numesh - torch| / max |torch| per
tensor, 1e-5: numesh keeps fp32 master weights and moments, torch float64).
Exit status: 0 all agree; 1 a mismatch; 2 torch or numpy missing (77 with
NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
np, torch = require("numpy", "torch")

PARAM_BOUND = 1e-5
SCALAR_BOUND = 1e-6


def lr_at(r, k):
    if k < r["warmup"]:
        return r["lr"] * k / max(1, r["warmup"])
    progress = (k - r["warmup"]) / max(1, r["total"] - r["warmup"])
    return r["lr"] * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def main():
    d = sys.argv[1]
    r = json.load(open(os.path.join(d, "results.json")))
    n = 2
    params = [torch.nn.Parameter(torch.from_numpy(np.load(os.path.join(d, f"param{i}.npy"))).double())
              for i in range(n)]
    opt = torch.optim.AdamW(params, lr=r["lr"], betas=(r["beta1"], r["beta2"]), eps=r["eps"],
                            weight_decay=r["weight_decay"])
    norms, lrs = [], []
    for k in range(r["steps"]):
        for i, p in enumerate(params):
            p.grad = torch.from_numpy(np.load(os.path.join(d, f"grad{k}_{i}.npy"))).double()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, r["max_norm"])))
        lr = lr_at(r, k)
        lrs.append(lr)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    failed = False
    clipped = sum(1 for x in norms if x > r["max_norm"])
    if not 0 < clipped < len(norms):
        print(f"optimizer_check: FAILED: the clip acts on {clipped} of {len(norms)} steps; the case must have both")
        failed = True
    for m in r["meshes"]:
        worst = {"norms": 0.0, "lrs": 0.0}
        for key, want in (("norms", norms), ("lrs", lrs)):
            for got, w in zip(m[key], want):
                worst[key] = max(worst[key], abs(got - w) / max(abs(w), 1e-12))
        errors = []
        for i, p in enumerate(params):
            got = np.load(os.path.join(d, f"{m['mesh']}_param{i}.npy")).astype(np.float64)
            want = p.detach().numpy()
            errors.append(float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
        ok = worst["norms"] <= SCALAR_BOUND and worst["lrs"] <= SCALAR_BOUND and max(errors) <= PARAM_BOUND
        failed |= not ok
        print(f"{m['mesh']}: norms {worst['norms']:.2e}, lrs {worst['lrs']:.2e}, parameters "
              f"{', '.join(f'{e:.2e}' for e in errors)} after {r['steps']} steps ({clipped} clipped): "
              f"{'ok' if ok else 'FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
