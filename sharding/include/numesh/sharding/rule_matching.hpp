#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Name-based partition rules: eformer's match_partition_rules and
// create_pattern_based_partition_spec (eformer `escale/partition/constraints.py`; SPEC 7, 9).
//
// Patterns are regular expressions matched with Python's `re.search` semantics (a match
// anywhere in the name; anchor with ^ and $). numesh compiles them as ECMAScript std::regex,
// which accepts the patterns eformer and EasyDeL use (`\d`, `(?:...)`, classes, alternation,
// lazy quantifiers, lookahead). Python-only syntax is translated where ECMAScript has its
// meaning (`\A` as ^, `\Z` as $, `(?P<name>...)` as a plain group); what it lacks (named
// back-references, lookbehind, other inline flags) is rejected with a ValueError when the rules
// are compiled.

namespace numesh::sharding {

/// One rule: a regular expression searched in a leaf's path, and the spec it assigns.
struct PartitionRule {
  std::string pattern;
  PartitionSpec spec;
};

/// eformer's MIN_SHARDING_SIZE: the `min_size` that match_partition_rules uses when given
/// nullopt. Read once from the environment variable MIN_SHARDING_SIZE (default 16384).
/// Throws: ValueError when the variable is set but is not an integer ("invalid literal for
/// int() with base 10: 'x'"). Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t min_sharding_size();

/// eformer's match_partition_rules(rules, tree, min_size, strict) over a flattened tree: one
/// spec per leaf, in the order of `leaves` (flatten in JAX order: dict keys sorted, list
/// indices, None subtrees skipped).
///
/// strict (default):
///  - a leaf without an array, or a scalar (rank 0), gets P() without looking at the rules;
///  - otherwise the first rule whose pattern is found in `path` wins: P() if the array has
///    fewer than `min_size` elements (so a 0-size array gets P() for any min_size >= 1), else
///    the rule's spec truncated to the rank.
/// not strict: the first matching rule's spec as is, for every leaf (no size check, no
/// truncation; leaves without an array need a rule too).
/// `min_size` nullopt means min_sharding_size(); eformer's default is 0 (its docstring says
/// MIN_SHARDING_SIZE; the code says 0).
/// Example: rules {{"kernel", P(('fsdp','sp'), 'tp', 'ep')}}, leaf "mlp/kernel" of shape
/// (4096, 11008) -> P(('fsdp','sp'), 'tp').
/// Throws: ValueError "Partition rule not found for param: <path>" for the first leaf no rule
/// matches; ValueError for a pattern std::regex cannot compile (naming the pattern).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<PartitionSpec> match_partition_rules(
    const std::vector<PartitionRule>& rules, const std::vector<NamedLeaf>& leaves,
    std::optional<std::int64_t> min_size = 0, bool strict = true);

/// The function create_pattern_based_partition_spec returns: maps a parameter name to the
/// spec of the first rule whose pattern is found in it, else to the default spec.
/// An immutable value. Thread-safety: const methods are safe to call concurrently.
class PatternPartitionSpec {
 public:
  /// Rules matched in order, and the spec for names none matches.
  /// Throws: ValueError for a pattern std::regex cannot compile (naming the pattern).
  PatternPartitionSpec(std::vector<PartitionRule> rules, PartitionSpec default_spec);

  /// The spec for `name`: the first matching rule's, else default_spec().
  [[nodiscard]] PartitionSpec operator()(std::string_view name) const;
  /// The rules, in order (create_pattern_based_partition_spec: one per `|`-separated pattern).
  [[nodiscard]] const std::vector<PartitionRule>& rules() const noexcept { return rules_; }
  /// The spec for names no rule matches.
  [[nodiscard]] const PartitionSpec& default_spec() const noexcept { return default_spec_; }

 private:
  struct Compiled;
  std::vector<PartitionRule> rules_;
  PartitionSpec default_spec_;
  std::shared_ptr<const Compiled> compiled_;
};

/// eformer's create_pattern_based_partition_spec(pattern, mesh, default_spec).
///
/// `pattern` is `regex|regex->axis.axis,regex->axis`: it is split on ',' into pieces; a piece
/// without "->" is ignored; otherwise the left side is split on '|' into patterns and the
/// right side on '.' into spec entries, an empty part meaning None ("fsdp..tp" gives
/// P('fsdp', None, 'tp'); "a->" gives P(None)). Nothing is trimmed: " bias" is a pattern with
/// a leading space, and "(fsdp,sp)" is split at its comma like any other.
/// A mesh is required, as in eformer, but not used: `mesh` nullptr means the current mesh.
/// `default_spec` nullopt means P().
/// Throws: NoMeshError when `mesh` is nullptr and the current mesh is empty; ValueError "too
/// many values to unpack (expected 2)" for a piece with two "->"; ValueError for a pattern
/// std::regex cannot compile (eformer fails later, at the first lookup).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] PatternPartitionSpec create_pattern_based_partition_spec(
    std::string_view pattern, const Mesh* mesh = nullptr,
    std::optional<PartitionSpec> default_spec = std::nullopt);

}  // namespace numesh::sharding
