// The MoE layer's backward (declared in lowering/moe.hpp, next to its forward).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

// A read-only row-major view whose rows lie `stride` values apart (the first k columns of the
// routing weights' gradients when a shared expert's column follows them).
using StridedConstMatrixMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;

// The routing weights' gradients dw [rows, k] of one token group to the router logits'
// dlogits [rows, E]: through the renormalisation w_j = p_j / Z (Z the sum of the k chosen
// probabilities), dp_i = (dw_i - sum_j w_j dw_j) / Z for each chosen i (else dp = dw), then
// the softmax, dlogits = p .* (dp - p . dp). `dprobs` (E values, or none) is added to every
// row's dp first: the router's load-balancing loss.
void routing_weights_backward(const RoutingTables& r, const MoeConfig& c, ConstMatrixMap probs,
                              StridedConstMatrixMap dweight, std::span<const float> dprobs,
                              MatrixMap dlogits) {
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
    if (!dprobs.empty())
      dl += Eigen::Map<const Eigen::RowVectorXf>(dprobs.data(),
                                                 static_cast<Eigen::Index>(dprobs.size()));
    const float pdp = probs.row(t).dot(dl);
    dl = (probs.row(t).array() * (dl.array() - pdp)).matrix();
  }
}

// What the experts' part of the backward reads and writes (emit_moe_backward's tensors).
struct ExpertsBackward {
  ProgramBuilder& pb;
  const MoeLayer& layer;
  const MoeSaved& saved;
  runtime::ShardedTensor& dy;          // laid out as the partial output (dy gathered)
  runtime::ShardedTensor& dweights;    // [rows, cols]: the routing weights' gradients (partial)
  runtime::ShardedTensor& dx_partial;  // laid out as the routed x
  runtime::ShardedTensor& d_gate;      // the experts' weight gradients as each device computes them
  runtime::ShardedTensor& d_up;
  runtime::ShardedTensor& d_down;
  const runtime::Frontier& after;
  const std::string& name;
  std::int64_t cols;
};

// Which of row's k choices names `expert` (top-k names each expert at most once).
std::int64_t choice_of(const RoutingTables& r, std::int64_t row, std::int64_t k,
                       std::int64_t expert) {
  std::int64_t choice = 0;
  while (r.choice[static_cast<std::size_t>(row * k + choice)] != expert) ++choice;
  return choice;
}

// One device's tensors of its experts' SwiGLU backward: the forward's gate and up
// pre-activations and activation (packed expert after expert), the stacked weights as
// multiplied, and their gradients as the device computes them.
struct ExpertTensors {
  runtime::Tensor &gate_pre, &up_pre, &act, &wg, &wu, &wd, &gg, &gu, &gd;
};

ExpertTensors expert_tensors(const ExpertsBackward& a, std::int64_t s) {
  const auto i = static_cast<std::size_t>(s);
  const MoeSaved& saved = a.saved;
  return {*saved.gate_pre[i],   *saved.up_pre[i],   *saved.hidden[i],
          saved.gate->shard(s), saved.up->shard(s), saved.down->shard(s),
          a.d_gate.shard(s),    a.d_up.shard(s),    a.d_down.shard(s)};
}

// Local expert `le`'s SwiGLU backward on n packed rows, the forward's intermediates from row
// `at` of t's: x [n, H] its inputs, g [n, H] its output's gradient (already scaled by the
// routing weights). Overwrites the expert's slices of the stacked weight gradients (stored
// out-in as the weights are: gg, gu [E_local, F_local, H], gd [E_local, H, F_local]) and
// dx [n, H]; da, du [n, F_local] are scratch, and so is g once read (dx's second term goes there).
void expert_backward_rows(MatmulPrecision prec, const ExpertTensors& t, std::int64_t le,
                          std::int64_t at, ConstMatrixMap x, MatrixMap g, MatrixMap da,
                          MatrixMap du, MatrixMap dx) {
  const std::int64_t n = x.rows(), h = x.cols(), fl = da.cols(), wgt = h * fl;
  const ConstMatrixMap gate_pre(t.gate_pre.values().data() + at * fl, n, fl);
  const ConstMatrixMap up_pre(t.up_pre.values().data() + at * fl, n, fl);
  const ConstMatrixMap act(t.act.values().data() + at * fl, n, fl);
  const runtime::Tensor &wg = t.wg, &wu = t.wu, &wd = t.wd;
  MatrixMap dwg(t.gg.values().data() + le * wgt, fl, h);
  MatrixMap dwu(t.gu.values().data() + le * wgt, fl, h);
  MatrixMap dwd(t.gd.values().data() + le * wgt, h, fl);
  const ConstMatrixMap gc(g.data(), g.rows(), h);
  // d act = g w_down^T: the stored [H, F] matrix read in-out as the transpose it is;
  // d w_down (out-in) = g^T act.
  device_gemm(gc, as_weight(wd, le * wgt, h, fl), da, prec);
  device_gemm_transposed_a(gc, act, dwd, 0.0f, prec);
  gated_backward(Activation::kSilu, gate_pre, up_pre, ConstMatrixMap(da.data(), da.rows(), fl), da,
                 du);
  const ConstMatrixMap dac(da.data(), da.rows(), fl), duc(du.data(), du.rows(), fl);
  device_gemm_transposed_a(dac, x, dwg, 0.0f, prec);
  device_gemm_transposed_a(duc, x, dwu, 0.0f, prec);
  device_gemm(dac, as_weight(wg, le * wgt, fl, h), dx, prec);
  device_gemm(duc, as_weight(wu, le * wgt, fl, h), g, prec);  // g is no longer needed
  dx += g;
}

