"""EasyDeL's sharding rules built on eformer's layer, as numesh's sharding layer implements
them (numesh/sharding/easydel.hpp): attention specs, MoE expert specs and the expert mesh,
the kernels' helpers, and the parameter specs' resolution and sanitising. Names and arguments
are EasyDeL's; EasyDeL's methods and private functions are plain functions here
(OperationImpl.get_mode is get_mode, _mesh_shape_ep is mesh_shape_ep)."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from numesh import _numesh
from numesh.common_types import MODE_TRAIN
from numesh.partition_manager import PartitionManager, _is_dynamic_class, _is_dynamic_instance


def _manager(partition_manager: Any) -> Any:
    """The C++ half of a numesh.PartitionManager; TypeError for anything else."""
    if not isinstance(partition_manager, PartitionManager):
        raise TypeError(f"Expected PartitionManager, got {type(partition_manager)}")
    return partition_manager._manager


def _shape_of(x: Any) -> Tuple[int, ...]:
    return tuple(x.shape if hasattr(x, "shape") else x)


def get_shardings(partition_manager: PartitionManager, mode: Any, layout: str = "bthd",
                  qkv_mni_sharding: bool = False, softmax_aux: Optional[Any] = None) -> "dict[str, Any]":
    """EasyDeL's OperationMetadata.get_shardings: the PartitionSpec of every attention tensor
    ("query3d", "query", "key", "value", "bias", "mask", "output", "q_segment_ids",
    "kv_segment_ids", "softmax_aux") in `mode`, for the "bthd" or "bhtd" layout. With
    `qkv_mni_sharding` keys and values take the query's heads; `softmax_aux` (an array, or
    anything with a shape) adds its spec by its rank. Raises NotImplementedError for "thd"
    (EasyDeL advertises it without implementing it) and ValueError for an int mode (EasyDeL
    gives no shape to infer it from)."""
    rank = None if softmax_aux is None else len(getattr(softmax_aux, "shape", softmax_aux))
    return _numesh._easydel_get_shardings(_manager(partition_manager), mode, layout, qkv_mni_sharding, rank)


def get_moe_partition_spec(partition_manager: PartitionManager, direction: str, tensors_are_expert: bool,
                           is_bias: bool = False, fsdp_is_ep_bound: bool = True, sp_is_ep_bound: bool = True,
                           module_view: bool = False) -> Any:
    """EasyDeL's get_moe_partition_spec: the spec of an MoE kernel ([E, in, out]) or bias
    ([E, out]). Expert-tensor mode (`tensors_are_expert`): kernel P(tp, None, None), bias
    P(tp, None). Otherwise the expert dim is on ep (with `module_view`, on (ep, sp, fsdp), sp
    and fsdp where bound): "column" kernel P(expert, None, tp), "row" P(expert, tp, None), a
    bias P(expert, tp) (the code's, not its docstring's [expert, None]). Axis names are the
    manager's. Raises ValueError "direction must be 'row' or 'column', got '<direction>'"."""
    return _numesh._easydel_get_moe_partition_spec(_manager(partition_manager), str(direction), tensors_are_expert,
                                                   is_bias, fsdp_is_ep_bound, sp_is_ep_bound, module_view)


def mesh_shape_ep(mesh: Any, partition_manager: PartitionManager, fsdp_is_ep_bound: bool = True,
                  sp_is_ep_bound: bool = True) -> Tuple[Tuple[int, int, int], Tuple[Any, Any, Any]]:
    """EasyDeL's _mesh_shape_ep: ((dp', ep', tp') sizes, (dp, ep, tp) names) of the 3-D expert
    mesh folded from `mesh`: tp stays, fsdp and sp join ep where bound, else dp."""
    return _numesh._easydel_mesh_shape_ep(mesh, _manager(partition_manager), fsdp_is_ep_bound, sp_is_ep_bound)


def create_stable_sharding(state_ps: Optional[Any] = None, preserved_indices: Optional[Sequence[int]] = None,
                           clone_ps: Optional[Any] = None, dep: Any = True, tensor: Optional[Any] = None, *,
                           mesh: Optional[Any] = None) -> Optional[Any]:
    """EasyDeL's OperationImpl.create_stable_sharding, on `mesh` (EasyDeL's metadata.mesh;
    None: no mesh, and the spec is returned uncorrected). None when `dep` or `state_ps` is
    None; else `state_ps` with only `preserved_indices` kept (taken from `clone_ps` when
    given), corrected against `tensor`'s shape when a tensor is given. Raises IndexError for a
    preserved index outside the specs."""
    shape = None if tensor is None else list(_shape_of(tensor))
    indices = None if preserved_indices is None else list(preserved_indices)
    return _numesh._easydel_create_stable_sharding(state_ps, indices, clone_ps, dep is None, shape, mesh)


def get_mode(query: Any, BTHD: bool = True) -> str:  # noqa: N803  (EasyDeL's name)
    """EasyDeL's OperationImpl.get_mode: MODE_DECODE when the query's sequence dim (1 for
    BTHD, else 2) has extent 1, else MODE_TRAIN. `query` is an array or its shape."""
    return _numesh._easydel_get_mode(_shape_of(query), BTHD)


def generalize_numeric_path(pattern: str) -> str:
    """EasyDeL's _generalize_numeric_path: the regex of a '/'-joined parameter path with any
    layer numbers and an optional prefix: "model/layers/0/mlp" -> ^(?:.*/)?model/layers/\\d+/mlp$."""
    return _numesh._easydel_generalize_numeric_path(pattern)


def sanitize_partition_spec_for_shape(spec: Any, shape: Sequence[int], mesh: Any) -> Any:
    """EasyDeL's sanitize_partition_spec_for_shape: `spec` cut to the rank, each entry whose
    axes' size product (axes `mesh` lacks count 1) is over 1 and does not divide its dim
    replaced by None. No padding, no P() for all None, missing and repeated axes kept."""
    return _numesh._easydel_sanitize_partition_spec_for_shape(spec, shape, mesh)


def resolve_safe_sharding(*, axes: Any, shape: Sequence[int], partition_manager: Optional[PartitionManager] = None,
                          mesh: Optional[Any] = None, mode: Any = MODE_TRAIN) -> Any:
    """EasyDeL's resolve_safe_sharding: `axes` (a preset, which carries its own mode, or
    semantic axes resolved in `mode`) resolved by `partition_manager` with `shape`, then, on
    `mesh` (default: the current mesh, if any), each entry whose axes' size product is over 1
    and does not divide its dim replaced by None. Returns `axes` itself, as EasyDeL does, when
    there is no manager or resolving fails."""
    manager = None if partition_manager is None else _manager(partition_manager)
    from_preset = _is_dynamic_instance(axes) or _is_dynamic_class(axes)
    rules, rules_mode = (axes.axes, axes.mode) if from_preset else (axes, mode)
    spec = _numesh._easydel_resolve_safe_sharding(list(rules), rules_mode, from_preset, tuple(shape), manager, mesh)
    return axes if spec is None else spec


__all__ = [
    "get_shardings",
    "get_moe_partition_spec",
    "mesh_shape_ep",
    "create_stable_sharding",
    "get_mode",
    "generalize_numeric_path",
    "sanitize_partition_spec_for_shape",
    "resolve_safe_sharding",
]
