#include "numesh/ops/lowering/gradients.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/reshard.hpp"

namespace numesh::ops {

using sharding::Placement;

std::vector<Placement> gradient_placements(std::vector<Placement> forward) {
  for (Placement& p : forward) {
    if (p.is_partial()) p = Placement::replicate();
  }
  return forward;
}

std::vector<Placement> weight_gradient_placements(const std::vector<Placement>& weight,
                                                  const std::vector<Placement>& x,
                                                  std::size_t x_rank) {
  std::vector<Placement> out = weight;
  for (std::size_t a = 0; a < out.size() && a < x.size(); ++a) {
    if (out[a].is_shard()) continue;
    out[a] = x[a].is_shard() && static_cast<std::size_t>(x[a].dim) + 1 < x_rank
                 ? Placement::partial()
                 : Placement::replicate();
  }
  return out;
}

std::vector<Placement> partial_where_sharded(std::vector<Placement> placed,
                                             const std::vector<Placement>& by,
                                             sharding::PartialOp op) {
  for (std::size_t a = 0; a < placed.size() && a < by.size(); ++a) {
    if (by[a].is_shard()) placed[a] = Placement::partial(op);
  }
  return placed;
}

runtime::ShardedTensor& canonical_gradient(ProgramBuilder& pb, runtime::ShardedTensor& produced,
                                           const std::vector<Placement>& produced_placed,
                                           const std::vector<Placement>& forward,
                                           const std::string& name, runtime::Frontier& ready) {
  const std::vector<Placement> canonical = gradient_placements(forward);
  if (canonical == produced_placed) return produced;
  const auto& m = pb.mesh().mesh();
  const std::size_t rank = produced.shape().size();
  runtime::ShardedTensor& out = pb.tensor(name, TensorRole::kActivation, produced.shape(),
                                          sharding::to_spec(canonical, m, rank), produced.dtype());
  ready = pb.reshard(produced, produced_placed, out, canonical, ready, name);
  return out;
}

runtime::Frontier reduce_gradient_into(ProgramBuilder& pb, runtime::ShardedTensor& produced,
                                       const std::vector<Placement>& produced_placed,
                                       runtime::ShardedTensor& out, const runtime::Frontier& after,
                                       const std::string& name) {
  NUMESH_CHECK(out.shape() == produced.shape(), ShapeError,
               "{}: gradient {} does not fit its parameter {}", name,
               fmt::join(produced.shape(), "x"), fmt::join(out.shape(), "x"));
  if (&produced == &out) return after;  // written in place (gradient_target)
  const std::size_t rank = out.shape().size();
  return pb.reshard(produced, produced_placed, out,
                    sharding::to_placements(out.spec(), pb.mesh().mesh(), rank), after, name);
}

runtime::Frontier reduce_weight_gradient(ProgramBuilder& pb, runtime::ShardedTensor& produced,
                                         const runtime::ShardedTensor& used,
                                         const std::vector<Placement>& x, std::size_t x_rank,
                                         runtime::ShardedTensor& out,
                                         const runtime::Frontier& after, const std::string& name) {
  const std::vector<Placement> placed = weight_gradient_placements(
      sharding::to_placements(used.spec(), pb.mesh().mesh(), used.shape().size()), x, x_rank);
  return reduce_gradient_into(pb, produced, placed, out, after, name);
}

runtime::ShardedTensor& gradient_target(ProgramBuilder& pb, const runtime::ShardedTensor& like,
                                        const std::vector<Placement>& produced_placed,
                                        runtime::ShardedTensor& out, const std::string& name) {
  const sharding::Mesh& m = pb.mesh().mesh();
  // An axis of one device neither sums nor splits anything: Replicate, whatever it says.
  const auto effective = [&](std::vector<Placement> placed) {
    for (std::size_t a = 0; a < placed.size(); ++a) {
      if (m.sizes()[a] == 1) placed[a] = Placement::replicate();
    }
    return placed;
  };
  const bool in_place = like.shape() == out.shape() && like.spec() == out.spec() &&
                        like.dtype() == out.dtype() &&
                        effective(produced_placed) ==
                            effective(sharding::to_placements(out.spec(), m, out.shape().size()));
  if (in_place) return out;
  return pb.tensor(name, TensorRole::kActivation, like.shape(), like.spec());
}

runtime::ShardedTensor& weight_gradient_target(ProgramBuilder& pb,
                                               const runtime::ShardedTensor& used,
                                               const std::vector<Placement>& x, std::size_t x_rank,
                                               runtime::ShardedTensor& out,
                                               const std::string& name) {
  const std::vector<Placement> placed = weight_gradient_placements(
      sharding::to_placements(used.spec(), pb.mesh().mesh(), used.shape().size()), x, x_rank);
  return gradient_target(pb, used, placed, out, name);
}

void check_laid_out_like(const runtime::ShardedTensor& t, const runtime::ShardedTensor& like,
                         std::string_view what, std::string_view name) {
  NUMESH_CHECK(t.shape() == like.shape() && t.spec() == like.spec(), ShapeError,
               "{}: {} is [{}] {} but must be laid out as [{}] {}", name, what,
               fmt::join(t.shape(), ", "), t.spec().repr(), fmt::join(like.shape(), ", "),
               like.spec().repr());
}

void check_backward_io(const runtime::ShardedTensor& dy, const runtime::ShardedTensor& dx,
                       const std::vector<std::int64_t>& x_shape,
                       const std::vector<sharding::Placement>& y_placed,
                       const std::vector<sharding::Placement>& x_placed, std::string_view name) {
  const sharding::Mesh& m = dx.mesh().mesh();
  const std::size_t rank = x_shape.size();
  NUMESH_CHECK(dy.shape() == x_shape && dx.shape() == x_shape &&
                   sharding::to_placements(dy.spec(), m, rank) == gradient_placements(y_placed) &&
                   sharding::to_placements(dx.spec(), m, rank) == gradient_placements(x_placed),
               ShapeError,
               "{}: dy {} {} and dx {} {} must be laid out as the forward's y and x ({})", name,
               fmt::join(dy.shape(), "x"), dy.spec().repr(), fmt::join(dx.shape(), "x"),
               dx.spec().repr(), fmt::join(x_shape, "x"));
}

std::shared_ptr<runtime::ShardedTensor> gradient_like(const runtime::ShardedTensor& parameter) {
  return std::make_shared<runtime::ShardedTensor>(parameter.mesh(), parameter.shape(),
                                                  parameter.spec(), DType::kF32);
}

std::shared_ptr<runtime::ShardedTensor> optional_gradient_like(
    const std::shared_ptr<runtime::ShardedTensor>& parameter) {
  return parameter != nullptr ? gradient_like(*parameter) : nullptr;
}

void check_optional_gradient(const std::shared_ptr<runtime::ShardedTensor>& grad,
                             const std::shared_ptr<runtime::ShardedTensor>& parameter,
                             std::string_view what, std::string_view name) {
  if (parameter == nullptr) return;
  NUMESH_CHECK(grad != nullptr, ValueError,
               "{}: the layer has the {} but no gradient is given for it", name, what);
  check_laid_out_like(*grad, *parameter, fmt::format("the {} gradient", what), name);
}

runtime::ShardedTensor* optional_partial_gradient(
    ProgramBuilder& program, const std::shared_ptr<runtime::ShardedTensor>& parameter,
    const std::string& name, const std::string& what) {
  if (parameter == nullptr) return nullptr;
  return &program.tensor(name + "." + what + ".grad_partial", TensorRole::kActivation,
                         parameter->shape(), parameter->spec());
}

}  // namespace numesh::ops
