#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/placement.hpp"
#include "numesh/sharding/reshard_plan.hpp"

// The resharding entry point: operators never hand-code data movement. Given a sharded tensor
// whose shards hold data placed as `from` (Partial axes: each shard holds a summand) and a
// target tensor laid out as `to`, it asks sharding::plan_reshard for the steps and emits each
// as runtime collectives into the graph: reductions as all_reduce / reduce_scatter on sharded
// tensors, every other step (local slice, all-to-all, change of order, all-gather) as
// runtime::redistribute, which copies by layout within the step's groups.

namespace numesh::ops {

/// What reshard() added: the plan it followed, the frontier after which `out` is complete, and
/// the intermediate tensors of multi-step plans, which must live as long as the compiled graph.
struct ReshardResult {
  /// The steps, as plan_reshard chose them (empty: a plain copy).
  std::vector<sharding::ReshardStep> plan;
  /// Per mesh slot, the node completing the slot's shard of `out`.
  runtime::Frontier frontier;
  /// Intermediate tensors between steps (none for one step).
  std::vector<std::unique_ptr<runtime::ShardedTensor>> temporaries;
};

/// The collectives reshard() emits, as functions it calls rather than names it hard-codes (the
/// model is XLA's SPMDCollectiveOpsCreator): the runtime's by default; a test substitutes
/// wrappers that count, record or fake them, and a caller can pin an all-reduce algorithm.
/// Every member is set (ValueError from reshard() otherwise).
struct CollectiveOps {
  /// Sums (or maxes) `in` over args.axes into `out` (same layout).
  std::function<runtime::Frontier(runtime::GraphBuilder&, runtime::ShardedTensor& in,
                                  runtime::ShardedTensor& out, runtime::ReduceOp,
                                  const runtime::CollectiveArgs&)>
      all_reduce;
  /// Reduces `in`'s partial values over args.axes into `out`'s layout.
  std::function<runtime::Frontier(runtime::GraphBuilder&, runtime::ShardedTensor& in,
                                  runtime::ShardedTensor& out, runtime::ReduceOp,
                                  const runtime::CollectiveArgs&)>
      reduce_scatter;
  /// Copies `in` into `out`'s layout within the groups over args.axes (all-gather, all-to-all,
  /// local slice).
  std::function<runtime::Frontier(runtime::GraphBuilder&, runtime::ShardedTensor& in,
                                  runtime::ShardedTensor& out, const runtime::CollectiveArgs&)>
      redistribute;

  /// The runtime's collectives, all-reduces by `algorithm`.
  [[nodiscard]] static CollectiveOps runtime_collectives(
      runtime::AllReduceAlgorithm algorithm = runtime::AllReduceAlgorithm::kAuto);
};

/// The layout spec of a tensor placed as `placements` (Partial axes hold full-size summands,
/// so they lay out as Replicate). Throws: as sharding::to_spec.
sharding::PartitionSpec layout_spec(std::vector<sharding::Placement> placements,
                                    const sharding::Mesh& mesh, std::size_t rank);

/// Emits into `builder` the collectives that take `in` (placed as `from`) to `out` (placed as
/// `to`, no Partial), after `after` (per slot; empty = nothing to wait for), through `ops`.
/// Node names start with `name`.
/// Throws: ValueError when in's layout is not layout_spec(from) or out's is not to_spec(to)
/// (naming both), or when plan_reshard refuses the pair; what the collectives throw.
ReshardResult reshard(runtime::GraphBuilder& builder, runtime::ShardedTensor& in,
                      const std::vector<sharding::Placement>& from, runtime::ShardedTensor& out,
                      const std::vector<sharding::Placement>& to, const runtime::Frontier& after,
                      const std::string& name,
                      const CollectiveOps& ops = CollectiveOps::runtime_collectives());

}  // namespace numesh::ops
