// The MLP's backward (declared in lowering/mlp.hpp, next to its forward).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/mlp.hpp"

namespace numesh::ops {

runtime::Frontier emit_mlp_backward(ProgramBuilder& pb, const MlpLayer& layer,
                                    const MlpSaved& saved, runtime::ShardedTensor& dy,
                                    const runtime::Frontier& after, runtime::ShardedTensor& dx,
                                    const MlpGradients& grads, const std::string& name,
                                    runtime::Frontier* dx_ready) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const auto& m = pb.mesh().mesh();
  const std::size_t rank = dx.shape().size();
  NUMESH_CHECK(saved.x != nullptr && saved.up != nullptr && saved.down != nullptr, ValueError,
               "{}: the forward kept nothing for the backward (emit_mlp without `saved`)", name);
  check_backward_io(dy, dx, saved.x->shape(), saved.y_placed, saved.x_placed, name);
  check_laid_out_like(*grads.up, *layer.up, "the up gradient", name);
  check_laid_out_like(*grads.down, *layer.down, "the down gradient", name);
  if (layer.gate) check_laid_out_like(*grads.gate, *layer.gate, "the gate gradient", name);
  check_optional_gradient(grads.gate_bias, layer.gate_bias, "gate bias", name);
  check_optional_gradient(grads.up_bias, layer.up_bias, "up bias", name);
  check_optional_gradient(grads.down_bias, layer.down_bias, "down bias", name);
  // Each bias' gradient as this device computes it: its outputs' gradient over its rows.
  runtime::ShardedTensor* const d_gate_bias =
      optional_partial_gradient(pb, layer.gate_bias, name, "gate_bias");
  runtime::ShardedTensor* const d_up_bias =
      optional_partial_gradient(pb, layer.up_bias, name, "up_bias");
  runtime::ShardedTensor* const d_down_bias =
      optional_partial_gradient(pb, layer.down_bias, name, "down_bias");

