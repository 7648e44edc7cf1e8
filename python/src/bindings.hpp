#pragma once

#include <pybind11/pybind11.h>

/// The parts of the numesh._numesh extension module, one function per area, each in its own
/// file (bind_<area>.cpp); module.cpp calls them in order.
namespace numesh::python {

/// numesh.Error, numesh.DuplicateSpecError and the translation of numesh's errors into the
/// Python exceptions eformer raises.
void bind_errors(pybind11::module_& m);

/// eformer's partition layer: the semantic-axis constants and modes, PartitionAxis, the
/// resolution entry points of PartitionManager, the DynamicShardingAxes presets, Mesh,
/// create_mesh, NamedSharding and get_corrected_named_sharding.
void bind_sharding(pybind11::module_& m);

/// EasyDeL's rules on eformer's layer (the attention tensors' specs), under numesh.easydel.
void bind_easydel(pybind11::module_& m);

/// The machine: Topology (hwloc's view) and DeviceMesh (devices laid out as a named mesh).
void bind_runtime(pybind11::module_& m);

/// The models: CausalLM (from_pretrained, logits, generate) and its Tokenizer.
void bind_models(pybind11::module_& m);

/// Training: Trainer (numesh train's options, step on NumPy rows, save).
void bind_training(pybind11::module_& m);

}  // namespace numesh::python
