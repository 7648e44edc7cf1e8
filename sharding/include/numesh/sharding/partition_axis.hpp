#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::sharding {

/// The fields of a PartitionAxis, in eformer's order, with eformer's defaults. Use with
/// designated initializers: `PartitionAxis({.tensor_parallel_axis = "model"})`.
/// NOT_GIVEN fields are derived when the PartitionAxis is built (see PartitionAxis).
struct PartitionAxisFields {
  AxisRule data_parallel_axis = "dp";
  AxisRule fully_sharded_data_parallel_axis = "fsdp";
  AxisRule tensor_parallel_axis = "tp";
  AxisRule sequence_parallel_axis = "sp";
  AxisRule expert_parallel_axis = "ep";
  AxisRule batch_axis = not_given;
  AxisRule sequence_axis = not_given;
  AxisRule query_sequence_axis = not_given;
  AxisRule head_axis = not_given;
  AxisRule kv_head_axis = not_given;
  AxisRule key_sequence_axis = not_given;
  AxisRule hidden_state_axis = not_given;
  AxisRule mlp_intermediate_axis = not_given;
  AxisRule vocab_axis = not_given;
  AxisRule expert_axis = not_given;
  AxisRule expert_gate_axis = nullptr;
  AxisRule attention_dim_axis = nullptr;
  AxisRule attention_kv_dim_axis = nullptr;
  AxisRule bias_head_sequence_axis = nullptr;
  AxisRule bias_key_sequence_axis = nullptr;
  AxisRule decode_batch_axis = not_given;
  AxisRule decode_query_sequence_axis = nullptr;
  AxisRule decode_head_axis = not_given;
  AxisRule decode_kv_head_axis = not_given;
  AxisRule decode_key_sequence_axis = not_given;
  AxisRule decode_attention_dim_axis = nullptr;
  AxisRule decode_attention_kv_dim_axis = nullptr;

  friend bool operator==(const PartitionAxisFields&, const PartitionAxisFields&) = default;
};

/// Maps semantic-axis tokens to mesh axes: eformer's PartitionAxis, field for field.
///
/// Building one derives every NOT_GIVEN field from the mesh-axis names:
///   batch_axis = (fsdp, dp); sequence/query_sequence/key_sequence = sp;
///   head/kv_head/hidden_state/mlp_intermediate/vocab = tp; expert = ep;
///   decode_batch/head/kv_head/key_sequence = their resolved train values.
/// So `PartitionAxis({.tensor_parallel_axis = "model"})` puts heads, hidden and vocab on
/// "model". Explicit None is kept (it never means "derive").
///
///   PartitionAxis paxis;
///   paxis.resolve_spec({tokens::kBatch, tokens::kQueryLength, tokens::kEmbed}, Mode::kTrain)
///     == PartitionSpec{AxisRule::tuple({"fsdp", "dp"}), "sp", "tp"}
///
/// Resolution follows eformer exactly (docs/sharding.md): a token reads its field; in decode
/// and insert a field with a non-None decode_* twin reads the twin; a tuple or list entry is a
/// composite whose members resolve one by one and unknown members stay literal mesh names.
///
/// The process-global registry of custom tokens (register_axis and friends) is shared by all
/// PartitionAxis objects, as eformer's class-level registry is.
/// Thread-safety: a PartitionAxis is immutable; the registry functions are thread-safe and
/// resolution sees a consistent registry.
class PartitionAxis {
 public:
  /// The defaults: every field derived from dp, fsdp, tp, sp, ep.
  PartitionAxis();
  /// Derives NOT_GIVEN fields. Throws: ValueError "Partitioning rule `<field>` was not
  /// resolved." for the first field (in field order) left NOT_GIVEN (a mesh-name field or a
  /// field without a derivation rule given NOT_GIVEN explicitly).
  explicit PartitionAxis(PartitionAxisFields fields);

  /// Builds from (field name, value) pairs, eformer's keyword arguments.
  /// Throws: TypeError "PartitionAxis got an unexpected keyword argument 'x'" for an unknown
  /// field name; ValueError as the constructor.
  [[nodiscard]] static PartitionAxis from_kwargs(
      const std::vector<std::pair<std::string, AxisRule>>& kwargs);

