#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "conversions.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"
#include "numesh/sharding/auto_spec.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/mesh_creation.hpp"
#include "numesh/sharding/mesh_helpers.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/presets.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

using sharding::AxisRule;
using sharding::Mesh;
using sharding::NamedSharding;
using sharding::PartitionAxis;
using sharding::PartitionManager;
using sharding::PartitionSpec;

using Kwargs = std::vector<std::pair<std::string, AxisRule>>;

Kwargs to_kwargs(const py::kwargs& kwargs) {
  Kwargs out;
  for (const auto& [key, value] : kwargs) {
    out.emplace_back(key.cast<std::string>(), to_axis_rule(value));
  }
  return out;
}

// eformer's PartitionAxis is a dataclass: positional arguments fill the fields in order, and
// Python's own messages refuse too many or a field given twice.
PartitionAxis make_partition_axis(const py::args& args, const py::kwargs& kwargs) {
  const auto names = PartitionAxis::field_names();
  if (args.size() > names.size()) {
    throw TypeError("PartitionAxis.__init__() takes from 1 to " + std::to_string(names.size() + 1) +
                    " positional arguments but " + std::to_string(args.size() + 1) + " were given");
  }
  Kwargs all;
  for (std::size_t i = 0; i < args.size(); ++i) {
    all.emplace_back(std::string(names[i]), to_axis_rule(args[i]));
  }
  for (auto& [key, value] : to_kwargs(kwargs)) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (key == names[i]) {
        throw TypeError("PartitionAxis.__init__() got multiple values for argument '" + key + "'");
      }
    }
    all.emplace_back(std::move(key), std::move(value));
  }
  return PartitionAxis::from_kwargs(all);
}

// The dataclass repr: PartitionAxis(data_parallel_axis='dp', ...,
// decode_attention_kv_dim_axis=None).
std::string partition_axis_repr(const PartitionAxis& pa) {
  std::string out = "PartitionAxis(";
  bool first = true;
  for (const std::string_view name : PartitionAxis::field_names()) {
    if (!first) out += ", ";
    first = false;
    out += std::string(name) + "=" +
           py::repr(from_axis_rule(*pa.find_field(name))).cast<std::string>();
  }
  return out + ")";
}

py::dict partition_axis_dict(const PartitionAxis& pa) {
  py::dict out;
  for (const std::string_view name : PartitionAxis::field_names()) {
    out[py::str(std::string(name))] = from_axis_rule(*pa.find_field(name));
  }
  return out;
}

std::optional<std::vector<std::int64_t>> optional_shape(const py::object& shape) {
  if (shape.is_none()) return std::nullopt;
  return to_shape(shape);
}

// `with mesh:` on this thread: the scopes entered through Python, innermost last. JAX's context
// mesh is per thread, and so is the sharding layer's current mesh (MeshScope); a `with` block
// enters and exits on one thread, so a per-thread stack pairs them.
thread_local std::vector<std::unique_ptr<sharding::MeshScope>> python_mesh_scopes;

std::int64_t machine_device_count() {
  const runtime::Topology topology = runtime::Topology::discover();
  return static_cast<std::int64_t>(runtime::place_devices(topology, {}).size());
}

std::string named_sharding_repr(const NamedSharding& s) {
  return "NamedSharding(mesh=" + s.mesh().repr() + ", spec=" + s.spec().repr() + ")";
}

// A mesh axis or a list or tuple of them, as eformer's shard_map helpers take it; their
// TypeError for anything else.
std::vector<std::string> axis_name_list(const py::object& axis_names) {
  if (py::isinstance<py::str>(axis_names)) return {axis_names.cast<std::string>()};
  if (py::isinstance<py::list>(axis_names) || py::isinstance<py::tuple>(axis_names)) {
    return axis_names.cast<std::vector<std::string>>();
  }
  throw TypeError("Input 'axis_names' must be a string or sequence (list/tuple), but got type " +
                  python_type_name(axis_names));
}

