#!/usr/bin/python3
"""Checks numesh's AdamW, gradient clip and learning-rate schedule against PyTorch in float64.

    optimizer_check.py DIR

DIR holds what optimizer_check_main wrote (initial parameters, every step's gradients, and per
run, a mesh with a warm-up of 3 steps or none, the parameters after the last step, the clip's
total norms and the learning rates).
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
from errors import relative_max, relative_scalar, within, worst  # noqa: E402
np, torch = require("numpy", "torch")

PARAM_BOUND = 1e-5
SCALAR_BOUND = 1e-6


def lr_at(r, warmup, k):
    if k < warmup:
        return r["lr"] * k / max(1, warmup)
    progress = (k - warmup) / max(1, r["total"] - warmup)
    return r["lr"] * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def replay(d, r, warmup):
    """torch's run of the same steps: the final parameters, the clip's norms, the rates."""
    params = [torch.nn.Parameter(torch.from_numpy(np.load(os.path.join(d, f"param{i}.npy"))).double())
              for i in range(2)]
    opt = torch.optim.AdamW(params, lr=r["lr"], betas=(r["beta1"], r["beta2"]), eps=r["eps"],
                            weight_decay=r["weight_decay"])
    norms, lrs = [], []
    for k in range(r["steps"]):
        for i, p in enumerate(params):
            p.grad = torch.from_numpy(np.load(os.path.join(d, f"grad{k}_{i}.npy"))).double()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, r["max_norm"])))
        lr = lr_at(r, warmup, k)
        lrs.append(lr)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    return [p.detach().numpy() for p in params], norms, lrs


def main():
    d = sys.argv[1]
    r = json.load(open(os.path.join(d, "results.json")))
    failed = False
    replays = {}
    for run in r["runs"]:
        warmup = run["warmup"]
        if warmup not in replays:
            replays[warmup] = replay(d, r, warmup)
            norms, lrs = replays[warmup][1:]
            clipped = sum(1 for x in norms if x > r["max_norm"])
            if not 0 < clipped < len(norms):
                print(f"optimizer_check: FAILED: the clip acts on {clipped} of {len(norms)} steps; the case must "
                      f"have both")
                failed = True
            if warmup == 0 and not lrs[0] > 0:
                print("optimizer_check: FAILED: the run without warm-up must take its first step at a rate above 0")
                failed = True
        want_params, norms, lrs = replays[warmup]
        norm_error = worst(relative_scalar(g, w) for g, w in zip(run["norms"], norms))
        lr_error = worst(relative_scalar(g, w) for g, w in zip(run["lrs"], lrs))
        errors = [relative_max(np.load(os.path.join(d, f"{run['run']}_param{i}.npy")), want)
                  for i, want in enumerate(want_params)]
        ok = (len(run["norms"]) == len(norms) and within(norm_error, SCALAR_BOUND) and
              within(lr_error, SCALAR_BOUND) and within(worst(errors), PARAM_BOUND))
        failed |= not ok
        print(f"{run['mesh']}, warm-up {warmup}: norms {norm_error:.2e}, lrs {lr_error:.2e}, parameters "
              f"{', '.join(f'{e:.2e}' for e in errors)} after {r['steps']} steps: {'ok' if ok else 'FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
