#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "conversions.hpp"
#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/easydel.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/presets.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

// Every function here is private: numesh.easydel (python/numesh/easydel.py) gives each its
// EasyDeL name and signature, and passes the Python PartitionManager's C++ half.

namespace numesh::python {

namespace {

namespace ed = sharding::easydel;
using sharding::Mesh;
using sharding::PartitionManager;
using sharding::PartitionSpec;

void bind_attention(py::module_& m) {
  m.def(
      "_easydel_get_shardings",
      [](const PartitionManager& pm, const py::object& mode, const std::string& layout,
         bool qkv_mni_sharding, std::optional<std::size_t> softmax_aux_rank) {
        const auto r =
            ed::get_shardings(pm, to_mode_arg(mode), layout, qkv_mni_sharding, softmax_aux_rank);
        py::dict out;
        out["query3d"] = r.query3d;
        out["query"] = r.query;
        out["key"] = r.key;
        out["value"] = r.value;
        out["bias"] = r.bias;
        out["mask"] = r.mask;
        out["output"] = r.output;
        out["q_segment_ids"] = r.q_segment_ids;
        out["kv_segment_ids"] = r.kv_segment_ids;
        out["softmax_aux"] = r.softmax_aux ? py::cast(*r.softmax_aux) : py::object(py::none());
        return out;
      },
      "partition_manager"_a, "mode"_a, "layout"_a, "qkv_mni_sharding"_a, "softmax_aux_rank"_a,
      "OperationMetadata.get_shardings: the attention tensors' specs by name.");
}

void bind_moe(py::module_& m) {
  m.def(
      "_easydel_get_moe_partition_spec",
      [](const PartitionManager& pm, const std::string& direction, bool tensors_are_expert,
         bool is_bias, bool fsdp_is_ep_bound, bool sp_is_ep_bound, bool module_view) {
        ed::MoeSpecOptions options;
        options.tensors_are_expert = tensors_are_expert;
        options.is_bias = is_bias;
        options.fsdp_is_ep_bound = fsdp_is_ep_bound;
        options.sp_is_ep_bound = sp_is_ep_bound;
        options.module_view = module_view;
        return ed::get_moe_partition_spec(pm, direction, options);
      },
      "partition_manager"_a, "direction"_a, "tensors_are_expert"_a, "is_bias"_a,
      "fsdp_is_ep_bound"_a, "sp_is_ep_bound"_a, "module_view"_a,
      "get_moe_partition_spec: the spec of an MoE expert kernel or bias.");
  m.def(
      "_easydel_mesh_shape_ep",
      [](const Mesh& mesh, const PartitionManager& pm, bool fsdp_is_ep_bound, bool sp_is_ep_bound) {
        const auto s = ed::mesh_shape_ep(mesh, pm, fsdp_is_ep_bound, sp_is_ep_bound);
        return py::make_tuple(py::make_tuple(s.sizes[0], s.sizes[1], s.sizes[2]),
                              py::make_tuple(s.names[0], s.names[1], s.names[2]));
      },
      "mesh"_a, "partition_manager"_a, "fsdp_is_ep_bound"_a, "sp_is_ep_bound"_a,
      "_mesh_shape_ep: ((dp', ep', tp') sizes, their names) of the folded expert mesh.");
}

void bind_operation_helpers(py::module_& m) {
  m.def(
      "_easydel_create_stable_sharding",
      [](std::optional<PartitionSpec> state_ps,
         std::optional<std::vector<std::int64_t>> preserved_indices,
         std::optional<PartitionSpec> clone_ps, bool dep_is_none,
         std::optional<std::vector<std::int64_t>> tensor_shape, const std::optional<Mesh>& mesh) {
        ed::StableShardingArgs args;
        args.state_ps = std::move(state_ps);
        args.preserved_indices = std::move(preserved_indices);
        args.clone_ps = std::move(clone_ps);
        args.dep_is_none = dep_is_none;
        args.tensor_shape = std::move(tensor_shape);
        return ed::create_stable_sharding(args, mesh);
      },
      "state_ps"_a, "preserved_indices"_a, "clone_ps"_a, "dep_is_none"_a, "tensor_shape"_a,
      "mesh"_a, "OperationImpl.create_stable_sharding on `mesh` (None: no mesh).");
  m.def(
      "_easydel_get_mode",
      [](const py::object& query_shape, bool bthd) {
        return std::string(sharding::mode_string(ed::get_mode(to_shape(query_shape), bthd)));
      },
      "query_shape"_a, "bthd"_a, "OperationImpl.get_mode: the mode a query's shape implies.");
  m.def("_easydel_generalize_numeric_path", &ed::generalize_numeric_path, "pattern"_a,
        "_generalize_numeric_path: the regex of a '/'-joined path with any layer numbers.");
}

void bind_parameter_rules(py::module_& m) {
  m.def(
      "_easydel_sanitize_partition_spec_for_shape",
      [](const PartitionSpec& spec, const py::object& shape, const Mesh& mesh) {
        return ed::sanitize_partition_spec_for_shape(spec, to_shape(shape), mesh);
      },
      "spec"_a, "shape"_a, "mesh"_a,
      "sanitize_partition_spec_for_shape: `spec` cut to the rank, indivisible entries None.");
  m.def(
      "_easydel_resolve_safe_sharding",
      [](const std::vector<sharding::AxisRule>& axes, const py::object& mode, bool from_preset,
         const py::object& shape, const PartitionManager* pm,
         const std::optional<Mesh>& mesh) -> std::optional<PartitionSpec> {
        // A preset resolves in its own mode, with EasyDeL's fallbacks; plain axes in `mode`.
        if (from_preset) {
          const sharding::DynamicShardingAxes preset{axes, to_mode_arg(mode)};
          return ed::resolve_safe_sharding(preset, to_shape(shape), pm, mesh);
        }
        return ed::resolve_safe_sharding(axes, to_shape(shape), pm, mesh, to_mode_arg(mode));
      },
      "axes"_a, "mode"_a, "from_preset"_a, "shape"_a, "partition_manager"_a, "mesh"_a,
      "resolve_safe_sharding: the safe spec, or None where EasyDeL returns `axes` unchanged.");
}

}  // namespace

void bind_easydel(py::module_& m) {
  bind_attention(m);
  bind_moe(m);
  bind_operation_helpers(m);
  bind_parameter_rules(m);
}

}  // namespace numesh::python
