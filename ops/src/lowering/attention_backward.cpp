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

namespace {

// Refuses a backward whose forward kept nothing for it or whose gradients are not laid out as
// what they differentiate.
void attention_bwd_check_inputs(const AttentionLayer& layer, const AttentionSaved& saved,
                                runtime::ShardedTensor& dy, runtime::ShardedTensor& dx,
                                const AttentionGradients& grads, const std::string& name) {
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
}

// What every phase of the backward reads: the layer, its saved forward, the sizes, x's
// placements and the projections' weights as the program uses them.
struct AttentionBwd {
  ProgramBuilder& pb;
  const AttentionLayer& layer;
  const AttentionSaved& saved;
  const AttentionGradients& grads;
  const std::string& name;
  MatmulPrecision prec;  // of the fp32 products
  const runtime::DeviceMesh& mesh;
  const sharding::Mesh& m;
  runtime::ShardedTensor& x;
  std::int64_t d, hidden, t, local_batch, local_t, rows, lq, lkv;
  std::optional<std::size_t> heads_axis;
  std::vector<sharding::Placement> x_placed;
  runtime::ShardedTensor& wq;
  runtime::ShardedTensor& wk;
  runtime::ShardedTensor& wv;
  runtime::ShardedTensor& wo;
};

// The shared state: sizes from x and the layer, and the four projections registered as weights.
AttentionBwd attention_bwd_context(ProgramBuilder& pb, const AttentionLayer& layer,
                                   const AttentionSaved& saved, const AttentionGradients& grads,
                                   const std::string& name) {
  const sharding::Mesh& m = pb.mesh().mesh();
  runtime::ShardedTensor& x = *saved.x;
  const std::int64_t local_batch = x.layout().shard_shape()[0],
                     local_t = x.layout().shard_shape()[1];
  return AttentionBwd{
      .pb = pb,
      .layer = layer,
      .saved = saved,
      .grads = grads,
      .name = name,
      .prec = pb.matmul_precision(),
      .mesh = pb.mesh(),
      .m = m,
      .x = x,
      .d = layer.config.head_dim,
      .hidden = layer.hidden,
      .t = x.shape()[1],
      .local_batch = local_batch,
      .local_t = local_t,
      .rows = local_batch * local_t,
      .lq = layer.local_q_heads,
      .lkv = layer.local_kv_heads,
      .heads_axis =
          layer.splits_heads() ? m.find_axis(layer.heads_axis) : std::optional<std::size_t>(),
      .x_placed = sharding::to_placements(x.spec(), m, 3),
      .wq = pb.use(name + ".wq", TensorRole::kWeight, layer.wq),
      .wk = pb.use(name + ".wk", TensorRole::kWeight, layer.wk),
      .wv = pb.use(name + ".wv", TensorRole::kWeight, layer.wv),
      .wo = pb.use(name + ".wo", TensorRole::kWeight, layer.wo),
  };
}

// The gradients as each device computes them, the q/k norm weights as used, and dk and dv
// over the keys attention read.
struct AttentionBwdTensors {
  runtime::ShardedTensor& d_wo;
  runtime::ShardedTensor& d_wq;
  runtime::ShardedTensor& d_wk;
  runtime::ShardedTensor& d_wv;
  runtime::ShardedTensor* d_bq;
  runtime::ShardedTensor* d_bk;
  runtime::ShardedTensor* d_bv;
  runtime::ShardedTensor* d_bo;
  runtime::ShardedTensor* d_qn;
  runtime::ShardedTensor* d_kn;
  runtime::ShardedTensor* q_norm;
  runtime::ShardedTensor* k_norm;
  runtime::ShardedTensor& dk_all;
  runtime::ShardedTensor& dv_all;
};

// Registers the tensors the per-device phases write (in the order the program has always
// registered them).
AttentionBwdTensors attention_bwd_tensors(const AttentionBwd& st) {
  ProgramBuilder& pb = st.pb;
  const AttentionLayer& layer = st.layer;
  const std::string& name = st.name;
  auto produced = [&](runtime::ShardedTensor& like,
                      const std::string& what) -> runtime::ShardedTensor& {
    return pb.tensor(name + "." + what, TensorRole::kActivation, like.shape(), like.spec());
  };
  // The projections' gradients as each device computes them (the gradients themselves when
  // nothing is left to reduce).
  auto weight_target = [&](runtime::ShardedTensor& used, runtime::ShardedTensor& out,
                           const std::string& what) -> runtime::ShardedTensor& {
    return weight_gradient_target(pb, used, st.x_placed, 3, out,
                                  name + "." + what + ".grad_partial");
  };
  // The rows' gradients as each device computes them (laid out as the rows; a q/k norm's
  // summed over the device's heads only).
  return AttentionBwdTensors{
      .d_wo = weight_target(st.wo, *st.grads.wo, "wo"),
      .d_wq = weight_target(st.wq, *st.grads.wq, "wq"),
      .d_wk = weight_target(st.wk, *st.grads.wk, "wk"),
      .d_wv = weight_target(st.wv, *st.grads.wv, "wv"),
      .d_bq = optional_partial_gradient(pb, layer.bq, name, "bq"),
      .d_bk = optional_partial_gradient(pb, layer.bk, name, "bk"),
      .d_bv = optional_partial_gradient(pb, layer.bv, name, "bv"),
      .d_bo = optional_partial_gradient(pb, layer.bo, name, "bo"),
      .d_qn = optional_partial_gradient(pb, layer.q_norm, name, "q_norm"),
      .d_kn = optional_partial_gradient(pb, layer.k_norm, name, "k_norm"),
      .q_norm = pb.use_if_present(name + ".q_norm", TensorRole::kWeight, layer.q_norm),
      .k_norm = pb.use_if_present(name + ".k_norm", TensorRole::kWeight, layer.k_norm),
      .dk_all = produced(*st.saved.k, "dk_all"),
      .dv_all = produced(*st.saved.v, "dv_all"),
  };
}

// Per device: d_out = dy wo (its heads' columns), d_wo = dy^T out. as_weight() reads each
// stored [out, in] projection as it is: the backward multiplies by w, not w^T. Fills d_out.
runtime::Frontier attention_bwd_output_projection(const AttentionBwd& st,
                                                  const AttentionBwdTensors& g,
                                                  runtime::ShardedTensor& dyp,
                                                  const runtime::Frontier& dy_ready,
                                                  std::vector<runtime::Tensor*>& d_out) {
  ProgramBuilder& pb = st.pb;
  const MatmulPrecision prec = st.prec;
  const std::int64_t rows = st.rows, hidden = st.hidden, lq = st.lq, d = st.d;
  return pb.per_device(st.name + ".out_bwd", {&dy_ready}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& dys = dyp.shard(s);
    runtime::Tensor& os = *st.saved.out[i];
    runtime::Tensor& wos = st.wo.shard(s);  // [H, local heads * D]
    runtime::Tensor& gwo = g.d_wo.shard(s);
    runtime::Tensor& dos = pb.scratch(s, {rows, lq * d});
    d_out[i] = &dos;
    // The output bias' gradient: dy summed over the rows (dy is whole on every device of the
    // heads axis, so each has the same: replicated there, as bo is).
    runtime::Tensor* gbo = g.d_bo != nullptr ? &g.d_bo->shard(s) : nullptr;
    pb.add_flops(s, 4.0 * static_cast<double>(rows * hidden * lq * d));
    return [prec, &dys, &os, &wos, &gwo, &dos, gbo, rows, hidden] {
      const ConstMatrixMap dym(dys.values().data(), rows, hidden);
      device_gemm(dym, as_weight(wos), as_matrix(dos), prec);
      device_gemm_transposed_a(dym, as_matrix(std::as_const(os)), as_matrix(gwo), 0.0f, prec);
      if (gbo != nullptr) as_matrix(*gbo) = dym.colwise().sum();
    };
  });
}

