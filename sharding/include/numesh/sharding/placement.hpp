#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Per-mesh-axis placements, as PyTorch DTensor (`Shard(dim)`, `Replicate()`,
// `Partial(reduce_op)`) models them; the resharding plan between two of them is in
// reshard_plan.hpp. Pure logic: no TBB, hwloc, Eigen.
//
// A PartitionSpec says, per *tensor dim*, which mesh axes split it. A placement vector says the
// same thing per *mesh axis* (one Placement per axis, in mesh order), and can say one more
// thing a spec cannot: Partial, "every device holds a summand; the value is their sum over
// this axis", which is what a row-parallel matmul produces before its all-reduce.
//
// Worked example, mesh (dp=2, tp=4):
//
//   to_placements(P('dp', 'tp'), mesh, 2)    == {Shard(0), Shard(1)}
//   to_placements(P(('dp', 'tp')), mesh, 1)  == {Shard(0), Shard(0)@1}   (dp major, tp minor)
//   to_placements(P(None, 'tp'), mesh, 2)    == {Replicate(), Shard(1)}
//   to_spec({Replicate(), Shard(1)}, mesh, 3) == P(None, 'tp')            (trailing None dropped)

namespace numesh::sharding {

/// The reduction a Partial placement is waiting for (DTensor's `Partial(reduce_op)`).
enum class PartialOp : std::uint8_t {
  kSum,  ///< the value is the sum of the devices' summands
  kMax,  ///< the value is the element-wise maximum of the devices' values
};

/// "sum" or "max". Stable: to_string() of Placement and ReshardStep use it.
std::string_view to_string(PartialOp op) noexcept;

/// How one mesh axis places a tensor.
///  - Replicate(): every device along the axis holds the same data.
///  - Shard(dim): the axis splits tensor dim `dim` into size(axis) blocks. When several mesh
///    axes split the same dim (a spec entry like ('dp', 'tp')), `order` is the axis's position
///    among them, major to minor: in ('dp', 'tp') dp has order 0 and tp order 1, and the device
///    at (dp = i, tp = j) holds block i * size(tp) + j.
///  - Partial(op): each device holds a partial value; the tensor is their reduction by `op`
///    over this axis (a pending all-reduce).
/// Fields that do not belong to `kind` (dim and order unless kShard, op unless kPartial) are
/// ignored by ==, hash_value and to_string(); build values with the factories.
///
/// A regular value type: copyable, ==, std::hash, to_string(), fmt-formattable.
/// Thread-safety: const methods are safe to call concurrently.
struct Placement {
  /// What the axis does to the tensor.
  enum class Kind : std::uint8_t { kReplicate, kShard, kPartial };

  /// What the axis does.
  Kind kind = Kind::kReplicate;
  /// kShard: the tensor dim the axis splits (>= 0).
  int dim = 0;
  /// kShard: position among the mesh axes splitting `dim`, major (0) to minor.
  int order = 0;
  /// kPartial: the pending reduction.
  PartialOp op = PartialOp::kSum;

  /// Replicate().
  [[nodiscard]] static Placement replicate() noexcept { return Placement{}; }
  /// Shard(dim), at position `order` among the axes splitting `dim`.
  /// REQUIRES: dim >= 0, order >= 0 (check_placements reports violations).
  [[nodiscard]] static Placement shard(int dim, int order = 0) noexcept {
    return Placement{Kind::kShard, dim, order, PartialOp::kSum};
  }
  /// Partial(op).
  [[nodiscard]] static Placement partial(PartialOp op = PartialOp::kSum) noexcept {
    return Placement{Kind::kPartial, 0, 0, op};
  }

  bool is_replicate() const noexcept { return kind == Kind::kReplicate; }
  bool is_shard() const noexcept { return kind == Kind::kShard; }
  bool is_partial() const noexcept { return kind == Kind::kPartial; }

  /// Stable compact text: "Replicate()", "Shard(0)", "Shard(0)@1" (order shown only when
  /// not 0), "Partial(sum)", "Partial(max)". Tests assert on it.
  std::string to_string() const;