  // dy as the down projection's output was laid out (gathered over F's axes under sequence
  // parallelism): the transpose of the forward's reduce-scatter; the same tensor otherwise.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyc = canonical_gradient(pb, dy, gradient_placements(saved.y_placed),
                                                   saved.partial_placed, name + ".dy", dy_ready);

  runtime::ShardedTensor& xc = *saved.x;
  const std::int64_t h = layer.hidden;
  const std::int64_t rows = xc.layout().elements_per_device() / h;
  const std::int64_t f_local = saved.up->layout().shard_shape()[0];
  const std::vector<sharding::Placement> x_placed = sharding::to_placements(xc.spec(), m, rank);
  // Each weight's gradient as this device computes it: on the weight as multiplied (gathered),
  // summed over the device's rows only (the gradient itself when nothing is left to reduce).
  auto produced = [&](runtime::ShardedTensor& used, runtime::ShardedTensor& out,
                      const std::string& wname) -> runtime::ShardedTensor& {
    return weight_gradient_target(pb, used, x_placed, rank, out,
                                  name + "." + wname + ".grad_partial");
  };
  runtime::ShardedTensor& d_down = produced(*saved.down, *grads.down, "w_down");
  runtime::ShardedTensor& d_up = produced(*saved.up, *grads.up, "w_up");
  runtime::ShardedTensor* d_gate =
      saved.gate != nullptr ? &produced(*saved.gate, *grads.gate, "w_gate") : nullptr;
  // dx as computed: Partial over the axes splitting F. When no axis does and no gather came
  // before, that is dx's own layout and the products write it directly.
  const std::vector<sharding::Placement> dx_target = gradient_placements(saved.x_placed);
  const bool direct = saved.partial_placed == dx_target && xc.spec() == dx.spec();
  runtime::ShardedTensor& dx_partial =
      direct ? dx : pb.tensor(name + ".dx_partial", TensorRole::kActivation, xc.shape(), xc.spec());

  const double forward_flops =
      2.0 * static_cast<double>(rows * h * f_local) * (saved.gate != nullptr ? 3.0 : 2.0);
  std::vector<runtime::Tensor*> d_act(static_cast<std::size_t>(pb.mesh().size()));
  // Per device: da = dy w_down and d_w_down = dy^T h. The backward multiplies by the weights
  // themselves, not their transposes: as_weight() reads a stored [out, in] matrix as it is.
  const runtime::Frontier down_done =
      pb.per_device(name + ".down_bwd", {&dy_ready}, [&](std::int64_t s) {
        runtime::Tensor& dys = dyc.shard(s);
        runtime::Tensor& hs = *saved.hidden[static_cast<std::size_t>(s)];
        runtime::Tensor& wd = saved.down->shard(s);  // [H, F_local]
        runtime::Tensor& gd = d_down.shard(s);
        runtime::Tensor& das = pb.scratch(s, {rows, f_local});
        d_act[static_cast<std::size_t>(s)] = &das;
        // The down bias: dy summed over the rows (dy is whole on every device of F's split, so each
        // has the same: replicated there, as the bias is).
        runtime::Tensor* gbd = d_down_bias != nullptr ? &d_down_bias->shard(s) : nullptr;
        pb.add_flops(s, forward_flops / (saved.gate != nullptr ? 1.5 : 1.0));
        return [prec, &dys, &hs, &wd, &gd, &das, gbd, rows, h] {
          const ConstMatrixMap dym(dys.values().data(), rows, h);
          device_gemm(dym, as_weight(wd), as_matrix(das), prec);
          device_gemm_transposed_a(dym, as_matrix(std::as_const(hs)), as_matrix(gd), 0.0f, prec);
          if (gbd != nullptr) as_matrix(*gbd) = dym.colwise().sum();
        };
      });
  // Per device: the activation's backward, the up (and gate) weights' gradients and dx_partial.
  const bool gelu = saved.gate == nullptr;
  const runtime::Frontier up_done =
      pb.per_device(name + ".up_bwd", {&down_done}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        runtime::Tensor& das = *d_act[i];
        runtime::Tensor& up_pre = *saved.up_pre[i];
        runtime::Tensor* gate_pre = saved.gate_pre[i];
        runtime::Tensor& xs = xc.shard(s);
        runtime::Tensor& wu = saved.up->shard(s);  // [F_local, H]
        runtime::Tensor* wg = gelu ? nullptr : &saved.gate->shard(s);
        runtime::Tensor& gu = d_up.shard(s);
        runtime::Tensor* gg = gelu ? nullptr : &d_gate->shard(s);
        runtime::Tensor* d_up_pre = gelu ? nullptr : &pb.scratch(s, {rows, f_local});
        runtime::Tensor* gate_term = gelu ? nullptr : &pb.scratch(s, {rows, h});
        runtime::Tensor& dxs = dx_partial.shard(s);
        runtime::Tensor* gbg = d_gate_bias != nullptr ? &d_gate_bias->shard(s) : nullptr;
        runtime::Tensor* gbu = d_up_bias != nullptr ? &d_up_bias->shard(s) : nullptr;
        pb.add_flops(s, forward_flops * (gelu ? 1.0 : 4.0 / 3.0));
        return [prec, &das, &up_pre, gate_pre, &xs, &wu, wg, &gu, gg, d_up_pre, gate_term, &dxs,
                gbg, gbu, rows, h] {
          const ConstMatrixMap xm(xs.values().data(), rows, h);
          MatrixMap dxm(dxs.values().data(), rows, h);
          // A bias' gradient: its pre-activation's gradient summed over the rows (its slice of F).
          const auto bias_grad = [](runtime::Tensor* grad, const runtime::Tensor& d_pre) {
            if (grad != nullptr) as_matrix(*grad) = as_matrix(d_pre).colwise().sum();
          };
          if (wg == nullptr) {  // GELU: d_pre = da .* gelu'(pre), in place of da
            gelu_backward_inplace(as_matrix(std::as_const(up_pre)), as_matrix(das));
            bias_grad(gbu, das);
            device_gemm_transposed_a(as_matrix(std::as_const(das)), xm, as_matrix(gu), 0.0f, prec);
            device_gemm(as_matrix(std::as_const(das)), as_weight(wu), dxm, prec);
            return;
          }
          // SwiGLU: d_gate_pre in place of da, d_up_pre beside it.
          silu_mul_backward(as_matrix(std::as_const(*gate_pre)), as_matrix(std::as_const(up_pre)),
                            as_matrix(std::as_const(das)), as_matrix(das), as_matrix(*d_up_pre));
          bias_grad(gbg, das);
          bias_grad(gbu, *d_up_pre);
          device_gemm_transposed_a(as_matrix(std::as_const(das)), xm, as_matrix(*gg), 0.0f, prec);
          device_gemm_transposed_a(as_matrix(std::as_const(*d_up_pre)), xm, as_matrix(gu), 0.0f,
                                   prec);
          device_gemm(as_matrix(std::as_const(das)), as_weight(*wg), dxm, prec);
          device_gemm(as_matrix(std::as_const(*d_up_pre)), as_weight(wu), as_matrix(*gate_term),
                      prec);
          dxm += as_matrix(std::as_const(*gate_term));
        };
      });

  // The weights' gradients: all-reduced over the axes splitting the rows, reduce-scattered
  // over those splitting the stored weights (the transposes of the forward's all-gathers).
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                    runtime::ShardedTensor& out, const runtime::Frontier& ready,
                    const std::string& wname) {
    parts.push_back(reduce_weight_gradient(pb, partial, used, x_placed, rank, out, ready,
                                           name + "." + wname + ".grad"));
  };
  reduce(d_down, *saved.down, *grads.down, down_done, "w_down");
  // The biases as the weights they follow (down's replicated over F's split, as dy is).
  if (d_down_bias != nullptr)
    reduce(*d_down_bias, *layer.down_bias, *grads.down_bias, down_done, "down_bias");
  if (d_up_bias != nullptr) reduce(*d_up_bias, *layer.up_bias, *grads.up_bias, up_done, "up_bias");
  if (d_gate_bias != nullptr)
    reduce(*d_gate_bias, *layer.gate_bias, *grads.gate_bias, up_done, "gate_bias");
  reduce(d_up, *saved.up, *grads.up, up_done, "w_up");
  if (d_gate != nullptr) reduce(*d_gate, *saved.gate, *grads.gate, up_done, "w_gate");
  // dx: the transpose of the forward's token gather (a reduce-scatter) or of using x whole on
  // every device of the F split (an all-reduce).
  if (!direct)
    parts.push_back(
        pb.reshard(dx_partial, saved.partial_placed, dx, dx_target, up_done, name + ".dx"));
  else
    parts.push_back(up_done);
  if (dx_ready != nullptr) *dx_ready = parts.back();
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
