"""PartitionManager: eformer's resolver of semantic axes, with its `with` and its fallbacks."""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Optional

from numesh import _numesh
from numesh._numesh import NOT_GIVEN, PartitionAxis
from numesh.presets import DynamicShardingAxes

# eformer keeps the current manager in a context variable (so other threads see none) and the
# last one created or entered in a process-wide global.
_current: contextvars.ContextVar = contextvars.ContextVar("numesh_partition_manager", default=None)
_entered: contextvars.ContextVar = contextvars.ContextVar("numesh_partition_manager_entered", default=())
_last: Optional["PartitionManager"] = None
_last_lock = threading.Lock()


def _set_last(manager: "PartitionManager") -> None:
    global _last
    with _last_lock:
        _last = manager


def _is_dynamic_instance(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _is_dynamic_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, tuple) and hasattr(value, "_fields")


def _shape_of(x: Any):
    return x.shape if hasattr(x, "shape") else x


class PartitionManager:
    """Resolves semantic axes into partition specs with one PartitionAxis (eformer's
    PartitionManager). Creating or entering one makes it the process's last manager, the
    fallback of apply_logical_sharding; ``with manager:`` makes it this context's current one.
    """

    def __init__(self, paxis: Any = NOT_GIVEN):
        self.paxis = PartitionAxis() if paxis is NOT_GIVEN else paxis
        _set_last(self)

    @property
    def paxis(self) -> PartitionAxis:
        """The PartitionAxis; assigning another one (eformer's manager is a mutable dataclass)
        changes what the manager resolves."""
        return self._paxis

    @paxis.setter
    def paxis(self, paxis: Any) -> None:
        if not isinstance(paxis, PartitionAxis):
            raise TypeError(f"Expected PartitionAxis, got {type(paxis)}")
        self._paxis = paxis
        self._manager = _numesh._PartitionManager(paxis)

    def __enter__(self) -> "PartitionManager":
        # The tokens to restore live in the context, not in the manager: one manager may be
        # entered from several threads or asyncio tasks at once.
        _entered.set(_entered.get() + ((self, _current.set(self)),))
        _set_last(self)
        return self

    def __exit__(self, *exc) -> None:
        entered = _entered.get()
        for i in range(len(entered) - 1, -1, -1):
            if entered[i][0] is self:
                _current.reset(entered[i][1])
                _entered.set(entered[:i] + entered[i + 1:])
                return

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionManager) and self.paxis == other.paxis

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self.paxis))

    def __repr__(self) -> str:
        return f"PartitionManager(paxis={self.paxis!r})"

    def _axes_and_mode(self, axes, mode, dynamic_axes):
        # eformer's precedence: a DynamicShardingAxes given as `axes` (instance or preset class)
        # moves to dynamic_axes; when axes or mode is missing, dynamic_axes supplies both.
        if dynamic_axes is NOT_GIVEN and axes is not NOT_GIVEN:
            if _is_dynamic_instance(axes):
                dynamic_axes, axes = axes, NOT_GIVEN
            elif _is_dynamic_class(axes):
                dynamic_axes, axes = DynamicShardingAxes(axes.axes, axes.mode), NOT_GIVEN
        if axes is NOT_GIVEN or mode is NOT_GIVEN:
            if dynamic_axes is NOT_GIVEN:
                raise ValueError("if axes or mode is empty you should provide dynamic axes")
            axes, mode = dynamic_axes.axes, dynamic_axes.mode
        return list(axes), mode

    def resolve(self, axes: Any = NOT_GIVEN, mode: Any = NOT_GIVEN, dynamic_axes: Any = NOT_GIVEN,
                shape: Any = NOT_GIVEN):
        """The PartitionSpec of `axes` in `mode`. An int mode names the dimension of `shape`
        whose extent decides (1: decode, else train). A preset class or DynamicShardingAxes
        may stand for both axes and mode."""
        axes, mode = self._axes_and_mode(axes, mode, dynamic_axes)
        # The shape matters only to an int mode (eformer reads shape[mode] then alone).
        by_dim = isinstance(mode, int)
        return self._manager.resolve(axes, mode, None if shape is NOT_GIVEN or not by_dim else shape)

    def shard(self, x: Any, axes: Any = NOT_GIVEN, mode: Any = NOT_GIVEN,
              dynamic_axes: Any = NOT_GIVEN, auto_correct: bool = True):
        """eformer's shard for an array `x` (or its shape): resolves with x's shape, corrects
        the spec against the current mesh when `auto_correct`, and returns the NamedSharding
        that with_sharding_constraint would apply, or None when it applies none."""
        axes, mode = self._axes_and_mode(axes, mode, dynamic_axes)
        return self._manager.shard(tuple(_shape_of(x)), axes, mode, auto_correct)


def get_current_partition_manager() -> Optional[PartitionManager]:
    """The manager of the innermost ``with manager:`` in this context, or None."""
    return _current.get()


def get_partition_manager() -> Optional[PartitionManager]:
    """The manager most recently created or entered in this process, or None."""
    return _last


def apply_logical_sharding(x: Any, partition_manager: Any = NOT_GIVEN, axes: Any = NOT_GIVEN,
                           mode: Any = NOT_GIVEN, dynamic_axes: Any = NOT_GIVEN,
                           auto_correct: bool = True):
    """shard() with `partition_manager`, else the current manager, else the last one."""
    pm = partition_manager
    if pm is NOT_GIVEN or pm is None:
        pm = get_current_partition_manager() or get_partition_manager()
    if pm is None:
        raise ValueError("No PartitionManager is available. Provide `partition_manager` or use "
                         "`with PartitionManager(...)`.")
    return pm.shard(x, axes=axes, mode=mode, dynamic_axes=dynamic_axes, auto_correct=auto_correct)
