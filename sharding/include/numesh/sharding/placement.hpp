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

// Per-mesh-axis placements and the resharding plan between two of them, as PyTorch DTensor
// (`Shard(dim)`, `Replicate()`, `Partial(reduce_op)`, `redistribute`) and XLA's SPMD
// partitioner (`PartitionedHlo::ReshardNoCache`) model them. Pure logic: no TBB, hwloc, Eigen.
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
//
// The output of a row-parallel matmul x[B, K/tp] @ w[K/tp, N] is {Replicate(), Partial(sum)};
// its consumer wants the rows split over tp instead:
//
//   plan_reshard({Replicate(), Partial(sum)}, {Replicate(), Shard(0)}, mesh)
//       == {ReduceScatter(sum, dim=0, axes=[tp])}
//
// and a batch-sharded, tp-partial value that must become fully replicated needs
//
//   plan_reshard({Shard(0), Partial(sum)}, {Replicate(), Replicate()}, mesh)
//       == {AllReduce(sum, axes=[tp]), AllGather(dim=0, axes=[dp])}
//
// in that order: the sum runs over B/2 rows per device, not over all B of them.

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

/// One collective (or local step) of a resharding plan. Fields a kind does not use hold
/// kNoDim (dims) and PartialOp::kSum (op); build steps with the factories.
///
/// Semantics, applied to the placement vector the plan has reached so far (apply_reshard_step
/// computes the next one). `axes` form one group per combination of the other axes'
/// coordinates; a device's rank in its group reads its coordinates on `axes` as a mixed-radix
/// number, the first listed axis most significant (the spec's tuple order).
///  - kLocalSlice(to_dim): `axes` are Replicate; each device keeps block `rank` of its data
///    along to_dim. No communication. The axes become the minor-most splitters of to_dim, in
///    listed order.
///  - kReduceScatter(op, to_dim): `axes` are Partial(op); reduce over the group and scatter
///    along to_dim. The axes become the minor-most splitters of to_dim, in listed order.
///  - kAllReduce(op): `axes` are Partial(op); reduce over the group. They become Replicate.
///  - kAllToAll(from_dim -> to_dim), from_dim != to_dim: `axes` are, in listed order, the
///    minor-most splitters of from_dim; each device splits its data along to_dim into
///    group-size pieces, sends piece r to rank r and concatenates what it receives along
///    from_dim. The axes leave from_dim and become the minor-most splitters of to_dim.
///  - kAllToAll(d -> d): a change of order among the axes splitting d. `axes` is the new order,
///    major to minor, of the minor-most splitters of d from the first one whose position
///    changes (('dp', 'tp') -> ('tp', 'dp') is axes [tp, dp]). Each device sends its whole
///    block to the one peer of the group that must hold it; the lowering may use a
///    collective-permute, which is what XLA emits for a reordered tile assignment.
///  - kAllGather(from_dim): `axes` are, in listed order, the minor-most splitters of from_dim;
///    gather along from_dim, concatenating in rank order. They become Replicate.
/// A step over axes that all have size 1 moves no data; the lowering may skip it.
///
/// A regular value type: copyable, ==, std::hash, to_string(), fmt-formattable.
/// Thread-safety: const methods are safe to call concurrently.
struct ReshardStep {
  /// The collective.
  enum class Kind : std::uint8_t { kAllReduce, kReduceScatter, kAllGather, kAllToAll, kLocalSlice };
  /// from_dim / to_dim of a kind that has no such dim.
  static constexpr int kNoDim = -1;

  /// The collective.
  Kind kind = Kind::kLocalSlice;
  /// The mesh axes of the group, in group-rank order (major first). Never empty in a plan.
  std::vector<std::string> axes;
  /// The tensor dim data leaves (kAllGather, kAllToAll); kNoDim otherwise.
  int from_dim = kNoDim;
  /// The tensor dim data is split along (kLocalSlice, kReduceScatter, kAllToAll); kNoDim
  /// otherwise.
  int to_dim = kNoDim;
  /// The reduction (kAllReduce, kReduceScatter); kSum otherwise.
  PartialOp op = PartialOp::kSum;

  /// kAllReduce(op) over `axes`.
  [[nodiscard]] static ReshardStep all_reduce(std::vector<std::string> axes, PartialOp op);
  /// kReduceScatter(op) over `axes`, scattering along `dim`.
  [[nodiscard]] static ReshardStep reduce_scatter(std::vector<std::string> axes, int dim,
                                                  PartialOp op);
  /// kAllGather over `axes` along `dim`.
  [[nodiscard]] static ReshardStep all_gather(std::vector<std::string> axes, int dim);
  /// kAllToAll over `axes`, from `from_dim` to `to_dim` (equal for a change of order).
  [[nodiscard]] static ReshardStep all_to_all(std::vector<std::string> axes, int from_dim,
                                              int to_dim);
  /// kLocalSlice over `axes` along `dim`.
  [[nodiscard]] static ReshardStep local_slice(std::vector<std::string> axes, int dim);

  /// Stable compact text: "AllReduce(sum, axes=[dp,tp])", "ReduceScatter(sum, dim=0,
  /// axes=[tp])", "AllGather(dim=1, axes=[tp])", "AllToAll(dim=0->1, axes=[tp])",
  /// "LocalSlice(dim=0, axes=[dp])". Tests assert on it.
  std::string to_string() const;