// Per device: attention's backward over its sequences and heads, then RoPE turned back on dq
// and dk (the keys at their global positions 0..T-1, the queries at the device's tokens').
// Fills dq.
runtime::Frontier attention_bwd_core(const AttentionBwd& st, const AttentionBwdTensors& g,
                                     const std::vector<runtime::Tensor*>& d_out,
                                     const runtime::Frontier& out_done,
                                     std::vector<runtime::Tensor*>& dq) {
  ProgramBuilder& pb = st.pb;
  const AttentionConfig& config = st.layer.config;
  const std::int64_t rows = st.rows, lq = st.lq, d = st.d, local_t = st.local_t;
  // One of the core's seven [queries, keys, D] products (half of them under the causal mask).
  const double core_product = 2.0 * static_cast<double>(st.local_batch * lq * local_t * st.t * d) *
                              (config.causal ? 0.5 : 1.0);
  return pb.per_device(st.name + ".core_bwd", {&out_done}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t token_offset = st.x.layout().device(s).block[1] * local_t;
    const AttentionSlice slice = st.layer.slice(st.x, s);
    runtime::Tensor& qs = *st.saved.q[i];
    runtime::Tensor& ks = st.saved.k->shard(s);
    runtime::Tensor& vs = st.saved.v->shard(s);
    runtime::Tensor& dos = *d_out[i];
    runtime::Tensor& dqs = pb.scratch(s, {rows, lq * d});
    dq[i] = &dqs;
    runtime::Tensor& dks = g.dk_all.shard(s);
    runtime::Tensor& dvs = g.dv_all.shard(s);
    runtime::Tensor& scratch = pb.scratch(
        s, {attention_backward_scratch_floats(slice, d, st.mesh.device(s).spec().threads)});
    pb.add_flops(s, 7.0 * core_product);
    return [&qs, &ks, &vs, &dos, &dqs, &dks, &dvs, &scratch, slice, config, token_offset] {
      const std::int64_t dd = config.head_dim;
      attention_core_backward(qs.values().data(), ks.values().data(), vs.values().data(),
                              dos.values().data(), dqs.values().data(), dks.values().data(),
                              dvs.values().data(), slice, dd, token_offset, config.causal,
                              scratch.values());
      if (config.rope_theta > 0.0f) {
        rope_inplace(dqs.values().data(), slice.batch, slice.q_len, slice.q_heads, dd, token_offset,
                     config.rope_theta, config.rope_scaling, /*inverse=*/true);
        rope_inplace(dks.values().data(), slice.batch, slice.kv_len, slice.kv_heads, dd, 0,
                     config.rope_theta, config.rope_scaling, /*inverse=*/true);
      }
    };
  });
}

