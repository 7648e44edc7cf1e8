#include "numesh/sharding/partition_axis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

namespace {

struct FieldInfo {
  std::string_view name;
  AxisRule PartitionAxisFields::*member;
};

#define NUMESH_FIELD(f) \
  FieldInfo { #f, &PartitionAxisFields::f }
// eformer's field order: it decides which unresolved field _safety_check reports first.
constexpr std::array<FieldInfo, 27> kFields = {{
    NUMESH_FIELD(data_parallel_axis),
    NUMESH_FIELD(fully_sharded_data_parallel_axis),
    NUMESH_FIELD(tensor_parallel_axis),
    NUMESH_FIELD(sequence_parallel_axis),
    NUMESH_FIELD(expert_parallel_axis),
    NUMESH_FIELD(batch_axis),
    NUMESH_FIELD(sequence_axis),
    NUMESH_FIELD(query_sequence_axis),
    NUMESH_FIELD(head_axis),
    NUMESH_FIELD(kv_head_axis),
    NUMESH_FIELD(key_sequence_axis),
    NUMESH_FIELD(hidden_state_axis),
    NUMESH_FIELD(mlp_intermediate_axis),
    NUMESH_FIELD(vocab_axis),
    NUMESH_FIELD(expert_axis),
    NUMESH_FIELD(expert_gate_axis),
    NUMESH_FIELD(attention_dim_axis),
    NUMESH_FIELD(attention_kv_dim_axis),
    NUMESH_FIELD(bias_head_sequence_axis),
    NUMESH_FIELD(bias_key_sequence_axis),
    NUMESH_FIELD(decode_batch_axis),
    NUMESH_FIELD(decode_query_sequence_axis),
    NUMESH_FIELD(decode_head_axis),
    NUMESH_FIELD(decode_kv_head_axis),
    NUMESH_FIELD(decode_key_sequence_axis),
    NUMESH_FIELD(decode_attention_dim_axis),
    NUMESH_FIELD(decode_attention_kv_dim_axis),
}};
#undef NUMESH_FIELD

constexpr std::array<std::string_view, 27> kFieldNames = [] {
  std::array<std::string_view, 27> names{};
  for (std::size_t i = 0; i < kFields.size(); ++i) names[i] = kFields[i].name;
  return names;
}();

// eformer's _STANDARD_TO_GENERATION_ATTR_MAP: train fields with a decode twin.
constexpr std::array<std::pair<std::string_view, std::string_view>, 7> kDecodeTwins = {{
    {"batch_axis", "decode_batch_axis"},
    {"query_sequence_axis", "decode_query_sequence_axis"},
    {"key_sequence_axis", "decode_key_sequence_axis"},
    {"head_axis", "decode_head_axis"},
    {"kv_head_axis", "decode_kv_head_axis"},
    {"attention_dim_axis", "decode_attention_dim_axis"},
    {"attention_kv_dim_axis", "decode_attention_kv_dim_axis"},
}};

std::optional<std::string_view> decode_twin_of(const AxisRule& rule) {
  if (!rule.is_name()) return std::nullopt;
  for (const auto& [train, twin] : kDecodeTwins) {
    if (train == rule.name()) return twin;
  }
  return std::nullopt;
}

// The process-global registry of custom tokens (eformer's class-level dicts behind an RLock).
// Readers (resolution) take it shared; writers exclusively.
struct Registry {
  std::shared_mutex mutex;
  std::map<std::string, AxisRule> rules;
  std::map<std::string, AxisRule> generation_rules;
};

Registry& registry() {
  static Registry r;
  return r;
}

// eformer's `lookup`: the registered rule, else the built-in token's field name. None when
// neither exists (or when the registered rule is None). REQUIRES: registry lock held.
AxisRule lookup(const AxisRule& token) {
  if (!token.is_name()) return AxisRule();
  const Registry& reg = registry();
  if (auto it = reg.rules.find(token.name()); it != reg.rules.end()) return it->second;
  if (auto field = builtin_field_of(token.name()); field && !field->empty()) {
    return AxisRule(std::string(*field));
  }
  return AxisRule();
}

// eformer's `gen_lookup`: the registered generation rule, if any. REQUIRES: lock held.
std::optional<AxisRule> generation_lookup(const AxisRule& token) {
  if (!token.is_name()) return std::nullopt;
  const Registry& reg = registry();
  if (auto it = reg.generation_rules.find(token.name()); it != reg.generation_rules.end()) {
    return it->second;
  }
  return std::nullopt;
}

// Python's str() of a value in eformer's messages: names bare, everything else as repr.
std::string python_str(const AxisRule& r) { return r.is_name() ? r.name() : r.repr(); }

std::string strip(std::string_view s) {
  const auto not_space = [](char c) { return !std::isspace(static_cast<unsigned char>(c)); };
  auto b = std::find_if(s.begin(), s.end(), not_space);
  auto e = std::find_if(s.rbegin(), s.rend(), not_space).base();
  return b < e ? std::string(b, e) : std::string();
}

nlohmann::json rule_to_json(const AxisRule& r) {
  switch (r.kind()) {
    case AxisRule::Kind::kNone:
      return nullptr;
    case AxisRule::Kind::kName:
      return r.name();
    case AxisRule::Kind::kInt:
      return r.integer_value();
    case AxisRule::Kind::kTuple:
    case AxisRule::Kind::kList: {
      nlohmann::json out = nlohmann::json::array();
      for (const AxisRule& m : r.members()) out.push_back(rule_to_json(m));
      return out;
    }
    default:
      return r.repr();  // NOT_GIVEN / UNCONSTRAINED never survive construction
  }
}

AxisRule rule_from_json(const nlohmann::json& j, std::string_view field) {
  if (j.is_null()) return AxisRule();
  if (j.is_string()) return AxisRule(j.get<std::string>());
  if (j.is_number_integer()) return AxisRule::integer(j.get<std::int64_t>());
  if (j.is_array()) {
    std::vector<AxisRule> members;
    for (const auto& m : j) members.push_back(rule_from_json(m, field));
    return AxisRule::tuple(std::move(members));
  }
  throw TypeError(fmt::format(
      "PartitionAxis field '{}' must be null, a mesh axis name or a list of them (got {})", field,
      j.dump()));
}

}  // namespace

PartitionAxis::PartitionAxis() : PartitionAxis(PartitionAxisFields{}) {}

PartitionAxis::PartitionAxis(PartitionAxisFields fields) : fields_(std::move(fields)) {
  // eformer's __post_init__: derive what was not given from this instance's mesh names.
  PartitionAxisFields& f = fields_;
  auto derive = [](AxisRule& field, const AxisRule& value) {
    if (field.is_not_given()) field = value;
  };
  derive(f.batch_axis, AxisRule::tuple({f.fully_sharded_data_parallel_axis, f.data_parallel_axis}));
  derive(f.sequence_axis, f.sequence_parallel_axis);
  derive(f.query_sequence_axis, f.sequence_parallel_axis);
  derive(f.key_sequence_axis, f.sequence_parallel_axis);
  derive(f.head_axis, f.tensor_parallel_axis);
  derive(f.kv_head_axis, f.tensor_parallel_axis);
  derive(f.hidden_state_axis, f.tensor_parallel_axis);
  derive(f.mlp_intermediate_axis, f.tensor_parallel_axis);
  derive(f.vocab_axis, f.tensor_parallel_axis);
  derive(f.expert_axis, f.expert_parallel_axis);
  derive(f.decode_batch_axis, f.batch_axis);
  derive(f.decode_head_axis, f.head_axis);
  derive(f.decode_kv_head_axis, f.kv_head_axis);
  derive(f.decode_key_sequence_axis, f.key_sequence_axis);
  // _safety_check.
  for (const FieldInfo& info : kFields) {
    if ((f.*info.member).is_not_given()) {
      throw ValueError(fmt::format("Partitioning rule `{}` was not resolved.", info.name));
    }
  }
}

PartitionAxis PartitionAxis::from_kwargs(
    const std::vector<std::pair<std::string, AxisRule>>& kwargs) {
  PartitionAxisFields fields;
  for (const auto& [name, value] : kwargs) {
    // Through a reference: clang 14 cannot capture a structured binding.
    const std::string& wanted = name;
    auto it = std::find_if(kFields.begin(), kFields.end(),
                           [&](const FieldInfo& i) { return i.name == wanted; });
    if (it == kFields.end()) {
      throw TypeError(
          fmt::format("PartitionAxis.__init__() got an unexpected keyword argument '{}'", name));
    }
    fields.*(it->member) = value;
  }
  return PartitionAxis(std::move(fields));
}

const AxisRule* PartitionAxis::find_field(std::string_view name) const noexcept {
  for (const FieldInfo& info : kFields) {
    if (info.name == name) return &(fields_.*info.member);
  }
  return nullptr;
}

std::span<const std::string_view> PartitionAxis::field_names() noexcept { return kFieldNames; }

std::span<const std::pair<std::string_view, std::string_view>>
PartitionAxis::decode_twins() noexcept {
  return kDecodeTwins;
}

PartitionAxis PartitionAxis::replace(
    const std::vector<std::pair<std::string, AxisRule>>& kwargs) const {
  std::vector<std::pair<std::string, AxisRule>> all;
  for (const FieldInfo& info : kFields) all.emplace_back(info.name, fields_.*info.member);
  for (const auto& kw : kwargs) all.push_back(kw);  // later pairs win in from_kwargs
  return from_kwargs(all);
}

AxisRule PartitionAxis::resolve_rule(const AxisRule& rule,
                                     std::vector<std::string>* visited) const {
  if (rule.is_sequence()) {
    std::vector<AxisRule> members;
    for (const AxisRule& r : rule.members()) {
      std::vector<std::string> copy = visited ? *visited : std::vector<std::string>{};
      members.push_back(resolve_rule(r, visited ? &copy : nullptr));
    }
    return rule.is_list() ? AxisRule::list(std::move(members))
                          : AxisRule::tuple(std::move(members));
  }
  if (!rule.is_name()) return rule;
  // hasattr(self, rule): a field name reads the field, raw (not resolved further).
  if (const AxisRule* field = find_field(rule.name())) return *field;
  const AxisRule mapped = lookup(rule);
  if (mapped.is_none()) return rule;  // a literal mesh axis name
  std::vector<std::string> seen = visited ? *visited : std::vector<std::string>{};
  if (std::find(seen.begin(), seen.end(), rule.name()) != seen.end()) {
    throw ValueError(
        fmt::format("Cyclic semantic axis registration detected at '{}'.", rule.name()));
  }
  seen.push_back(rule.name());
  return resolve_rule(mapped, &seen);
}

std::vector<AxisRule> PartitionAxis::resolve_axis(const std::vector<AxisRule>& axes,
                                                  Mode mode) const {
  std::shared_lock lock(registry().mutex);
  const bool generation = is_generation_mode(mode);
  // A decode twin applies when the standard rule names a field that has one and the twin is
  // neither None nor NOT_GIVEN (a None twin means "use the train value").
  auto usable_twin = [this](const AxisRule& standard) -> std::optional<AxisRule> {
    auto twin = decode_twin_of(standard);
    if (!twin) return std::nullopt;
    const AxisRule* value = find_field(*twin);
    if (value->is_none() || value->is_not_given()) return std::nullopt;
    return AxisRule(std::string(*twin));
  };

  std::vector<AxisRule> out;
  out.reserve(axes.size());
  for (const AxisRule& a : axes) {
    if (a.is_none() || (a.is_name() && a.name() == tokens::kEmpty)) {
      out.emplace_back();
      continue;
    }
    AxisRule target;
    if (a.is_sequence()) {
      // A composite: members map one by one; unknown members stay literal mesh names.
      std::vector<AxisRule> standard;
      for (const AxisRule& s : a.members()) {
        AxisRule m = lookup(s);
        standard.push_back(m.is_none() ? s : std::move(m));
      }
      target = AxisRule::list(standard);
      if (generation) {
        bool changed = false;
        std::vector<AxisRule> gen;
        for (std::size_t i = 0; i < standard.size(); ++i) {
          if (auto g = generation_lookup(a.members()[i])) {
            gen.push_back(*g);
            changed = true;
          } else if (auto twin = usable_twin(standard[i])) {
            gen.push_back(*twin);
            changed = true;
          } else {
            gen.push_back(standard[i]);
          }
        }
        if (changed) target = AxisRule::list(std::move(gen));
      }
    } else {
      target = lookup(a);
      if (target.is_none()) {
        throw ValueError(fmt::format("Unknown semantic axis name: '{}'", python_str(a)));
      }
      if (generation) {
        if (auto g = generation_lookup(a)) {
          target = *g;
        } else if (auto twin = usable_twin(target)) {
          target = *twin;
        }
      }
    }
    AxisRule resolved = resolve_rule(target, nullptr);
    if (resolved.is_not_given()) {
      throw ValueError(
          fmt::format("Resolved axis rule for '{}' is still NOT_GIVEN.", python_str(a)));
    }
    out.push_back(std::move(resolved));
  }
  return out;
}

PartitionSpec PartitionAxis::resolve_spec(const std::vector<AxisRule>& axes, Mode mode) const {
  return PartitionSpec(resolve_axis(axes, mode));
}

void PartitionAxis::register_axis(std::string_view semantic_axis, AxisRule axis_rule,
                                  AxisRule generation_axis_rule, bool override_existing) {
  const std::string name = strip(semantic_axis);
  if (name.empty()) throw ValueError("`semantic_axis` must be a non-empty string.");
  Registry& reg = registry();
  std::unique_lock lock(reg.mutex);
  if (!override_existing && (builtin_field_of(name) || reg.rules.count(name))) {
    throw ValueError(
        fmt::format("Semantic axis '{}' already exists. Use override=True to replace it.", name));
  }
  if (generation_axis_rule.is_not_given()) {
    // Infer the generation rule when the rule names a field with a decode twin.
    if (auto twin = decode_twin_of(axis_rule)) {
      reg.generation_rules[name] = AxisRule(std::string(*twin));
    } else {
      reg.generation_rules.erase(name);
    }
  } else {
    reg.generation_rules[name] = std::move(generation_axis_rule);
  }
  reg.rules[name] = std::move(axis_rule);
}

void PartitionAxis::unregister_axis(std::string_view semantic_axis, bool missing_ok) {
  const std::string name = strip(semantic_axis);
  if (name.empty()) throw ValueError("`semantic_axis` must be a non-empty string.");
  Registry& reg = registry();
  std::unique_lock lock(reg.mutex);
  const bool removed = reg.rules.erase(name) + reg.generation_rules.erase(name) > 0;
  if (!removed && !missing_ok) {
    const std::string message = fmt::format("Semantic axis '{}' is not registered.", name);
    throw KeyError(message, message);
  }
}

void PartitionAxis::clear_registered_axes() {
  Registry& reg = registry();
  std::unique_lock lock(reg.mutex);
  reg.rules.clear();
  reg.generation_rules.clear();
}

std::map<std::string, PartitionAxis::RegisteredAxis> PartitionAxis::get_registered_axes() {
  Registry& reg = registry();
  std::shared_lock lock(reg.mutex);
  std::map<std::string, RegisteredAxis> out;
  for (const auto& [name, rule] : reg.rules) {
    auto g = reg.generation_rules.find(name);
    out[name] = {rule, g == reg.generation_rules.end() ? AxisRule(not_given) : g->second};
  }
  return out;
}

nlohmann::json PartitionAxis::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const FieldInfo& info : kFields)
    out[std::string(info.name)] = rule_to_json(fields_.*info.member);
  return out;
}

PartitionAxis PartitionAxis::from_json(const nlohmann::json& j) {
  if (!j.is_object()) {
    throw TypeError(
        fmt::format("a PartitionAxis must be a JSON object of fields (got {})", j.dump()));
  }
  std::vector<std::pair<std::string, AxisRule>> kwargs;
  for (const auto& [key, value] : j.items()) kwargs.emplace_back(key, rule_from_json(value, key));
  return from_kwargs(kwargs);
}

}  // namespace numesh::sharding