  friend bool operator==(const ReshardStep&, const ReshardStep&) = default;
};

/// Hash consistent with operator==.
std::size_t hash_value(const ReshardStep& step) noexcept;

/// "[step; step; ...]" with each step's to_string(); "[]" for an empty plan.
std::string to_string(const std::vector<ReshardStep>& plan);

/// The steps that turn data placed as `from` into data placed as `to` on `mesh`: the single
/// resharding entry point's decision (XLA's ReshardNoCache, DTensor's redistribute). Per mesh
/// axis whose placement differs:
///
///   from \ to     Replicate        Shard(e)                  Partial(op)
///   Replicate     -                local slice along e       ValueError
///   Shard(d)      all-gather of d  all-to-all d -> e         ValueError
///   Partial(op)   all-reduce       reduce-scatter along e    - (same op), else ValueError
///
/// Shard(d) -> Shard(d) with another order is a change of order: an all-to-all d -> d.
///
/// Axes doing the same thing (same kind, dims and op) are merged into one step over several
/// axes: {Partial, Partial} -> {Replicate, Replicate} is one all-reduce over [dp, tp].
///
/// Step order, and why: the plan moves the fewest bytes when data shrinks before it travels
/// and grows only at the end. XLA's ReshardNoCache tries all-to-all and collective-permute
/// before its replicate-then-slice fallback, and DTensor's min-cost redistribute planner
/// (Dijkstra over these same transitions) prefers such paths for the same reason; numesh fixes
/// the order instead of searching:
///  1. local slices (free, and they shrink every later collective by the axis size);
///  2. reductions: reduce-scatters (they shrink the data), then all-reduces (size kept, now on
///     the smaller shards);
///  3. all-to-alls (size kept), including changes of order within a dim;
///  4. all-gathers last (they grow the data, so nothing runs on the grown data).
/// Slices, reduce-scatters and all-to-alls append their axes as the minor-most splitters of
/// their dim and all-gathers remove the minor-most ones (see ReshardStep), so when a dim's
/// order would otherwise come out wrong the plan inserts a change of order (an all-to-all
/// d -> d over the affected axes) just before the all-to-alls out of that dim or before the
/// all-gathers. Example: {Shard(0), Replicate()} -> {Replicate(), Shard(0)} is
/// [LocalSlice(dim=0, axes=[tp]), AllToAll(dim=0->0, axes=[tp,dp]), AllGather(dim=0,
/// axes=[dp])] on (dp=2, tp=4): each device receives at most 1/8 + 1/8 of the tensor, where
/// gathering dp first would receive 1/2 (and hold all of it).
/// Within one phase, steps go by dim ascending (all-to-alls: by source dim, and out of one dim
/// the minor-most group first); a step's axes follow the target order of the dim (slices,
/// reduce-scatters), the current order (all-to-alls, gathers) or mesh order (all-reduces).
///
/// Checks: check_placements on both vectors (ValueError); every Partial of `from` has the same
/// op (ValueError: with sum on one axis and max on another the value depends on the order of
/// reduction); no axis goes to a Partial it does not already hold (ValueError naming the axis
/// and both placements: a reshard cannot create a pending reduction).
/// Applying the steps in order with apply_reshard_step to `from` gives `to`.
/// Thread-safety: pure; safe to call concurrently. Throws: ValueError as listed.
[[nodiscard]] std::vector<ReshardStep> plan_reshard(const std::vector<Placement>& from,
                                                    const std::vector<Placement>& to,
                                                    const Mesh& mesh);

/// The placement vector after `step` runs on data placed as `placements` (the semantics are
/// on ReshardStep). A lowering walks a plan with it to know each intermediate placement.
/// Checks: check_placements; `axes` non-empty, mesh axes, each once (KeyError for an unknown
/// axis, ValueError otherwise); the step's preconditions (ValueError naming the step, the
/// axis and its placement): the axes' current placements, and for gathers, all-to-alls and
/// changes of order that they are the minor-most splitters of the dim in the listed order
/// (for a change of order: the same axes, any order); dims >= 0.
/// Thread-safety: pure; safe to call concurrently. Throws: ValueError, KeyError as listed.
[[nodiscard]] std::vector<Placement> apply_reshard_step(const std::vector<Placement>& placements,
                                                        const ReshardStep& step, const Mesh& mesh);

}  // namespace numesh::sharding

template <>
struct std::hash<numesh::sharding::Placement> {
  std::size_t operator()(const numesh::sharding::Placement& p) const noexcept {
    return numesh::sharding::hash_value(p);
  }
};

template <>
struct std::hash<numesh::sharding::ReshardStep> {
  std::size_t operator()(const numesh::sharding::ReshardStep& s) const noexcept {
    return numesh::sharding::hash_value(s);
  }
};

template <>
struct fmt::formatter<numesh::sharding::Placement> : fmt::formatter<std::string> {
  auto format(const numesh::sharding::Placement& p, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(p.to_string(), ctx);
  }
};

template <>
struct fmt::formatter<numesh::sharding::ReshardStep> : fmt::formatter<std::string> {
  auto format(const numesh::sharding::ReshardStep& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
