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

namespace {

// Refuses a backward whose forward kept nothing for it, or whose dy, dx or gradients are not
// laid out as what they differentiate.
void check_mlp_backward_inputs(const MlpLayer& layer, const MlpSaved& saved,
                               runtime::ShardedTensor& dy, runtime::ShardedTensor& dx,
                               const MlpGradients& grads, const std::string& name) {
  NUMESH_CHECK(saved.x != nullptr && saved.up != nullptr && saved.down != nullptr, ValueError,
               "{}: the forward kept nothing for the backward (emit_mlp without `saved`)", name);
  check_backward_io(dy, dx, saved.x->shape(), saved.y_placed, saved.x_placed, name);
  check_laid_out_like(*grads.up, *layer.up, "the up gradient", name);
  check_laid_out_like(*grads.down, *layer.down, "the down gradient", name);
  if (layer.gate) check_laid_out_like(*grads.gate, *layer.gate, "the gate gradient", name);
  check_optional_gradient(grads.gate_bias, layer.gate_bias, "gate bias", name);
  check_optional_gradient(grads.up_bias, layer.up_bias, "up bias", name);
  check_optional_gradient(grads.down_bias, layer.down_bias, "down bias", name);
}

// Each bias' gradient as this device computes it (null without the bias).
struct MlpBiasGradients {
  runtime::ShardedTensor* gate;
  runtime::ShardedTensor* up;
  runtime::ShardedTensor* down;
};

// What the backward's per-device phases and its reductions share: the sizes, the tokens'
// placements, and the tensors each device writes its gradients into.
struct MlpBackward {
  ProgramBuilder& pb;
  const MlpSaved& saved;
  const std::string& name;
  MatmulPrecision prec;  // of the fp32 products
  std::size_t rank;
  runtime::ShardedTensor& xc;
  std::int64_t h, rows, f_local;
  std::vector<sharding::Placement> x_placed;
  runtime::ShardedTensor& d_down;
  runtime::ShardedTensor& d_up;
  runtime::ShardedTensor* d_gate;
  MlpBiasGradients d_bias;
  std::vector<sharding::Placement> dx_target;
  bool direct;  // dx itself takes the products
  runtime::ShardedTensor& dx_partial;
  double forward_flops;
  Activation activation;  // the layer kind's
};

// The shared state: the sizes and placements, and the weights' and dx's tensors as each device
// computes them.
MlpBackward mlp_backward_context(ProgramBuilder& pb, const MlpSaved& saved,
                                 const MlpGradients& grads, runtime::ShardedTensor& dx,
                                 const std::string& name, std::int64_t h,
                                 const MlpBiasGradients& d_bias, Activation activation) {
  const std::size_t rank = dx.shape().size();
  runtime::ShardedTensor& xc = *saved.x;
  const std::int64_t rows = xc.layout().elements_per_device() / h;
  const std::int64_t f_local = saved.up->layout().shard_shape()[0];
  std::vector<sharding::Placement> x_placed =
      sharding::to_placements(xc.spec(), pb.mesh().mesh(), rank);
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
  std::vector<sharding::Placement> dx_target = gradient_placements(saved.x_placed);
  const bool direct = saved.partial_placed == dx_target && xc.spec() == dx.spec();
  runtime::ShardedTensor& dx_partial =
      direct ? dx : pb.tensor(name + ".dx_partial", TensorRole::kActivation, xc.shape(), xc.spec());
  return MlpBackward{.pb = pb,
                     .saved = saved,
                     .name = name,
                     .prec = pb.matmul_precision(),
                     .rank = rank,
                     .xc = xc,
                     .h = h,
                     .rows = rows,
                     .f_local = f_local,
                     .x_placed = std::move(x_placed),
                     .d_down = d_down,
                     .d_up = d_up,
                     .d_gate = d_gate,
                     .d_bias = d_bias,
                     .dx_target = std::move(dx_target),
                     .direct = direct,
                     .dx_partial = dx_partial,
                     .forward_flops = 2.0 * static_cast<double>(rows * h * f_local) *
                                      (saved.gate != nullptr ? 3.0 : 2.0),
                     .activation = activation};
}

// Per device: da = dy w_down and d_w_down = dy^T h. The backward multiplies by the weights
// themselves, not their transposes: as_weight() reads a stored [out, in] matrix as it is.
// Fills d_act.
runtime::Frontier emit_mlp_down_backward(const MlpBackward& st, runtime::ShardedTensor& dyc,
                                         const runtime::Frontier& dy_ready,
                                         std::vector<runtime::Tensor*>& d_act) {
  ProgramBuilder& pb = st.pb;
  const MlpSaved& saved = st.saved;
  const MatmulPrecision prec = st.prec;
  const std::int64_t rows = st.rows, h = st.h, f_local = st.f_local;
  return pb.per_device(st.name + ".down_bwd", {&dy_ready}, [&](std::int64_t s) {
    runtime::Tensor& dys = dyc.shard(s);
    runtime::Tensor& hs = *saved.hidden[static_cast<std::size_t>(s)];
    runtime::Tensor& wd = saved.down->shard(s);  // [H, F_local]
    runtime::Tensor& gd = st.d_down.shard(s);
    runtime::Tensor& das = pb.scratch(s, {rows, f_local});
    d_act[static_cast<std::size_t>(s)] = &das;
    // The down bias: dy summed over the rows (dy is whole on every device of F's split, so each
    // has the same: replicated there, as the bias is).
    runtime::Tensor* gbd = st.d_bias.down != nullptr ? &st.d_bias.down->shard(s) : nullptr;
    pb.add_flops(s, st.forward_flops / (saved.gate != nullptr ? 1.5 : 1.0));
    return [prec, &dys, &hs, &wd, &gd, &das, gbd, rows, h] {
      const ConstMatrixMap dym(dys.values().data(), rows, h);
      device_gemm(dym, as_weight(wd), as_matrix(das), prec);
      device_gemm_transposed_a(dym, as_matrix(std::as_const(hs)), as_matrix(gd), 0.0f, prec);
      if (gbd != nullptr) as_matrix(*gbd) = dym.colwise().sum();
    };
  });
}

// Per device: the activation's backward, the up (and gate) weights' gradients and dx_partial.
runtime::Frontier emit_mlp_up_backward(const MlpBackward& st,
                                       const std::vector<runtime::Tensor*>& d_act,
                                       const runtime::Frontier& down_done) {
  ProgramBuilder& pb = st.pb;
  const MlpSaved& saved = st.saved;
  const MatmulPrecision prec = st.prec;
  const std::int64_t rows = st.rows, h = st.h, f_local = st.f_local;
  const bool gated = saved.gate != nullptr;
  const Activation act = st.activation;
  return pb.per_device(st.name + ".up_bwd", {&down_done}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& das = *d_act[i];
    runtime::Tensor& up_pre = *saved.up_pre[i];
    runtime::Tensor* gate_pre = saved.gate_pre[i];
    runtime::Tensor& xs = st.xc.shard(s);
    runtime::Tensor& wu = saved.up->shard(s);  // [F_local, H]
    runtime::Tensor* wg = gated ? &saved.gate->shard(s) : nullptr;
    runtime::Tensor& gu = st.d_up.shard(s);
    runtime::Tensor* gg = gated ? &st.d_gate->shard(s) : nullptr;
    runtime::Tensor* d_up_pre = gated ? &pb.scratch(s, {rows, f_local}) : nullptr;
    runtime::Tensor* gate_term = gated ? &pb.scratch(s, {rows, h}) : nullptr;
    runtime::Tensor& dxs = st.dx_partial.shard(s);
    runtime::Tensor* gbg = st.d_bias.gate != nullptr ? &st.d_bias.gate->shard(s) : nullptr;
    runtime::Tensor* gbu = st.d_bias.up != nullptr ? &st.d_bias.up->shard(s) : nullptr;
    pb.add_flops(s, st.forward_flops * (gated ? 4.0 / 3.0 : 1.0));
    return [prec, act, &das, &up_pre, gate_pre, &xs, &wu, wg, &gu, gg, d_up_pre, gate_term, &dxs,
            gbg, gbu, rows, h] {
      const ConstMatrixMap xm(xs.values().data(), rows, h);
      MatrixMap dxm(dxs.values().data(), rows, h);
      // A bias' gradient: its pre-activation's gradient summed over the rows (its slice of F).
      const auto bias_grad = [](runtime::Tensor* grad, const runtime::Tensor& d_pre) {
        if (grad != nullptr) as_matrix(*grad) = as_matrix(d_pre).colwise().sum();
      };
      if (wg == nullptr) {  // no gate: d_pre = da .* act'(pre), in place of da
        activation_backward_inplace(act, as_matrix(std::as_const(up_pre)), as_matrix(das));
        bias_grad(gbu, das);
        device_gemm_transposed_a(as_matrix(std::as_const(das)), xm, as_matrix(gu), 0.0f, prec);
        device_gemm(as_matrix(std::as_const(das)), as_weight(wu), dxm, prec);
        return;
      }
      // Gated: d_gate_pre in place of da, d_up_pre beside it.
      gated_backward(act, as_matrix(std::as_const(*gate_pre)), as_matrix(std::as_const(up_pre)),
                     as_matrix(std::as_const(das)), as_matrix(das), as_matrix(*d_up_pre));
      bias_grad(gbg, das);
      bias_grad(gbu, *d_up_pre);
      device_gemm_transposed_a(as_matrix(std::as_const(das)), xm, as_matrix(*gg), 0.0f, prec);
      device_gemm_transposed_a(as_matrix(std::as_const(*d_up_pre)), xm, as_matrix(gu), 0.0f, prec);
      device_gemm(as_matrix(std::as_const(das)), as_weight(*wg), dxm, prec);
      device_gemm(as_matrix(std::as_const(*d_up_pre)), as_weight(wu), as_matrix(*gate_term), prec);
      dxm += as_matrix(std::as_const(*gate_term));
    };
  });
}

