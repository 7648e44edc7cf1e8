#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "interrupts.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/option_text.hpp"
#include "numesh/ops/lowering/layer_table.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

// A layer's inputs from the arrays of a call, named as the call names them ("wq",
// "heads=3"). The arrays are checked when the call starts (with the GIL) and each is copied
// once, when the layer loads it (without the GIL: only their buffers are read).
class ArrayInputs final : public ops::LayerInputs {
 public:
  explicit ArrayInputs(std::map<std::string, ArrayView> arrays) : arrays_(std::move(arrays)) {}

  runtime::HostTensor load(const std::string& name) const override {
    return to_host_tensor(arrays_.at(name));
  }
  bool has(const std::string& name) const override { return arrays_.contains(name); }
  std::string label(std::string_view name) const override { return std::string(name); }
  OptionStyle option_style() const override { return OptionStyle::kKeyword; }

 private:
  std::map<std::string, ArrayView> arrays_;
};

// What numesh.ops.run returns.
struct LayerRun {
  py::array_t<float> y;
  std::optional<py::array_t<float>> reference;
  std::string plan;
  double seconds = 0.0;
  std::vector<std::int64_t> tokens_per_expert;
  std::int64_t dropped = 0;
};

// The arrays of `inputs` (a dict of name to array) and x, each checked. A name the layer never
// takes, one it needs and was not given, or one its other form takes (w1 beside w_gate) is a
// TypeError naming it.
ArrayInputs array_inputs(const ops::LayerEntry& entry, const py::dict& inputs, py::handle x) {
  std::map<std::string, ArrayView> arrays;
  arrays.emplace("x", array_view(x, "x"));
  for (const auto& [key, value] : inputs) {
    const auto name = py::str(key).cast<std::string>();
    arrays.emplace(name, array_view(value, name));
  }
  ArrayInputs given(arrays);
  const std::vector<std::string> needed = ops::needed_inputs(entry, given);
  std::vector<std::string> missing, extra;
  for (const std::string& name : needed) {
    if (!given.has(name)) missing.push_back(name);
  }
  for (const auto& [name, view] : arrays) {
    if (std::find(needed.begin(), needed.end(), name) == needed.end()) extra.push_back(name);
  }
  if (!extra.empty()) {
    throw TypeError(fmt::format("{} takes {} with these inputs; {} {} not among them", entry.name,
                                fmt::join(needed, ", "), fmt::join(extra, ", "),
                                extra.size() > 1 ? "are" : "is"));
  }
  if (!missing.empty()) {
    throw TypeError(fmt::format("{} is missing input{} {} (it needs {})", entry.name,
                                missing.size() > 1 ? "s" : "", fmt::join(missing, ", "),
                                fmt::join(needed, ", ")));
  }
  return given;
}

LayerRun run_layer(const std::string& op, const py::object& x, const py::dict& inputs,
                   std::optional<runtime::DeviceMesh> mesh,
                   std::optional<sharding::PartitionAxis> partition_axis, const std::string& mode,
                   std::int64_t position, const std::string& layout, const std::string& dtype,
                   const ops::LayerOptions& options) {
  const ops::LayerEntry* entry = ops::find_layer(op);
  if (entry == nullptr) {
    throw ValueError(fmt::format("op '{}': expected {}", op, ops::layer_names_text()));
  }
  if (options.repeats <= 0) {
    throw ValueError(fmt::format("repeats={} must be positive", options.repeats));
  }
  const sharding::Mode m = sharding::parse_named_mode(mode, OptionStyle::kKeyword);
  const ops::KvLayout kv = ops::parse_kv_layout(layout, OptionStyle::kKeyword);
  const DType weights = parse_dtype(dtype);
  const ArrayInputs in = array_inputs(*entry, inputs, x);
  const sharding::PartitionManager pm(partition_axis.value_or(sharding::PartitionAxis{}));
  const ops::ModelAxes axes = ops::ModelAxes::resolve(pm, m);
  ops::LayerResult r;
  run_interruptible([&] {
    const runtime::HostTensor x_values = in.load("x");
    ops::check_x(*entry, x_values, in);
    const ops::TokenPlan tokens = ops::token_plan(*entry, x_values, m, position, in);
    if (!mesh) mesh = default_device_mesh();
    r = entry->run(ops::LayerContext{.options = options,
                                     .inputs = in,
                                     .x = x_values,
                                     .mode = m,
                                     .axes = axes,
                                     .mesh = *mesh,
                                     .kv_layout = kv,
                                     .tokens = tokens,
                                     .weights = weights});
  });
  LayerRun out{.y = to_numpy(std::move(r.y)),
               .reference = std::nullopt,
               .plan = r.plan.text(),
               .seconds = r.seconds,
               .tokens_per_expert = {},
               .dropped = 0};
  if (r.want) out.reference = to_numpy(std::move(*r.want));
  if (r.stats) {
    out.tokens_per_expert = r.stats->tokens_per_expert;
    out.dropped = r.stats->dropped;
  }
  return out;
}

}  // namespace