py::object constrain(const py::object& x, const py::object& sharding);

// True for what with_sharding_constraint takes as a pytree: a dict, or a list or tuple that
// holds more than ints (a list or tuple of ints is a shape).
bool is_tree(const py::object& x) {
  if (py::isinstance<py::dict>(x)) return true;
  if (!py::isinstance<py::tuple>(x) && !py::isinstance<py::list>(x)) return false;
  for (py::handle item : x) {
    if (!py::isinstance<py::int_>(item)) return true;
  }
  return false;
}

// with_sharding_constraint over a pytree, as eformer maps it over the leaves: the same
// containers, each array leaf's result (a NamedSharding or None) in its place, every other leaf
// (None, a number) returned as it is.
py::object constrain_tree(const py::object& x, const py::object& sharding) {
  if (py::isinstance<py::dict>(x)) {
    py::dict out;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(x)) {
      out[key] = constrain_tree(py::reinterpret_borrow<py::object>(value), sharding);
    }
    return out;
  }
  if (py::isinstance<py::tuple>(x) || py::isinstance<py::list>(x)) {
    py::list out;
    for (py::handle item : x) {
      out.append(constrain_tree(py::reinterpret_borrow<py::object>(item), sharding));
    }
    if (py::isinstance<py::tuple>(x)) return py::tuple(out);
    return out;
  }
  return py::hasattr(x, "shape") ? constrain(x, sharding) : x;
}

// with_sharding_constraint of one value: an array (or its shape) gives its NamedSharding or
// None; a pytree, constrain_tree's tree.
py::object constrain(const py::object& x, const py::object& sharding) {
  if (is_tree(x)) return constrain_tree(x, sharding);
  const bool sequence = py::isinstance<py::tuple>(x) || py::isinstance<py::list>(x);
  // eformer constrains arrays only and returns any other value (a Python scalar, a string,
  // None) as it is, before it looks at the sharding. A tuple or list of ints is taken for the
  // shape of an array here.
  if (!py::hasattr(x, "shape") && !sequence) return py::none();
  const auto shape = to_shape(py::hasattr(x, "shape") ? x.attr("shape") : x);
  std::optional<NamedSharding> applied;
  if (py::isinstance<NamedSharding>(sharding)) {
    applied = sharding::with_sharding_constraint(shape, sharding.cast<const NamedSharding&>());
  } else if (py::isinstance(sharding,
                            py::module_::import("numesh.partition_spec").attr("PartitionSpec"))) {
    applied = sharding::with_sharding_constraint(shape, sharding.cast<PartitionSpec>());
  } else {
    throw TypeError("Unsupported sharding type: " + python_type_name(sharding));
  }
  if (!applied) return py::none();
  return py::cast(*applied);
}

// The names in one item of get_names_from_partition_spec's argument, each as a spec of its
// own, as eformer's recursion collects them: a name stands for itself, None for nothing, a
// tuple or list (a spec, or specs nested to any depth) for the names in its items; eformer's
// recursion fails on anything else as iterating it does.
void collect_names(py::handle item, std::vector<PartitionSpec>& out) {
  if (item.is_none()) return;
  if (py::isinstance<py::str>(item)) {
    out.emplace_back(std::vector<AxisRule>{to_axis_rule(item)});
    return;
  }
  if (!py::isinstance<py::tuple>(item) && !py::isinstance<py::list>(item)) {
    throw TypeError("'" + py::type::handle_of(item).attr("__name__").cast<std::string>() +
                    "' object is not iterable");
  }
  for (py::handle inner : item) collect_names(inner, out);
}

// A config value as the JSON the sharding layer's dynamically typed entry points take: None,
// bool, int, float, str, and lists or tuples of them. Throws: TypeError naming anything else.
nlohmann::json to_json_value(py::handle value) {
  if (value.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<std::int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    nlohmann::json out = nlohmann::json::array();
    for (py::handle item : value) out.push_back(to_json_value(item));
    return out;
  }
  throw TypeError("expected None, a bool, a number, a string or a list of them; got " +
                  python_type_name(value));
}

