// Attention's backward (declared in lowering/attention.hpp, next to its forward).

#include "numesh/ops/kernels/attention_backward.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/gradients.hpp"

namespace numesh::ops {

runtime::Frontier emit_attention_backward(ProgramBuilder& pb, const AttentionLayer& layer,
                                          const AttentionSaved& saved, runtime::ShardedTensor& dy,
                                          const runtime::Frontier& after,
                                          runtime::ShardedTensor& dx,
                                          const AttentionGradients& grads, const std::string& name,
                                          runtime::Frontier* dx_ready) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  NUMESH_CHECK(saved.x != nullptr && saved.k != nullptr, ValueError,
               "{}: the forward kept nothing for the backward (emit_attention without `saved`)",
               name);
  runtime::ShardedTensor& x = *saved.x;
  check_laid_out_like(dy, x, "dy", name);
  check_laid_out_like(dx, x, "dx", name);
  check_laid_out_like(*grads.wq, *layer.wq, "the wq gradient", name);
  check_laid_out_like(*grads.wk, *layer.wk, "the wk gradient", name);
  check_laid_out_like(*grads.wv, *layer.wv, "the wv gradient", name);
  check_laid_out_like(*grads.wo, *layer.wo, "the wo gradient", name);
  // The optional rows (biases, q/k norm weights): each present one needs its gradient.
  check_optional_gradient(grads.bq, layer.bq, "bq", name);
  check_optional_gradient(grads.bk, layer.bk, "bk", name);
  check_optional_gradient(grads.bv, layer.bv, "bv", name);
  check_optional_gradient(grads.bo, layer.bo, "bo", name);
  check_optional_gradient(grads.q_norm, layer.q_norm, "q_norm", name);
  check_optional_gradient(grads.k_norm, layer.k_norm, "k_norm", name);
  NUMESH_CHECK((layer.q_norm == nullptr || !saved.q_pre.empty()) &&
                   (layer.k_norm == nullptr || !saved.k_pre.empty()),
               ValueError, "{}: the forward kept no q or k before their norms", name);
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const AttentionConfig& config = layer.config;
  const std::int64_t d = config.head_dim;
  const std::int64_t hidden = layer.hidden, t = x.shape()[1];
  const std::int64_t local_batch = x.layout().shard_shape()[0],
                     local_t = x.layout().shard_shape()[1];
  const std::int64_t rows = local_batch * local_t;
  const std::int64_t lq = layer.local_q_heads, lkv = layer.local_kv_heads;
  const std::optional<std::size_t> heads_axis =
      layer.splits_heads() ? m.find_axis(layer.heads_axis) : std::optional<std::size_t>();
  const std::vector<sharding::Placement> x_placed = sharding::to_placements(x.spec(), m, 3);
  runtime::ShardedTensor& wq = pb.use(name + ".wq", TensorRole::kWeight, layer.wq);
  runtime::ShardedTensor& wk = pb.use(name + ".wk", TensorRole::kWeight, layer.wk);
  runtime::ShardedTensor& wv = pb.use(name + ".wv", TensorRole::kWeight, layer.wv);
  runtime::ShardedTensor& wo = pb.use(name + ".wo", TensorRole::kWeight, layer.wo);
  // One of the core's seven [queries, keys, D] products (half of them under the causal mask).
  const double core_product =
      2.0 * static_cast<double>(local_batch * lq * local_t * t * d) * (config.causal ? 0.5 : 1.0);

