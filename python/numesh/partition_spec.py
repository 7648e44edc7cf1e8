"""PartitionSpec: JAX's partition spec, as eformer uses it."""

from __future__ import annotations

from numesh import _numesh

UNCONSTRAINED = _numesh.UNCONSTRAINED


class PartitionSpec(tuple):
    """A partition spec: one entry per tensor dimension, each None (replicated), a mesh axis
    name, or a tuple of mesh axis names (sharded over their product). ``P()`` is fully
    replicated whatever the rank.

    Entries are canonicalised as JAX 0.9.2 does: a falsy entry (None, "", (), [], 0) becomes
    None, a tuple or list of one member becomes that member, a longer list a tuple; a tuple
    inside a tuple raises ValueError. A PartitionSpec is a tuple of its entries (``len``,
    iteration, ``[i]``; ``P(...)[:k]`` is a plain tuple) but, as in JAX since 2026-04, equals
    only another PartitionSpec: ``P('dp') != ('dp',)``, and ``P(None) != P()``.
    """

    __slots__ = ()

    UNCONSTRAINED = UNCONSTRAINED

    def __new__(cls, *entries):
        return tuple.__new__(cls, _numesh._canonical_entries(list(entries)))

    @classmethod
    def _from_canonical(cls, entries: tuple) -> "PartitionSpec":
        # Entries that are canonical already (the C++ layer's results): no second pass.
        return tuple.__new__(cls, entries)

    def __repr__(self) -> str:
        # JAX's repr is P followed by the tuple of the entries as they are stored.
        return "P" + tuple.__repr__(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionSpec) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


P = PartitionSpec
