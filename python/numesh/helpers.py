"""eformer.escale.helpers: rules that map every leaf of a pytree to a spec, and
ShardingAnalyzer. Each class here holds its C++ rule (numesh's sharding layer); `apply`
flattens the tree in JAX's order (numesh.pytree) and rebuilds the specs in its structure.

Where eformer crashes, numesh does what its code evidently means (docs/eformer-compat.md):
AutoShardingRule's default minimum size is the device count and it tries axes in the order
given (eformer iterates a set); estimate_memory_usage divides by the device count; a tuple
entry counts as the product of its axes.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Sequence

from numesh import _numesh
from numesh.pytree import leaves_with_paths, rebuild, subtrees_at_leaves


class ShardingRule(abc.ABC):
    """eformer's ShardingRule: `apply(pytree)` gives a tree of specs of the same structure.
    Subclass it for a rule of your own; CompositeShardingRule combines numesh's rules only."""

    @abc.abstractmethod
    def apply(self, pytree: Any) -> Any:
        """A tree with `pytree`'s structure whose leaves are the specs of its leaves."""


class _NumeshRule(ShardingRule):
    _rule: Any

    def apply(self, pytree: Any) -> Any:
        return rebuild(pytree, self._rule.apply(leaves_with_paths(pytree)))


class AutoShardingRule(_NumeshRule):
    """Arrays of at least `min_shard_size` elements (default: the device count) have their
    dims, largest first (`reverse`: smallest), each take the first remaining axis of
    `axis_names` (default: the mesh's, in mesh order) whose size divides them. `mesh`
    defaults to the current mesh (AssertionError without one)."""

    def __init__(self, mesh: Optional[Any] = None, axis_names: Optional[Sequence[str]] = None,
                 min_shard_size: Optional[int] = None, reverse: bool = False):
        self._rule = _numesh._AutoShardingRule(mesh, None if axis_names is None else list(axis_names),
                                               min_shard_size, reverse)


class MemoryConstrainedShardingRule(_NumeshRule):
    """Arrays over `max_memory_per_device` bytes are split, largest dim first, over the
    largest axes that divide them until they fit; smaller arrays get P()."""

    def __init__(self, max_memory_per_device: int, mesh: Optional[Any] = None,
                 axis_names: Optional[Sequence[str]] = None):
        self._rule = _numesh._MemoryConstrainedShardingRule(
            max_memory_per_device, mesh, None if axis_names is None else list(axis_names))


class ShapeBasedShardingRule(_NumeshRule):
    """`shape_patterns` maps shape patterns (tuples of extents, None matching any) to specs:
    an array takes the spec of the first pattern of its rank that matches, else P()."""

    def __init__(self, shape_patterns: Dict[Any, Any]):
        self._rule = _numesh._ShapeBasedShardingRule(list(shape_patterns.items()))


class CompositeShardingRule(_NumeshRule):
    """Every rule is applied; each leaf takes the first spec that is not P(), else P().
    Raises TypeError for a rule that is not one of numesh's."""

    def __init__(self, *rules: ShardingRule):
        for rule in rules:
            if not isinstance(rule, _NumeshRule):
                raise TypeError(f"CompositeShardingRule combines numesh's rules, got {type(rule)}")
        self.rules = rules
        self._rule = _numesh._CompositeShardingRule([rule._rule for rule in rules])


class ShardingAnalyzer:
    """Checks specs against a pytree's shapes on `mesh` (default: the current mesh;
    AssertionError without one) and estimates their memory."""

    def __init__(self, mesh: Optional[Any] = None):
        self._analyzer = _numesh._ShardingAnalyzer(mesh)

    def validate_partition_specs(self, pytree: Any, partition_specs: Any) -> List[str]:
        """The issues, "Array shape <shape> not divisible by mesh axis <axis> size <n>", of each
        entry of a spec other than P() whose axes do not divide its dim (`partition_specs` has
        `pytree`'s structure). Raises KeyError for an axis the mesh lacks."""
        leaves = leaves_with_paths(pytree)
        return self._analyzer.validate_partition_specs(leaves, subtrees_at_leaves(pytree, partition_specs))

    def estimate_memory_usage(self, pytree: Any, partition_specs: Any) -> Dict[str, int]:
        """{"total_size": the bytes of every array divided by its spec's axis sizes,
        "size_per_device": total_size // the device count}."""
        leaves = leaves_with_paths(pytree)
        return self._analyzer.estimate_memory_usage(leaves, subtrees_at_leaves(pytree, partition_specs))


__all__ = [
    "ShardingRule",
    "AutoShardingRule",
    "MemoryConstrainedShardingRule",
    "ShapeBasedShardingRule",
    "CompositeShardingRule",
    "ShardingAnalyzer",
]
