#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/placement.hpp"

// The resharding plan between two placement vectors (placement.hpp), as XLA's SPMD partitioner
// (`PartitionedHlo::ReshardNoCache`) and PyTorch DTensor's `redistribute` model it: the steps
// (collectives or local slices) that take data placed one way to another. Pure logic: no TBB,
// hwloc, Eigen; ops/lowering/reshard.hpp emits the steps as collectives.
//
// The output of a row-parallel matmul x[B, K/tp] @ w[K/tp, N] on mesh (dp=2, tp=4) is
// {Replicate(), Partial(sum)}; its consumer wants the rows split over tp instead:
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
struct std::hash<numesh::sharding::ReshardStep> {
  std::size_t operator()(const numesh::sharding::ReshardStep& s) const noexcept {
    return numesh::sharding::hash_value(s);
  }
};

template <>
struct fmt::formatter<numesh::sharding::ReshardStep> : fmt::formatter<std::string> {
  auto format(const numesh::sharding::ReshardStep& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