// eformer's small helpers of escale/partition/constraints.py (misc.json's functions).
void bind_mesh_helpers(py::module_& m) {
  m.def(
      "get_safe_hash_int",
      [](const py::object& text, const std::string& algorithm) {
        const std::string digits =
            sharding::get_safe_hash_int(py::str(text).cast<std::string>(), algorithm);
        return py::int_(py::str(digits));
      },
      "text"_a, "algorithm"_a = "md5",
      "eformer's get_safe_hash_int: the hashlib `algorithm` digest of str(text) as a big-endian "
      "int. Raises ValueError \"Unsupported hash algorithm: <algorithm>\" for another name.");
  m.def(
      "get_axes_size_in_mesh",
      [](const AxisRule& axis_names, const std::optional<Mesh>& mesh) {
        return sharding::get_axes_size_in_mesh(axis_names, mesh ? &*mesh : nullptr);
      },
      "axis_names"_a, "mesh"_a = py::none(),
      "eformer's get_axes_size_in_mesh: the size of the axis, or the product of a list or tuple "
      "of axes, of `mesh` (default: the current mesh). KeyError for an unknown axis, TypeError "
      "for a value that is neither a name nor a sequence, AssertionError without a mesh.");
  m.def(
      "get_mesh_axis_names",
      [](const std::optional<Mesh>& mesh) {
        return sharding::get_mesh_axis_names(mesh ? &*mesh : nullptr);
      },
      "mesh"_a = py::none(),
      "eformer's get_mesh_axis_names: the axis names of `mesh` (default: the current mesh), in "
      "mesh order. AssertionError without a mesh.");
  m.def(
      "names_in_current_mesh",
      [](const py::args& names) {
        std::vector<std::string> strings;
        for (py::handle name : names) {
          // eformer compares sets: a name that is not a string is in no mesh.
          if (!py::isinstance<py::str>(name)) return false;
          strings.push_back(name.cast<std::string>());
        }
        return sharding::names_in_current_mesh(strings);
      },
      "eformer's names_in_current_mesh(*names): True when every name is an axis of the current "
      "mesh (True for none; False for any name without a mesh).");
  m.def(
      "get_names_from_partition_spec",
      [](const py::object& partition_specs) {
        const py::object items = py::isinstance<py::dict>(partition_specs)
                                     ? partition_specs.attr("values")()
                                     : partition_specs;
        std::vector<PartitionSpec> specs;
        for (py::handle item : items) collect_names(item, specs);
        return sharding::get_names_from_partition_spec(specs);
      },
      "partition_specs"_a,
      "eformer's get_names_from_partition_spec: every mesh axis the specs (a dict's values, or "
      "any iterable of specs) use, each once, sorted (eformer's order is a set's).");
  m.def(
      "get_mesh_axis_size",
      [](const py::object& axis_names, const std::optional<Mesh>& mesh) {
        return sharding::get_mesh_axis_size(sharding::mesh_or_current(mesh),
                                            axis_name_list(axis_names));
      },
      "axis_names"_a, py::kw_only(), "mesh"_a = py::none(),
      "eformer's get_mesh_axis_size, outside shard_map: the product of the sizes of the axes (a "
      "name, or a list or tuple; 1 for none) of `mesh` (default: the current mesh; "
      "AssertionError without one). KeyError \"unbound axis name: x\" for an axis the mesh "
      "lacks.");
  m.def(
      "get_submesh_device_index",
      [](const py::object& axis_names, const std::vector<std::int64_t>& device_coords,
         const std::optional<Mesh>& mesh) {
        return sharding::get_submesh_device_index(sharding::mesh_or_current(mesh), device_coords,
                                                  axis_name_list(axis_names));
      },
      "axis_names"_a, py::kw_only(), "device_coords"_a, "mesh"_a = py::none(),
      "eformer's get_submesh_device_index, outside shard_map: the row-major index, over the axes "
      "(the last varies fastest; 0 for none), of the device at `device_coords` (one coordinate "
      "per axis of `mesh`, default the current mesh), where eformer reads the device it runs on. "
      "ValueError for coordinates that do not fit the mesh, KeyError for an unknown axis, "
      "AssertionError without a mesh.");
}

}  // namespace

