// RMSNorm's backward (declared in lowering/rmsnorm.hpp, next to its forward).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/rmsnorm.hpp"

namespace numesh::ops {

runtime::Frontier emit_rmsnorm_backward(
    ProgramBuilder& pb, runtime::ShardedTensor& input, runtime::ShardedTensor& weight,
    runtime::ShardedTensor& d_out, runtime::ShardedTensor* d_residual,
    runtime::ShardedTensor& d_input, runtime::ShardedTensor& d_weight, RmsNormConstants norm,
    const runtime::Frontier& after, const std::string& name, runtime::Frontier* dx_ready) {
  const std::int64_t h = input.shape().back();
  auto alike = [&](const runtime::ShardedTensor& t) {
    return t.shape() == input.shape() && t.spec() == input.spec();
  };
  NUMESH_CHECK(
      alike(d_out) && alike(d_input) && (d_residual == nullptr || alike(*d_residual)) &&
          input.layout().shard_shape().back() == h,
      ShapeError, "{}: input {} {}, d_out {} {} and d_input {} {} must be laid out alike, H whole",
      name, fmt::join(input.shape(), "x"), input.spec().repr(), fmt::join(d_out.shape(), "x"),
      d_out.spec().repr(), fmt::join(d_input.shape(), "x"), d_input.spec().repr());
  NUMESH_CHECK(weight.shape() == (std::vector<std::int64_t>{1, h}) &&
                   d_weight.shape() == weight.shape() && d_weight.spec() == weight.spec(),
               ShapeError, "{}: weight {} and its gradient {} must be [1, {}], laid out alike",
               name, fmt::join(weight.shape(), "x"), fmt::join(d_weight.shape(), "x"), h);
  NUMESH_CHECK(&d_input != d_residual, ValueError, "{}: d_input must not be d_residual's tensor",
               name);
  const auto& m = pb.mesh().mesh();
  const std::int64_t rows = input.layout().elements_per_device() / h;
  runtime::ShardedTensor& dw_partial = pb.tensor(
      name + ".weight.grad_partial", TensorRole::kActivation, weight.shape(), weight.spec());
  const runtime::Frontier done = pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& xs = input.shard(s);
    runtime::Tensor& ws = weight.shard(s);
    runtime::Tensor& dys = d_out.shard(s);
    runtime::Tensor* rs = d_residual != nullptr ? &d_residual->shard(s) : nullptr;
    runtime::Tensor& dxs = d_input.shard(s);
    runtime::Tensor& dws = dw_partial.shard(s);
    pb.add_flops(s, static_cast<double>(rows * h) * (rs != nullptr ? 9.0 : 8.0));
    return [&xs, &ws, &dys, rs, &dxs, &dws, rows, h, norm] {
      MatrixMap dx(dxs.values().data(), rows, h);
      rmsnorm_rows_backward(ConstMatrixMap(xs.values().data(), rows, h),
                            as_matrix(std::as_const(ws)),
                            ConstMatrixMap(dys.values().data(), rows, h), norm, dx, as_matrix(dws));
      if (rs != nullptr) dx += ConstMatrixMap(rs->values().data(), rows, h);
    };
  });
  if (dx_ready != nullptr) *dx_ready = done;
  const runtime::Frontier reduced = reduce_weight_gradient(
      pb, dw_partial, weight, sharding::to_placements(input.spec(), m, input.shape().size()),
      input.shape().size(), d_weight, done, name + ".weight.grad");
  return pb.join(name + ".done", {&done, &reduced});
}

}  // namespace numesh::ops
