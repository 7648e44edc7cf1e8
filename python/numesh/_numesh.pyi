# Type stubs of numesh._numesh, the C++ half of the package (pybind11). Written by hand; the
# test test_stubs.py checks that every public name of the module and of its classes is here.
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from numesh.partition_spec import PartitionSpec

AxisValue = Union[None, str, int, "tuple[Any, ...]", "list[Any]", "_NotGivenType", "_UnconstrainedType"]
Ids = Union[Sequence[int], npt.NDArray[np.integer]]

class _NotGivenType: ...
class _UnconstrainedType: ...

NOT_GIVEN: _NotGivenType
UNCONSTRAINED: _UnconstrainedType
MIN_SHARDING_SIZE: int
DEFAULT_MASK_VALUE: float

class Error(Exception): ...
class DuplicateSpecError(Exception): ...
class ShapeError(Error, ValueError): ...
class IoError(Error, OSError): ...

class PartitionAxis:
    data_parallel_axis: AxisValue
    fully_sharded_data_parallel_axis: AxisValue
    tensor_parallel_axis: AxisValue
    sequence_parallel_axis: AxisValue
    expert_parallel_axis: AxisValue
    batch_axis: AxisValue
    sequence_axis: AxisValue
    query_sequence_axis: AxisValue
    head_axis: AxisValue
    kv_head_axis: AxisValue
    key_sequence_axis: AxisValue
    hidden_state_axis: AxisValue
    mlp_intermediate_axis: AxisValue
    vocab_axis: AxisValue
    expert_axis: AxisValue
    expert_gate_axis: AxisValue
    attention_dim_axis: AxisValue
    attention_kv_dim_axis: AxisValue
    bias_head_sequence_axis: AxisValue
    bias_key_sequence_axis: AxisValue
    decode_batch_axis: AxisValue
    decode_query_sequence_axis: AxisValue
    decode_head_axis: AxisValue
    decode_kv_head_axis: AxisValue
    decode_key_sequence_axis: AxisValue
    decode_attention_dim_axis: AxisValue
    decode_attention_kv_dim_axis: AxisValue
    def __init__(self, *args: AxisValue, **fields: AxisValue) -> None: ...
    def resolve_spec(self, axes: Sequence[AxisValue], mode: Any) -> PartitionSpec: ...
    def resolve_axis(self, axes: Sequence[AxisValue], mode: Any) -> "list[AxisValue]": ...
    def replace(self, **fields: AxisValue) -> "PartitionAxis": ...
    def to_dict(self) -> "dict[str, AxisValue]": ...
    @staticmethod
    def register(semantic_axis: Any, axis_rule: AxisValue, *, generation_axis_rule: AxisValue = ...,
                 override: bool = False) -> None: ...
    @staticmethod
    def unregister(semantic_axis: Any, *, missing_ok: bool = True) -> None: ...
    @staticmethod
    def clear_registered_axes() -> None: ...
    @staticmethod
    def get_registered_axes() -> "dict[str, dict[str, AxisValue]]": ...

class _PartitionManager:
    paxis: PartitionAxis
    def __init__(self, paxis: PartitionAxis) -> None: ...
    def resolve(self, axes: Sequence[AxisValue], mode: Any, shape: Optional[Sequence[int]] = None) -> PartitionSpec: ...
    def shard(self, shape: Sequence[int], axes: Sequence[AxisValue], mode: Any,
              auto_correct: bool = True) -> Optional["NamedSharding"]: ...

class Mesh:
    axis_names: "tuple[str, ...]"
    axis_sizes: "tuple[int, ...]"
    shape: "dict[str, int]"
    size: int
    empty: bool
    def __init__(self, axis_names: Sequence[str], axis_sizes: Sequence[int]) -> None: ...
    def __enter__(self) -> "Mesh": ...
    def __exit__(self, *exc: Any) -> None: ...

class NamedSharding:
    mesh: Mesh
    spec: PartitionSpec
    def __init__(self, mesh: Mesh, spec: PartitionSpec) -> None: ...

