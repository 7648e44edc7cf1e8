"""EasyDeL's sharding rules built on eformer's layer, as numesh's sharding layer implements
them (numesh/sharding/easydel.hpp)."""

from __future__ import annotations

from typing import Any, Optional

from numesh import _numesh
from numesh.partition_manager import PartitionManager


def get_shardings(partition_manager: PartitionManager, mode: Any, layout: str = "bthd",
                  qkv_mni_sharding: bool = False, softmax_aux: Optional[Any] = None) -> "dict[str, Any]":
    """EasyDeL's OperationMetadata.get_shardings: the PartitionSpec of every attention tensor
    ("query3d", "query", "key", "value", "bias", "mask", "output", "q_segment_ids",
    "kv_segment_ids", "softmax_aux") in `mode`, for the "bthd" or "bhtd" layout. With
    `qkv_mni_sharding` keys and values take the query's heads; `softmax_aux` (an array, or
    anything with a shape) adds its spec by its rank. Raises NotImplementedError for "thd"
    (EasyDeL advertises it without implementing it) and ValueError for an int mode (EasyDeL
    gives no shape to infer it from)."""
    if not isinstance(partition_manager, PartitionManager):
        raise TypeError(f"Expected PartitionManager, got {type(partition_manager)}")
    rank = None if softmax_aux is None else len(getattr(softmax_aux, "shape", softmax_aux))
    return _numesh._easydel_get_shardings(partition_manager._manager, mode, layout, qkv_mni_sharding, rank)


__all__ = ["get_shardings"]
