#include "numesh/ops/lowering/reshard.hpp"

#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

namespace {

using sharding::Placement;
using sharding::ReshardStep;

runtime::ReduceOp reduce_op(sharding::PartialOp op) {
  return op == sharding::PartialOp::kSum ? runtime::ReduceOp::kSum : runtime::ReduceOp::kMax;
}

// Same layout: compare per-axis placements, which do not care about trailing Nones.
bool same_layout(const runtime::ShardedTensor& t, const std::vector<Placement>& placements) {
  return sharding::to_placements(t.spec(), t.mesh().mesh(), t.shape().size()) == placements;
}

std::vector<Placement> without_partial(std::vector<Placement> p) {
  for (Placement& x : p) {
    if (x.is_partial()) x = Placement::replicate();
  }
  return p;
}

}  // namespace

sharding::PartitionSpec layout_spec(std::vector<Placement> placements, const sharding::Mesh& mesh,
                                    std::size_t rank) {
  return sharding::to_spec(without_partial(std::move(placements)), mesh, rank);
}

CollectiveOps CollectiveOps::runtime_collectives(runtime::AllReduceAlgorithm algorithm) {
  CollectiveOps ops;
  ops.all_reduce = [algorithm](runtime::GraphBuilder& b, runtime::ShardedTensor& in,
                               runtime::ShardedTensor& out, runtime::ReduceOp op,
                               const runtime::CollectiveArgs& args) {
    return runtime::all_reduce(b, in, out, op, args, algorithm);
  };
  ops.reduce_scatter = [](runtime::GraphBuilder& b, runtime::ShardedTensor& in,
                          runtime::ShardedTensor& out, runtime::ReduceOp op,
                          const runtime::CollectiveArgs& args) {
    return runtime::reduce_scatter(b, in, out, op, args);
  };
  ops.redistribute = [](runtime::GraphBuilder& b, runtime::ShardedTensor& in,
                        runtime::ShardedTensor& out, const runtime::CollectiveArgs& args) {
    return runtime::redistribute(b, in, out, args);
  };
  return ops;
}

ReshardResult reshard(runtime::GraphBuilder& builder, runtime::ShardedTensor& in,
                      const std::vector<Placement>& from, runtime::ShardedTensor& out,
                      const std::vector<Placement>& to, const runtime::Frontier& after,
                      const std::string& name, const CollectiveOps& ops) {
  NUMESH_CHECK(ops.all_reduce && ops.reduce_scatter && ops.redistribute, ValueError,
               "{}: the CollectiveOps given to reshard() leave a collective unset", name);
  const sharding::Mesh& mesh = in.mesh().mesh();
  const std::size_t rank = in.shape().size();
  NUMESH_CHECK(same_layout(in, without_partial(from)), ValueError,
               "{}: the input is laid out as {} but its placements {} need {}", name,
               in.spec().repr(), sharding::to_string(from), layout_spec(from, mesh, rank).repr());
  NUMESH_CHECK(same_layout(out, to), ValueError,
               "{}: the output is laid out as {} but the target placements {} need {}", name,
               out.spec().repr(), sharding::to_string(to),
               sharding::to_spec(to, mesh, rank).repr());
  ReshardResult result;
  result.plan = sharding::plan_reshard(from, to, mesh);
  if (result.plan.empty()) {
    // Same placements: a local copy per slot.
    result.frontier =
        ops.redistribute(builder, in, out, {.axes = {}, .after = after, .name = name});
    return result;
  }
  runtime::ShardedTensor* src = &in;
  std::vector<Placement> placed = from;
  runtime::Frontier frontier = after;
  for (std::size_t i = 0; i < result.plan.size(); ++i) {
    const ReshardStep& step = result.plan[i];
    const std::vector<Placement> next = sharding::apply_reshard_step(placed, step, mesh);
    runtime::ShardedTensor* dst = &out;
    if (i + 1 < result.plan.size()) {
      result.temporaries.push_back(std::make_unique<runtime::ShardedTensor>(
          out.mesh(), out.shape(), layout_spec(next, mesh, rank), out.dtype()));
      dst = result.temporaries.back().get();
    }
    const runtime::CollectiveArgs args{
        .axes = step.axes, .after = frontier, .name = fmt::format("{}.{}", name, i)};
    switch (step.kind) {
      case ReshardStep::Kind::kAllReduce:
        frontier = ops.all_reduce(builder, *src, *dst, reduce_op(step.op), args);
        break;
      case ReshardStep::Kind::kReduceScatter:
        frontier = ops.reduce_scatter(builder, *src, *dst, reduce_op(step.op), args);
        break;
      case ReshardStep::Kind::kAllGather:
      case ReshardStep::Kind::kAllToAll:
      case ReshardStep::Kind::kLocalSlice:
        frontier = ops.redistribute(builder, *src, *dst, args);
        break;
    }
    src = dst;
    placed = next;
  }
  result.frontier = std::move(frontier);
  return result;
}

}  // namespace numesh::ops