// Local expert `le`'s slices of the stacked weight gradients set to zero: an expert without
// tokens has no gradient, but the buffers hold the last step's.
void zero_expert_gradients(const ExpertTensors& t, std::int64_t le, std::int64_t h,
                           std::int64_t fl) {
  for (runtime::Tensor* g : {&t.gg, &t.gu, &t.gd})
    std::fill_n(g->values().begin() + le * h * fl, h * fl, 0.0f);
}

// The experts' part when the tokens were gathered to the experts (or replicated there): per
// device, each local expert on its assignments' rows: dw = dy . out (the routing weight's
// gradient), then the SwiGLU backward on w dy, its input gradient added back into the rows.
runtime::Frontier emit_experts_backward_gathered(const ExpertsBackward& a) {
  ProgramBuilder& pb = a.pb;
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const MoeSaved& saved = a.saved;
  runtime::ShardedTensor& xc = *saved.x;
  const MoeConfig& c = a.layer.config;
  const std::int64_t h = a.layer.hidden, e = c.num_experts, k = c.top_k,
                     le_count = a.layer.local_experts, fl = a.layer.local_ffn, cols = a.cols;
  const std::int64_t rows = xc.layout().elements_per_device() / h;
  const double expert_flops = 2.0 * 2.0 * 3.0 * static_cast<double>(h * fl) *
                              static_cast<double>(rows * k) / static_cast<double>(e) *
                              static_cast<double>(le_count);
  return pb.per_device(a.name + ".experts_bwd", {&a.after}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    pb.add_flops(s, expert_flops);
    RoutingTables& r = *saved.tables[i];
    runtime::Tensor& xs = xc.shard(s);
    runtime::Tensor& dys = a.dy.shard(s);
    runtime::Tensor& out = *saved.expert_out[i];
    const ExpertTensors t = expert_tensors(a, s);
    runtime::Tensor& dws = a.dweights.shard(s);
    runtime::Tensor& dxs = a.dx_partial.shard(s);
    runtime::Tensor& xe = pb.scratch(s, {rows, h});
    runtime::Tensor& ge = pb.scratch(s, {rows, h});
    runtime::Tensor& da = pb.scratch(s, {rows, fl});
    runtime::Tensor& du = pb.scratch(s, {rows, fl});
    runtime::Tensor& dxe = pb.scratch(s, {rows, h});
    return [prec, &r, &xs, &dys, &out, t, &dws, &dxs, &xe, &ge, &da, &du, &dxe, le_count, h, fl, k,
            cols] {
      std::fill(dws.values().begin(), dws.values().end(), 0.0f);
      std::fill(dxs.values().begin(), dxs.values().end(), 0.0f);
      std::int64_t at = 0;  // the expert's first row in the packed buffers
      for (std::int64_t le = 0; le < le_count; ++le) {
        const std::int64_t n = r.expert_count[static_cast<std::size_t>(le)];
        if (n == 0) {
          zero_expert_gradients(t, le, h, fl);
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
          const std::int64_t choice = choice_of(r, row, k, r.first_expert + le);
          dws.values()[static_cast<std::size_t>(row * cols + choice)] = gm.row(j).dot(om.row(j));
          gm.row(j) *= scale[static_cast<std::size_t>(j)];
        }
        MatrixMap dxm(dxe.values().data(), n, h);
        expert_backward_rows(prec, t, le, at, ConstMatrixMap(xm.data(), n, h), gm,
                             MatrixMap(da.values().data(), n, fl),
                             MatrixMap(du.values().data(), n, fl), dxm);
        for (std::int64_t j = 0; j < n; ++j) {
          MatrixMap(dxs.values().data() + rows_of[static_cast<std::size_t>(j)] * h, 1, h) +=
              dxm.row(j);
        }
        at += n;
      }
    };
  });
}

// The tensors the all-to-all backward's three phases share: the forward's buffers at the
// experts and at the tokens, and the gradients of their slots on either side.
struct AllToAllBackward {
  runtime::ShardedTensor& received;  // [P, E, C, H] at the experts
  runtime::ShardedTensor& counts;
  runtime::ShardedTensor& returned;  // the experts' outputs at the tokens
  runtime::ShardedTensor& at_source;
  runtime::ShardedTensor& at_experts;
  std::int64_t slots, held_blocks;
};