// The weights' gradients: all-reduced over the axes splitting the rows, reduce-scattered
// over those splitting the stored weights (the transposes of the forward's all-gathers).
// Returns the frontiers after which each is complete.
std::vector<runtime::Frontier> reduce_mlp_weight_gradients(const MlpBackward& st,
                                                           const MlpLayer& layer,
                                                           const MlpGradients& grads,
                                                           const runtime::Frontier& down_done,
                                                           const runtime::Frontier& up_done) {
  const MlpSaved& saved = st.saved;
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                    runtime::ShardedTensor& out, const runtime::Frontier& ready,
                    const std::string& wname) {
    parts.push_back(reduce_weight_gradient(st.pb, partial, used, st.x_placed, st.rank, out, ready,
                                           st.name + "." + wname + ".grad"));
  };
  reduce(st.d_down, *saved.down, *grads.down, down_done, "w_down");
  // The biases as the weights they follow (down's replicated over F's split, as dy is).
  if (st.d_bias.down != nullptr)
    reduce(*st.d_bias.down, *layer.down_bias, *grads.down_bias, down_done, "down_bias");
  if (st.d_bias.up != nullptr)
    reduce(*st.d_bias.up, *layer.up_bias, *grads.up_bias, up_done, "up_bias");
  if (st.d_bias.gate != nullptr)
    reduce(*st.d_bias.gate, *layer.gate_bias, *grads.gate_bias, up_done, "gate_bias");
  reduce(st.d_up, *saved.up, *grads.up, up_done, "w_up");
  if (st.d_gate != nullptr) reduce(*st.d_gate, *saved.gate, *grads.gate, up_done, "w_gate");
  return parts;
}

}  // namespace

