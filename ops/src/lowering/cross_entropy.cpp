#include "numesh/ops/lowering/cross_entropy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <span>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/cross_entropy.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/lowering/gradients.hpp"

namespace numesh::ops {

runtime::Frontier emit_lm_head_cross_entropy(ProgramBuilder& pb, const LmHeadLayer& layer,
                                             runtime::ShardedTensor& x,
                                             const std::vector<std::int32_t>* targets,
                                             const runtime::Frontier& after,
                                             runtime::ShardedTensor& losses,
                                             const std::string& name, CrossEntropySaved* saved) {
  const auto& m = pb.mesh().mesh();
  const std::int64_t total_rows = x.shape().empty() ? 0 : x.shape()[0];
  NUMESH_CHECK(
      losses.shape() == (std::vector<std::int64_t>{total_rows, 1}) && losses.spec() == x.spec(),
      ShapeError, "{}: losses {} {} must be [{}, 1], laid out as x {}", name,
      fmt::join(losses.shape(), "x"), losses.spec().repr(), total_rows, x.spec().repr());
  const sharding::PartitionSpec logits_spec = lm_head_logits_spec(layer, x.spec());
  runtime::ShardedTensor& logits =
      pb.tensor(name + ".logits", TensorRole::kActivation, {total_rows, layer.vocab}, logits_spec);
  const runtime::Frontier multiplied = emit_lm_head(pb, layer, x, after, logits, name);  // checks x
  runtime::ShardedTensor& w = pb.use(name + ".weight", TensorRole::kWeight, layer.weight);

  // Per row: the max over the whole vocabulary, then the sum of exponentials and the target's
  // logit, each a Partial over the axes splitting the vocabulary, all-reduced.
  const std::vector<sharding::Placement> row_placed = sharding::to_placements(x.spec(), m, 2);
  const std::vector<sharding::Placement> vocab_split = sharding::to_placements(w.spec(), m, 2);
  runtime::ShardedTensor& local_max =
      pb.tensor(name + ".max_local", TensorRole::kActivation, {total_rows, 1}, x.spec());
  runtime::ShardedTensor& max =
      pb.tensor(name + ".max", TensorRole::kActivation, {total_rows, 1}, x.spec());
  runtime::ShardedTensor& local_sums =
      pb.tensor(name + ".sums_local", TensorRole::kActivation, {total_rows, 2}, x.spec());
  runtime::ShardedTensor& sums =
      pb.tensor(name + ".sums", TensorRole::kActivation, {total_rows, 2}, x.spec());
  const std::int64_t rows = x.layout().shard_shape()[0];
  const std::int64_t v_local = w.layout().shard_shape()[0];
  auto vocab_start = [&](std::int64_t s) { return w.layout().tile_offset(s)[0]; };
  auto row_start = [&](std::int64_t s) { return x.layout().tile_offset(s)[0]; };

  const runtime::Frontier maxed =
      pb.per_device(name + ".row_max", {&multiplied}, [&](std::int64_t s) {
        runtime::Tensor& ls = logits.shard(s);
        runtime::Tensor& ms = local_max.shard(s);
        return [&ls, &ms, rows, v_local] {
          row_max(ConstMatrixMap(ls.values().data(), rows, v_local), ms.values());
        };
      });
  const runtime::Frontier max_ready = pb.reshard(
      local_max, partial_where_sharded(row_placed, vocab_split, sharding::PartialOp::kMax), max,
      row_placed, maxed, name + ".max");
  const runtime::Frontier summed =
      pb.per_device(name + ".row_sums", {&max_ready}, [&](std::int64_t s) {
        runtime::Tensor& ls = logits.shard(s);
        runtime::Tensor& ms = max.shard(s);
        runtime::Tensor& ss = local_sums.shard(s);
        const std::int64_t v0 = vocab_start(s), r0 = row_start(s);
        pb.add_flops(s, 3.0 * static_cast<double>(rows * v_local));
        return [&ls, &ms, &ss, targets, rows, v_local, v0, r0] {
          cross_entropy_sums(ConstMatrixMap(ls.values().data(), rows, v_local), ms.values(),
                             std::span<const std::int32_t>(*targets).subspan(
                                 static_cast<std::size_t>(r0), static_cast<std::size_t>(rows)),
                             v0, ss.values());
        };
      });
  const runtime::Frontier sums_ready =
      pb.reshard(local_sums, partial_where_sharded(row_placed, vocab_split), sums, row_placed,
                 summed, name + ".sums");
  const runtime::Frontier done = pb.per_device(name + ".loss", {&sums_ready}, [&](std::int64_t s) {
    runtime::Tensor& ms = max.shard(s);
    runtime::Tensor& ss = sums.shard(s);
    runtime::Tensor& out = losses.shard(s);
    return [&ms, &ss, &out, rows] {
      const std::span<const float> top = ms.values(), total = ss.values();
      const std::span<float> loss = out.values();
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto i = static_cast<std::size_t>(r);
        loss[i] = static_cast<float>(std::log(static_cast<double>(total[2 * i])) + top[i] -
                                     total[2 * i + 1]);
      }
    };
  });
  if (saved != nullptr) {
    *saved = CrossEntropySaved{
        .x = &x, .weight = &w, .logits = &logits, .max = &max, .sums = &sums, .targets = targets};
  }
  return done;
}

