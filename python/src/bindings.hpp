#pragma once

#include <pybind11/pybind11.h>

#include "numesh/runtime/device_mesh.hpp"

/// The parts of the numesh._numesh extension module, one function per area, each in its own
/// file (bind_<area>.cpp); module.cpp calls them in order.
namespace numesh::python {

/// numesh.Error, numesh.DuplicateSpecError and the translation of numesh's errors into the
/// Python exceptions eformer raises.
void bind_errors(pybind11::module_& m);

/// eformer's partition layer: the semantic-axis constants and modes, PartitionAxis, the
/// resolution entry points of PartitionManager, the DynamicShardingAxes presets, Mesh,
/// create_mesh, NamedSharding, get_corrected_named_sharding and the small mesh helpers
/// (get_axes_size_in_mesh, get_safe_hash_int, ...).
void bind_sharding(pybind11::module_& m);

/// eformer's whole-tree rules over flattened pytrees: match_partition_rules,
/// create_pattern_based_partition_spec, the sharding strategies of auto_spec
/// (optimize_sharding_for_memory, validate_sharding_config, analyze_sharding_strategy,
/// convert_sharding_strategy), and escale.helpers' rule classes and ShardingAnalyzer.
void bind_rules(pybind11::module_& m);

/// EasyDeL's rules on eformer's layer (the attention tensors' specs), under numesh.easydel.
void bind_easydel(pybind11::module_& m);

/// The machine: Topology (hwloc's view) and DeviceMesh (devices laid out as a named mesh).
void bind_runtime(pybind11::module_& m);

/// The models: CausalLM (from_pretrained, logits, generate) and its Tokenizer.
void bind_models(pybind11::module_& m);

/// Training: Trainer (numesh train's options, step on NumPy rows, save).
void bind_training(pybind11::module_& m);

/// The server: numesh.serve and Server (serve::Service, as `numesh serve` runs it).
void bind_serve(pybind11::module_& m);

/// The layers of `numesh op` on NumPy arrays: numesh.ops.run and LayerRun.
void bind_ops(pybind11::module_& m);

/// The mesh a call defaults to: the machine's devices (hwloc's NUMA nodes) on the tp axis of
/// [dp, ep, tp] = [1, 1, n], as DeviceMesh() gives.
[[nodiscard]] runtime::DeviceMesh default_device_mesh();

}  // namespace numesh::python