  /// Equal kinds and, for kShard, equal dim and order; for kPartial, equal op.
  friend bool operator==(const Placement& a, const Placement& b) noexcept;
};

/// Hash consistent with operator==.
std::size_t hash_value(const Placement& p) noexcept;

/// "[Shard(0), Replicate()]": the to_string() of each placement, comma-separated, in brackets.
std::string to_string(const std::vector<Placement>& placements);

/// Checks that `placements` is a well-formed placement vector for `mesh`:
///  1. one placement per mesh axis (ValueError naming both counts and the mesh);
///  2. every Shard has dim >= 0 and order >= 0 (ValueError naming the axis and placement);
///  3. per tensor dim, the orders of the axes sharding it are 0, 1, ..., k-1, each once
///     (ValueError naming the dim and the axes with their orders).
/// The tensor rank is not checked (to_spec does that). Thread-safety: pure; safe to call
/// concurrently. Throws: ValueError as listed.
void check_placements(const std::vector<Placement>& placements, const Mesh& mesh);

/// One Placement per axis of `mesh`, in mesh order, for a tensor of rank `rank` partitioned by
/// `spec`: an axis named by entry d alone is Shard(d); the members of a tuple entry are
/// Shard(d) with orders 0, 1, ... in tuple order (major to minor); an axis the spec does not
/// name is Replicate(). A spec never yields Partial.
///
/// Checks, in order (the same rules as ShardLayout, but KeyError for an unknown axis, as
/// Mesh::axis_size):
///  1. spec.size() <= rank (ShapeError naming the spec, its length and the rank);
///  2. then entry by entry, member by member:
///     - the entry is None, a name, or a tuple of names (ValueError naming the dim for
///       UNCONSTRAINED, NOT_GIVEN, an integer, or a None/integer member of a tuple);
///     - the name is a mesh axis (KeyError, key() = the name, message naming the spec and the
///       mesh's axes);
///     - the axis was not named before, in this or an earlier entry (DuplicateSpecError naming
///       the axis, the spec and both dims).
/// Divisibility is not checked: there is no shape here (ShardLayout checks it).
/// Thread-safety: pure; safe to call concurrently.
/// Throws: ShapeError, ValueError, KeyError, DuplicateSpecError as listed.
[[nodiscard]] std::vector<Placement> to_placements(const PartitionSpec& spec, const Mesh& mesh,
                                                   std::size_t rank);

/// The inverse of to_placements: the PartitionSpec of a Partial-free placement vector for a
/// tensor of rank `rank`. Entry d holds the axes sharding dim d ordered by `order`: None when
/// there are none, the axis name for one, a tuple for several. Trailing None entries are
/// dropped, so every placement vector has one spec (P() when nothing is sharded):
/// to_spec(to_placements(P('dp', None), mesh, 2), mesh, 2) == P('dp',). P('dp',) and
/// P('dp', None) lay out a rank-2 array identically, although PartitionSpec's == (like JAX's)
/// tells them apart; PartitionSpec itself keeps trailing Nones, as eformer's correction does.
///
/// Checks, in order: check_placements (ValueError); no Partial (ValueError naming the axis: a
/// spec cannot express a pending reduction); every Shard dim < rank (ShapeError naming the
/// axis, its placement and the rank).
/// Thread-safety: pure; safe to call concurrently. Throws: ValueError, ShapeError as listed.
[[nodiscard]] PartitionSpec to_spec(const std::vector<Placement>& placements, const Mesh& mesh,
                                    std::size_t rank);

}  // namespace numesh::sharding

template <>
struct std::hash<numesh::sharding::Placement> {
  std::size_t operator()(const numesh::sharding::Placement& p) const noexcept {
    return numesh::sharding::hash_value(p);
  }
};

template <>
struct fmt::formatter<numesh::sharding::Placement> : fmt::formatter<std::string> {
  auto format(const numesh::sharding::Placement& p, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(p.to_string(), ctx);
  }
};
