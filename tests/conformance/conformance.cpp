#include "conformance.hpp"

#include <map>

namespace numesh::conformance {

namespace {
std::map<std::string, Evaluator>& registry() {
  static std::map<std::string, Evaluator> evaluators;
  return evaluators;
}
}  // namespace

bool register_evaluator(const std::string& file_name, Evaluator evaluator) {
  registry()[file_name] = std::move(evaluator);
  return true;
}

const Evaluator* find_evaluator(const std::string& file_name) {
  auto it = registry().find(file_name);
  return it == registry().end() ? nullptr : &it->second;
}

sharding::AxisRule decode_rule(const json& j) {
  using sharding::AxisRule;
  if (j.is_null()) return AxisRule();
  if (j.is_string()) return AxisRule(j.get<std::string>());
  if (j.is_boolean()) return AxisRule::integer(j.get<bool>() ? 1 : 0);
  if (j.is_number_integer()) return AxisRule::integer(j.get<std::int64_t>());
  if (j.is_array()) return AxisRule::tuple(decode_rules(j));
  if (j.is_object()) {
    if (j.contains("$not_given")) return AxisRule(sharding::not_given);
    if (j.contains("$unconstrained")) return AxisRule::unconstrained();
    if (j.contains("$int")) return AxisRule::integer(j["$int"].get<std::int64_t>());
  }
  throw NotEvaluated("cannot decode axis value " + j.dump());
}

std::vector<sharding::AxisRule> decode_rules(const json& j) {
  std::vector<sharding::AxisRule> out;
  for (const json& e : j) out.push_back(decode_rule(e));
  return out;
}

sharding::PartitionSpec decode_spec(const json& j) {
  if (j.is_object() && j.contains("$spec")) return decode_spec(j["$spec"]);
  if (j.is_object() && j.contains("$pspec")) return decode_spec(j["$pspec"]);
  return sharding::PartitionSpec(decode_rules(j));
}

sharding::Mesh decode_mesh(const json& j) {
  if (j.is_null()) return {};
  return sharding::Mesh(j.at("names").get<std::vector<std::string>>(),
                        j.at("sizes").get<std::vector<std::int64_t>>());
}

std::vector<std::int64_t> decode_shape(const json& j) { return j.get<std::vector<std::int64_t>>(); }

json encode_rule(const sharding::AxisRule& r) {
  using Kind = sharding::AxisRule::Kind;
  switch (r.kind()) {
    case Kind::kNone:
      return nullptr;
    case Kind::kNotGiven:
      return json{{"$not_given", true}};
    case Kind::kUnconstrained:
      return json{{"$unconstrained", true}};
    case Kind::kName:
      return r.name();
    case Kind::kInt:
      return json{{"$int", r.integer_value()}};
    case Kind::kTuple:
    case Kind::kList: {
      json out = json::array();
      for (const auto& m : r.members()) out.push_back(encode_rule(m));
      return out;
    }
  }
  return nullptr;
}

json encode_spec(const sharding::PartitionSpec& spec) {
  json out = json::array();
  for (const auto& e : spec) out.push_back(encode_rule(e));
  return out;
}

json encode_mesh(const sharding::Mesh& mesh) {
  return json{{"names", mesh.names()}, {"sizes", mesh.sizes()}};
}

std::string python_error_type(const Error& e) {
  if (dynamic_cast<const ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const TypeError*>(&e)) return "TypeError";
  if (dynamic_cast<const KeyError*>(&e)) return "KeyError";
  if (dynamic_cast<const IndexError*>(&e)) return "IndexError";
  if (dynamic_cast<const DuplicateSpecError*>(&e)) return "DuplicateSpecError";
  if (dynamic_cast<const NoMeshError*>(&e)) return "AssertionError";
  if (dynamic_cast<const NotImplementedError*>(&e)) return "NotImplementedError";
  return "Error";
}

json encode_error(const Error& e) {
  if (const auto* k = dynamic_cast<const KeyError*>(&e)) {
    return json{{"type", "KeyError"}, {"message", k->key()}};
  }
  return json{{"type", python_error_type(e)}, {"message", e.what()}};
}

json capture(const std::function<json()>& fn) {
  try {
    return json{{"ok", fn()}};
  } catch (const Error& e) {
    return json{{"error", encode_error(e)}};
  }
}

const json& partition_axis_config(const json& file, const std::string& name) {
  // Files that name a config without defining it use the six configs that resolve_spec.json
  // defines (their inputs, not results: the PartitionAxis keyword arguments).
  static const json kSharedConfigs = json::parse(
      R"json({"default": {}, "renamed_mesh_axes": {"data_parallel_axis": "data", "fully_sharded_data_parallel_axis": "zero", "tensor_parallel_axis": "model", "sequence_parallel_axis": "seq", "expert_parallel_axis": "expert"}, "decode_overrides": {"decode_batch_axis": "dp", "decode_query_sequence_axis": "dp", "decode_key_sequence_axis": "tp", "decode_head_axis": null, "decode_kv_head_axis": ["tp", "sp"], "decode_attention_dim_axis": "sp", "decode_attention_kv_dim_axis": "ep"}, "dim_and_bias_axes_set": {"attention_dim_axis": "tp", "attention_kv_dim_axis": "sp", "expert_gate_axis": "ep", "bias_head_sequence_axis": "tp", "bias_key_sequence_axis": "sp", "head_axis": null, "kv_head_axis": "ep"}, "tuple_and_list_overrides": {"batch_axis": "dp", "head_axis": ["tp", "ep"], "hidden_state_axis": ["fsdp", "sp"], "mlp_intermediate_axis": ["tp"], "vocab_axis": null, "sequence_axis": null, "key_sequence_axis": ["sp", "fsdp"]}, "empty_string_and_underscore_decode": {"decode_key_sequence_axis": "", "decode_batch_axis": "_", "decode_query_sequence_axis": "", "decode_head_axis": ""}})json");
  const json& configs =
      file.contains("partition_axis_configs") ? file["partition_axis_configs"] : kSharedConfigs;
  if (!configs.contains(name)) throw NotEvaluated("unknown partition_axis config " + name);
  return configs.at(name);
}

}  // namespace numesh::conformance
