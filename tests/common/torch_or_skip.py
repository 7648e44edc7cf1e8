"""The import rule of numesh's checks against PyTorch, in one place.

    sys.path.insert(0, <this folder>); from torch_or_skip import np, torch

Imports numpy and torch (Debian's python3-numpy and python3-torch). Without them the check
fails with exit status 2 and says what to install, unless NUMESH_SKIP_TORCH_CHECKS=1, which
makes it a reported skip (exit status 77, "torch_check: skipped:", the pattern CTest's
SKIP_REGULAR_EXPRESSION matches).
"""
import os
import sys

try:
    import numpy as np  # noqa: F401  (re-exported)
    import torch  # noqa: F401  (re-exported)
except ImportError as e:  # pragma: no cover - depends on the machine
    name = os.path.basename(sys.argv[0])
    if os.environ.get("NUMESH_SKIP_TORCH_CHECKS") == "1":
        print(f"torch_check: skipped: {e} (NUMESH_SKIP_TORCH_CHECKS=1)")
        sys.exit(77)
    print(f"{name}: FAILED: {e}: install Debian's python3-torch and python3-numpy, or set "
          "NUMESH_SKIP_TORCH_CHECKS=1 to report this check as skipped")
    sys.exit(2)