def get_incontext_mesh(raise_error: bool = True) -> Mesh: ...
def get_safe_hash_int(text: Any, algorithm: str = "md5") -> int: ...
def get_axes_size_in_mesh(axis_names: AxisValue, mesh: Optional[Mesh] = None) -> int: ...
def get_mesh_axis_names(mesh: Optional[Mesh] = None) -> "list[str]": ...
def names_in_current_mesh(*names: Any) -> bool: ...
def get_names_from_partition_spec(partition_specs: Any) -> "list[str]": ...
def get_mesh_axis_size(axis_names: Union[str, Sequence[str]], *, mesh: Optional[Mesh] = None) -> int: ...
def get_submesh_device_index(axis_names: Union[str, Sequence[str]], *, device_coords: Sequence[int],
                             mesh: Optional[Mesh] = None) -> int: ...
def calculate_host_mesh_shape(global_mesh_shape: Sequence[int], total_devices: int,
                              num_processes: int) -> "list[int]": ...
def fill_minus_one_to_target(shape: Sequence[int], target: int) -> "list[int]": ...
def parse_mesh_from_string(axis_dims: str, names: Sequence[str]) -> "tuple[tuple[int, ...], tuple[str, ...]]": ...

class MeshPartitionHelper:
    mesh: Mesh
    def __init__(self, mesh: Mesh) -> None: ...
    def suggest_methods(self, shape: Sequence[int]) -> "list[tuple[str, ...]]": ...
    def create_partition_spec(self, shape: Sequence[int], methods: Sequence[Sequence[str]],
                              min_shard_size: int = 1024) -> PartitionSpec: ...
def create_mesh(axis_dims: Sequence[int] = ..., axis_names: Sequence[str] = ..., *,
                device_count: Optional[int] = None, process_count: int = 1,
                dcn_mesh_dims: Optional[Sequence[int]] = None) -> Mesh: ...
def get_corrected_named_sharding(shape: Sequence[int], partition_spec: PartitionSpec,
                                 raise_mesh_error: bool = True) -> NamedSharding: ...
def auto_partition_spec(x: Any, mesh: Optional[Mesh] = None, names: Optional[Sequence[AxisValue]] = None,
                        min_sharding_size: Optional[int] = None, reverse: bool = False) -> PartitionSpec: ...
def vrn_auto_partition_spec(x: Any, mesh: Optional[Mesh] = None, names: Optional[Sequence[AxisValue]] = None,
                            min_sharding_size: Optional[int] = None, reverse: bool = False) -> PartitionSpec: ...
def with_sharding_constraint(x: Any, sharding: Union[PartitionSpec, NamedSharding]) -> Optional[NamedSharding]: ...

# Rules over flattened pytrees: `leaves` is a list of (path, leaf) pairs (numesh.pytree).
Leaves = Sequence["tuple[str, Any]"]

class PatternPartitionSpec:
    rules: "list[tuple[str, PartitionSpec]]"
    default_spec: PartitionSpec
    def __call__(self, name: str, array: Any = None) -> PartitionSpec: ...

def create_pattern_based_partition_spec(pattern: str, mesh: Optional[Mesh] = None,
                                        default_spec: Optional[PartitionSpec] = None) -> PatternPartitionSpec: ...
def convert_sharding_strategy(array: Any, old_partition_specs: "dict[Any, PartitionSpec]", old_mesh: Mesh,
                              new_mesh: Mesh, strategy: str = "preserve_balance") -> "dict[str, PartitionSpec]": ...

class _ShardingRule:
    def apply(self, leaves: Leaves) -> "list[PartitionSpec]": ...
class _AutoShardingRule(_ShardingRule):
    def __init__(self, mesh: Optional[Mesh], axis_names: Optional[Sequence[str]], min_shard_size: Optional[int],
                 reverse: bool) -> None: ...
class _MemoryConstrainedShardingRule(_ShardingRule):
    def __init__(self, max_memory_per_device: int, mesh: Optional[Mesh], axis_names: Optional[Sequence[str]]) -> None: ...
class _ShapeBasedShardingRule(_ShardingRule):
    def __init__(self, shape_patterns: Sequence["tuple[Sequence[Optional[int]], PartitionSpec]"]) -> None: ...
class _CompositeShardingRule(_ShardingRule):
    def __init__(self, rules: Sequence[_ShardingRule]) -> None: ...

class _ShardingAnalyzer:
    def __init__(self, mesh: Optional[Mesh]) -> None: ...
    def validate_partition_specs(self, leaves: Leaves, specs: Sequence[PartitionSpec]) -> "list[str]": ...
    def estimate_memory_usage(self, leaves: Leaves, specs: Sequence[PartitionSpec]) -> "dict[str, int]": ...

