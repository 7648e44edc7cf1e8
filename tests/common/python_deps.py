"""The rule every check of numesh against a Python reference follows for a missing module.

    sys.path.insert(0, <this folder>)
    from python_deps import require
    np, torch = require("numpy", "torch")

require() imports the modules and returns them. A missing one fails the check with exit
status 2, naming the Debian package that brings it, unless NUMESH_SKIP_TORCH_CHECKS=1 is set:
then the check is a reported skip, exit status 77 and a line starting "torch_check: skipped:"
(the prefix CTest's SKIP_REGULAR_EXPRESSION matches, ops/torch_check.cmake).
"""
import importlib
import os
import sys

DEBIAN_PACKAGES = {"torch": "python3-torch", "numpy": "python3-numpy", "sentencepiece": "python3-sentencepiece"}


def missing_dependency(module, error):
    """Exits: 77 (a skip) with NUMESH_SKIP_TORCH_CHECKS=1, else 2 naming the package."""
    package = DEBIAN_PACKAGES.get(module, f"python3-{module}")
    if os.environ.get("NUMESH_SKIP_TORCH_CHECKS") == "1":
        print(f"torch_check: skipped: {error} (NUMESH_SKIP_TORCH_CHECKS=1; Debian package {package})")
        sys.exit(77)
    check = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"{check}: FAILED: the Python module '{module}' is missing for {sys.executable}: {error}.\n"
          f"Install Debian's {package} (apt-get install {package}), or set "
          f"NUMESH_SKIP_TORCH_CHECKS=1 to report this check as skipped.")
    sys.exit(2)


def require(*modules):
    """The modules, imported (one module alone, or a list in the order given)."""
    loaded = []
    for module in modules:
        try:
            loaded.append(importlib.import_module(module))
        except ImportError as error:  # pragma: no cover - depends on the machine
            missing_dependency(module, error)
    return loaded[0] if len(loaded) == 1 else loaded
