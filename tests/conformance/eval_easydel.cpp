// Evaluators for easydel_attention.json and easydel_misc.json: EasyDeL's attention specs, MoE
// specs, expert mesh, kernel helpers and parameter-spec sanitising (numesh/sharding/easydel.hpp).

#include <optional>
#include <string>

#include "conformance.hpp"
#include "numesh/sharding/easydel.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/presets.hpp"

namespace numesh::conformance {
namespace {

namespace ed = sharding::easydel;
using sharding::Mode;
using sharding::ModeArg;
using sharding::PartitionAxis;
using sharding::PartitionManager;

PartitionManager manager_from(const json& file, const json& inputs) {
  if (inputs.contains("partition_axis_kwargs")) {
    return PartitionManager(PartitionAxis::from_json(inputs["partition_axis_kwargs"]));
  }
  return PartitionManager(
      PartitionAxis::from_json(partition_axis_config(file, inputs.at("partition_axis"))));
}

ModeArg decode_mode(const json& j) {
  if (j.is_number_integer()) return ModeArg::from_dim(j.get<std::int64_t>());
  const auto mode = sharding::parse_mode(j.get<std::string>());
  if (!mode) throw NotEvaluated("unknown mode " + j.dump());
  return *mode;
}

json error_json(const Error& e) { return json{{"error", encode_error(e)}}; }

json eval_attention(const json& file, const json& c) {
  const json& in = c.at("inputs");
  const PartitionManager pm = manager_from(file, in);
  std::optional<std::size_t> aux_rank;
  if (!in.at("softmax_aux_shape").is_null()) aux_rank = in["softmax_aux_shape"].size();
  try {
    const auto r =
        ed::get_shardings(pm, decode_mode(in.at("mode")), in.at("layout").get<std::string>(),
                          in.at("qkv_mni_sharding").get<bool>(), aux_rank);
    return json{{"query3d", encode_spec(r.query3d)},
                {"query", encode_spec(r.query)},
                {"key", encode_spec(r.key)},
                {"value", encode_spec(r.value)},
                {"bias", encode_spec(r.bias)},
                {"mask", encode_spec(r.mask)},
                {"output", encode_spec(r.output)},
                {"q_segment_ids", encode_spec(r.q_segment_ids)},
                {"kv_segment_ids", encode_spec(r.kv_segment_ids)},
                {"softmax_aux", r.softmax_aux ? encode_spec(*r.softmax_aux) : json(nullptr)}};
  } catch (const Error& e) {
    return error_json(e);
  }
}

std::optional<sharding::PartitionSpec> optional_spec(const json& j) {
  if (j.is_null()) return std::nullopt;
  return decode_spec(j);
}

json eval_misc(const json& file, const json& c) {
  const json& in = c.at("inputs");
  const std::string fn = in.at("fn");
  if (fn == "get_moe_partition_spec") {
    const PartitionManager pm = manager_from(file, in);
    ed::MoeSpecOptions o;
    o.tensors_are_expert = in.at("tensors_are_expert").get<bool>();
    o.is_bias = in.value("is_bias", false);
    o.fsdp_is_ep_bound = in.value("fsdp_is_ep_bound", true);
    o.sp_is_ep_bound = in.value("sp_is_ep_bound", true);
    o.module_view = in.value("module_view", false);
    try {
      return json{{"spec", encode_spec(ed::get_moe_partition_spec(
                               pm, in.at("direction").get<std::string>(), o))}};
    } catch (const Error& e) {
      return error_json(e);
    }
  }
  if (fn == "_mesh_shape_ep") {
    const PartitionManager pm = manager_from(file, in);
    return capture([&] {
      const auto s =
          ed::mesh_shape_ep(decode_mesh(in.at("mesh")), pm, in.at("fsdp_is_ep_bound").get<bool>(),
                            in.at("sp_is_ep_bound").get<bool>());
      json names = json::array();
      for (const auto& n : s.names) names.push_back(encode_rule(n));
      return json{{"sizes", s.sizes}, {"names", names}};
    });
  }
  if (fn == "create_stable_sharding") {
    return capture([&] {
      ed::StableShardingArgs args;
      args.state_ps = optional_spec(in.at("state_ps"));
      if (!in.at("preserved_indices").is_null()) {
        args.preserved_indices = in["preserved_indices"].get<std::vector<std::int64_t>>();
      }
      args.clone_ps = optional_spec(in.at("clone_ps"));
      args.dep_is_none = in.at("dep_is_none").get<bool>();
      if (!in.at("tensor_shape").is_null()) args.tensor_shape = decode_shape(in["tensor_shape"]);
      const auto r = ed::create_stable_sharding(args, decode_mesh(in.at("mesh")));
      return r ? encode_spec(*r) : json(nullptr);
    });
  }
  if (fn == "get_mode") {
    return capture([&] {
      return json(std::string(sharding::mode_string(
          ed::get_mode(decode_shape(in.at("query_shape")), in.at("BTHD").get<bool>()))));
    });
  }
  if (fn == "_generalize_numeric_path") {
    return capture(
        [&] { return json(ed::generalize_numeric_path(in.at("pattern").get<std::string>())); });
  }
  if (fn == "resolve_safe_sharding") {
    // `axes` is a preset's name (the class) or a list of semantic axes; `mode` is EasyDeL's
    // mode argument (default train), which a preset ignores because it carries its own.
    std::optional<PartitionManager> pm;
    if (!in.contains("partition_manager")) pm = manager_from(file, in);
    std::optional<sharding::Mesh> mesh;
    if (!in.at("mesh").is_null()) mesh = decode_mesh(in["mesh"]);
    const json& axes = in.at("axes");
    const auto shape = decode_shape(in.at("shape"));
    if (axes.is_string()) {
      const std::string preset_name = axes;
      const auto* preset = sharding::find_preset(preset_name);
      if (preset == nullptr) throw NotEvaluated("unknown preset " + preset_name);
      return capture([&] {
        const auto r = ed::resolve_safe_sharding(*preset, shape, pm ? &*pm : nullptr, mesh);
        return r ? encode_spec(*r) : json{{"$returned_axes_unchanged", true}};
      });
    }
    const ModeArg mode = in.contains("mode") && !in["mode"].is_null() ? decode_mode(in["mode"])
                                                                      : ModeArg(Mode::kTrain);
    const auto rules = decode_rules(axes);
    return capture([&] {
      const auto r = ed::resolve_safe_sharding(rules, shape, pm ? &*pm : nullptr, mesh, mode);
      return r ? encode_spec(*r) : json{{"$returned_axes_unchanged", true}};
    });
  }
  if (fn == "sanitize_partition_spec_for_shape") {
    return capture([&] {
      const sharding::Mesh mesh = decode_mesh(in.at("mesh"));
      const auto spec = ed::sanitize_partition_spec_for_shape(decode_spec(in.at("spec")),
                                                              decode_shape(in.at("shape")), mesh);
      const json ns = capture([&] {
        sharding::check_partition_spec(mesh, spec);
        return json(true);
      });
      return json{{"spec", encode_spec(spec)}, {"named_sharding", ns}};
    });
  }
  throw NotEvaluated("no evaluator for fn " + fn);
}

NUMESH_CONFORMANCE_EVALUATOR("easydel_attention.json", eval_attention);
NUMESH_CONFORMANCE_EVALUATOR("easydel_misc.json", eval_misc);

}  // namespace
}  // namespace numesh::conformance
