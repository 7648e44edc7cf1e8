#include "numesh/ops/lowering/layernorm.hpp"

#include <utility>

#include "lowering_util.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/norms.hpp"

namespace numesh::ops {

runtime::Frontier emit_layernorm(ProgramBuilder& pb, runtime::ShardedTensor& x,
                                 runtime::ShardedTensor& weight, runtime::ShardedTensor* bias,
                                 runtime::ShardedTensor& out, float eps,
                                 const runtime::Frontier& after, const std::string& name) {
  const std::int64_t h = x.shape().back();
  detail::check_rows_alike(x, out, out, name);
  detail::check_replicated_row(&weight, h, "weight", name);
  detail::check_replicated_row(bias, h, "bias", name);
  const std::int64_t rows = x.layout().elements_per_device() / h;
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& ws = weight.shard(s);
    runtime::Tensor* bs = bias != nullptr ? &bias->shard(s) : nullptr;
    runtime::Tensor& os = out.shard(s);
    pb.add_flops(s, 8.0 * static_cast<double>(rows * h));
    return [&xs, &ws, bs, &os, rows, h, eps] {
      const ConstMatrixMap no_bias(nullptr, 1, 0);
      layernorm_rows(ConstMatrixMap(xs.values().data(), rows, h), as_matrix(std::as_const(ws)),
                     bs != nullptr ? as_matrix(std::as_const(*bs)) : no_bias,
                     MatrixMap(os.values().data(), rows, h), eps);
    };
  });
}

}  // namespace numesh::ops
