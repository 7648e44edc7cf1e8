"""Error measures for the checks of numesh against a Python reference, blind to nothing.

Python's built-in max() drops a NaN that is not its first argument (NaN > x is False), so a
check that folds its errors with it passes a NaN output. Every measure here propagates NaN
instead, and every bound test fails on it:

    sys.path.insert(0, <this folder>)
    from errors import worst, relative_max, within
"""
import math

import numpy as np


def worst(values):
    """The largest of `values` (any iterable of numbers), NaN if any of them is NaN; 0.0 if empty."""
    values = [float(v) for v in values]
    if not values:
        return 0.0
    return float(np.max(np.asarray(values, dtype=np.float64)))


def relative_max(got, want):
    """max |got - want| / max |want| over two arrays (NumPy or torch), NaN if either holds NaN."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shapes differ: got {got.shape}, want {want.shape}")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want))) / max(scale, np.finfo(np.float64).tiny)


def relative_scalar(got, want):
    """|got - want| / |want| (|want| at least 1e-12), NaN if either is NaN."""
    return abs(float(got) - float(want)) / max(abs(float(want)), 1e-12)


def within(error, bound):
    """True when `error` is a number no larger than `bound`: NaN and infinity are never within."""
    return math.isfinite(error) and error <= bound
