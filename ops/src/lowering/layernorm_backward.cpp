// LayerNorm's backward (declared in lowering/layernorm.hpp, next to its forward).

#include <utility>
#include <vector>

#include "lowering_util.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/layernorm.hpp"

namespace numesh::ops {

runtime::Frontier emit_layernorm_backward(ProgramBuilder& pb, runtime::ShardedTensor& x,
                                          runtime::ShardedTensor& weight,
                                          runtime::ShardedTensor& d_out,
                                          runtime::ShardedTensor& d_x,
                                          runtime::ShardedTensor& d_weight,
                                          runtime::ShardedTensor* d_bias, float eps,
                                          const runtime::Frontier& after, const std::string& name) {
  detail::check_rows_alike(x, d_out, d_x, name);
  detail::check_replicated_row(&weight, x.shape().back(), "weight", name);
  check_laid_out_like(d_weight, weight, "the weight's gradient", name);
  if (d_bias != nullptr) check_laid_out_like(*d_bias, weight, "the bias' gradient", name);
  const auto& m = pb.mesh().mesh();
  const std::int64_t h = x.shape().back();
  const std::int64_t rows = x.layout().elements_per_device() / h;
  // Each device's sums over its rows, reduced below.
  runtime::ShardedTensor& dw_partial = pb.tensor(
      name + ".weight.grad_partial", TensorRole::kActivation, weight.shape(), weight.spec());
  runtime::ShardedTensor* db_partial =
      d_bias != nullptr ? &pb.tensor(name + ".bias.grad_partial", TensorRole::kActivation,
                                     weight.shape(), weight.spec())
                        : nullptr;
  const runtime::Frontier done = pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& ws = weight.shard(s);
    runtime::Tensor& dys = d_out.shard(s);
    runtime::Tensor& dxs = d_x.shard(s);
    runtime::Tensor& dws = dw_partial.shard(s);
    runtime::Tensor* dbs = db_partial != nullptr ? &db_partial->shard(s) : nullptr;
    pb.add_flops(s, 11.0 * static_cast<double>(rows * h));
    return [&xs, &ws, &dys, &dxs, &dws, dbs, rows, h, eps] {
      layernorm_rows_backward(ConstMatrixMap(xs.values().data(), rows, h),
                              as_matrix(std::as_const(ws)),
                              ConstMatrixMap(dys.values().data(), rows, h), eps,
                              MatrixMap(dxs.values().data(), rows, h), as_matrix(dws),
                              dbs != nullptr ? as_matrix(*dbs) : MatrixMap(nullptr, 1, 0));
    };
  });
  const std::vector<sharding::Placement> x_placed =
      sharding::to_placements(x.spec(), m, x.shape().size());
  const runtime::Frontier w_done = reduce_weight_gradient(
      pb, dw_partial, weight, x_placed, x.shape().size(), d_weight, done, name + ".weight.grad");
  if (db_partial == nullptr) return pb.join(name + ".done", {&done, &w_done});
  const runtime::Frontier b_done = reduce_weight_gradient(
      pb, *db_partial, weight, x_placed, x.shape().size(), *d_bias, done, name + ".bias.grad");
  return pb.join(name + ".done", {&done, &w_done, &b_done});
}

}  // namespace numesh::ops
