#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/placement.hpp"

// How gradients are placed on the mesh, so that every backward collective follows from the
// forward's placements instead of being written per operator.
//
// A gradient is held as placements too. Its canonical placement (gradient_placements) mirrors
// its tensor's: a Shard stays the same Shard, a Replicate is Replicate (every device holds the
// whole gradient, because every device ran the same computation downstream of it), and a
// Partial(sum) is Replicate (each summand's gradient is the whole gradient of the sum). A
// backward node may produce a gradient in another placement: Partial over the axes whose
// devices each used the tensor on their own part of the work (a replicated weight applied to
// each device's rows, an input multiplied by each device's slice of the weights). Resharding
// that produced gradient into the canonical placement of the forward tensor is the transpose
// of whatever the forward did to it:
//   forward all-gather   Shard -> Replicate   backward Partial -> Shard     reduce-scatter
//   forward all-reduce   Partial -> Replicate backward Replicate -> Replicate identity
//   forward reduce-scatter Partial -> Shard   backward Shard -> Replicate   all-gather
//   forward all-to-all   Shard(a) -> Shard(b) backward Shard(b) -> Shard(a) all-to-all
//   forward local slice  Replicate -> Shard   backward Shard -> Replicate   all-gather
// and a weight used whole by data-parallel devices (Partial over dp) is all-reduced, one
// stored split over fsdp is reduce-scattered (ZeRO), both from the same rule. The loss is a
// mean over every token of the global batch, so the summed partial gradients are the exact
// gradient: no division by the data-parallel size follows.

