// Evaluators for eformer's common_types, PartitionAxis, its registry, the presets and
// PartitionManager: constants.json, partition_axis_fields.json, resolve_spec.json,
// registry.json, presets.json, manager_resolve.json, and misc.json's context-semantics case.

#include <thread>

#include "conformance.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/mesh_creation.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/presets.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::conformance {

using sharding::AxisRule;
using sharding::Mode;
using sharding::ModeArg;
using sharding::PartitionAxis;
using sharding::PartitionManager;

namespace {

std::vector<std::pair<std::string, AxisRule>> decode_kwargs(const json& kwargs) {
  std::vector<std::pair<std::string, AxisRule>> out;
  if (kwargs.is_null()) return out;
  for (const auto& [k, v] : kwargs.items()) out.emplace_back(k, decode_rule(v));
  return out;
}

PartitionAxis paxis_from_config(const json& file, const json& inputs) {
  return PartitionAxis::from_kwargs(
      decode_kwargs(partition_axis_config(file, inputs.at("partition_axis").get<std::string>())));
}

// The C++ API takes a Mode enum where eformer takes any object: every value other than the
// decode and insert strings (prefill, unknown strings, ints, None) behaves as train there.
Mode named_mode(const json& j) {
  if (j.is_string()) {
    if (auto m = sharding::parse_mode(j.get<std::string>())) return *m;
  }
  return Mode::kTrain;
}

// PartitionManager.resolve's mode: an int (bool included) infers from a dim.
ModeArg mode_arg(const json& j) {
  if (j.is_boolean()) return ModeArg::from_dim(j.get<bool>() ? 1 : 0);
  if (j.is_number_integer()) return ModeArg::from_dim(j.get<std::int64_t>());
  return named_mode(j);
}

json encode_rules(const std::vector<AxisRule>& rules) {
  json out = json::array();
  for (const auto& r : rules) out.push_back(encode_rule(r));
  return out;
}

json encode_fields(const PartitionAxis& pa) {
  json out = json::object();
  for (std::string_view name : PartitionAxis::field_names()) {
    out[std::string(name)] = encode_rule(*pa.find_field(name));
  }
  return out;
}

// {"resolve_axis": {ok|error}, "spec" | "error"}: eformer's resolve_axis, then P().
json resolve_result(const PartitionAxis& pa, const std::vector<AxisRule>& axes, Mode mode) {
  json out;
  std::vector<AxisRule> raw;
  try {
    raw = pa.resolve_axis(axes, mode);
    out["resolve_axis"] = {{"ok", encode_rules(raw)}};
  } catch (const Error& e) {
    out["resolve_axis"] = {{"error", encode_error(e)}};
    out["error"] = encode_error(e);
    return out;
  }
  try {
    out["spec"] = encode_spec(sharding::PartitionSpec(raw));
  } catch (const Error& e) {
    out["error"] = encode_error(e);
  }
  return out;
}

json spec_or_error(const std::function<sharding::PartitionSpec()>& fn) {
  try {
    return {{"spec", encode_spec(fn())}};
  } catch (const Error& e) {
    return {{"error", encode_error(e)}};
  }
}

json encode_preset(const sharding::DynamicShardingAxes& p) {
  json mode = p.mode.is_dim() ? json(p.mode.dim()) : json(sharding::mode_string(p.mode.mode()));
  return {{"axes", encode_rules(p.axes)}, {"mode", mode}};
}

json eval_constants(const json&, const json& c) {
  const std::string id = c.at("id");
  if (id == "semantic_tokens") {
    json out = json::object();
    for (const auto& t : sharding::semantic_tokens()) out[std::string(t.constant)] = t.token;
    return out;
  }
  if (id == "mode_constants") {
    return {{"MODE_TRAIN", sharding::mode_string(Mode::kTrain)},
            {"MODE_PREFILL", sharding::mode_string(Mode::kPrefill)},
            {"MODE_DECODE", sharding::mode_string(Mode::kDecode)},
            {"MODE_INSERT", sharding::mode_string(Mode::kInsert)},
            {"GENERATION_MODES",
             {sharding::mode_string(Mode::kDecode), sharding::mode_string(Mode::kInsert)}}};
  }
  if (id == "semantic_map") {
    json out = json::object();
    for (const auto& t : sharding::semantic_tokens()) {
      out[std::string(t.token)] = t.field.empty() ? json(nullptr) : json(t.field);
    }
    return out;
  }
  if (id == "standard_to_generation_attr_map") {
    json out = json::object();
    for (const auto& [train, twin] : PartitionAxis::decode_twins()) out[std::string(train)] = twin;
    return out;
  }
  if (id == "presets") {
    json out = json::object();
    for (const auto& p : sharding::all_presets()) out[std::string(p.name)] = encode_preset(*p.axes);
    return out;
  }
  if (id == "mesh_defaults") {
    json names = json::array();
    for (auto n : sharding::kDefaultMeshNames) names.push_back(n);
    return {{"DEFAULT_SHARDING_STG", sharding::kDefaultMeshDims},
            {"DEFAULT_NAMED_SHARDING_STG", names},
            {"MIN_SHARDING_SIZE", sharding::kMinShardingSize},
            {"DEFAULT_MASK_VALUE", sharding::kDefaultMaskValue}};
  }
  throw NotEvaluated("unknown constants case");
}

json eval_partition_axis_fields(const json&, const json& c) {
  const json& in = c.at("inputs");
  return capture([&] {
    if (in.contains("args")) {
      // Positional construction fills fields in eformer's order.
      std::vector<std::pair<std::string, AxisRule>> kwargs;
      const auto names = PartitionAxis::field_names();
      for (std::size_t i = 0; i < in["args"].size(); ++i) {
        kwargs.emplace_back(std::string(names[i]), decode_rule(in["args"][i]));
      }
      return encode_fields(PartitionAxis::from_kwargs(kwargs));
    }
    if (in.contains("replace")) {
      return encode_fields(PartitionAxis::from_kwargs(decode_kwargs(in["base_kwargs"]))
                               .replace(decode_kwargs(in["replace"])));
    }
    return encode_fields(PartitionAxis::from_kwargs(decode_kwargs(in.at("kwargs"))));
  });
}

json eval_resolve_spec(const json& file, const json& c) {
  const json& in = c.at("inputs");
  const PartitionAxis pa = paxis_from_config(file, in);
  return resolve_result(pa, decode_rules(in.at("axes")), named_mode(in.at("mode")));
}

json eval_presets(const json& file, const json& c) {
  const json& in = c.at("inputs");
  const PartitionAxis pa = paxis_from_config(file, in);
  const auto* preset = sharding::find_preset(in.at("preset").get<std::string>());
  if (!preset) return {{"unknown preset", in["preset"]}};
  if (in.contains("axes")) {
    // The vector names the preset's axes: they must be numesh's too.
    if (encode_rules(preset->axes) != in["axes"]) {
      return {{"preset axes differ", encode_preset(*preset)}};
    }
    return resolve_result(pa, preset->axes, named_mode(in.at("mode")));
  }
  const PartitionManager pm(pa);
  std::optional<std::vector<std::int64_t>> shape;
  if (in.contains("shape")) shape = decode_shape(in["shape"]);
  return spec_or_error([&] { return pm.resolve(*preset, shape); });
}

std::optional<sharding::DynamicShardingAxes> decode_dynamic(const json& j) {
  if (j.contains("preset")) {
    const auto* p = sharding::find_preset(j["preset"].get<std::string>());
    if (!p) throw NotEvaluated("unknown preset " + j["preset"].dump());
    return *p;
  }
  return sharding::DynamicShardingAxes{decode_rules(j.at("axes")), mode_arg(j.at("mode"))};
}

json eval_manager_resolve(const json& file, const json& c) {
  const json& in = c.at("inputs");
  if (in.contains("paxis")) {
    // eformer's PartitionManager(paxis=<not a PartitionAxis>); in C++ the type system rules
    // this out, so the JSON front door (PartitionManager::from_json) is what checks it.
    return capture([&] { return PartitionManager::from_json({{"paxis", in["paxis"]}}).to_json(); });
  }
  const PartitionManager pm(paxis_from_config(file, in));
  sharding::ResolveArgs args;
  if (in.contains("axes")) {
    const json& axes = in["axes"];
    if (axes.is_object()) {
      // A preset class or a DynamicShardingAxes instance passed as `axes` becomes dynamic_axes.
      args.dynamic_axes = decode_dynamic(axes.contains("dynamic") ? axes["dynamic"] : axes);
    } else {
      args.axes = decode_rules(axes);
    }
  }
  if (in.contains("axes_tuple")) args.axes = decode_rules(in["axes_tuple"]);
  if (in.contains("mode")) args.mode = mode_arg(in["mode"]);
  if (in.contains("dynamic_axes")) {
    if (in["dynamic_axes"].is_null()) {
      args.dynamic_axes_is_none = true;
    } else if (!args.dynamic_axes) {
      args.dynamic_axes = decode_dynamic(in["dynamic_axes"]);
    }
  }
  if (in.contains("shape")) args.shape = decode_shape(in["shape"]);
  return spec_or_error([&] { return pm.resolve(args); });
}

json registered_axes_json() {
  json out = json::object();
  for (const auto& [name, entry] : PartitionAxis::get_registered_axes()) {
    out[name] = {{"axis_rule", encode_rule(entry.axis_rule)},
                 {"generation_axis_rule", encode_rule(entry.generation_axis_rule)}};
  }
  return out;
}

// registry.json registers rules written as Python lists; the JSON encoding does not tell lists
// from tuples, and the nested-tuple error message shows which one it was.
AxisRule decode_list_rule(const json& j) {
  if (!j.is_array()) return decode_rule(j);
  std::vector<AxisRule> members;
  for (const json& m : j) members.push_back(decode_list_rule(m));
  return AxisRule::list(std::move(members));
}

std::string python_str_of_name(const json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

json eval_registry(const json&, const json& c) {
  PartitionAxis::clear_registered_axes();
  json steps = json::array();
  for (const json& s : c.at("steps")) {
    const json& step = s.at("step");
    const std::string op = step.at("op");
    json result;
    if (op == "register") {
      result = capture([&] {
        PartitionAxis::register_axis(
            python_str_of_name(step.at("name")), decode_list_rule(step.at("rule")),
            step.contains("generation_axis_rule") ? decode_rule(step["generation_axis_rule"])
                                                  : AxisRule(sharding::not_given),
            step.value("override", false));
        return json(nullptr);
      });
    } else if (op == "unregister") {
      result = capture([&] {
        PartitionAxis::unregister_axis(python_str_of_name(step.at("name")),
                                       step.value("missing_ok", true));
        return json(nullptr);
      });
    } else if (op == "clear") {
      PartitionAxis::clear_registered_axes();
      result = {{"ok", nullptr}};
    } else if (op == "get_registered_axes") {
      result = {{"ok", registered_axes_json()}};
    } else if (op == "resolve") {
      const PartitionAxis pa = PartitionAxis::from_kwargs(
          decode_kwargs(step.contains("kwargs") ? step["kwargs"] : json(nullptr)));
      result = resolve_result(pa, decode_rules(step.at("axes")), named_mode(step.at("mode")));
    } else {
      PartitionAxis::clear_registered_axes();
      throw NotEvaluated("unknown registry op " + op);
    }
    steps.push_back({{"step", step}, {"result", result}});
  }
  PartitionAxis::clear_registered_axes();
  return {{"steps", steps}};
}

json constraint_json(const std::optional<sharding::NamedSharding>& applied) {
  if (!applied) return {{"constraint_applied", false}, {"returned_same_object", true}};
  return {{"constraint_applied", true},
          {"applied_spec", encode_spec(applied->spec())},
          {"n_constraints", 1}};
}

json eval_shard(const json& file, const json& c) {
  const json& in = c.at("inputs");
  const std::string id = c.at("id");
  if (id.rfind("apply_logical_sharding/", 0) == 0) {
    // Which manager apply_logical_sharding picks: explicit, else current, else last created.
    return capture([&] {
      PartitionManager::reset_last_created();
      if (in.empty()) {
        return constraint_json(sharding::apply_logical_sharding({1}, {}));
      }
      auto manager = [](const json& hidden) {
        return PartitionManager(PartitionAxis({.hidden_state_axis = decode_rule(hidden)}));
      };
      std::optional<PartitionManager> last, context, explicit_pm;
      last = manager(in.at("last_created_manager_hidden_state_axis"));
      if (!in.at("context_manager_hidden_state_axis").is_null()) {
        context = manager(in["context_manager_hidden_state_axis"]);
      }
      if (!in.at("explicit_manager_hidden_state_axis").is_null()) {
        explicit_pm = manager(in["explicit_manager_hidden_state_axis"]);
      }
      // Constructing the others made them "last created"; eformer's script creates the
      // last-created one last.
      last = manager(in.at("last_created_manager_hidden_state_axis"));
      std::optional<PartitionManager::Scope> scope;
      if (context) scope.emplace(*context);
      if (context) last = manager(in.at("last_created_manager_hidden_state_axis"));
      sharding::MeshScope mesh(decode_mesh(in.at("mesh")));
      sharding::ResolveArgs args{.axes = decode_rules(in.at("axes")), .mode = Mode::kTrain};
      return constraint_json(sharding::apply_logical_sharding(
          decode_shape(in.at("array").at("shape")), args,
          explicit_pm && !in.value("partition_manager_arg_none", false) ? &*explicit_pm : nullptr));
    });
  }
  const PartitionManager pm(paxis_from_config(file, in));
  sharding::ResolveArgs args;
  if (in.contains("dynamic_axes")) {
    const auto* preset = sharding::find_preset(in["dynamic_axes"].get<std::string>());
    if (!preset) throw NotEvaluated("unknown preset " + in["dynamic_axes"].dump());
    args.dynamic_axes = *preset;
  } else {
    args.axes = decode_rules(in.at("axes"));
    args.mode = mode_arg(in.at("mode"));
  }
  sharding::MeshScope mesh(decode_mesh(in.at("mesh")));
  return capture([&] {
    return constraint_json(
        pm.shard(decode_shape(in.at("array").at("shape")), args, in.value("auto_correct", true)));
  });
}

}  // namespace

// misc.json's `partition_manager_context_semantics`: the script of the vector, in C++.
json eval_partition_manager_context_semantics(const json&, const json&) {
  const PartitionManager pm;
  json r;
  {
    PartitionManager::Scope outer(pm);
    {
      PartitionManager::Scope inner(pm);
      r["inside_inner"] = PartitionManager::current() == &pm;
    }
    r["after_inner_exit"] = PartitionManager::current() == &pm;
  }
  r["after_outer_exit_still_current"] = PartitionManager::current() == &pm;
  const PartitionManager a(PartitionAxis({.tensor_parallel_axis = "a"}));
  const PartitionManager b(PartitionAxis({.tensor_parallel_axis = "b"}));
  r["last_is_most_recently_constructed"] = PartitionManager::last_created() == b;
  {
    PartitionManager::Scope scope(a);
    r["enter_sets_last"] = PartitionManager::last_created() == a;
    std::thread probe([&] {
      r["other_thread_current_is_none"] = PartitionManager::current() == nullptr;
      r["other_thread_sees_last"] = PartitionManager::last_created() == a;
    });
    probe.join();
  }
  r["after_exit_current_is_none"] = PartitionManager::current() == nullptr;
  r["after_exit_last_still_a"] = PartitionManager::last_created() == a;
  return {{"ok", r}};
}

NUMESH_CONFORMANCE_EVALUATOR("constants.json", eval_constants);
NUMESH_CONFORMANCE_EVALUATOR("partition_axis_fields.json", eval_partition_axis_fields);
NUMESH_CONFORMANCE_EVALUATOR("resolve_spec.json", eval_resolve_spec);
NUMESH_CONFORMANCE_EVALUATOR("registry.json", eval_registry);
NUMESH_CONFORMANCE_EVALUATOR("presets.json", eval_presets);
NUMESH_CONFORMANCE_EVALUATOR("manager_resolve.json", eval_manager_resolve);
NUMESH_CONFORMANCE_EVALUATOR("shard.json", eval_shard);

}  // namespace numesh::conformance