// dk and dv laid out as this run's keys, each with the frontier after which it is complete.
struct AttentionBwdKeyGradients {
  runtime::ShardedTensor& dk;
  runtime::ShardedTensor& dv;
  runtime::Frontier dk_ready, dv_ready;
};

// dk and dv back to this run's keys' layout: each device summed over its own queries, so the
// gradients are Partial over the axes that gathered the keys (a reduce-scatter) and, when the
// query heads are split but the kv heads are not, over the heads axis (an all-reduce).
AttentionBwdKeyGradients attention_bwd_reduce_key_gradients(const AttentionBwd& st,
                                                            const AttentionBwdTensors& g,
                                                            const runtime::Frontier& core_done) {
  std::vector<sharding::Placement> kv_produced =
      sharding::to_placements(st.saved.k->spec(), st.m, 3);
  const std::vector<sharding::Placement> kv_local =
      sharding::to_placements(st.saved.k_local->spec(), st.m, 3);
  for (std::size_t a = 0; a < kv_produced.size(); ++a) {
    const bool gathered =
        kv_local[a].is_shard() && kv_local[a].dim == 1 && !kv_produced[a].is_shard();
    const bool shared_kv = st.heads_axis && a == *st.heads_axis && !st.layer.splits_kv_heads();
    if (gathered || shared_kv) kv_produced[a] = sharding::Placement::partial();
  }
  runtime::Frontier dk_ready = core_done, dv_ready = core_done;
  runtime::ShardedTensor& dk =
      canonical_gradient(st.pb, g.dk_all, kv_produced, kv_local, st.name + ".dk", dk_ready);
  runtime::ShardedTensor& dv =
      canonical_gradient(st.pb, g.dv_all, kv_produced, kv_local, st.name + ".dv", dv_ready);
  return AttentionBwdKeyGradients{
      .dk = dk, .dv = dv, .dk_ready = std::move(dk_ready), .dv_ready = std::move(dv_ready)};
}