class Topology:
    source: str
    origin: str
    can_bind: bool
    numa_nodes: "list[dict[str, Any]]"
    cores: int
    pus: int
    notes: "list[str]"
    @staticmethod
    def discover() -> "Topology": ...
    @staticmethod
    def from_synthetic(description: str) -> "Topology": ...
    @staticmethod
    def from_xml(path: str) -> "Topology": ...

class DeviceMesh:
    mesh: Mesh
    size: int
    devices: "list[dict[str, Any]]"
    def __init__(self, dims: Sequence[int] = (1, 1, -1), names: Sequence[str] = ("dp", "ep", "tp"), *,
                 policy: str = "numa", smt: bool = False, threads: int = 0,
                 topology: Optional[Topology] = None) -> None: ...

class Tokenizer:
    vocab_size: int
    kind: str
    def encode(self, text: str, add_special_tokens: bool = True) -> "list[int]": ...
    def decode(self, ids: Ids, skip_special_tokens: bool = True) -> str: ...

class CausalLM:
    tokenizer: Optional[Tokenizer]
    vocab_size: int
    max_context: int
    dtype: str
    mesh: DeviceMesh
    path: str
    @staticmethod
    def from_pretrained(path: str, *, dtype: Optional[str] = None, mesh: Optional[DeviceMesh] = None,
                        partition_axis: Optional[PartitionAxis] = None, context: int = 0,
                        batch: int = 1, mmap: str = "auto", kv_dtype: str = "f32",
                        prefill_chunk: int = 512, progress: bool = True) -> "CausalLM": ...
    def logits(self, ids: Union[Ids, Sequence[Ids], npt.NDArray[np.integer]]) -> npt.NDArray[np.float32]: ...
    def generate(self, prompt: Union[str, Ids], *, max_new_tokens: int = 32, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 1.0, seed: int = 0, stop_ids: Optional[Sequence[int]] = None,
                 on_token: Optional[Callable[[int], None]] = None) -> "dict[str, Any]": ...
    def stream(self, prompt: Union[str, Ids], **options: Any) -> Iterator[int]: ...

class Trainer:
    steps: int
    last_step: Optional["dict[str, float]"]
    parameter_count: int
    def __init__(self, model: str, *, batch: int, tokens: int, mesh: Optional[DeviceMesh] = None,
                 partition_axis: Optional[PartitionAxis] = None, mode: Any = "__train__",
                 init: str = "checkpoint", seed: int = 0, lr: float = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2, clip: float = 1.0,
                 warmup: int = 0, total_steps: int = 1, schedule: str = "constant", dtype: str = "f32",
                 router_aux_loss_coef: Optional[float] = None, progress: bool = True) -> None: ...
    def step(self, rows: npt.NDArray[np.int32]) -> float: ...
    def save(self, dir: str) -> None: ...

Array = npt.NDArray[Any]

def to_bf16(array: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]: ...
def from_bf16(array: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]: ...

class LayerRun:
    y: npt.NDArray[np.float32]
    reference: Optional[npt.NDArray[np.float32]]
    plan: str
    seconds: float
    tokens_per_expert: list[int]
    dropped: int

def run_layer(op: str, x: Array, inputs: "dict[str, Array]", *, mesh: Optional[DeviceMesh] = None,
              partition_axis: Optional[PartitionAxis] = None, mode: str = "prefill",
              position: int = -1, kv_layout: str = "bthd", dtype: str = "f32", heads: int = 0,
              kv_heads: int = 0, rope_theta: float = 10000.0, top_k: int = 2,
              capacity: float = 0.0, renormalize: bool = True, norm_eps: float = 1e-6,
              repeats: int = 1, check: bool = True) -> LayerRun: ...

class Server:
    port: int
    url: str
    model_name: str
    def stop(self) -> None: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def __enter__(self) -> "Server": ...
    def __exit__(self, *args: Any) -> None: ...

def serve(model: str, *, host: str = "127.0.0.1", port: int = 8080, parallel: int = 8,
          ctx_size: int = 0, kv_cache_tokens: int = 0, batch_tokens: int = 256,
          block_size: int = 16, max_queue: int = 64, prefix_cache: bool = True,
          dtype: Optional[str] = None, mesh: Optional[DeviceMesh] = None,
          partition_axis: Optional[PartitionAxis] = None, mode: Any = "__autoregressive__",
          api_key: str = "", model_name: str = "", chat_template: Optional[str] = None,
          http_threads: int = 0, mmap: str = "auto", kv_dtype: str = "f32") -> Server: ...
