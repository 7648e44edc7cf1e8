#include "numesh/ops/lowering/rmsnorm.hpp"

#include <utility>

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/norms.hpp"

namespace numesh::ops {

runtime::Frontier emit_residual_rmsnorm(ProgramBuilder& pb, runtime::ShardedTensor& a,
                                        runtime::ShardedTensor* b, runtime::ShardedTensor* weight,
                                        runtime::ShardedTensor* sum, runtime::ShardedTensor& out,
                                        RmsNormConstants norm, const runtime::Frontier& after,
                                        const std::string& name) {
  const std::int64_t h = a.shape().back();
  const std::int64_t rows = a.layout().elements_per_device() / h;
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& as = a.shard(s);
    runtime::Tensor* bs = b != nullptr ? &b->shard(s) : nullptr;
    runtime::Tensor* ss = sum != nullptr ? &sum->shard(s) : nullptr;
    runtime::Tensor* ws = weight != nullptr ? &weight->shard(s) : nullptr;
    runtime::Tensor& os = out.shard(s);
    pb.add_flops(s, static_cast<double>(rows * h) * (bs != nullptr ? 5.0 : 4.0));
    return [&as, bs, ss, ws, &os, rows, h, norm] {
      MatrixMap o(os.values().data(), rows, h);
      const ConstMatrixMap x(as.values().data(), rows, h);
      if (bs == nullptr) {
        rmsnorm_rows(x, as_matrix(std::as_const(*ws)), o, norm);
        return;
      }
      // The sum goes to `sum` when kept, else straight into out, then normalised in place.
      MatrixMap total = ss != nullptr ? MatrixMap(ss->values().data(), rows, h) : o;
      total = x + ConstMatrixMap(bs->values().data(), rows, h);
      if (ws != nullptr)
        rmsnorm_rows(ConstMatrixMap(total.data(), rows, h), as_matrix(std::as_const(*ws)), o, norm);
    };
  });
}

}  // namespace numesh::ops