void bind_ops(py::module_& m) {
  py::class_<LayerRun>(m, "LayerRun", "What numesh.ops.run returns: the output and its account.")
      .def_readonly("y", &LayerRun::y, "The output (float32), of the call's tokens.")
      .def_readonly("reference", &LayerRun::reference,
                    "The dense float64 reference's output on the same weights (float32), or "
                    "None with check=False.")
      .def_readonly("plan", &LayerRun::plan,
                    "The layer's plan as `numesh op` prints it: nodes, collectives, bytes, FLOPs.")
      .def_readonly("seconds", &LayerRun::seconds, "The median time of the `repeats` calls.")
      .def_readonly("tokens_per_expert", &LayerRun::tokens_per_expert,
                    "The MoE's routing of the last call (empty without a MoE).")
      .def_readonly("dropped", &LayerRun::dropped,
                    "Tokens past the MoE's capacity in the last call.");

  m.def(
      "run_layer",
      [](const std::string& op, const py::object& x, const py::dict& inputs,
         std::optional<runtime::DeviceMesh> mesh,
         std::optional<sharding::PartitionAxis> partition_axis, const std::string& mode,
         std::int64_t position, const std::string& layout, const std::string& dtype,
         std::int64_t heads, std::int64_t kv_heads, double rope_theta, std::int64_t top_k,
         double capacity, bool renormalize, double norm_eps, int repeats, bool check) {
        const ops::LayerOptions options{.heads = heads,
                                        .kv_heads = kv_heads,
                                        .rope_theta = rope_theta,
                                        .top_k = top_k,
                                        .capacity = capacity,
                                        .raw_weights = !renormalize,
                                        .norm_eps = norm_eps,
                                        .repeats = repeats,
                                        .no_check = !check,
                                        .timing = false,
                                        .trace = {}};
        return run_layer(op, x, inputs, std::move(mesh), std::move(partition_axis), mode, position,
                         layout, dtype, options);
      },
      "op"_a, "x"_a, "inputs"_a, py::kw_only(), "mesh"_a = py::none(),
      "partition_axis"_a = py::none(), "mode"_a = "prefill", "position"_a = -1,
      "kv_layout"_a = "bthd", "dtype"_a = "f32", "heads"_a = 0, "kv_heads"_a = 0,
      "rope_theta"_a = 10000.0, "top_k"_a = 2, "capacity"_a = 0.0, "renormalize"_a = true,
      "norm_eps"_a = 1e-6, "repeats"_a = 1, "check"_a = true, R"pbdoc(
Runs the layer `op` (mlp, attention, moe or block: what `numesh op` runs) sharded over `mesh`
(default: the machine's devices on tp) on x and the weights in `inputs` (a dict of name to
array, the names of numesh op's files: docs/ops.md). Arrays are float32, or uint16 holding bf16
bits, C-contiguous. `dtype` is how the devices store the matrices; `mode` (train, prefill,
decode, insert, or eformer's MODE_*) and `position` choose the timed tokens of attention and
block, as numesh op's --mode and --position do. Returns a LayerRun: the output, the dense
reference's (unless check=False), the plan, the median of `repeats` timed calls. The GIL is
released while it runs. Raises TypeError for an input the layer does not take or lacks,
ValueError / IndexError for bad options and shapes, each naming it.
)pbdoc");
}

}  // namespace numesh::python