runtime::Frontier emit_lm_head_cross_entropy_backward(
    ProgramBuilder& pb, const CrossEntropySaved& saved, double scale,
    const runtime::Frontier& after, runtime::ShardedTensor& dx, runtime::ShardedTensor& d_weight,
    const std::string& name, runtime::Frontier* dx_ready) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  NUMESH_CHECK(
      saved.logits != nullptr && saved.x != nullptr && saved.weight != nullptr, ValueError,
      "{}: the forward kept nothing for the backward (emit_lm_head_cross_entropy without `saved`)",
      name);
  const auto& m = pb.mesh().mesh();
  runtime::ShardedTensor& x = *saved.x;
  runtime::ShardedTensor& w = *saved.weight;
  runtime::ShardedTensor& logits = *saved.logits;
  check_laid_out_like(dx, x, "dx", name);
  check_laid_out_like(d_weight, w, "the head's gradient", name);
  const std::int64_t rows = x.layout().shard_shape()[0], h = x.shape()[1];
  const std::int64_t v_local = w.layout().shard_shape()[0];
  const std::vector<sharding::Placement> row_placed = sharding::to_placements(x.spec(), m, 2);
  const std::vector<sharding::Placement> vocab_split = sharding::to_placements(w.spec(), m, 2);
  const std::vector<sharding::Placement> dx_placed = partial_where_sharded(row_placed, vocab_split);
  const bool direct = dx_placed == row_placed;  // the vocabulary is not split: dx is whole here
  runtime::ShardedTensor& dx_partial =
      direct ? dx : pb.tensor(name + ".dx_partial", TensorRole::kActivation, x.shape(), x.spec());
  runtime::ShardedTensor& dw_partial =
      weight_gradient_target(pb, w, row_placed, 2, d_weight, name + ".weight.grad_partial");
  const runtime::Frontier done = pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& ls = logits.shard(s);
    runtime::Tensor& ms = saved.max->shard(s);
    runtime::Tensor& ss = saved.sums->shard(s);
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& ws = w.shard(s);
    runtime::Tensor& dxs = dx_partial.shard(s);
    runtime::Tensor& dws = dw_partial.shard(s);
    const std::int64_t v0 = w.layout().tile_offset(s)[0], r0 = x.layout().tile_offset(s)[0];
    const std::vector<std::int32_t>* targets = saved.targets;
    pb.add_flops(s, 4.0 * static_cast<double>(rows * h * v_local) +
                        3.0 * static_cast<double>(rows * v_local));
    return [prec, &ls, &ms, &ss, &xs, &ws, &dxs, &dws, targets, rows, h, v_local, v0, r0, scale] {
      MatrixMap dl(ls.values().data(), rows, v_local);
      cross_entropy_logit_gradient(
          dl, ms.values(), ss.values(),
          std::span<const std::int32_t>(*targets).subspan(static_cast<std::size_t>(r0),
                                                          static_cast<std::size_t>(rows)),
          v0, scale);
      // The head is stored [V, H]: dx = dl w reads it as the [V, H] matrix it is.
      device_gemm(ConstMatrixMap(dl.data(), rows, v_local), as_weight(ws),
                  MatrixMap(dxs.values().data(), rows, h), prec);
      device_gemm_transposed_a(ConstMatrixMap(dl.data(), rows, v_local),
                               ConstMatrixMap(xs.values().data(), rows, h), as_matrix(dws), 0.0f,
                               prec);
    };
  });
  const runtime::Frontier dw_done = reduce_weight_gradient(pb, dw_partial, w, row_placed, 2,
                                                           d_weight, done, name + ".weight.grad");
  const runtime::Frontier dx_done =
      direct ? done
             : pb.reshard(dx_partial, dx_placed, dx, gradient_placements(row_placed), done,
                          name + ".dx");
  if (dx_ready != nullptr) *dx_ready = dx_done;
  return pb.join(name + ".done", {&dw_done, &dx_done});
}

}  // namespace numesh::ops
