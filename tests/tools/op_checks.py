#!/usr/bin/python3
"""Checks of `numesh op` that need values computed outside numesh (NumPy, float64).

    op_checks.py nonfinite NUMESH OP FIXTURE WORK nan|inf x|weight [-- ARGS...]
        Copies the .npy folder FIXTURE into WORK, puts one NaN or infinity into x.npy or into
        the op's first weight file, runs `NUMESH op OP --dir WORK ARGS...`, and requires exit
        status 1 with the check reporting FAILED and why (a non-finite reference or output).
        The check must fail: NaN must never be reported as "ok". The input's non-finite value
        must be noted where it is read, and with --refuse-nonfinite refused (exit status 2).

    op_checks.py moe-routing NUMESH FIXTURE WORK CAPACITY [-- ARGS...]
        Runs `NUMESH op moe --dir FIXTURE --capacity CAPACITY --json ...` and compares its
        tokens per expert, drops and capacity with a NumPy routing of the same inputs (softmax
        router, top-2 ties to the lower index, GShard priority: every token's first choice
        before any second; one routing group, as on a mesh without batch axes).

Exit status 0 when the check holds, 1 otherwise (with the reason). NumPy is required: its
absence is a failure, not a skip (Debian: python3-numpy).
"""
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"op_checks: {e}: NumPy is required for this test (Debian: apt-get install python3-numpy)")
    sys.exit(1)

# The weight file corrupted per op (the first one the op reads).
FIRST_WEIGHT = {"mlp": ["w1", "w_gate"], "attention": ["wq"], "moe": ["router"], "block": ["wq"]}


def split_args(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.returncode, p.stdout


def nonfinite(numesh, op, fixture, work, kind, target, extra):
    work = pathlib.Path(work)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(fixture, work / "in")
    names = ["x"] if target == "x" else [n for n in FIRST_WEIGHT[op] if (work / "in" / f"{n}.npy").exists()][:1]
    if not names:
        print(f"op_checks: no weight file to corrupt for {op} in {fixture}")
        return 1
    path = work / "in" / f"{names[0]}.npy"
    a = np.load(path)
    a.flat[a.size // 2] = np.nan if kind == "nan" else np.inf
    np.save(path, a)
    rc, out = run([numesh, "op", op, "--dir", str(work / "in"), "--out", str(work)] + extra)
    print(out)
    if rc != 1:
        print(f"op_checks: expected exit status 1 (the check fails), got {rc}")
        return 1
    check = [line for line in out.splitlines() if line.startswith("check ")]
    if not check or "FAILED" not in check[0] or not ("not finite" in check[0] or "non-finite" in check[0]):
        print(f"op_checks: expected a 'check ... FAILED' line naming the non-finite values, got {check}")
        return 1
    note = f"note: {names[0]}.npy holds 1 non-finite value of "
    if not any(line.startswith(note) for line in out.splitlines()):
        print(f"op_checks: expected the input's non-finite value noted where it is read ('{note}...')")
        return 1
    # --refuse-nonfinite: the same input is an error before anything runs (exit status 2).
    rc, out = run([numesh, "op", op, "--dir", str(work / "in"), "--out", str(work), "--refuse-nonfinite"] + extra)
    print(out)
    want = f"{names[0]}.npy holds 1 non-finite value of "
    if rc != 2 or want not in out or "--refuse-nonfinite refuses it" not in out:
        print(f"op_checks: with --refuse-nonfinite expected exit status 2 and '{want}... --refuse-nonfinite "
              f"refuses it', got {rc}")
        return 1
    print(f"op_checks: {op} with {kind} in {names[0]}.npy is noted, fails its check as it must, and is refused "
          f"with --refuse-nonfinite")
    return 0


def moe_routing(numesh, fixture, work, capacity_factor, extra):
    work = pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    report = work / "moe_routing.json"
    rc, out = run([numesh, "op", "moe", "--dir", fixture, "--capacity", capacity_factor, "--out", str(work),
                   "--json", str(report)] + extra)
    print(out)
    if rc != 0:
        print(f"op_checks: numesh op moe exited with {rc}")
        return 1
    got = json.loads(report.read_text())
    d = pathlib.Path(fixture)
    x = np.load(d / "x.npy").astype(np.float64)
    router = np.load(d / "router.npy").astype(np.float64)
    t, e, k = x.shape[0], router.shape[1], 2
    logits = x @ router
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    # Highest first, ties to the lower index: a stable sort of the negated probabilities.
    choice = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    capacity = math.ceil(float(capacity_factor) * t * k / e) if float(capacity_factor) > 0 else 0
    load, dropped = [0] * e, 0
    for j in range(k):
        for i in range(t):
            ex = int(choice[i, j])
            if capacity and load[ex] >= capacity:
                dropped += 1
                continue
            load[ex] += 1
    want_line = f"routing  tokens per expert [{', '.join(map(str, load))}], {dropped} dropped"
    ok = got.get("tokens_per_expert") == load and want_line in out
    if capacity:
        ok = ok and f"(capacity {capacity} per group)" in out
    print(f"op_checks: NumPy routes {load}, {dropped} dropped, capacity {capacity}; numesh reports "
          f"{got.get('tokens_per_expert')}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def main():
    args, extra = split_args(sys.argv[1:])
    if len(args) == 7 and args[0] == "nonfinite" and args[5] in ("nan", "inf") and args[6] in ("x", "weight"):
        return nonfinite(*args[1:], extra)
    if len(args) == 5 and args[0] == "moe-routing":
        return moe_routing(*args[1:], extra)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