// Per device, at the tokens: every kept assignment's slot gets w dy of its row, and its routing
// weight's gradient dy . the expert's output.
runtime::Frontier emit_a2a_backward_unpack(const ExpertsBackward& a, const AllToAllBackward& bufs) {
  const MoeConfig& c = a.layer.config;
  const std::int64_t h = a.layer.hidden, e = c.num_experts, k = c.top_k, cols = a.cols,
                     slots = bufs.slots;
  return a.pb.per_device(a.name + ".unpack_bwd", {&a.after}, [&](std::int64_t s) {
    RoutingTables& r = *a.saved.tables[static_cast<std::size_t>(s)];
    runtime::Tensor& dys = a.dy.shard(s);
    runtime::Tensor& back = bufs.returned.shard(s);
    runtime::Tensor& slot_grads = bufs.at_source.shard(s);
    runtime::Tensor& dws = a.dweights.shard(s);
    return [&r, &dys, &back, &slot_grads, &dws, e, k, slots, h, cols] {
      std::fill(dws.values().begin(), dws.values().end(), 0.0f);
      for (std::int64_t ex = 0; ex < e; ++ex) {
        for (std::int64_t j = 0; j < r.expert_count[static_cast<std::size_t>(ex)]; ++j) {
          const std::int64_t row =
              r.expert_rows[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          const float w = r.expert_scale[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          const auto dy_row = ConstMatrixMap(dys.values().data(), dys.size() / h, h).row(row);
          const std::int64_t slot = (ex * slots + j) * h;
          dws.values()[static_cast<std::size_t>(row * cols + choice_of(r, row, k, ex))] =
              dy_row.dot(ConstMatrixMap(back.values().data() + slot, 1, h).row(0));
          MatrixMap(slot_grads.values().data() + slot, 1, h) = w * dy_row;
        }
      }
    };
  });
}

// Per device, at the experts: each expert's SwiGLU backward on every slot it received, the
// input gradients written back into those slots.
runtime::Frontier emit_a2a_backward_experts(const ExpertsBackward& a, const AllToAllBackward& bufs,
                                            const runtime::Frontier& there) {
  ProgramBuilder& pb = a.pb;
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const MoeConfig& c = a.layer.config;
  const std::int64_t h = a.layer.hidden, e = c.num_experts, k = c.top_k,
                     le_count = a.layer.local_experts, fl = a.layer.local_ffn;
  const std::int64_t slots = bufs.slots, held_blocks = bufs.held_blocks;
  // Expected FLOPs with balanced routing, as the forward counts them: each expert sees the
  // rows x k / E assignments of every block it holds, rows a block's tokens.
  const std::int64_t rows = a.saved.x->layout().elements_per_device() / h;
  const double expert_flops = 2.0 * 2.0 * 3.0 * static_cast<double>(h * fl) *
                              static_cast<double>(rows * k) / static_cast<double>(e) *
                              static_cast<double>(le_count * held_blocks);
  return pb.per_device(a.name + ".experts_bwd", {&there}, [&](std::int64_t s) {
    pb.add_flops(s, expert_flops);
    runtime::Tensor& in = bufs.received.shard(s);
    runtime::Tensor& n = bufs.counts.shard(s);
    runtime::Tensor& slot_grads = bufs.at_experts.shard(s);
    const ExpertTensors t = expert_tensors(a, s);
    const std::int64_t most = held_blocks * slots;  // an expert's slots from every block
    runtime::Tensor& xe = pb.scratch(s, {most, h});
    runtime::Tensor& ge = pb.scratch(s, {most, h});
    runtime::Tensor& da = pb.scratch(s, {most, fl});
    runtime::Tensor& du = pb.scratch(s, {most, fl});
    runtime::Tensor& dxe = pb.scratch(s, {most, h});
    return [prec, &in, &n, &slot_grads, t, &xe, &ge, &da, &du, &dxe, held_blocks, le_count, slots,
            h, fl] {
      // Where block b's slots for local expert le start, and how many of them it filled.
      const auto slot_at = [&](std::int64_t b, std::int64_t le) {
        return ((b * le_count + le) * slots) * h;
      };
      const auto filled = [&](std::int64_t b, std::int64_t le) {
        return static_cast<std::int64_t>(n.values()[static_cast<std::size_t>(b * le_count + le)]);
      };
      std::int64_t at = 0;  // the expert's first row in the saved buffers
      for (std::int64_t le = 0; le < le_count; ++le) {
        std::int64_t total = 0;
        for (std::int64_t b = 0; b < held_blocks; ++b) {
          const std::int64_t count = filled(b, le);
          std::copy_n(in.values().data() + slot_at(b, le), count * h,
                      xe.values().data() + total * h);
          std::copy_n(slot_grads.values().data() + slot_at(b, le), count * h,
                      ge.values().data() + total * h);
          total += count;
        }
        if (total == 0) {
          zero_expert_gradients(t, le, h, fl);
          continue;
        }
        MatrixMap dxm(dxe.values().data(), total, h);
        expert_backward_rows(prec, t, le, at, ConstMatrixMap(xe.values().data(), total, h),
                             MatrixMap(ge.values().data(), total, h),
                             MatrixMap(da.values().data(), total, fl),
                             MatrixMap(du.values().data(), total, fl), dxm);
        std::int64_t from = 0;
        for (std::int64_t b = 0; b < held_blocks; ++b) {
          const std::int64_t count = filled(b, le);
          std::copy_n(dxe.values().data() + from * h, count * h,
                      slot_grads.values().data() + slot_at(b, le));
          from += count;
        }
        at += total;
      }
    };
  });
}

// Per device, back at the tokens: its assignments' slots added into their rows of dx_partial.
runtime::Frontier emit_a2a_backward_pack(const ExpertsBackward& a, const AllToAllBackward& bufs,
                                         const runtime::Frontier& home) {
  const std::int64_t h = a.layer.hidden, e = a.layer.config.num_experts, slots = bufs.slots;
  return a.pb.per_device(a.name + ".pack_bwd", {&home}, [&](std::int64_t s) {
    RoutingTables& r = *a.saved.tables[static_cast<std::size_t>(s)];
    runtime::Tensor& slot_grads = bufs.at_source.shard(s);
    runtime::Tensor& dxs = a.dx_partial.shard(s);
    return [&r, &slot_grads, &dxs, e, slots, h] {
      std::fill(dxs.values().begin(), dxs.values().end(), 0.0f);
      for (std::int64_t ex = 0; ex < e; ++ex) {
        for (std::int64_t j = 0; j < r.expert_count[static_cast<std::size_t>(ex)]; ++j) {
          const std::int64_t row =
              r.expert_rows[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          MatrixMap(dxs.values().data() + row * h, 1, h) +=
              ConstMatrixMap(slot_grads.values().data() + (ex * slots + j) * h, 1, h);
        }
      }
    };
  });
}

// The experts' part when the tokens travelled to the experts by all-to-all (GShard's dispatch,
// MoeSaved::dispatched): the forward's steps transposed. At each token's device, every kept
// assignment's slot gets w dy of its row and its routing weight's gradient dy . the expert's
// output; the slots travel to the experts as the dispatch did; each expert runs its SwiGLU
// backward on every slot it received and writes the input gradients back into them; they
// travel home as the combine did, and each device adds its assignments' slots into their rows.
// One buffer per side carries both directions.
runtime::Frontier emit_experts_backward_all_to_all(const ExpertsBackward& a) {
  ProgramBuilder& pb = a.pb;
  const sharding::Mesh& m = pb.mesh().mesh();
  const MoeSaved& saved = a.saved;
  runtime::ShardedTensor& received = *saved.dispatched;
  runtime::ShardedTensor& returned = *saved.combined;
  const auto placed = [&](const runtime::ShardedTensor& t) {
    return sharding::to_placements(t.spec(), m, t.shape().size());
  };
  runtime::ShardedTensor& at_source =
      pb.tensor(a.name + ".dcombined", TensorRole::kActivation, returned.shape(), returned.spec());
  runtime::ShardedTensor& at_experts = pb.tensor(a.name + ".ddispatched", TensorRole::kActivation,
                                                 received.shape(), received.spec());
  const AllToAllBackward bufs{.received = received,
                              .counts = *saved.dispatched_counts,
                              .returned = returned,
                              .at_source = at_source,
                              .at_experts = at_experts,
                              .slots = received.shape()[2],
                              .held_blocks = received.layout().shard_shape()[0]};

  const runtime::Frontier unpacked = emit_a2a_backward_unpack(a, bufs);
  const runtime::Frontier there = pb.reshard(at_source, placed(at_source), at_experts,
                                             placed(at_experts), unpacked, a.name + ".dcombine");
  const runtime::Frontier experts_done = emit_a2a_backward_experts(a, bufs, there);
  const runtime::Frontier home = pb.reshard(at_experts, placed(at_experts), at_source,
                                            placed(at_source), experts_done, a.name + ".ddispatch");
  return emit_a2a_backward_pack(a, bufs, home);
}

// The shared expert's backward on the rows each device ran it on in the forward (MoeSaved's
// shared_ fields): its gate s = sigmoid(x g) again, dy . S(x) into the last column of
// `dweights` (the gate's gradient, a partial sum completed with the routing weights'
// gradients), then the SwiGLU backward of s dy: the weights' gradients over the rows (zero on
// a device without rows: the buffers hold the last step's) and the input's gradient added into
// dx_partial's rows. Starts after `after`; returns the frontier after which all are written.
runtime::Frontier emit_shared_expert_backward(
    ProgramBuilder& pb, const MoeSaved& saved, runtime::ShardedTensor& dyc,
    runtime::ShardedTensor& d_gate, runtime::ShardedTensor& d_up, runtime::ShardedTensor& d_down,
    runtime::ShardedTensor& dweights, runtime::ShardedTensor& dx_partial,
    const runtime::Frontier& after, const std::string& name) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  runtime::ShardedTensor& xc = *saved.x;
  const std::int64_t h = xc.shape().back(), cols = dweights.shape().back();
  const std::int64_t fl = saved.shared_up->layout().shard_shape()[0];  // stored out-in, [Fs, H]
  return pb.per_device(
      name + ".shared_bwd", {&after}, [&](std::int64_t s) -> std::function<void()> {
        const auto i = static_cast<std::size_t>(s);
        const std::int64_t first = saved.shared_first[i], n = saved.shared_count[i];
        runtime::Tensor& gg = d_gate.shard(s);
        runtime::Tensor& gu = d_up.shard(s);
        runtime::Tensor& gd = d_down.shard(s);
        if (n == 0) {
          return [&gg, &gu, &gd] {
            for (runtime::Tensor* t : {&gg, &gu, &gd})
              std::fill(t->values().begin(), t->values().end(), 0.0f);
          };
        }
        pb.add_flops(s, 2.0 * 2.0 * 3.0 * static_cast<double>(n * h * fl));
        runtime::Tensor& xs = xc.shard(s);
        runtime::Tensor& dys = dyc.shard(s);
        runtime::Tensor& ws = saved.shared_expert_gate->shard(s);
        runtime::Tensor& wg = saved.shared_gate->shard(s);  // [Fs_local, H]
        runtime::Tensor& wu = saved.shared_up->shard(s);    // [Fs_local, H]
        runtime::Tensor& wd = saved.shared_down->shard(s);  // [H, Fs_local]
        runtime::Tensor& gate_pre = *saved.shared_gate_pre[i];
        runtime::Tensor& up_pre = *saved.shared_up_pre[i];
        runtime::Tensor& act = *saved.shared_hidden[i];
        runtime::Tensor& out = *saved.shared_out[i];
        runtime::Tensor& dws = dweights.shard(s);
        runtime::Tensor& dxs = dx_partial.shard(s);
        runtime::Tensor& logit = pb.scratch(s, {n, 1});
        runtime::Tensor& scaled = pb.scratch(s, {n, h});
        runtime::Tensor& da = pb.scratch(s, {n, fl});
        runtime::Tensor& du = pb.scratch(s, {n, fl});
        runtime::Tensor& dx_gate = pb.scratch(s, {n, h});
        runtime::Tensor& dx_up = pb.scratch(s, {n, h});
        return [prec, &gg, &gu, &gd, &xs, &dys, &ws, &wg, &wu, &wd, &gate_pre, &up_pre, &act, &out,
                &dws, &dxs, &logit, &scaled, &da, &du, &dx_gate, &dx_up, first, n, h, cols] {
          const ConstMatrixMap xm(xs.values().data() + first * h, n, h);
          const ConstMatrixMap dym(dys.values().data() + first * h, n, h);
          const ConstMatrixMap om = as_matrix(std::as_const(out));
          MatrixMap lg = as_matrix(logit);
          gemm(xm, as_matrix(std::as_const(ws)), lg);  // as the forward computed it
          MatrixMap sm = as_matrix(scaled);
          for (std::int64_t j = 0; j < n; ++j) {
            dws.values()[static_cast<std::size_t>((first + j) * cols + cols - 1)] =
                dym.row(j).dot(om.row(j));
            sm.row(j) = (1.0f / (1.0f + std::exp(-lg(j, 0)))) * dym.row(j);
          }
          const ConstMatrixMap smc(sm.data(), n, h);
          device_gemm(smc, as_weight(wd), as_matrix(da), prec);
          device_gemm_transposed_a(smc, as_matrix(std::as_const(act)), as_matrix(gd), 0.0f, prec);
          gated_backward(Activation::kSilu, as_matrix(std::as_const(gate_pre)),
                         as_matrix(std::as_const(up_pre)), as_matrix(std::as_const(da)),
                         as_matrix(da), as_matrix(du));
          device_gemm_transposed_a(as_matrix(std::as_const(da)), xm, as_matrix(gg), 0.0f, prec);
          device_gemm_transposed_a(as_matrix(std::as_const(du)), xm, as_matrix(gu), 0.0f, prec);
          device_gemm(as_matrix(std::as_const(da)), as_weight(wg), as_matrix(dx_gate), prec);
          device_gemm(as_matrix(std::as_const(du)), as_weight(wu), as_matrix(dx_up), prec);
          MatrixMap(dxs.values().data() + first * h, n, h) +=
              as_matrix(std::as_const(dx_gate)) + as_matrix(std::as_const(dx_up));
        };
      });
}

// Refuses a backward whose forward kept nothing for it, or whose dy, dx or gradients are not
// laid out as what they differentiate.
void check_moe_backward_inputs(const MoeLayer& layer, const MoeSaved& saved,
                               runtime::ShardedTensor& dy, runtime::ShardedTensor& dx,
                               const MoeGradients& grads, const std::string& name) {
  NUMESH_CHECK(saved.x != nullptr && !saved.tables.empty() && !saved.gate_pre.empty(), ValueError,
               "{}: the forward kept nothing for the backward (emit_moe without `saved`)", name);
  check_backward_io(dy, dx, saved.x->shape(), saved.y_placed, saved.x_placed, name);
  check_laid_out_like(*grads.router, *layer.router, "the router gradient", name);
  check_laid_out_like(*grads.gate, *layer.gate, "the gate gradient", name);
  check_laid_out_like(*grads.up, *layer.up, "the up gradient", name);
  check_laid_out_like(*grads.down, *layer.down, "the down gradient", name);
  if (layer.shared_expert.has_value()) {
    NUMESH_CHECK(
        grads.shared_gate && grads.shared_up && grads.shared_down && grads.shared_expert_gate,
        ValueError, "{}: the layer has a shared expert but no gradients are given for it", name);
    NUMESH_CHECK(saved.shared_gate != nullptr && !saved.shared_out.empty(), ValueError,
                 "{}: the forward kept nothing of the shared expert for the backward", name);
    check_laid_out_like(*grads.shared_gate, *layer.shared_expert->gate,
                        "the shared expert's gate gradient", name);
    check_laid_out_like(*grads.shared_up, *layer.shared_expert->up,
                        "the shared expert's up gradient", name);
    check_laid_out_like(*grads.shared_down, *layer.shared_expert->down,
                        "the shared expert's down gradient", name);
    check_laid_out_like(*grads.shared_expert_gate, *layer.shared_expert_gate,
                        "the shared_expert_gate gradient", name);
  }
}

// What the backward's phases after the checks share: the sizes, the placements, and the
// tensors each device writes its gradients into.
struct MoeBackward {
  ProgramBuilder& pb;
  const MoeLayer& layer;
  const MoeSaved& saved;
  const MoeGradients& grads;
  const std::string& name;
  const sharding::Mesh& m;
  std::size_t rank;
  bool shared;
  runtime::ShardedTensor& xc;
  std::int64_t h, e, k, rows, cols;
  std::vector<sharding::Placement> x_placed, full_placed;
  bool reduced;  // some axis splits the weights
  runtime::ShardedTensor& dw_partial;
  runtime::ShardedTensor& dw_full;
  runtime::ShardedTensor& d_gate;
  runtime::ShardedTensor& d_up;
  runtime::ShardedTensor& d_down;
  runtime::ShardedTensor& d_router;
  std::vector<sharding::Placement> dx_target;
  bool direct;  // dx itself takes the partial sums
  runtime::ShardedTensor& dx_partial;
};

// Each weight's gradient as this device computes it (the gradient itself when nothing is left
// to reduce).
runtime::ShardedTensor& moe_backward_produced(ProgramBuilder& pb,
                                              const std::vector<sharding::Placement>& x_placed,
                                              std::size_t rank, const runtime::ShardedTensor& used,
                                              runtime::ShardedTensor& out, const std::string& name,
                                              const std::string& wname) {
  return weight_gradient_target(pb, used, x_placed, rank, out,
                                name + "." + wname + ".grad_partial");
}

// The shared state: the sizes and placements, and the routing weights', the experts' and dx's
// tensors as each device computes them.
MoeBackward moe_backward_context(ProgramBuilder& pb, const MoeLayer& layer, const MoeSaved& saved,
                                 const MoeGradients& grads, runtime::ShardedTensor& dx,
                                 const std::string& name) {
  const sharding::Mesh& m = pb.mesh().mesh();
  const std::size_t rank = dx.shape().size();
  const bool shared = layer.shared_expert.has_value();
  runtime::ShardedTensor& xc = *saved.x;
  const MoeConfig& c = layer.config;
  const std::int64_t h = layer.hidden;
  const std::vector<sharding::Placement> x_placed = sharding::to_placements(xc.spec(), m, rank);
  const std::vector<sharding::Placement> full_placed = gradient_placements(saved.partial_placed);
  const bool reduced = saved.partial_placed != full_placed;  // some axis splits the weights

  // Tensors shaped as the tokens with k (the routing weights) in place of H, and with a shared
  // expert one more column (dy . its output, its gate's gradient): partial over the weights'
  // axes as each device computes them, then summed.
  const std::int64_t cols = c.top_k + (shared ? 1 : 0);
  std::vector<std::int64_t> table_shape = xc.shape();
  table_shape.back() = cols;
  runtime::ShardedTensor& dw_partial =
      pb.tensor(name + ".dweights_partial", TensorRole::kActivation, table_shape, xc.spec());
  runtime::ShardedTensor& dw_full =
      reduced ? pb.tensor(name + ".dweights", TensorRole::kActivation, table_shape, xc.spec())
              : dw_partial;
  const auto produced = [&](const runtime::ShardedTensor& used, runtime::ShardedTensor& out,
                            const std::string& wname) -> runtime::ShardedTensor& {
    return moe_backward_produced(pb, x_placed, rank, used, out, name, wname);
  };
  runtime::ShardedTensor& d_gate = produced(*saved.gate, *grads.gate, "w_gate");
  runtime::ShardedTensor& d_up = produced(*saved.up, *grads.up, "w_up");
  runtime::ShardedTensor& d_down = produced(*saved.down, *grads.down, "w_down");
  runtime::ShardedTensor& d_router = produced(*saved.router, *grads.router, "router");
  // dx as computed: the experts' terms and the router's (added by one device of each partial
  // sum), a partial sum over the weights' axes.
  std::vector<sharding::Placement> dx_target = gradient_placements(saved.x_placed);
  const bool direct = saved.partial_placed == dx_target && xc.spec() == dx.spec();
  runtime::ShardedTensor& dx_partial =
      direct ? dx : pb.tensor(name + ".dx_partial", TensorRole::kActivation, xc.shape(), xc.spec());
  return MoeBackward{.pb = pb,
                     .layer = layer,
                     .saved = saved,
                     .grads = grads,
                     .name = name,
                     .m = m,
                     .rank = rank,
                     .shared = shared,
                     .xc = xc,
                     .h = h,
                     .e = c.num_experts,
                     .k = c.top_k,
                     .rows = xc.layout().elements_per_device() / h,
                     .cols = cols,
                     .x_placed = x_placed,
                     .full_placed = full_placed,
                     .reduced = reduced,
                     .dw_partial = dw_partial,
                     .dw_full = dw_full,
                     .d_gate = d_gate,
                     .d_up = d_up,
                     .d_down = d_down,
                     .d_router = d_router,
                     .dx_target = std::move(dx_target),
                     .direct = direct,
                     .dx_partial = dx_partial};
}

// The shared expert's weights' gradients as each device computes them: Partial over the axes
// sharing out its rows as well as where a weight's gradient is.
std::vector<sharding::Placement> shared_expert_gradient_placements(
    const MoeBackward& st, const runtime::ShardedTensor& used) {
  std::vector<sharding::Placement> placed = weight_gradient_placements(
      sharding::to_placements(used.spec(), st.m, used.shape().size()), st.x_placed, st.rank);
  for (const std::size_t a : st.saved.shared_sharing) placed[a] = sharding::Placement::partial();
  return placed;
}

// The shared expert's gradients as each device computes them (all null without one), and the
// frontier after which its backward is done.
struct SharedExpertGradients {
  runtime::ShardedTensor* d_gate = nullptr;
  runtime::ShardedTensor* d_up = nullptr;
  runtime::ShardedTensor* d_down = nullptr;
  runtime::ShardedTensor* d_scale = nullptr;  // its gate's
  runtime::Frontier done;
};

// The shared expert on the rows its forward ran on (after the experts: both write dw and dx).
// Its weights' gradients are Partial over the axes sharing out its rows as well.
SharedExpertGradients emit_moe_shared_expert_backward(const MoeBackward& st,
                                                      runtime::ShardedTensor& dyc,
                                                      const runtime::Frontier& experts_done) {
  const MoeSaved& saved = st.saved;
  const MoeGradients& grads = st.grads;
  const auto shared_target = [&](const runtime::ShardedTensor* used,
                                 const std::shared_ptr<runtime::ShardedTensor>& out,
                                 const std::string& wname) -> runtime::ShardedTensor* {
    if (!st.shared) return nullptr;
    return &gradient_target(st.pb, *used, shared_expert_gradient_placements(st, *used), *out,
                            st.name + "." + wname + ".grad_partial");
  };
  SharedExpertGradients g;
  g.d_gate = shared_target(saved.shared_gate, grads.shared_gate, "shared_w_gate");
  g.d_up = shared_target(saved.shared_up, grads.shared_up, "shared_w_up");
  g.d_down = shared_target(saved.shared_down, grads.shared_down, "shared_w_down");
  g.d_scale = st.shared
                  ? &moe_backward_produced(st.pb, st.x_placed, st.rank, *saved.shared_expert_gate,
                                           *grads.shared_expert_gate, st.name, "shared_gate")
                  : nullptr;
  g.done = st.shared
               ? emit_shared_expert_backward(st.pb, saved, dyc, *g.d_gate, *g.d_up, *g.d_down,
                                             st.dw_partial, st.dx_partial, experts_done, st.name)
               : experts_done;
  return g;
}

// Per device: the router's backward on its rows (every device of a partial sum computes the
// same values; the first adds the input gradient into dx).
runtime::Frontier emit_moe_router_backward(const MoeBackward& st,
                                           const SharedExpertGradients& shared_grads,
                                           const runtime::Frontier& dw_ready,
                                           const RouterAuxGradient* aux) {
  ProgramBuilder& pb = st.pb;
  const runtime::DeviceMesh& mesh = pb.mesh();
  const MoeSaved& saved = st.saved;
  const MoeConfig& c = st.layer.config;
  const bool shared = st.shared;
  const std::int64_t rows = st.rows, h = st.h, e = st.e, k = st.k, cols = st.cols;
  const runtime::Frontier* aux_ready = aux != nullptr ? &aux->ready : nullptr;
  return pb.per_device(
      st.name + ".router_bwd", {&dw_ready, &shared_grads.done, aux_ready}, [&](std::int64_t s) {
        const auto i = static_cast<std::size_t>(s);
        pb.add_flops(s, 2.0 * 2.0 * static_cast<double>(rows * h * e));
        const bool adds_dx = detail::first_of_partial_sum(mesh, saved.partial_placed, s);
        RoutingTables& r = *saved.tables[i];
        runtime::Tensor& p = *saved.probs[i];
        runtime::Tensor& dws = st.dw_full.shard(s);
        runtime::Tensor& xs = st.xc.shard(s);
        runtime::Tensor& wr = saved.router->shard(s);
        runtime::Tensor& gr = st.d_router.shard(s);
        runtime::Tensor& dxs = st.dx_partial.shard(s);
        runtime::Tensor& dl = pb.scratch(s, {rows, e});
        // The load-balancing loss's dp: every row's the same, scale x the step's choice counts.
        runtime::Tensor* stats = aux != nullptr ? &aux->stats->shard(s) : nullptr;
        runtime::Tensor* dprobs = aux != nullptr ? &pb.scratch(s, {e}) : nullptr;
        const double aux_scale = aux != nullptr ? aux->scale : 0.0;
        // The shared expert's gate: its logits again for every row, their gradient, its own.
        runtime::Tensor* ws = shared ? &saved.shared_expert_gate->shard(s) : nullptr;
        runtime::Tensor* gws = shared ? &shared_grads.d_scale->shard(s) : nullptr;
        runtime::Tensor* dlogit = shared ? &pb.scratch(s, {rows, 1}) : nullptr;
        return [&r, &p, &dws, &xs, &wr, &gr, &dxs, &dl, stats, dprobs, ws, gws, dlogit, aux_scale,
                c, rows, h, e, k, cols, adds_dx] {
          std::span<const float> extra;
          if (stats != nullptr) {
            const std::span<const float> counts =
                stats->values().first(static_cast<std::size_t>(e));
            for (std::size_t ex = 0; ex < counts.size(); ++ex) {
              dprobs->values()[ex] =
                  static_cast<float>(aux_scale * static_cast<double>(counts[ex]));
            }
            extra = dprobs->values();
          }
          routing_weights_backward(
              r, c, as_matrix(std::as_const(p)),
              StridedConstMatrixMap(dws.values().data(), rows, k, Eigen::OuterStride<>(cols)),
              extra, as_matrix(dl));
          const ConstMatrixMap xm(xs.values().data(), rows, h);
          const ConstMatrixMap dlm(dl.values().data(), rows, e);
          device_gemm_transposed_a(xm, dlm, as_matrix(gr));
          MatrixMap dxm(dxs.values().data(), rows, h);
          if (adds_dx)
            gemm(dlm, as_matrix(std::as_const(wr)), dxm, 1.0f, 1.0f, /*transpose_b=*/true);
          if (ws == nullptr) return;
          // d logit = s (1 - s) (dy . shared output), s = sigmoid(logit) as the forward computed
          // it.
          MatrixMap dlg = as_matrix(*dlogit);
          gemm(xm, as_matrix(std::as_const(*ws)), dlg);
          for (std::int64_t t = 0; t < rows; ++t) {
            const float sg = 1.0f / (1.0f + std::exp(-dlg(t, 0)));
            dlg(t, 0) = sg * (1.0f - sg) * dws.values()[static_cast<std::size_t>(t * cols + k)];
          }
          device_gemm_transposed_a(xm, as_matrix(std::as_const(*dlogit)), as_matrix(*gws));
          if (adds_dx)
            gemm(as_matrix(std::as_const(*dlogit)), as_matrix(std::as_const(*ws)), dxm, 1.0f, 1.0f,
                 /*transpose_b=*/true);
        };
      });
}

// The weights' gradients over the axes splitting the tokens. Returns the frontiers after which
// each is complete.
std::vector<runtime::Frontier> reduce_moe_weight_gradients(const MoeBackward& st,
                                                           const SharedExpertGradients& sg,
                                                           const runtime::Frontier& experts_done,
                                                           const runtime::Frontier& router_done) {
  ProgramBuilder& pb = st.pb;
  const MoeSaved& saved = st.saved;
  const MoeGradients& grads = st.grads;
  const std::string& name = st.name;
  std::vector<runtime::Frontier> parts;
  auto reduce = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                    runtime::ShardedTensor& grad, const runtime::Frontier& ready,
                    const std::string& wname) {
    parts.push_back(reduce_weight_gradient(pb, partial, used, st.x_placed, st.rank, grad, ready,
                                           name + "." + wname + ".grad"));
  };
  reduce(st.d_gate, *saved.gate, *grads.gate, experts_done, "w_gate");
  reduce(st.d_up, *saved.up, *grads.up, experts_done, "w_up");
  reduce(st.d_down, *saved.down, *grads.down, experts_done, "w_down");
  reduce(st.d_router, *saved.router, *grads.router, router_done, "router");
  if (st.shared) {
    reduce(*sg.d_scale, *saved.shared_expert_gate, *grads.shared_expert_gate, router_done,
           "shared_gate");
    // The shared expert's weights: each device summed over its share of the rows, so Partial
    // over the axes sharing the rows out as well as over those splitting the tokens.
    auto reduce_shared = [&](runtime::ShardedTensor& partial, runtime::ShardedTensor& used,
                             runtime::ShardedTensor& grad, const std::string& wname) {
      parts.push_back(reduce_gradient_into(pb, partial, shared_expert_gradient_placements(st, used),
                                           grad, sg.done, name + "." + wname + ".grad"));
    };
    reduce_shared(*sg.d_gate, *saved.shared_gate, *grads.shared_gate, "shared_w_gate");
    reduce_shared(*sg.d_up, *saved.shared_up, *grads.shared_up, "shared_w_up");
    reduce_shared(*sg.d_down, *saved.shared_down, *grads.shared_down, "shared_w_down");
  }
  return parts;
}

}  // namespace