void bind_sharding(py::module_& m) {
  // The constants of eformer's common_types, from the sharding layer's own tables.
  py::dict tokens;
  py::dict semantic_map;
  for (const auto& t : sharding::semantic_tokens()) {
    tokens[py::str(std::string(t.constant))] = py::str(std::string(t.token));
    semantic_map[py::str(std::string(t.token))] =
        t.field.empty() ? py::object(py::none()) : py::object(py::str(std::string(t.field)));
  }
  m.attr("_SEMANTIC_TOKENS") = tokens;
  m.attr("_SEMANTIC_MAP") = semantic_map;
  py::dict modes;
  modes["MODE_TRAIN"] = std::string(sharding::mode_string(sharding::Mode::kTrain));
  modes["MODE_PREFILL"] = std::string(sharding::mode_string(sharding::Mode::kPrefill));
  modes["MODE_DECODE"] = std::string(sharding::mode_string(sharding::Mode::kDecode));
  modes["MODE_INSERT"] = std::string(sharding::mode_string(sharding::Mode::kInsert));
  m.attr("_MODES") = modes;
  py::dict twins;
  for (const auto& [field, twin] : PartitionAxis::decode_twins()) {
    twins[py::str(std::string(field))] = py::str(std::string(twin));
  }
  m.attr("_STANDARD_TO_GENERATION_ATTR_MAP") = twins;
  m.attr("MIN_SHARDING_SIZE") = sharding::kMinShardingSize;
  m.attr("DEFAULT_MASK_VALUE") = sharding::kDefaultMaskValue;
  py::list presets;
  for (const auto& p : sharding::all_presets()) {
    py::object mode =
        p.axes->mode.is_dim()
            ? py::object(py::int_(p.axes->mode.dim()))
            : py::object(py::str(std::string(sharding::mode_string(p.axes->mode.mode()))));
    py::list axes;
    for (const auto& a : p.axes->axes) axes.append(from_axis_rule(a));
    presets.append(py::make_tuple(std::string(p.name), axes, mode));
  }
  m.attr("_PRESETS") = presets;

  m.def(
      "_canonical_entries",
      [](const std::vector<AxisRule>& entries) { return PartitionSpec(entries).entries(); },
      "entries"_a, "P(*entries)'s entries, canonicalised as JAX does.");
  py::class_<PartitionAxis> partition_axis(m, "PartitionAxis", R"pbdoc(
Maps semantic axes (BATCH, HEAD, ...) to mesh axes: eformer's PartitionAxis, field for field.

PartitionAxis(**fields) takes eformer's 27 fields by keyword (or in order, positionally);
every field left out, or given NOT_GIVEN where a rule derives it, is derived from the five
mesh-axis names (data_parallel_axis="dp", fully_sharded_data_parallel_axis="fsdp",
tensor_parallel_axis="tp", sequence_parallel_axis="sp", expert_parallel_axis="ep"): batch_axis
= (fsdp, dp), the sequence axes = sp, heads, hidden state, MLP and vocabulary = tp, experts =
ep, and the decode_* twins = their resolved train values.

Raises TypeError for an unknown field name, ValueError "Partitioning rule `<field>` was not
resolved." for a field left NOT_GIVEN that no rule derives.
)pbdoc");
  partition_axis.def(py::init(&make_partition_axis))
      .def(
          "resolve_spec",
          [](const PartitionAxis& pa, const std::vector<AxisRule>& axes, const py::object& mode) {
            return pa.resolve_spec(axes, to_mode(mode));
          },
          "axes"_a, "mode"_a, R"pbdoc(
P(*resolve_axis(axes, mode)): the partition spec of a tensor whose dimensions play the
semantic roles `axes` in `mode` (MODE_TRAIN, MODE_PREFILL, MODE_DECODE, MODE_INSERT).
Raises ValueError for an unknown semantic axis or a nested tuple.
)pbdoc")
      .def(
          "resolve_axis",
          [](const PartitionAxis& pa, const std::vector<AxisRule>& axes, const py::object& mode) {
            return pa.resolve_axis(axes, to_mode(mode));
          },
          "axes"_a, "mode"_a,
          "The resolved rule of each entry of `axes`, raw (tuples stay tuples, lists lists).")
      .def(
          "replace",
          [](const PartitionAxis& pa, const py::kwargs& kwargs) {
            return pa.replace(to_kwargs(kwargs));
          },
          "dataclasses.replace: these fields changed, every other kept as it is (nothing is "
          "derived again).")
      .def("to_dict", &partition_axis_dict, "{field name: value}, in field order.")
      .def(py::pickle([](const PartitionAxis& pa) { return partition_axis_dict(pa); },
                      [](const py::dict& fields) {
                        return make_partition_axis(py::args(),
                                                   py::reinterpret_borrow<py::kwargs>(fields));
                      }))
      .def("__repr__", &partition_axis_repr)
      .def("__eq__",
           [](const PartitionAxis& a, const py::object& b) {
             return py::isinstance<PartitionAxis>(b) && a == b.cast<const PartitionAxis&>();
           })
      .def("__hash__",
           [](const PartitionAxis& pa) { return py::hash(py::str(partition_axis_repr(pa))); })
      .def_static(
          "register",
          [](const py::object& semantic_axis, const AxisRule& axis_rule,
             const AxisRule& generation_axis_rule, bool override_existing) {
            // eformer takes str(semantic_axis).strip(): any object names an axis.
            PartitionAxis::register_axis(py::str(semantic_axis).cast<std::string>(), axis_rule,
                                         generation_axis_rule, override_existing);
          },
          "semantic_axis"_a, "axis_rule"_a, py::kw_only(),
          "generation_axis_rule"_a = AxisRule(sharding::not_given), "override"_a = false,
          R"pbdoc(
Maps the semantic axis `semantic_axis` to `axis_rule` for every PartitionAxis (a process-wide
registry, as eformer's class-level one). Without a generation rule, one is inferred when
`axis_rule` names a field with a decode_* twin. Raises ValueError when the name is built in or
registered and `override` is False.
)pbdoc")
      .def_static(
          "unregister",
          [](const py::object& semantic_axis, bool missing_ok) {
            PartitionAxis::unregister_axis(py::str(semantic_axis).cast<std::string>(), missing_ok);
          },
          "semantic_axis"_a, py::kw_only(), "missing_ok"_a = true,
          "Removes a registered semantic axis (an overridden built-in comes back). Raises "
          "KeyError when none is registered and `missing_ok` is False.")
      .def_static("clear_registered_axes", &PartitionAxis::clear_registered_axes,
                  "Empties the registry of semantic axes.")
      .def_static(
          "get_registered_axes",
          [] {
            py::dict out;
            for (const auto& [name, entry] : PartitionAxis::get_registered_axes()) {
              py::dict e;
              e["axis_rule"] = from_axis_rule(entry.axis_rule);
              e["generation_axis_rule"] = from_axis_rule(entry.generation_axis_rule);
              out[py::str(name)] = e;
            }
            return out;
          },
          "{name: {'axis_rule': ..., 'generation_axis_rule': ...}} of every registered axis.");
  for (const std::string_view name : PartitionAxis::field_names()) {
    partition_axis.def_property_readonly(
        std::string(name).c_str(),
        [name](const PartitionAxis& pa) { return from_axis_rule(*pa.find_field(name)); });
  }

  // The C++ manager under numesh.PartitionManager, which adds eformer's Python semantics (the
  // `with`, the presets passed as classes, dynamic_axes).
  py::class_<PartitionManager>(m, "_PartitionManager")
      .def(py::init<PartitionAxis>(), "paxis"_a)
      .def_property_readonly("paxis", &PartitionManager::paxis)
      .def(
          "resolve",
          [](const PartitionManager& pm, const std::vector<AxisRule>& axes, const py::object& mode,
             const py::object& shape) {
            return pm.resolve(axes, to_mode_arg(mode), optional_shape(shape));
          },
          "axes"_a, "mode"_a, "shape"_a = py::none())
      .def(
          "shard",
          [](const PartitionManager& pm, const py::object& shape, const std::vector<AxisRule>& axes,
             const py::object& mode, bool auto_correct) -> py::object {
            sharding::ResolveArgs args;
            args.axes = axes;
            args.mode = to_mode_arg(mode);
            const auto applied = pm.shard(to_shape(shape), std::move(args), auto_correct);
            if (!applied) return py::none();
            return py::cast(*applied);
          },
          "shape"_a, "axes"_a, "mode"_a, "auto_correct"_a = true);

  py::class_<Mesh>(m, "Mesh", R"pbdoc(
A logical device mesh: ordered, named axes with sizes (JAX's Mesh without the device objects);
devices are numbered 0..size-1 row-major over the axes. `with mesh:` makes it the current mesh
of this thread, as JAX's context mesh, for get_corrected_named_sharding and
PartitionManager.shard. Built by create_mesh, or Mesh(axis_names, axis_sizes).
)pbdoc")
      .def(py::init<std::vector<std::string>, std::vector<std::int64_t>>(), "axis_names"_a,
           "axis_sizes"_a)
      .def_property_readonly("axis_names",
                             [](const Mesh& mesh) { return py::tuple(py::cast(mesh.names())); })
      .def_property_readonly("axis_sizes",
                             [](const Mesh& mesh) { return py::tuple(py::cast(mesh.sizes())); })
      .def_property_readonly(
          "shape",
          [](const Mesh& mesh) {
            py::dict out;
            for (std::size_t i = 0; i < mesh.rank(); ++i)
              out[py::str(mesh.names()[i])] = mesh.sizes()[i];
            return out;
          },
          "{axis name: size}, in mesh order.")
      .def_property_readonly("size", &Mesh::size, "The number of devices.")
      .def_property_readonly("empty", &Mesh::empty, "True when the mesh has no devices.")
      .def("__enter__",
           [](const py::object& self) {
             python_mesh_scopes.push_back(
                 std::make_unique<sharding::MeshScope>(self.cast<const Mesh&>()));
             return self;
           })
      .def("__exit__",
           [](const Mesh&, const py::args&) {
             if (!python_mesh_scopes.empty()) python_mesh_scopes.pop_back();
           })
      .def("__repr__", &Mesh::repr)
      .def("__eq__",
           [](const Mesh& a, const py::object& b) {
             return py::isinstance<Mesh>(b) && a == b.cast<const Mesh&>();
           })
      .def("__hash__", [](const Mesh& mesh) { return py::hash(py::str(mesh.repr())); });
  m.def("get_incontext_mesh", &sharding::get_incontext_mesh, "raise_error"_a = true,
        "eformer's get_incontext_mesh: the current mesh of this thread (the innermost `with "
        "mesh:`). Without one: the empty mesh, or with `raise_error` AssertionError \"No mesh "
        "found under this context manager.\" (the default, as eformer's).");

  m.def(
      "_normalize_axis_types",
      [](const std::vector<std::string>& axis_names,
         const py::object& axis_types) -> std::optional<std::vector<std::string>> {
        const auto types = sharding::normalize_axis_types(axis_names, to_json_value(axis_types));
        if (!types) return std::nullopt;
        std::vector<std::string> out;
        for (const sharding::AxisType t : *types) out.emplace_back(sharding::to_string(t));
        return out;
      },
      "axis_names"_a, "axis_types"_a,
      "eformer's private _normalize_axis_types: one of JAX's AxisType names (\"Auto\", "
      "\"Explicit\", \"Manual\") per axis from a string, a list of them or None (None back).");
  m.def("calculate_host_mesh_shape", &sharding::calculate_host_mesh_shape, "global_mesh_shape"_a,
        "total_devices"_a, "num_processes"_a,
        "eformer's calculate_host_mesh_shape: the part of the global mesh one host holds.");
  m.def("fill_minus_one_to_target", &sharding::fill_minus_one_to_target, "shape"_a, "target"_a,
        "eformer's fill_minus_one_to_target: the one -1 of `shape` replaced so that its "
        "product is `target`.");
  m.def(
      "parse_mesh_from_string",
      [](const std::string& axis_dims, const std::vector<std::string>& names) {
        const auto parsed = sharding::parse_mesh_from_string(axis_dims, names);
        return py::make_tuple(py::tuple(py::cast(parsed.axis_dims)),
                              py::tuple(py::cast(parsed.axis_names)));
      },
      "axis_dims"_a, "names"_a,
      "eformer's parse_mesh_from_string: (axis_dims, axis_names) from 'dp:2,tp:4' or '2,4' "
      "(zipped with `names`).");
  py::class_<sharding::MeshPartitionHelper>(m, "MeshPartitionHelper",
                                            "eformer's MeshPartitionHelper: sharding methods for "
                                            "a shape from the mesh's dp, fsdp, tp and sp axes.")
      .def(py::init<Mesh>(), "mesh"_a)
      .def_property_readonly("mesh", &sharding::MeshPartitionHelper::mesh)
      .def(
          "suggest_methods",
          [](const sharding::MeshPartitionHelper& h, const py::object& shape) {
            py::list out;
            for (const auto& method : h.suggest_methods(to_shape(shape))) {
              out.append(py::tuple(py::cast(method)));
            }
            return out;
          },
          "shape"_a, "The methods (tuples of mesh axes) in eformer's priority order.")
      .def(
          "create_partition_spec",
          [](const sharding::MeshPartitionHelper& h, const py::object& shape,
             const std::vector<sharding::MeshPartitionHelper::Method>& methods,
             std::int64_t min_shard_size) {
            return h.create_partition_spec(to_shape(shape), methods, min_shard_size);
          },
          "shape"_a, "methods"_a, "min_shard_size"_a = 1024,
          "The spec the methods give `shape` (eformer's create_partition_spec, quirks included).");

  m.def(
      "create_mesh",
      [](const std::vector<std::int64_t>& axis_dims, const std::vector<std::string>& axis_names,
         std::optional<std::int64_t> device_count, std::int64_t process_count,
         std::optional<std::vector<std::int64_t>> dcn_mesh_dims) {
        sharding::CreateMeshOptions options;
        options.device_count = device_count ? *device_count : machine_device_count();
        options.process_count = process_count;
        options.dcn_mesh_dims = std::move(dcn_mesh_dims);
        return sharding::create_mesh(axis_dims, axis_names, options);
      },
      "axis_dims"_a = sharding::kDefaultMeshDims, "axis_names"_a = sharding::kDefaultMeshNames,
      py::kw_only(), "device_count"_a = py::none(), "process_count"_a = 1,
      "dcn_mesh_dims"_a = py::none(), R"pbdoc(
eformer's create_mesh: a mesh of `axis_names` with `axis_dims` (one -1 takes the devices left).
The devices are the machine's NUMA devices (one per NUMA node) unless `device_count` says how
many. Raises ValueError when the dims do not fit the devices.
)pbdoc");

  py::class_<NamedSharding>(m, "NamedSharding",
                            "A partition spec on a mesh (JAX's NamedSharding), validated as JAX "
                            "does: DuplicateSpecError for an axis used twice, ValueError for an "
                            "axis the mesh lacks.")
      .def(py::init<Mesh, PartitionSpec>(), "mesh"_a, "spec"_a)
      .def_property_readonly("mesh", &NamedSharding::mesh)
      .def_property_readonly("spec", &NamedSharding::spec)
      .def("__repr__", &named_sharding_repr)
      .def("__eq__",
           [](const NamedSharding& a, const py::object& b) {
             return py::isinstance<NamedSharding>(b) && a == b.cast<const NamedSharding&>();
           })
      .def("__hash__",
           [](const NamedSharding& s) { return py::hash(py::str(named_sharding_repr(s))); });

  for (const bool vrn : {false, true}) {
    m.def(
        vrn ? "vrn_auto_partition_spec" : "auto_partition_spec",
        [vrn](const py::object& x, const std::optional<Mesh>& mesh,
              const std::optional<std::vector<AxisRule>>& names,
              std::optional<std::int64_t> min_sharding_size, bool reverse) {
          const sharding::ArrayInfo array = to_array_info(x);
          return vrn ? sharding::vrn_auto_partition_spec(array, mesh, names, min_sharding_size,
                                                         reverse)
                     : sharding::auto_partition_spec(array, mesh, names, min_sharding_size,
                                                     reverse);
        },
        "x"_a, "mesh"_a = py::none(), "names"_a = py::none(), "min_sharding_size"_a = py::none(),
        "reverse"_a = false,
        vrn ? "eformer's vrn_auto_partition_spec: as auto_partition_spec, with its variations "
              "(names not de-duplicated, an empty tuple assigned, no early stop); `names` may be "
              "any sequence (eformer's takes only a list)."
            : "eformer's auto_partition_spec: for an array `x` (anything with a shape and a "
              "dtype) on `mesh` (default: the current mesh), each dimension, largest first, takes "
              "the first remaining axis (largest first, or `names` in order) whose size divides "
              "it; P() below `min_sharding_size` elements (default: the device count).");
  }

  m.def("with_sharding_constraint", &constrain, "x"_a, "sharding"_a, R"pbdoc(
eformer's with_sharding_constraint for an array `x` (or its shape): the NamedSharding the
constraint applies, or None when eformer applies none (no current mesh, P(), or an `x` that
is neither an array nor a shape, which eformer returns untouched). A pytree (a dict, or a list
or tuple holding arrays or containers) gives the same tree of those results, leaf by leaf, as
eformer constrains each leaf; other leaves (None, numbers) stay as they are. A
PartitionSpec is corrected against the current mesh (as get_corrected_named_sharding); a
NamedSharding applies on its own mesh.
)pbdoc");

  m.def(
      "get_corrected_named_sharding",
      [](const py::object& shape, const PartitionSpec& partition_spec, bool raise_mesh_error) {
        std::vector<std::string> warnings;
        NamedSharding out = sharding::get_corrected_named_sharding(to_shape(shape), partition_spec,
                                                                   raise_mesh_error, &warnings);
        const py::object warn = py::module_::import("warnings").attr("warn");
        for (const auto& w : warnings) warn(w, "stacklevel"_a = 1);  // the caller's line
        return out;
      },
      "shape"_a, "partition_spec"_a, "raise_mesh_error"_a = true, R"pbdoc(
eformer's get_corrected_named_sharding on the current mesh: the spec padded or truncated to the
rank, each entry dropped to None where its axes are missing from the mesh or do not divide the
dimension; all None becomes P(). With no current mesh: AssertionError, or (raise_mesh_error
False) a warning and a replicated sharding on the empty mesh.
)pbdoc");
  bind_mesh_helpers(m);
}

}  // namespace numesh::python
