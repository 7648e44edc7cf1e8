"""numesh: a task-graph runtime for NUMA CPU machines, with eformer's partition layer.

The sharding vocabulary is eformer's, with its names and behaviour::

    import numesh
    paxis = numesh.PartitionAxis()
    paxis.resolve_spec([numesh.BATCH, numesh.QUERY_LENGTH, numesh.EMBED], numesh.MODE_TRAIN)
    # P(('fsdp', 'dp'), 'sp', 'tp')
"""

from numesh import _numesh, easydel, helpers, ops, pytree, rules
from numesh._numesh import (
    DeviceMesh,
    MeshPartitionHelper,
    DuplicateSpecError,
    Error,
    IoError,
    Mesh,
    NamedSharding,
    PartitionAxis,
    Server,
    ShapeError,
    PatternPartitionSpec,
    Topology,
    Trainer,
    auto_partition_spec,
    calculate_host_mesh_shape,
    convert_sharding_strategy,
    create_mesh,
    create_pattern_based_partition_spec,
    fill_minus_one_to_target,
    from_bf16,
    get_axes_size_in_mesh,
    get_corrected_named_sharding,
    get_incontext_mesh,
    get_mesh_axis_names,
    get_mesh_axis_size,
    get_names_from_partition_spec,
    get_safe_hash_int,
    get_submesh_device_index,
    names_in_current_mesh,
    parse_mesh_from_string,
    serve,
    to_bf16,
    vrn_auto_partition_spec,
    with_sharding_constraint,
)
from numesh.common_types import *  # noqa: F401,F403  (eformer's constants, by name)
from numesh.common_types import NOT_GIVEN
from numesh.helpers import (
    AutoShardingRule,
    CompositeShardingRule,
    MemoryConstrainedShardingRule,
    ShapeBasedShardingRule,
    ShardingAnalyzer,
    ShardingRule,
)
from numesh.partition_manager import (
    PartitionManager,
    apply_logical_sharding,
    get_current_partition_manager,
    get_partition_manager,
)
from numesh.models import CausalLM, Tokenizer
from numesh.partition_spec import P, PartitionSpec
from numesh.presets import *  # noqa: F401,F403  (DynamicShardingAxes and the presets)
from numesh.presets import DynamicShardingAxes
from numesh.rules import (
    analyze_sharding_strategy,
    match_partition_rules,
    optimize_sharding_for_memory,
    validate_sharding_config,
)

__version__ = "0.1.0"