// Per device: dx_partial = dq wq + dk wk + dv wv and the projections' gradients. When every
// device of the heads axis holds the same (all-reduced) dk and dv, only the first adds their
// terms to its partial sum, so that the all-reduce of dx counts them once.
runtime::Frontier attention_bwd_input_projections(const AttentionBwd& st,
                                                  const AttentionBwdTensors& g,
                                                  const std::vector<runtime::Tensor*>& dq,
                                                  const AttentionBwdKeyGradients& kv,
                                                  const runtime::Frontier& core_done,
                                                  runtime::ShardedTensor& dx_partial) {
  ProgramBuilder& pb = st.pb;
  const MatmulPrecision prec = st.prec;
  const std::int64_t rows = st.rows, hidden = st.hidden, lq = st.lq, lkv = st.lkv, d = st.d;
  return pb.per_device(
      st.name + ".qkv_bwd", {&core_done, &kv.dk_ready, &kv.dv_ready}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        runtime::Tensor& xs = st.x.shard(s);
        runtime::Tensor& dqs = *dq[i];
        runtime::Tensor& dks = kv.dk.shard(s);
        runtime::Tensor& dvs = kv.dv.shard(s);
        runtime::Tensor& wqs = st.wq.shard(s);
        runtime::Tensor& wks = st.wk.shard(s);
        runtime::Tensor& wvs = st.wv.shard(s);
        runtime::Tensor& gq = g.d_wq.shard(s);
        runtime::Tensor& gk = g.d_wk.shard(s);
        runtime::Tensor& gv = g.d_wv.shard(s);
        runtime::Tensor& dxs = dx_partial.shard(s);
        runtime::Tensor& term = pb.scratch(s, {rows, hidden});
        const bool adds_kv =
            st.layer.splits_kv_heads() || !st.heads_axis || st.mesh.coords(s)[*st.heads_axis] == 0;
        // The q/k norms' and the biases' parts (each null when the layer has none).
        runtime::Tensor* q_pre = st.saved.q_pre.empty() ? nullptr : st.saved.q_pre[i];
        runtime::Tensor* k_pre = st.saved.k_pre.empty() ? nullptr : st.saved.k_pre[i];
        runtime::Tensor* qn = g.q_norm != nullptr ? &g.q_norm->shard(s) : nullptr;
        runtime::Tensor* kn = g.k_norm != nullptr ? &g.k_norm->shard(s) : nullptr;
        runtime::Tensor* gqn = g.d_qn != nullptr ? &g.d_qn->shard(s) : nullptr;
        runtime::Tensor* gkn = g.d_kn != nullptr ? &g.d_kn->shard(s) : nullptr;
        runtime::Tensor* gbq = g.d_bq != nullptr ? &g.d_bq->shard(s) : nullptr;
        runtime::Tensor* gbk = g.d_bk != nullptr ? &g.d_bk->shard(s) : nullptr;
        runtime::Tensor* gbv = g.d_bv != nullptr ? &g.d_bv->shard(s) : nullptr;
        const float qk_eps = st.layer.config.qk_norm_eps;
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
                                  ConstMatrixMap(dz.values().data(), n, d), {.eps = qk_eps},
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
}

// The projections' gradients: all-reduced over the axes splitting the tokens (and nothing
// more: wk and wv are replicated on the heads axis exactly when dk and dv were all-reduced).
// Returns the frontiers after which each is complete.
std::vector<runtime::Frontier> attention_bwd_reduce_parameter_gradients(
    const AttentionBwd& st, const AttentionBwdTensors& g, const runtime::Frontier& out_done,
    const runtime::Frontier& qkv_done) {
  ProgramBuilder& pb = st.pb;
  const AttentionLayer& layer = st.layer;
  const AttentionGradients& grads = st.grads;
  const std::string& name = st.name;
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                    runtime::ShardedTensor& out, const runtime::Frontier& ready,
                    const std::string& what) {
    parts.push_back(reduce_weight_gradient(pb, partial, used, st.x_placed, 3, out, ready,
                                           name + "." + what + ".grad"));
  };
  reduce(g.d_wo, st.wo, *grads.wo, out_done, "wo");
  reduce(g.d_wq, st.wq, *grads.wq, qkv_done, "wq");
  reduce(g.d_wk, st.wk, *grads.wk, qkv_done, "wk");
  reduce(g.d_wv, st.wv, *grads.wv, qkv_done, "wv");
  // The biases as the projections they follow (bo replicated over the heads axis, as dy is);
  // a q/k norm's also over the heads axis when it splits those heads (its devices summed
  // different heads), and not when every device there holds the same (all-reduced) dk.
  if (g.d_bq != nullptr) reduce(*g.d_bq, *layer.bq, *grads.bq, qkv_done, "bq");
  if (g.d_bk != nullptr) reduce(*g.d_bk, *layer.bk, *grads.bk, qkv_done, "bk");
  if (g.d_bv != nullptr) reduce(*g.d_bv, *layer.bv, *grads.bv, qkv_done, "bv");
  if (g.d_bo != nullptr) reduce(*g.d_bo, *layer.bo, *grads.bo, out_done, "bo");
  const auto reduce_norm = [&](runtime::ShardedTensor& partial, const runtime::ShardedTensor& used,
                               runtime::ShardedTensor& out, bool heads_split,
                               const std::string& what) {
    std::vector<sharding::Placement> placed =
        weight_gradient_placements(sharding::to_placements(used.spec(), st.m, 2), st.x_placed, 3);
    if (heads_split) placed[*st.heads_axis] = sharding::Placement::partial();
    parts.push_back(
        reduce_gradient_into(pb, partial, placed, out, qkv_done, name + "." + what + ".grad"));
  };
  if (g.d_qn != nullptr)
    reduce_norm(*g.d_qn, *layer.q_norm, *grads.q_norm, layer.splits_heads(), "q_norm");
  if (g.d_kn != nullptr)
    reduce_norm(*g.d_kn, *layer.k_norm, *grads.k_norm, layer.splits_kv_heads(), "k_norm");
  return parts;
}

}  // namespace