namespace numesh::ops {

/// The canonical placement of the gradient of a tensor placed `forward`: Shard as it is,
/// Replicate and Partial(any op) as Replicate.
std::vector<sharding::Placement> gradient_placements(std::vector<sharding::Placement> forward);

/// The placement a per-device weight gradient dW = dy^T x is produced in, for a weight used
/// as placed `weight` and an activation x [..., in] placed `x` (rank `x_rank`): the weight's
/// Shards, Partial(sum) on every other axis that splits one of x's token dims (all but the
/// last: each device summed over its own tokens), Replicate elsewhere.
std::vector<sharding::Placement> weight_gradient_placements(
    const std::vector<sharding::Placement>& weight, const std::vector<sharding::Placement>& x,
    std::size_t x_rank);

/// `placed` with Partial(op) on every axis where `by` holds a Shard: the placement of an
/// output whose devices each reduced over their own slice of a dimension split as `by` (a
/// row-parallel product, an input gradient through a column-parallel one, a row's max over a
/// vocabulary slice).
std::vector<sharding::Placement> partial_where_sharded(
    std::vector<sharding::Placement> placed, const std::vector<sharding::Placement>& by,
    sharding::PartialOp op = sharding::PartialOp::kSum);

/// The gradient of a tensor placed `forward`, from `produced` (a program tensor holding it
/// placed `produced_placed`): `produced` itself when that already is the canonical placement
/// gradient_placements(forward), else a new program tensor `name` laid out canonically, filled
/// by the collectives that take one to the other (the transpose of the forward's collectives;
/// see the table above), which start after `ready`. `ready` becomes the frontier after which
/// the returned tensor is complete.
/// Throws: as ProgramBuilder::reshard (a produced placement the planner cannot take to the
/// canonical one, e.g. a Partial where the forward tensor was Shard on the same axis).
runtime::ShardedTensor& canonical_gradient(ProgramBuilder& program,
                                           runtime::ShardedTensor& produced,
                                           const std::vector<sharding::Placement>& produced_placed,
                                           const std::vector<sharding::Placement>& forward,
                                           const std::string& name, runtime::Frontier& ready);

/// As canonical_gradient(), into `out` (laid out as gradient_placements(forward): a parameter's
/// gradient tensor): the collectives when the placements differ, else one copy node per slot;
/// nothing when `produced` is `out` itself (gradient_target() chose it): then returns `after`.
/// Returns the frontier after which `out` is complete.
/// Throws: as ProgramBuilder::reshard; ShapeError when out's shape is not produced's.
runtime::Frontier reduce_gradient_into(ProgramBuilder& program, runtime::ShardedTensor& produced,
                                       const std::vector<sharding::Placement>& produced_placed,
                                       runtime::ShardedTensor& out, const runtime::Frontier& after,
                                       const std::string& name);

/// reduce_gradient_into() for a weight's gradient dW = dy^T x computed per device into
/// `produced` (laid out as `used`, the weight as multiplied) from an activation x placed `x`
/// (rank `x_rank`): produced placed as weight_gradient_placements(used's, x, x_rank).
/// Throws: as reduce_gradient_into.
runtime::Frontier reduce_weight_gradient(ProgramBuilder& program, runtime::ShardedTensor& produced,
                                         const runtime::ShardedTensor& used,
                                         const std::vector<sharding::Placement>& x,
                                         std::size_t x_rank, runtime::ShardedTensor& out,
                                         const runtime::Frontier& after, const std::string& name);

/// The tensor a backward node writes a parameter's gradient into as it computes it, placed
/// `produced_placed` and laid out as `like` (the parameter as the node multiplied it): `out`
/// itself when reduce_gradient_into() would only copy it there (nothing to sum or gather: the
/// placements are out's but on axes of one device, `like` is laid out as `out`), so that no
/// copy runs; else a new program tensor `name` laid out as `like`.
runtime::ShardedTensor& gradient_target(ProgramBuilder& program, const runtime::ShardedTensor& like,
                                        const std::vector<sharding::Placement>& produced_placed,
                                        runtime::ShardedTensor& out, const std::string& name);

/// gradient_target() for a weight's gradient dW = dy^T x over an activation x placed `x` (rank
/// `x_rank`), the weight multiplied as `used`: placed as weight_gradient_placements() says.
runtime::ShardedTensor& weight_gradient_target(ProgramBuilder& program,
                                               const runtime::ShardedTensor& used,
                                               const std::vector<sharding::Placement>& x,
                                               std::size_t x_rank, runtime::ShardedTensor& out,
                                               const std::string& name);

/// Checks that `t` (a gradient, or a tensor in a backward's signature) has `like`'s shape and
/// spec. Throws: ShapeError "NAME: WHAT is [shape] spec but must be laid out as [shape] spec".
void check_laid_out_like(const runtime::ShardedTensor& t, const runtime::ShardedTensor& like,
                         std::string_view what, std::string_view name);

/// Checks a backward's dy and dx against its forward: both of shape `x_shape` (the forward's
/// x and y), dy laid out as gradient_placements(y_placed) and dx as
/// gradient_placements(x_placed). Throws: ShapeError "NAME: dy [shape] spec and dx [shape] spec
/// must be laid out as the forward's y and x ([shape])".
void check_backward_io(const runtime::ShardedTensor& dy, const runtime::ShardedTensor& dx,
                       const std::vector<std::int64_t>& x_shape,
                       const std::vector<sharding::Placement>& y_placed,
                       const std::vector<sharding::Placement>& x_placed, std::string_view name);

/// An fp32 tensor laid out exactly as `parameter` (same mesh, shape and spec), zero-filled:
/// the gradient of a parameter, the optimizer's moments.
std::shared_ptr<runtime::ShardedTensor> gradient_like(const runtime::ShardedTensor& parameter);

// An optional parameter (a layer's bias or norm weight, null when the layer has none) in a
// backward: each helper passes null through.

/// gradient_like(*parameter), or null for null.
std::shared_ptr<runtime::ShardedTensor> optional_gradient_like(
    const std::shared_ptr<runtime::ShardedTensor>& parameter);

/// Checks an optional parameter's gradient: nothing when the parameter is null, else that the
/// gradient is given and laid out like it (check_laid_out_like, "the WHAT gradient").
/// Throws: ValueError "NAME: the layer has the WHAT but no gradient is given for it";
/// ShapeError as check_laid_out_like.
void check_optional_gradient(const std::shared_ptr<runtime::ShardedTensor>& grad,
                             const std::shared_ptr<runtime::ShardedTensor>& parameter,
                             std::string_view what, std::string_view name);

/// The gradient of an optional parameter as one device computes it, before its reduction: a
/// program tensor "NAME.WHAT.grad_partial" laid out like the parameter; null for null.
runtime::ShardedTensor* optional_partial_gradient(
    ProgramBuilder& program, const std::shared_ptr<runtime::ShardedTensor>& parameter,
    const std::string& name, const std::string& what);

}  // namespace numesh::ops
