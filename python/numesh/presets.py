"""DynamicShardingAxes and eformer's presets: each preset is a class (eformer passes the class,
not an instance) whose `axes` and `mode` are read from numesh's C++ table of presets."""

from __future__ import annotations

from typing import Any, NamedTuple

from numesh import _numesh


class DynamicShardingAxes(NamedTuple):
    """The semantic axes of a tensor and the mode to resolve them in: a mode string, or an int
    naming the dimension whose extent decides (1: decode, else train)."""

    axes: Any
    mode: Any


_TABLE = {name: (axes, mode) for name, axes, mode in _numesh._PRESETS}


def _preset(name: str) -> type:
    axes, mode = _TABLE[name]
    return type(name, (DynamicShardingAxes,), {"axes": axes, "mode": mode, "__slots__": ()})


HiddenStateSharding = _preset("HiddenStateSharding")
AttnQSharding = _preset("AttnQSharding")
AttnKVSharding = _preset("AttnKVSharding")
RowWise = _preset("RowWise")
SRowWise = _preset("SRowWise")
ColumnWise = _preset("ColumnWise")
SColumnWise = _preset("SColumnWise")
Replicated = _preset("Replicated")
ExpertColumnWise = _preset("ExpertColumnWise")
ExpertRowWise = _preset("ExpertRowWise")
ExpertColumnWiseAlt = _preset("ExpertColumnWiseAlt")
ExpertRowWiseAlt = _preset("ExpertRowWiseAlt")
UnifiedExpertColumnWise = _preset("UnifiedExpertColumnWise")
UnifiedExpertRowWise = _preset("UnifiedExpertRowWise")
ExpertActivations = _preset("ExpertActivations")
ExpertActivationsAlt = _preset("ExpertActivationsAlt")
ExpertTensorParallel = _preset("ExpertTensorParallel")

PRESETS = {name: globals()[name] for name in _TABLE}
"""Every preset by name."""

__all__ = [
    "DynamicShardingAxes",
    "HiddenStateSharding",
    "AttnQSharding",
    "AttnKVSharding",
    "RowWise",
    "SRowWise",
    "ColumnWise",
    "SColumnWise",
    "Replicated",
    "ExpertColumnWise",
    "ExpertRowWise",
    "ExpertColumnWiseAlt",
    "ExpertRowWiseAlt",
    "UnifiedExpertColumnWise",
    "UnifiedExpertRowWise",
    "ExpertActivations",
    "ExpertActivationsAlt",
    "ExpertTensorParallel",
    "PRESETS",
]
