"""JAX's view of a pytree, for numesh's whole-tree functions (match_partition_rules, the
sharding strategies, the rule classes of numesh.helpers): which values are containers, the
order of their leaves, and a leaf's '/'-joined path, as eformer's named_tree_map names it.

Containers are dicts (keys sorted, as JAX sorts them; an OrderedDict keeps its order), lists,
tuples (a namedtuple's children are named by field) and None, a container with no leaves. Any
other value is a leaf: an array, a Python scalar, a string, and a PartitionSpec (a tuple that
JAX treats as a leaf).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, List, Optional, Tuple

from numesh.partition_spec import PartitionSpec


def _is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(node, "_fields")


def _children(node: Any) -> Optional[List[Tuple[Any, Any]]]:
    """(key, child) pairs of a container in JAX's order; None for a leaf."""
    if isinstance(node, PartitionSpec):
        return None
    if isinstance(node, dict):
        keys = list(node) if isinstance(node, OrderedDict) else sorted(node)
        return [(key, node[key]) for key in keys]
    if _is_namedtuple(node):
        return list(zip(node._fields, node))
    if isinstance(node, (list, tuple)):
        return list(enumerate(node))
    return None


def leaves_with_paths(tree: Any) -> List[Tuple[str, Any]]:
    """The (path, leaf) pairs of `tree` in JAX's order; a path joins its keys with '/'
    ("model/layers/0/kernel")."""
    out: List[Tuple[str, Any]] = []

    def walk(node: Any, keys: Tuple[Any, ...]) -> None:
        if node is None:
            return
        children = _children(node)
        if children is None:
            out.append(("/".join(str(k) for k in keys), node))
            return
        for key, child in children:
            walk(child, keys + (key,))

    walk(tree, ())
    return out


def rebuild(tree: Any, leaves: List[Any]) -> Any:
    """`tree` with its leaves replaced, in JAX's order, by `leaves` (one per leaf); a None
    subtree stays None, a dict keeps its key order, a namedtuple its type."""
    remaining: Iterator[Any] = iter(leaves)

    def build(node: Any) -> Any:
        if node is None:
            return None
        children = _children(node)
        if children is None:
            return next(remaining)
        built = {key: build(child) for key, child in children}
        if isinstance(node, dict):
            return {key: built[key] for key in node}
        if _is_namedtuple(node):
            return type(node)(**built)
        values = [built[i] for i in range(len(node))]
        return values if isinstance(node, list) else tuple(values)

    return build(tree)


def subtrees_at_leaves(tree: Any, other: Any) -> List[Any]:
    """What `other`, a tree with `tree`'s structure (or deeper), holds at each leaf of `tree`,
    in JAX's order: the specs of a pytree's leaves, as JAX's tree_map(f, tree, other) pairs
    them. Raises ValueError naming the first path `other` lacks."""
    out: List[Any] = []

    def walk(node: Any, along: Any, keys: Tuple[Any, ...]) -> None:
        if node is None:
            return
        children = _children(node)
        if children is None:
            out.append(along)
            return
        for key, child in children:
            try:
                sub = getattr(along, key) if _is_namedtuple(along) else along[key]
            except (KeyError, IndexError, TypeError, AttributeError):
                path = "/".join(str(k) for k in keys + (key,))
                raise ValueError(f"the specs have no entry at '{path}' of the tree") from None
            walk(child, sub, keys + (key,))

    walk(tree, other, ())
    return out


__all__ = ["leaves_with_paths", "rebuild", "subtrees_at_leaves"]