  /// Every field.
  const PartitionAxisFields& fields() const noexcept { return fields_; }
  /// The field called `name` (eformer's hasattr/getattr), or nullptr.
  const AxisRule* find_field(std::string_view name) const noexcept;
  /// The 27 field names in eformer's order.
  static std::span<const std::string_view> field_names() noexcept;

  /// The train fields that have a decode twin, with the twin (eformer's
  /// _STANDARD_TO_GENERATION_ATTR_MAP): batch_axis -> decode_batch_axis, ...
  static std::span<const std::pair<std::string_view, std::string_view>> decode_twins() noexcept;

  /// dataclasses.replace: every current field value is passed back in with `kwargs` on top,
  /// so nothing is re-derived unless a field is given NOT_GIVEN (quirk: replacing
  /// tensor_parallel_axis keeps head_axis). Throws: as from_kwargs.
  [[nodiscard]] PartitionAxis replace(
      const std::vector<std::pair<std::string, AxisRule>>& kwargs) const;

  /// eformer's resolve_axis: one resolved rule per entry of `axes` (raw: tuples stay tuples,
  /// lists stay lists, None for None and "_"). Throws: ValueError "Unknown semantic axis name:
  /// 'x'" for an unknown top-level token; ValueError "Cyclic semantic axis registration
  /// detected at 'x'."; ValueError "Resolved axis rule for 'x' is still NOT_GIVEN.".
  [[nodiscard]] std::vector<AxisRule> resolve_axis(const std::vector<AxisRule>& axes,
                                                   Mode mode) const;
  /// P(*resolve_axis(axes, mode)). Throws: as resolve_axis, and ValueError when a composite
  /// member resolves to a tuple (nested tuple in P).
  [[nodiscard]] PartitionSpec resolve_spec(const std::vector<AxisRule>& axes, Mode mode) const;

  /// One entry of get_registered_axes().
  struct RegisteredAxis {
    AxisRule axis_rule;
    AxisRule generation_axis_rule;  ///< NOT_GIVEN when there is none.
    friend bool operator==(const RegisteredAxis&, const RegisteredAxis&) = default;
  };

  /// eformer's PartitionAxis.register (a C++ keyword, hence the name): maps the token
  /// `semantic_axis` (whitespace-stripped) to `axis_rule` for every PartitionAxis. With no
  /// generation rule, one is inferred when axis_rule names a field with a decode_* twin.
  /// Throws: ValueError "`semantic_axis` must be a non-empty string."; ValueError "Semantic
  /// axis 'x' already exists. Use override=True to replace it." when the token is built in or
  /// registered and `override_existing` is false. Thread-safe.
  static void register_axis(std::string_view semantic_axis, AxisRule axis_rule,
                            AxisRule generation_axis_rule = not_given,
                            bool override_existing = false);
  /// Removes a registered token (built-ins come back when they were overridden).
  /// Throws: ValueError for an empty name; KeyError "Semantic axis 'x' is not registered."
  /// when nothing was registered under it and `missing_ok` is false. Thread-safe.
  static void unregister_axis(std::string_view semantic_axis, bool missing_ok = true);
  /// Empties the registry. Thread-safe.
  static void clear_registered_axes();
  /// A snapshot of the registry. Thread-safe.
  static std::map<std::string, RegisteredAxis> get_registered_axes();

  /// eformer's to_dict: {field name: value}; tuples and lists become JSON arrays.
  nlohmann::json to_json() const;
  /// Inverse of to_json (arrays become tuples; missing fields take their defaults).
  /// Throws: TypeError for an unknown field or a value that is not null, a string or an array
  /// of those; ValueError as the constructor.
  [[nodiscard]] static PartitionAxis from_json(const nlohmann::json& j);

  friend bool operator==(const PartitionAxis& a, const PartitionAxis& b) noexcept {
    return a.fields_ == b.fields_;
  }

 private:
  AxisRule resolve_rule(const AxisRule& rule, std::vector<std::string>* visited) const;

  PartitionAxisFields fields_;
};

}  // namespace numesh::sharding