runtime::Frontier emit_mlp_backward(ProgramBuilder& pb, const MlpLayer& layer,
                                    const MlpSaved& saved, runtime::ShardedTensor& dy,
                                    const runtime::Frontier& after, runtime::ShardedTensor& dx,
                                    const MlpGradients& grads, const std::string& name,
                                    runtime::Frontier* dx_ready) {
  check_mlp_backward_inputs(layer, saved, dy, dx, grads, name);
  // Each bias' gradient as this device computes it: its outputs' gradient over its rows.
  const MlpBiasGradients d_bias{
      .gate = optional_partial_gradient(pb, layer.gate_bias, name, "gate_bias"),
      .up = optional_partial_gradient(pb, layer.up_bias, name, "up_bias"),
      .down = optional_partial_gradient(pb, layer.down_bias, name, "down_bias")};

  // dy as the down projection's output was laid out (gathered over F's axes under sequence
  // parallelism): the transpose of the forward's reduce-scatter; the same tensor otherwise.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyc = canonical_gradient(pb, dy, gradient_placements(saved.y_placed),
                                                   saved.partial_placed, name + ".dy", dy_ready);
  const MlpBackward st = mlp_backward_context(pb, saved, grads, dx, name, layer.hidden, d_bias,
                                              mlp_traits(layer.kind).activation);

  std::vector<runtime::Tensor*> d_act(static_cast<std::size_t>(pb.mesh().size()));
  const runtime::Frontier down_done = emit_mlp_down_backward(st, dyc, dy_ready, d_act);
  const runtime::Frontier up_done = emit_mlp_up_backward(st, d_act, down_done);

  std::vector<runtime::Frontier> parts =
      reduce_mlp_weight_gradients(st, layer, grads, down_done, up_done);
  // dx: the transpose of the forward's token gather (a reduce-scatter) or of using x whole on
  // every device of the F split (an all-reduce).
  if (!st.direct)
    parts.push_back(
        pb.reshard(st.dx_partial, saved.partial_placed, dx, st.dx_target, up_done, name + ".dx"));
  else
    parts.push_back(up_done);
  if (dx_ready != nullptr) *dx_ready = parts.back();
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
