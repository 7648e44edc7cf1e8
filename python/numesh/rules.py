"""eformer's functions that give every leaf of a pytree a spec: match_partition_rules
(escale/partition/constraints.py) and the sharding strategies of escale/partition/auto_spec.py.
The tree is flattened in JAX's order (numesh.pytree) and each result rebuilt in its structure;
the rules themselves are numesh's C++ sharding layer.

A leaf with a `shape` is an array (its `dtype` gives the bytes where they count); any other
leaf, such as a Python scalar, is not.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from numesh import _numesh
from numesh.pytree import leaves_with_paths, rebuild, subtrees_at_leaves


def match_partition_rules(rules: Sequence[Tuple[Any, Any]], tree: Any, min_size: Optional[int] = 0,
                          strict: bool = True) -> Any:
    """eformer's match_partition_rules: `tree` with each leaf replaced by the spec of the first
    rule (regex, spec) whose pattern is found (re.search) in the leaf's '/'-joined path.

    strict (default): a leaf without a shape, or a scalar, gets P() without a rule; a matched
    array of fewer than `min_size` elements gets P() (None means MIN_SHARDING_SIZE, from the
    environment); a spec longer than the rank is cut to it. Not strict: the matched spec as it
    is, for every leaf. Raises ValueError "Partition rule not found for param: <path>" for the
    first leaf no rule matches. A pattern may be a compiled re.Pattern (its flags are not
    used). Patterns are Python's re syntax run as ECMAScript regular expressions: (?P<name>...),
    \\A, \\Z and a leading (?i) are translated; lookbehind, other inline flags and named
    back-references raise ValueError.
    """
    pairs = [(getattr(pattern, "pattern", pattern), spec) for pattern, spec in rules]
    specs = _numesh._match_partition_rules(pairs, leaves_with_paths(tree), min_size, strict)
    return rebuild(tree, specs)


def optimize_sharding_for_memory(pytree: Any, mesh: Optional[Any] = None,
                                 max_memory_per_device: Optional[int] = None,
                                 names: Optional[Sequence[Any]] = None) -> Any:
    """eformer's optimize_sharding_for_memory: `pytree` with each array replaced by P() when it
    holds fewer than `max_memory_per_device` bytes (or when there is no limit), else by
    auto_partition_spec(array, mesh, names), whose names default to the mesh's axes in mesh
    order. `mesh` defaults to the current mesh (AssertionError without one). Returns a tree,
    not a dict of paths (eformer's docstring says a dict; its code returns a tree)."""
    leaves = leaves_with_paths(pytree)
    return rebuild(pytree, _numesh._optimize_sharding_for_memory(leaves, mesh, max_memory_per_device,
                                                                 names))


def validate_sharding_config(pytree: Any, partition_specs: Any, mesh: Optional[Any] = None) -> List[str]:
    """eformer's validate_sharding_config: the issues of `partition_specs` (a tree of specs with
    `pytree`'s structure) in leaf order: "Array at <key path> with shape <shape> not divisible
    by mesh axis <axis> size <n>" and "Small array at <key path> might not benefit from
    sharding". A tuple entry is checked against the product of its axes (eformer raises
    KeyError). Raises KeyError for an axis the mesh lacks, IndexError for a spec longer than
    the rank."""
    leaves = leaves_with_paths(pytree)
    return _numesh._validate_sharding_config(leaves, subtrees_at_leaves(pytree, partition_specs), mesh)


def analyze_sharding_strategy(pytree: Any, partition_specs: Any, mesh: Optional[Any] = None) -> Dict[str, Any]:
    """eformer's analyze_sharding_strategy: {"total_parameters", "sharded_parameters",
    "memory_per_device", "balance_score", "partition_stats"}. eformer leaves the last three as
    placeholders; numesh fills them: the bytes each device holds (a list by device id),
    min/max of those, and {"leaves", "sharded_leaves", "replicated_leaves", "axis_usage"}."""
    leaves = leaves_with_paths(pytree)
    return _numesh._analyze_sharding_strategy(leaves, subtrees_at_leaves(pytree, partition_specs), mesh)


__all__ = [
    "match_partition_rules",
    "optimize_sharding_for_memory",
    "validate_sharding_config",
    "analyze_sharding_strategy",
]
