// The MoE layer's backward (declared in lowering/moe.hpp, next to its forward).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <span>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/moe.hpp"

namespace numesh::ops {

namespace {

// The routing weights' gradients dw [rows, k] of one token group to the router logits'
// dlogits [rows, E]: through the renormalisation w_j = p_j / Z (Z the sum of the k chosen
// probabilities), dp_i = (dw_i - sum_j w_j dw_j) / Z for each chosen i (else dp = dw), then
// the softmax, dlogits = p .* (dp - p . dp). `dprobs` (E values, or none) is added to every
// row's dp first: the router's load-balancing loss.
void routing_weights_backward(const RoutingTables& r, const MoeConfig& c, ConstMatrixMap probs,
                              ConstMatrixMap dweight, std::span<const float> dprobs, MatrixMap dlogits) {
  const std::int64_t k = c.top_k;
  for (Eigen::Index t = 0; t < probs.rows(); ++t) {
    double z = 0.0, mean = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(t * k + j);
      z += static_cast<double>(probs(t, r.choice[at]));
      mean += static_cast<double>(r.weight[at]) * static_cast<double>(dweight(t, j));
    }
    auto dl = dlogits.row(t);
    dl.setZero();
    for (std::int64_t j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(t * k + j);
      const double dw = dweight(t, j);
      dl(r.choice[at]) = static_cast<float>(c.renormalize ? (dw - mean) / z : dw);
    }
    if (!dprobs.empty()) dl += Eigen::Map<const Eigen::RowVectorXf>(dprobs.data(), static_cast<Eigen::Index>(dprobs.size()));
    const float pdp = probs.row(t).dot(dl);
    dl = (probs.row(t).array() * (dl.array() - pdp)).matrix();
  }
}

}  // namespace

