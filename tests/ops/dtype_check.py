#!/usr/bin/python3
"""Checks numesh's fp32 -> bf16 and fp32 -> f16 conversions against PyTorch and NumPy, bit for bit.

    dtype_check.py DIR

DIR holds what dtype_check_main wrote: values.f32 and, per kernel level this CPU runs,
LEVEL.bf16 and LEVEL.f16. Every non-NaN value must convert to exactly the bits PyTorch 1.13
gives (x.to(torch.bfloat16), x.to(torch.float16)) and NumPy gives (astype(np.float16)); NaN
must stay NaN (the libraries disagree on NaN bits; numesh writes the canonical quiet NaN).
Exit status: 0 all agree; 1 a mismatch (the first few printed); 2 torch or numpy is missing
(77 with NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
np, torch = require("numpy", "torch")


def main():
    d = sys.argv[1]
    x = np.fromfile(os.path.join(d, "values.f32"), dtype="<f4")
    nan = np.isnan(x)
    t = torch.from_numpy(x.copy())
    want = {
        "bf16 (PyTorch)": ("bf16", t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)),
        "f16 (PyTorch)": ("f16", t.to(torch.float16).view(torch.int16).numpy().view(np.uint16)),
    }
    with np.errstate(over="ignore"):
        want["f16 (NumPy)"] = ("f16", x.astype(np.float16).view(np.uint16))
    levels = open(os.path.join(d, "levels.txt")).read().split()
    failed = False
    for level in levels:
        for name, (ext, bits) in want.items():
            got = np.fromfile(os.path.join(d, f"{level}.{ext}"), dtype="<u2")
            got_nan = (got & 0x7FFF) > (0x7F80 if ext == "bf16" else 0x7C00)
            bad = np.flatnonzero((got != bits) & ~nan)
            bad_nan = np.flatnonzero(nan & ~got_nan)
            ok = bad.size == 0 and bad_nan.size == 0
            failed |= not ok
            print(f"{level:12s} {name:15s} {x.size} values: {'identical' if ok else 'MISMATCH'}")
            for i in bad[:5]:
                print(f"    at {i}: fp32 bits {x.view(np.uint32)[i]:#010x} -> numesh {got[i]:#06x}, want {bits[i]:#06x}")
            for i in bad_nan[:5]:
                print(f"    at {i}: NaN became {got[i]:#06x}, not a NaN")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
