"""numesh: a task-graph runtime for NUMA CPU machines, with eformer's partition layer.

The sharding vocabulary is eformer's, with its names and behaviour::

    import numesh
    paxis = numesh.PartitionAxis()
    paxis.resolve_spec([numesh.BATCH, numesh.QUERY_LENGTH, numesh.EMBED], numesh.MODE_TRAIN)
    # P(('fsdp', 'dp'), 'sp', 'tp')
"""

from numesh import _numesh, easydel
from numesh._numesh import (
    DeviceMesh,
    MeshPartitionHelper,
    DuplicateSpecError,
    Error,
    Mesh,
    NamedSharding,
    PartitionAxis,
    Topology,
    Trainer,
    auto_partition_spec,
    calculate_host_mesh_shape,
    create_mesh,
    fill_minus_one_to_target,
    get_corrected_named_sharding,
    get_incontext_mesh,
    parse_mesh_from_string,
    vrn_auto_partition_spec,
    with_sharding_constraint,
)
from numesh.common_types import *  # noqa: F401,F403  (eformer's constants, by name)
from numesh.common_types import NOT_GIVEN
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

__version__ = "0.1.0"