runtime::Frontier emit_moe_backward(ProgramBuilder& pb, const MoeLayer& layer, const MoeSaved& saved,
                                    runtime::ShardedTensor& dy, const runtime::Frontier& after,
                                    runtime::ShardedTensor& dx, const MoeGradients& grads, const std::string& name,
                                    const RouterAuxGradient* aux) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const std::size_t rank = dx.shape().size();
  NUMESH_CHECK(saved.x != nullptr && !saved.tables.empty() && !saved.expert_out.empty(), ValueError,
               "{}: the forward kept nothing for the backward (emit_moe without `saved`)", name);
  check_backward_io(dy, dx, saved.x->shape(), saved.y_placed, saved.x_placed, name);
  check_laid_out_like(*grads.router, *layer.router, "the router gradient", name);
  check_laid_out_like(*grads.gate, *layer.gate, "the gate gradient", name);
  check_laid_out_like(*grads.up, *layer.up, "the up gradient", name);
  check_laid_out_like(*grads.down, *layer.down, "the down gradient", name);

  // dy as the partial output was laid out: gathered over the weights' axes (the transpose of
  // the forward's reduction), the same tensor when no axis splits the weights.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyc =
      canonical_gradient(pb, dy, gradient_placements(saved.y_placed), saved.partial_placed, name + ".dy", dy_ready);

  runtime::ShardedTensor& xc = *saved.x;
  const MoeConfig& c = layer.config;
  const std::int64_t h = layer.hidden, e = c.num_experts, k = c.top_k, le_count = layer.local_experts,
                     fl = layer.local_ffn;
  const std::int64_t rows = xc.layout().elements_per_device() / h;
  const std::vector<sharding::Placement> x_placed = sharding::to_placements(xc.spec(), m, rank);
  const std::vector<sharding::Placement> full_placed = gradient_placements(saved.partial_placed);
  const bool reduced = saved.partial_placed != full_placed;  // some axis splits the weights

  // Tensors shaped as the tokens with k (the routing weights) in place of H: partial over the
  // weights' axes as each device computes them, then summed.
  std::vector<std::int64_t> table_shape = xc.shape();
  table_shape.back() = k;
  runtime::ShardedTensor& dw_partial =
      pb.tensor(name + ".dweights_partial", TensorRole::kActivation, table_shape, xc.spec());
  runtime::ShardedTensor& dw_full =
      reduced ? pb.tensor(name + ".dweights", TensorRole::kActivation, table_shape, xc.spec()) : dw_partial;
  auto produced = [&](const runtime::ShardedTensor& used, const std::string& wname) -> runtime::ShardedTensor& {
    return pb.tensor(name + "." + wname + ".grad_partial", TensorRole::kActivation, used.shape(), used.spec());
  };
  runtime::ShardedTensor& d_gate = produced(*saved.gate, "w_gate");
  runtime::ShardedTensor& d_up = produced(*saved.up, "w_up");
  runtime::ShardedTensor& d_down = produced(*saved.down, "w_down");
  runtime::ShardedTensor& d_router = produced(*saved.router, "router");
  // dx as computed: the experts' terms and the router's (added by one device of each partial
  // sum), a partial sum over the weights' axes.
  const std::vector<sharding::Placement> dx_target = gradient_placements(saved.x_placed);
  const bool direct = saved.partial_placed == dx_target && xc.spec() == dx.spec();
  runtime::ShardedTensor& dx_partial =
      direct ? dx : pb.tensor(name + ".dx_partial", TensorRole::kActivation, xc.shape(), xc.spec());

  // Per device, each local expert on its assignments' rows: dw = dy . out (the routing
  // weight's gradient), then the SwiGLU backward on w dy.
  const double expert_flops = 2.0 * 2.0 * 3.0 * static_cast<double>(h * fl) * static_cast<double>(rows * k) /
                              static_cast<double>(e) * static_cast<double>(le_count);
  const runtime::Frontier experts_done = pb.per_device(name + ".experts_bwd", {&dy_ready}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    pb.add_flops(s, expert_flops);
    RoutingTables& r = *saved.tables[i];
    runtime::Tensor& xs = xc.shard(s);
    runtime::Tensor& dys = dyc.shard(s);
    runtime::Tensor& gp = *saved.gate_pre[i];
    runtime::Tensor& up_pre = *saved.up_pre[i];
    runtime::Tensor& act = *saved.hidden[i];
    runtime::Tensor& out = *saved.expert_out[i];
    runtime::Tensor& wg = saved.gate->shard(s);
    runtime::Tensor& wu = saved.up->shard(s);
    runtime::Tensor& wd = saved.down->shard(s);
    runtime::Tensor& gg = d_gate.shard(s);
    runtime::Tensor& gu = d_up.shard(s);
    runtime::Tensor& gd = d_down.shard(s);
    runtime::Tensor& dws = dw_partial.shard(s);
    runtime::Tensor& dxs = dx_partial.shard(s);
    runtime::Tensor& xe = pb.scratch(s, {rows, h});
    runtime::Tensor& ge = pb.scratch(s, {rows, h});
    runtime::Tensor& da = pb.scratch(s, {rows, fl});
    runtime::Tensor& du = pb.scratch(s, {rows, fl});
    runtime::Tensor& dxe = pb.scratch(s, {rows, h});
    return [prec, &r, &xs, &dys, &gp, &up_pre, &act, &out, &wg, &wu, &wd, &gg, &gu, &gd, &dws, &dxs, &xe, &ge, &da, &du,
            &dxe, le_count, h, fl, k] {
      std::fill(dws.values().begin(), dws.values().end(), 0.0f);
      std::fill(dxs.values().begin(), dxs.values().end(), 0.0f);
      const std::int64_t wgt = h * fl;
      std::int64_t at = 0;  // the expert's first row in the packed buffers
      for (std::int64_t le = 0; le < le_count; ++le) {
        const std::int64_t n = r.expert_count[static_cast<std::size_t>(le)];
        MatrixMap dwg(gg.values().data() + le * wgt, h, fl);
        MatrixMap dwu(gu.values().data() + le * wgt, h, fl);
        MatrixMap dwd(gd.values().data() + le * wgt, fl, h);
        if (n == 0) {  // no tokens: no gradient, but the buffers hold the last step's
          dwg.setZero(), dwu.setZero(), dwd.setZero();
          continue;
        }
        const auto& rows_of = r.expert_rows[static_cast<std::size_t>(le)];
        const auto& scale = r.expert_scale[static_cast<std::size_t>(le)];
        MatrixMap xm(xe.values().data(), n, h);
        MatrixMap gm(ge.values().data(), n, h);
        const ConstMatrixMap om(out.values().data() + at * h, n, h);
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t row = rows_of[static_cast<std::size_t>(j)];
          xm.row(j) = ConstMatrixMap(xs.values().data() + row * h, 1, h);
          gm.row(j) = ConstMatrixMap(dys.values().data() + row * h, 1, h);
          // Which of the row's k choices this assignment is: the one naming this expert (top-k
          // names each expert at most once).
          std::int64_t choice = 0;
          while (r.choice[static_cast<std::size_t>(row * k + choice)] != r.first_expert + le) ++choice;
          dws.values()[static_cast<std::size_t>(row * k + choice)] = gm.row(j).dot(om.row(j));
          gm.row(j) *= scale[static_cast<std::size_t>(j)];
        }
        const ConstMatrixMap gmc(gm.data(), n, h), xmc(xm.data(), n, h);
        const ConstMatrixMap actm(act.values().data() + at * fl, n, fl);
        MatrixMap dam(da.values().data(), n, fl);
        MatrixMap dum(du.values().data(), n, fl);
        // d act = (w dy) w_down^T: the stored [F, H] matrix read as the out-in form of its
        // transpose; d w_down = act^T (w dy).
        device_gemm(gmc, as_weight(wd, le * wgt, h, fl, WeightLayout::kOutIn), dam, prec);
        device_gemm_transposed_a(actm, gmc, dwd, 0.0f, prec);
        silu_mul_backward(ConstMatrixMap(gp.values().data() + at * fl, n, fl),
                          ConstMatrixMap(up_pre.values().data() + at * fl, n, fl), ConstMatrixMap(dam.data(), n, fl),
                          dam, dum);
        const ConstMatrixMap damc(dam.data(), n, fl), dumc(dum.data(), n, fl);
        device_gemm_transposed_a(xmc, damc, dwg, 0.0f, prec);
        device_gemm_transposed_a(xmc, dumc, dwu, 0.0f, prec);
        MatrixMap dxm(dxe.values().data(), n, h);
        device_gemm(damc, as_weight(wg, le * wgt, fl, h, WeightLayout::kOutIn), dxm, prec);
        MatrixMap gate_term(ge.values().data(), n, h);  // w dy is no longer needed
        device_gemm(dumc, as_weight(wu, le * wgt, fl, h, WeightLayout::kOutIn), gate_term, prec);
        dxm += gate_term;
        for (std::int64_t j = 0; j < n; ++j) {
          MatrixMap(dxs.values().data() + rows_of[static_cast<std::size_t>(j)] * h, 1, h) += dxm.row(j);
        }
        at += n;
      }
    };
  });
  // The routing weights' gradients summed over the weights' axes.
  const runtime::Frontier dw_ready =
      reduced ? pb.reshard(dw_partial, saved.partial_placed, dw_full, full_placed, experts_done, name + ".dweights")
              : experts_done;

  // Per device: the router's backward on its rows (every device of a partial sum computes the
  // same values; the first adds the input gradient into dx).
  const runtime::Frontier* aux_ready = aux != nullptr ? &aux->ready : nullptr;
  const runtime::Frontier router_done =
      pb.per_device(name + ".router_bwd", {&dw_ready, &experts_done, aux_ready}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        pb.add_flops(s, 2.0 * 2.0 * static_cast<double>(rows * h * e));
        const bool adds_dx = detail::first_of_partial_sum(mesh, saved.partial_placed, s);
        RoutingTables& r = *saved.tables[i];
        runtime::Tensor& p = *saved.probs[i];
        runtime::Tensor& dws = dw_full.shard(s);
        runtime::Tensor& xs = xc.shard(s);
        runtime::Tensor& wr = saved.router->shard(s);
        runtime::Tensor& gr = d_router.shard(s);
        runtime::Tensor& dxs = dx_partial.shard(s);
        runtime::Tensor& dl = pb.scratch(s, {rows, e});
        // The load-balancing loss's dp: every row's the same, scale x the step's choice counts.
        runtime::Tensor* stats = aux != nullptr ? &aux->stats->shard(s) : nullptr;
        runtime::Tensor* dprobs = aux != nullptr ? &pb.scratch(s, {e}) : nullptr;
        const double aux_scale = aux != nullptr ? aux->scale : 0.0;
        return [&r, &p, &dws, &xs, &wr, &gr, &dxs, &dl, stats, dprobs, aux_scale, c, rows, h, e, k, adds_dx] {
          std::span<const float> extra;
          if (stats != nullptr) {
            const std::span<const float> counts = stats->values().first(static_cast<std::size_t>(e));
            for (std::size_t ex = 0; ex < counts.size(); ++ex) {
              dprobs->values()[ex] = static_cast<float>(aux_scale * static_cast<double>(counts[ex]));
            }
            extra = dprobs->values();
          }
          routing_weights_backward(r, c, as_matrix(std::as_const(p)), ConstMatrixMap(dws.values().data(), rows, k),
                                   extra, as_matrix(dl));
          const ConstMatrixMap dlm(dl.values().data(), rows, e);
          device_gemm_transposed_a(ConstMatrixMap(xs.values().data(), rows, h), dlm, as_matrix(gr));
          if (adds_dx) {
            gemm(dlm, as_matrix(std::as_const(wr)), MatrixMap(dxs.values().data(), rows, h), 1.0f, 1.0f,
                 /*transpose_b=*/true);
          }
        };
      });

  // The weights' gradients over the axes splitting the tokens; dx over the weights' axes.
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used, runtime::ShardedTensor& grad,
                    const runtime::Frontier& ready, const std::string& wname) {
    parts.push_back(reduce_weight_gradient(pb, partial, used, x_placed, rank, grad, ready, name + "." + wname + ".grad"));
  };
  reduce(d_gate, *saved.gate, *grads.gate, experts_done, "w_gate");
  reduce(d_up, *saved.up, *grads.up, experts_done, "w_up");
  reduce(d_down, *saved.down, *grads.down, experts_done, "w_down");
  reduce(d_router, *saved.router, *grads.router, router_done, "router");
  if (!direct) parts.push_back(pb.reshard(dx_partial, saved.partial_placed, dx, dx_target, router_done, name + ".dx"));
  else parts.push_back(router_done);
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
