#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

/// numesh::sharding: eformer's partition layer in C++ (pure logic: no TBB, hwloc or Eigen).
namespace numesh::sharding {

/// The type of eformer's NOT_GIVEN sentinel: "this field or argument was not supplied".
struct NotGiven {
  friend bool operator==(NotGiven, NotGiven) noexcept { return true; }
};
/// eformer's NOT_GIVEN.
inline constexpr NotGiven not_given{};

/// One value of eformer's dynamically typed axis vocabulary: what a PartitionAxis field holds,
/// what a semantic token resolves to, and what a PartitionSpec entry is.
///
/// eformer stores these as plain Python objects, and its behaviour depends on which kind of
/// object it sees (a tuple and a list resolve differently; `""` and `()` mean "replicated";
/// None inside a tuple is a literal member). AxisRule keeps that distinction:
///
///   None            AxisRule() or AxisRule(nullptr)
///   NOT_GIVEN       AxisRule(not_given)
///   "tp"            AxisRule("tp")                   a mesh axis name or a semantic token
///   ("fsdp", "dp")  AxisRule::tuple({"fsdp", "dp"})
///   ["fsdp", "sp"]  AxisRule::list({"fsdp", "sp"})
///   5               AxisRule::integer(5)             accepted by P(), dropped by correction
///   UNCONSTRAINED   AxisRule::unconstrained()        JAX's P.UNCONSTRAINED
///
/// A regular value type: copyable, comparable (Python equality: a tuple never equals a list),
/// hashable. Thread-safety: const methods are safe to call concurrently.
class AxisRule {
 public:
  /// What kind of Python object this value stands for.
  enum class Kind : std::uint8_t { kNone, kNotGiven, kUnconstrained, kName, kInt, kTuple, kList };

  /// None.
  AxisRule() noexcept = default;
  /// None.
  AxisRule(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor)
  /// NOT_GIVEN.
  AxisRule(NotGiven) noexcept : kind_(Kind::kNotGiven) {}  // NOLINT(google-explicit-constructor)
  /// A name (mesh axis, semantic token or PartitionAxis field name).
  AxisRule(std::string name) : kind_(Kind::kName), name_(std::move(name)) {}  // NOLINT
  /// A name.
  AxisRule(const char* name) : AxisRule(std::string(name)) {}  // NOLINT
  /// A name.
  AxisRule(std::string_view name) : AxisRule(std::string(name)) {}  // NOLINT

  /// A Python tuple of members (members may themselves be any kind; P() rejects nesting).
  [[nodiscard]] static AxisRule tuple(std::vector<AxisRule> members);
  /// A Python list of members.
  [[nodiscard]] static AxisRule list(std::vector<AxisRule> members);
  /// A Python int.
  [[nodiscard]] static AxisRule integer(std::int64_t value);
  /// JAX's PartitionSpec.UNCONSTRAINED.
  [[nodiscard]] static AxisRule unconstrained();

  /// The kind of value.
  Kind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == Kind::kNone; }
  bool is_not_given() const noexcept { return kind_ == Kind::kNotGiven; }
  bool is_unconstrained() const noexcept { return kind_ == Kind::kUnconstrained; }
  bool is_name() const noexcept { return kind_ == Kind::kName; }
  bool is_int() const noexcept { return kind_ == Kind::kInt; }
  bool is_tuple() const noexcept { return kind_ == Kind::kTuple; }
  bool is_list() const noexcept { return kind_ == Kind::kList; }
  /// True for tuples and lists.
  bool is_sequence() const noexcept { return is_tuple() || is_list(); }

  /// The name. REQUIRES: is_name().
  const std::string& name() const noexcept { return name_; }
  /// The integer. REQUIRES: is_int().
  std::int64_t integer_value() const noexcept { return int_; }
  /// The members of a tuple or list; empty for every other kind.
  const std::vector<AxisRule>& members() const noexcept { return members_; }

  /// Python truthiness: None, "", (), [] and 0 are false; NOT_GIVEN and UNCONSTRAINED are true.
  bool truthy() const noexcept;

  /// Python repr: `'tp'`, `('fsdp', 'dp')`, `['a']`, `None`, `5`, `NOT_GIVEN`, `UNCONSTRAINED`.
  /// Stable; error messages and tests use it.
  std::string repr() const;

  /// Python's str() of the entry, as an f-string prints it: a name bare (`tp`), anything else as
  /// its repr().
  std::string str() const { return is_name() ? name() : repr(); }

  friend bool operator==(const AxisRule& a, const AxisRule& b) noexcept;

 private:
  Kind kind_ = Kind::kNone;
  std::int64_t int_ = 0;
  std::string name_;
  std::vector<AxisRule> members_;
};

/// Python repr of a string: single quotes unless the text holds a single quote and no double
/// quote; backslashes, the chosen quote and control characters escaped.
std::string python_repr(std::string_view text);

/// Hash consistent with operator==.
std::size_t hash_value(const AxisRule& rule) noexcept;

}  // namespace numesh::sharding

template <>
struct std::hash<numesh::sharding::AxisRule> {
  std::size_t operator()(const numesh::sharding::AxisRule& r) const noexcept {
    return numesh::sharding::hash_value(r);
  }
};
