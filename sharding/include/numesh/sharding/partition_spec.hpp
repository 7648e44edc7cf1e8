#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"

namespace numesh::sharding {

/// Canonicalises one PartitionSpec entry exactly as JAX 0.9.2 does: a falsy value (None, "",
/// (), [], 0) becomes None; a tuple or list of one member becomes that member (as it is); a
/// longer list becomes a tuple; anything else is kept.
/// Throws: ValueError when a tuple or list holds a tuple or list ("A tuple inside
/// PartitionSpec cannot contain a nested tuple. ...").
[[nodiscard]] AxisRule canonicalize_entry(const AxisRule& entry);

/// A partition spec: one entry per tensor dimension, each None (replicated), a mesh axis
/// name, or a tuple of mesh axis names (sharded over their product). `PartitionSpec{}` is
/// JAX's `P()` (fully replicated, rank-free).
///
/// Entries are canonicalised on construction (see canonicalize_entry), so
///   PartitionSpec{"dp", AxisRule::list({"fsdp"}), AxisRule::tuple({"fsdp", "sp"}), ""}
/// holds  P('dp', 'fsdp', ('fsdp', 'sp'), None).
/// `P(None) != P()`: the lengths differ (eformer relies on this quirk).
///
/// A regular value: copyable, ==, std::hash, repr(), fmt-formattable. Thread-safety: const
/// methods are safe to call concurrently.
class PartitionSpec {
 public:
  /// P(): no entries.
  PartitionSpec() = default;
  /// P(*entries). Throws: ValueError on a nested tuple.
  PartitionSpec(std::initializer_list<AxisRule> entries);
  /// P(*entries). Throws: ValueError on a nested tuple.
  explicit PartitionSpec(std::vector<AxisRule> entries);

  /// P(None, ..., None) with `rank` entries.
  [[nodiscard]] static PartitionSpec replicated(std::size_t rank);

  /// Parses the spec grammar of docs/sharding.md: an optional `P(` ... `)` wrapper around
  /// comma-separated entries; an entry is `None`, `null` or nothing (replicated), a name
  /// (optionally quoted), or `(a, b)` / `[a, b]` (a tuple). Examples: `P('dp', ('fsdp','sp'))`,
  /// `dp,(fsdp,sp),None`. Throws: ValueError naming the position of a syntax error.
  [[nodiscard]] static PartitionSpec parse(std::string_view text);

  /// Number of entries (not the tensor rank: P() has 0 entries for any rank).
  std::size_t size() const noexcept { return entries_.size(); }
  /// True for P().
  bool empty() const noexcept { return entries_.empty(); }
  /// Entry `i`. REQUIRES: i < size().
  const AxisRule& operator[](std::size_t i) const noexcept { return entries_[i]; }
  /// All entries, canonical.
  const std::vector<AxisRule>& entries() const noexcept { return entries_; }
  auto begin() const noexcept { return entries_.begin(); }
  auto end() const noexcept { return entries_.end(); }

  /// True when no entry shards anything (P() or all None).
  bool is_fully_replicated() const noexcept;

  /// The names used by entry `i` in order: {} for None, {name} for a name, the members' names
  /// for a tuple. Non-name members (None, ints) are skipped.
  std::vector<std::string> entry_names(std::size_t i) const;

  /// JAX's repr: `P()`, `P('dp',)`, `P(('fsdp', 'dp'), 'sp', None)`. Error messages use it.
  std::string repr() const;

  friend bool operator==(const PartitionSpec& a, const PartitionSpec& b) noexcept {
    return a.entries_ == b.entries_;
  }

 private:
  std::vector<AxisRule> entries_;
};

/// Hash consistent with operator==.
std::size_t hash_value(const PartitionSpec& spec) noexcept;

}  // namespace numesh::sharding

template <>
struct std::hash<numesh::sharding::PartitionSpec> {
  std::size_t operator()(const numesh::sharding::PartitionSpec& s) const noexcept {
    return numesh::sharding::hash_value(s);
  }
};

template <>
struct fmt::formatter<numesh::sharding::PartitionSpec> : fmt::formatter<std::string> {
  auto format(const numesh::sharding::PartitionSpec& spec, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(spec.repr(), ctx);
  }
};