runtime::Frontier emit_attention_backward(ProgramBuilder& pb, const AttentionLayer& layer,
                                          const AttentionSaved& saved, runtime::ShardedTensor& dy,
                                          const runtime::Frontier& after,
                                          runtime::ShardedTensor& dx,
                                          const AttentionGradients& grads, const std::string& name,
                                          runtime::Frontier* dx_ready) {
  attention_bwd_check_inputs(layer, saved, dy, dx, grads, name);
  const AttentionBwd st = attention_bwd_context(pb, layer, saved, grads, name);

  // dy as the output projection's partial sums were laid out: the all-reduce's transpose is the
  // identity, so this is dy itself.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyp = canonical_gradient(pb, dy, gradient_placements(st.x_placed),
                                                   saved.partial_placed, name + ".dy", dy_ready);
  const AttentionBwdTensors g = attention_bwd_tensors(st);
  const auto slots = static_cast<std::size_t>(st.mesh.size());
  std::vector<runtime::Tensor*> d_out(slots), dq(slots);

  const runtime::Frontier out_done = attention_bwd_output_projection(st, g, dyp, dy_ready, d_out);
  const runtime::Frontier core_done = attention_bwd_core(st, g, d_out, out_done, dq);
  const AttentionBwdKeyGradients kv = attention_bwd_reduce_key_gradients(st, g, core_done);

  // dx as each device computes it (dx itself when nothing is left to reduce).
  const std::vector<sharding::Placement> dx_placed =
      partial_where_sharded(st.x_placed, sharding::to_placements(st.wq.spec(), st.m, 2));
  runtime::ShardedTensor& dx_partial =
      dx_placed == st.x_placed
          ? dx
          : pb.tensor(name + ".dx_partial", TensorRole::kActivation, st.x.shape(), st.x.spec());
  const runtime::Frontier qkv_done =
      attention_bwd_input_projections(st, g, dq, kv, core_done, dx_partial);

  std::vector<runtime::Frontier> parts =
      attention_bwd_reduce_parameter_gradients(st, g, out_done, qkv_done);
  if (&dx_partial != &dx) {
    parts.push_back(pb.reshard(dx_partial, dx_placed, dx, gradient_placements(st.x_placed),
                               qkv_done, name + ".dx"));
  } else {
    parts.push_back(qkv_done);
  }
  if (dx_ready != nullptr) *dx_ready = parts.back();
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