  // dy as the output projection's partial sums were laid out: the all-reduce's transpose is the
  // identity, so this is dy itself.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyp = canonical_gradient(pb, dy, gradient_placements(x_placed),
                                                   saved.partial_placed, name + ".dy", dy_ready);

  auto produced = [&](runtime::ShardedTensor& like,
                      const std::string& what) -> runtime::ShardedTensor& {
    return pb.tensor(name + "." + what, TensorRole::kActivation, like.shape(), like.spec());
  };
  // The projections' gradients as each device computes them (the gradients themselves when
  // nothing is left to reduce).
  auto weight_target = [&](runtime::ShardedTensor& used, runtime::ShardedTensor& out,
                           const std::string& what) -> runtime::ShardedTensor& {
    return weight_gradient_target(pb, used, x_placed, 3, out, name + "." + what + ".grad_partial");
  };
  runtime::ShardedTensor& d_wo = weight_target(wo, *grads.wo, "wo");
  runtime::ShardedTensor& d_wq = weight_target(wq, *grads.wq, "wq");
  runtime::ShardedTensor& d_wk = weight_target(wk, *grads.wk, "wk");
  runtime::ShardedTensor& d_wv = weight_target(wv, *grads.wv, "wv");
  // The rows' gradients as each device computes them (laid out as the rows; a q/k norm's
  // summed over the device's heads only).
  runtime::ShardedTensor* const d_bq = optional_partial_gradient(pb, layer.bq, name, "bq");
  runtime::ShardedTensor* const d_bk = optional_partial_gradient(pb, layer.bk, name, "bk");
  runtime::ShardedTensor* const d_bv = optional_partial_gradient(pb, layer.bv, name, "bv");
  runtime::ShardedTensor* const d_bo = optional_partial_gradient(pb, layer.bo, name, "bo");
  runtime::ShardedTensor* const d_qn = optional_partial_gradient(pb, layer.q_norm, name, "q_norm");
  runtime::ShardedTensor* const d_kn = optional_partial_gradient(pb, layer.k_norm, name, "k_norm");
  runtime::ShardedTensor* const q_norm =
      pb.use_if_present(name + ".q_norm", TensorRole::kWeight, layer.q_norm);
  runtime::ShardedTensor* const k_norm =
      pb.use_if_present(name + ".k_norm", TensorRole::kWeight, layer.k_norm);
  runtime::ShardedTensor& dk_all = produced(*saved.k, "dk_all");
  runtime::ShardedTensor& dv_all = produced(*saved.v, "dv_all");
  const auto slots = static_cast<std::size_t>(mesh.size());
  std::vector<runtime::Tensor*> d_out(slots), dq(slots);

  // Per device: d_out = dy wo (its heads' columns), d_wo = dy^T out. as_weight() reads each
  // stored [out, in] projection as it is: the backward multiplies by w, not w^T.
  const runtime::Frontier out_done =
      pb.per_device(name + ".out_bwd", {&dy_ready}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        runtime::Tensor& dys = dyp.shard(s);
        runtime::Tensor& os = *saved.out[i];
        runtime::Tensor& wos = wo.shard(s);  // [H, local heads * D]
        runtime::Tensor& gwo = d_wo.shard(s);
        runtime::Tensor& dos = pb.scratch(s, {rows, lq * d});
        d_out[i] = &dos;
        // The output bias' gradient: dy summed over the rows (dy is whole on every device of the
        // heads axis, so each has the same: replicated there, as bo is).
        runtime::Tensor* gbo = d_bo != nullptr ? &d_bo->shard(s) : nullptr;
        pb.add_flops(s, 4.0 * static_cast<double>(rows * hidden * lq * d));
        return [prec, &dys, &os, &wos, &gwo, &dos, gbo, rows, hidden] {
          const ConstMatrixMap dym(dys.values().data(), rows, hidden);
          device_gemm(dym, as_weight(wos), as_matrix(dos), prec);
          device_gemm_transposed_a(dym, as_matrix(std::as_const(os)), as_matrix(gwo), 0.0f, prec);
          if (gbo != nullptr) as_matrix(*gbo) = dym.colwise().sum();
        };
      });

  // Per device: attention's backward over its sequences and heads, then RoPE turned back on dq
  // and dk (the keys at their global positions 0..T-1, the queries at the device's tokens').
  const runtime::Frontier core_done =
      pb.per_device(name + ".core_bwd", {&out_done}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        const std::int64_t token_offset = x.layout().device(s).block[1] * local_t;
        const AttentionSlice slice = layer.slice(x, s);
        runtime::Tensor& qs = *saved.q[i];
        runtime::Tensor& ks = saved.k->shard(s);
        runtime::Tensor& vs = saved.v->shard(s);
        runtime::Tensor& dos = *d_out[i];
        runtime::Tensor& dqs = pb.scratch(s, {rows, lq * d});
        dq[i] = &dqs;
        runtime::Tensor& dks = dk_all.shard(s);
        runtime::Tensor& dvs = dv_all.shard(s);
        runtime::Tensor& scratch = pb.scratch(
            s, {attention_backward_scratch_floats(slice, d, mesh.device(s).spec().threads)});
        pb.add_flops(s, 7.0 * core_product);
        return [&qs, &ks, &vs, &dos, &dqs, &dks, &dvs, &scratch, slice, config, token_offset] {
          const std::int64_t dd = config.head_dim;
          attention_core_backward(qs.values().data(), ks.values().data(), vs.values().data(),
                                  dos.values().data(), dqs.values().data(), dks.values().data(),
                                  dvs.values().data(), slice, dd, token_offset, config.causal,
                                  scratch.values());
          if (config.rope_theta > 0.0f) {
            rope_inplace(dqs.values().data(), slice.batch, slice.q_len, slice.q_heads, dd,
                         token_offset, config.rope_theta, config.rope_scaling, /*inverse=*/true);
            rope_inplace(dks.values().data(), slice.batch, slice.kv_len, slice.kv_heads, dd, 0,
                         config.rope_theta, config.rope_scaling, /*inverse=*/true);
          }
        };
      });

  // dk and dv back to this run's keys' layout: each device summed over its own queries, so the
  // gradients are Partial over the axes that gathered the keys (a reduce-scatter) and, when the
  // query heads are split but the kv heads are not, over the heads axis (an all-reduce).
  std::vector<sharding::Placement> kv_produced = sharding::to_placements(saved.k->spec(), m, 3);
  const std::vector<sharding::Placement> kv_local =
      sharding::to_placements(saved.k_local->spec(), m, 3);
  for (std::size_t a = 0; a < kv_produced.size(); ++a) {
    const bool gathered =
        kv_local[a].is_shard() && kv_local[a].dim == 1 && !kv_produced[a].is_shard();
    const bool shared_kv = heads_axis && a == *heads_axis && !layer.splits_kv_heads();
    if (gathered || shared_kv) kv_produced[a] = sharding::Placement::partial();
  }
  runtime::Frontier dk_ready = core_done, dv_ready = core_done;
  runtime::ShardedTensor& dk =
      canonical_gradient(pb, dk_all, kv_produced, kv_local, name + ".dk", dk_ready);
  runtime::ShardedTensor& dv =
      canonical_gradient(pb, dv_all, kv_produced, kv_local, name + ".dv", dv_ready);

  // Per device: dx_partial = dq wq + dk wk + dv wv and the projections' gradients. When every
  // device of the heads axis holds the same (all-reduced) dk and dv, only the first adds their
  // terms to its partial sum, so that the all-reduce of dx counts them once.
  const std::vector<sharding::Placement> dx_placed =
      partial_where_sharded(x_placed, sharding::to_placements(wq.spec(), m, 2));
  runtime::ShardedTensor& dx_partial =
      dx_placed == x_placed
          ? dx
          : pb.tensor(name + ".dx_partial", TensorRole::kActivation, x.shape(), x.spec());
  const runtime::Frontier qkv_done =
      pb.per_device(name + ".qkv_bwd", {&core_done, &dk_ready, &dv_ready}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        runtime::Tensor& xs = x.shard(s);
        runtime::Tensor& dqs = *dq[i];
        runtime::Tensor& dks = dk.shard(s);
        runtime::Tensor& dvs = dv.shard(s);
        runtime::Tensor& wqs = wq.shard(s);
        runtime::Tensor& wks = wk.shard(s);
        runtime::Tensor& wvs = wv.shard(s);
        runtime::Tensor& gq = d_wq.shard(s);
        runtime::Tensor& gk = d_wk.shard(s);
        runtime::Tensor& gv = d_wv.shard(s);
        runtime::Tensor& dxs = dx_partial.shard(s);
        runtime::Tensor& term = pb.scratch(s, {rows, hidden});
        const bool adds_kv =
            layer.splits_kv_heads() || !heads_axis || mesh.coords(s)[*heads_axis] == 0;
        // The q/k norms' and the biases' parts (each null when the layer has none).
        runtime::Tensor* q_pre = saved.q_pre.empty() ? nullptr : saved.q_pre[i];
        runtime::Tensor* k_pre = saved.k_pre.empty() ? nullptr : saved.k_pre[i];
        runtime::Tensor* qn = q_norm != nullptr ? &q_norm->shard(s) : nullptr;
        runtime::Tensor* kn = k_norm != nullptr ? &k_norm->shard(s) : nullptr;
        runtime::Tensor* gqn = d_qn != nullptr ? &d_qn->shard(s) : nullptr;
        runtime::Tensor* gkn = d_kn != nullptr ? &d_kn->shard(s) : nullptr;
        runtime::Tensor* gbq = d_bq != nullptr ? &d_bq->shard(s) : nullptr;
        runtime::Tensor* gbk = d_bk != nullptr ? &d_bk->shard(s) : nullptr;
        runtime::Tensor* gbv = d_bv != nullptr ? &d_bv->shard(s) : nullptr;
        const float qk_eps = config.qk_norm_eps;
        pb.add_flops(s, 4.0 * static_cast<double>(rows * hidden * (lq + 2 * lkv) * d));
        return [prec, &xs, &dqs, &dks, &dvs, &wqs, &wks, &wvs, &gq, &gk, &gv, &dxs, &term, rows,
                hidden, adds_kv, q_pre, k_pre, qn, kn, gqn, gkn, gbq, gbk, gbv, qk_eps, d] {
          // Through the q/k norms (each head's d values a row, one weight for all heads), in place:
          // dq and dk become the gradients of q and k as they left the biases.
          const auto norm_backward = [&](runtime::Tensor* pre, runtime::Tensor* weight,
                                         runtime::Tensor* grad, runtime::Tensor& dz) {
            if (weight == nullptr) return;
            const std::int64_t n = static_cast<std::int64_t>(dz.values().size()) / d;
            rmsnorm_rows_backward(ConstMatrixMap(pre->values().data(), n, d),
                                  as_matrix(std::as_const(*weight)),
                                  ConstMatrixMap(dz.values().data(), n, d), qk_eps,
                                  MatrixMap(dz.values().data(), n, d), as_matrix(*grad));
          };
          norm_backward(q_pre, qn, gqn, dqs);
          norm_backward(k_pre, kn, gkn, dks);
          // A bias' gradient: its outputs' gradients summed over the rows.
          const auto bias_grad = [&](runtime::Tensor* grad, runtime::Tensor& dz) {
            if (grad == nullptr) return;
            as_matrix(*grad) =
                ConstMatrixMap(dz.values().data(), rows, grad->size()).colwise().sum();
          };
          bias_grad(gbq, dqs);
          bias_grad(gbk, dks);
          bias_grad(gbv, dvs);
          const ConstMatrixMap xm(xs.values().data(), rows, hidden);
          const ConstMatrixMap dqm = as_matrix(std::as_const(dqs));
          const ConstMatrixMap dkm(dks.values().data(), rows,
                                   dks.values().size() / static_cast<std::size_t>(rows));
          const ConstMatrixMap dvm(dvs.values().data(), rows,
                                   dvs.values().size() / static_cast<std::size_t>(rows));
          MatrixMap dxm(dxs.values().data(), rows, hidden);
          device_gemm_transposed_a(dqm, xm, as_matrix(gq), 0.0f, prec);
          device_gemm_transposed_a(dkm, xm, as_matrix(gk), 0.0f, prec);
          device_gemm_transposed_a(dvm, xm, as_matrix(gv), 0.0f, prec);
          device_gemm(dqm, as_weight(wqs), dxm, prec);
          if (!adds_kv) return;
          device_gemm(dkm, as_weight(wks), as_matrix(term), prec);
          dxm += as_matrix(std::as_const(term));
          device_gemm(dvm, as_weight(wvs), as_matrix(term), prec);
          dxm += as_matrix(std::as_const(term));
        };
      });

  // The projections' gradients: all-reduced over the axes splitting the tokens (and nothing
  // more: wk and wv are replicated on the heads axis exactly when dk and dv were all-reduced).
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                    runtime::ShardedTensor& out, const runtime::Frontier& ready,
                    const std::string& what) {
    parts.push_back(reduce_weight_gradient(pb, partial, used, x_placed, 3, out, ready,
                                           name + "." + what + ".grad"));
  };
  reduce(d_wo, wo, *grads.wo, out_done, "wo");
  reduce(d_wq, wq, *grads.wq, qkv_done, "wq");
  reduce(d_wk, wk, *grads.wk, qkv_done, "wk");
  reduce(d_wv, wv, *grads.wv, qkv_done, "wv");
  // The biases as the projections they follow (bo replicated over the heads axis, as dy is);
  // a q/k norm's also over the heads axis when it splits those heads (its devices summed
  // different heads), and not when every device there holds the same (all-reduced) dk.
  if (d_bq != nullptr) reduce(*d_bq, *layer.bq, *grads.bq, qkv_done, "bq");
  if (d_bk != nullptr) reduce(*d_bk, *layer.bk, *grads.bk, qkv_done, "bk");
  if (d_bv != nullptr) reduce(*d_bv, *layer.bv, *grads.bv, qkv_done, "bv");
  if (d_bo != nullptr) reduce(*d_bo, *layer.bo, *grads.bo, out_done, "bo");
  const auto reduce_norm = [&](runtime::ShardedTensor& partial, const runtime::ShardedTensor& used,
                               runtime::ShardedTensor& out, bool heads_split,
                               const std::string& what) {
    std::vector<sharding::Placement> placed =
        weight_gradient_placements(sharding::to_placements(used.spec(), m, 2), x_placed, 3);
    if (heads_split) placed[*heads_axis] = sharding::Placement::partial();
    parts.push_back(
        reduce_gradient_into(pb, partial, placed, out, qkv_done, name + "." + what + ".grad"));
  };
  if (d_qn != nullptr)
    reduce_norm(*d_qn, *layer.q_norm, *grads.q_norm, layer.splits_heads(), "q_norm");
  if (d_kn != nullptr)
    reduce_norm(*d_kn, *layer.k_norm, *grads.k_norm, layer.splits_kv_heads(), "k_norm");
  if (&dx_partial != &dx) {
    parts.push_back(pb.reshard(dx_partial, dx_placed, dx, gradient_placements(x_placed), qkv_done,
                               name + ".dx"));
  } else {
    parts.push_back(qkv_done);
  }
  if (dx_ready != nullptr) *dx_ready = parts.back();
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