runtime::Frontier emit_moe_backward(ProgramBuilder& pb, const MoeLayer& layer,
                                    const MoeSaved& saved, runtime::ShardedTensor& dy,
                                    const runtime::Frontier& after, runtime::ShardedTensor& dx,
                                    const MoeGradients& grads, const std::string& name,
                                    const RouterAuxGradient* aux, runtime::Frontier* dx_ready) {
  check_moe_backward_inputs(layer, saved, dy, dx, grads, name);

  // dy as the partial output was laid out: gathered over the weights' axes (the transpose of
  // the forward's reduction), the same tensor when no axis splits the weights.
  runtime::Frontier dy_ready = after;
  runtime::ShardedTensor& dyc = canonical_gradient(pb, dy, gradient_placements(saved.y_placed),
                                                   saved.partial_placed, name + ".dy", dy_ready);
  const MoeBackward st = moe_backward_context(pb, layer, saved, grads, dx, name);

  // The experts' part: the routing weights' gradients into dw_partial (zeroed first), the
  // experts' weight gradients, and their input gradients into dx_partial (zeroed first).
  const ExpertsBackward part{pb,        layer,   saved,     dyc,      st.dw_partial, st.dx_partial,
                             st.d_gate, st.d_up, st.d_down, dy_ready, name,          st.cols};
  const runtime::Frontier experts_done = saved.dispatched != nullptr
                                             ? emit_experts_backward_all_to_all(part)
                                             : emit_experts_backward_gathered(part);
  const SharedExpertGradients sg = emit_moe_shared_expert_backward(st, dyc, experts_done);
  // The routing weights' gradients summed over the weights' axes.
  const runtime::Frontier dw_ready =
      st.reduced ? pb.reshard(st.dw_partial, saved.partial_placed, st.dw_full, st.full_placed,
                              sg.done, name + ".dweights")
                 : sg.done;
  const runtime::Frontier router_done = emit_moe_router_backward(st, sg, dw_ready, aux);

  // The weights' gradients over the axes splitting the tokens; dx over the weights' axes.
  std::vector<runtime::Frontier> parts =
      reduce_moe_weight_gradients(st, sg, experts_done, router_done);
  if (!st.direct)
    parts.push_back(pb.reshard(st.dx_partial, saved.partial_placed, dx, st.dx_target, router_done,
                               name + ".dx"));
  else
    parts.push_back(router_done);
  if (dx_ready != nullptr) *dx_ready = parts.back();
  std::vector<const runtime::Frontier*> all;
  for (const runtime::Frontier& f : parts) all.push_back(&f);
  return pb.join(name + ".done", all);
}

}  // namespace numesh::ops
