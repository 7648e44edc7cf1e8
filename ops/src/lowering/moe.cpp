#include "numesh/ops/lowering/moe.hpp"

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
#include "numesh/ops/kernels/routing.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::ops {

namespace {

// The router's (and the shared expert's gate's) small fp32 product on the calling thread; with
// kRowInvariant one row at a time, so that a token's routing does not depend on its batch.
void router_gemm(ConstMatrixMap x, ConstMatrixMap w, MatrixMap out, MatmulPrecision prec) {
  if (prec != MatmulPrecision::kRowInvariant) {
    gemm(x, w, out);
    return;
  }
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    gemm(ConstMatrixMap(x.data() + r * x.cols(), 1, x.cols()), w,
         MatrixMap(out.data() + r * out.cols(), 1, out.cols()));
  }
}

// The mesh axes that split the experts' F (gate stored out-in, [E, F, H]).
std::vector<std::string> ffn_axes(const MoeLayer& layer) {
  return detail::axes_of(layer.gate->spec(), 1);
}

using detail::shape_text;
using sharding::AxisRule;
using sharding::PartitionSpec;

}  // namespace

MoeStats MoeRouting::total() const {
  // Each group's statistics as E + 2 counts (tokens per expert, dropped, capacity), from the
  // rank that owns the group; zero where another rank does.
  const std::size_t e = per_slot.empty() ? 0 : per_slot.front().tokens_per_expert.size();
  const std::size_t width = e + 2, n = group_leaders.size();
  std::vector<std::int64_t> mine(n * width, 0);
  for (std::size_t g = 0; g < n; ++g) {
    if (group_owners[g] != this_rank) continue;
    const MoeStats& s = per_slot[static_cast<std::size_t>(group_leaders[g])];
    std::copy(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), mine.begin() + g * width);
    mine[g * width + e] = s.dropped;
    mine[g * width + e + 1] = s.capacity;
  }
  std::vector<std::int64_t> all = mine;
  const std::size_t ranks = transport != nullptr ? static_cast<std::size_t>(transport->size()) : 1;
  if (ranks > 1) {
    all.resize(ranks * n * width);
    transport->all_gather(std::as_bytes(std::span<const std::int64_t>(mine)),
                          std::as_writable_bytes(std::span<std::int64_t>(all)));
  }
  MoeStats sum;
  sum.tokens_per_expert.assign(e, 0);
  for (std::size_t g = 0; g < n; ++g) {
    const std::int64_t* counts =
        all.data() + (ranks > 1 ? static_cast<std::size_t>(group_owners[g]) * n * width : 0) +
        g * width;
    for (std::size_t x = 0; x < e; ++x) sum.tokens_per_expert[x] += counts[x];
    sum.dropped += counts[e];
    sum.capacity = counts[e + 1];
  }
  return sum;
}

void MoeRouting::set_groups(const runtime::DeviceMesh& mesh,
                            const std::vector<std::vector<std::int64_t>>& groups) {
  transport = mesh.transport();
  this_rank = mesh.this_rank();
  for (const auto& group : groups) {
    const auto local =
        std::find_if(group.begin(), group.end(), [&](std::int64_t s) { return mesh.is_local(s); });
    group_leaders.push_back(local != group.end() ? *local : -1);
    group_owners.push_back(mesh.rank_of(group.front()));
  }
}

MoeLayer MoeLayer::create(const runtime::DeviceMesh& mesh, const MoeConfig& c, const MoeWeights& w,
                          const MoeAxes& axes) {
  const std::int64_t e = c.num_experts;
  check_moe_config(c);
  NUMESH_CHECK(w.router.shape.size() == 2 && w.router.shape[1] == e && w.router.shape[0] > 0,
               ShapeError, "moe: router is {}, expected [H, {}] for {} experts (H > 0)",
               shape_text(w.router), e, e);
  const std::int64_t h = w.router.shape[0];
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) &&
                   w.up.shape == w.gate.shape &&
                   w.down.shape == (std::vector<std::int64_t>{e, f, h}),
               ShapeError,
               "moe: expert weights gate {}, up {}, down {} do not fit {} experts and hidden {} "
               "(expected [E, H, F], [E, H, F], [E, F, H])",
               shape_text(w.gate), shape_text(w.up), shape_text(w.down), e, h);
  const sharding::Mesh& m = mesh.mesh();
  const AxisRule ep = m.has_axis(axes.expert) ? AxisRule(axes.expert) : AxisRule();
  const AxisRule tp = m.has_axis(axes.tensor) ? AxisRule(axes.tensor) : AxisRule();
  MoeLayer layer;
  layer.config = c;
  layer.hidden = h;
  layer.ffn = f;
  layer.router = detail::laid_out(mesh, w.router, PartitionSpec({AxisRule(), AxisRule()}));
  // Stored out-in (gate and up [E, F, H], down [E, H, F]), as the dense layers store theirs:
  // decode reads each output's weights in one run, and a block format's blocks run along them
  // (so H and each device's F must be whole blocks: laid_out names the matrix otherwise). The
  // router stays fp32 in every format, as llama.cpp keeps it.
  layer.gate =
      detail::laid_out_out_in(mesh, w.gate, PartitionSpec({ep, AxisRule(), tp}), w.stored_as.gate);
  layer.up =
      detail::laid_out_out_in(mesh, w.up, PartitionSpec({ep, AxisRule(), tp}), w.stored_as.up);
  layer.down =
      detail::laid_out_out_in(mesh, w.down, PartitionSpec({ep, tp, AxisRule()}), w.stored_as.down);
  layer.local_experts = layer.gate->layout().shard_shape()[0];
  layer.local_ffn = layer.gate->layout().shard_shape()[1];
  check_shared_expert(w, h);
  if (w.has_shared_expert()) {
    // Fs over the tensor axis only when the experts' F is split there too: the shared output
    // joins the experts' partial sum, which runs over their weights' axes only.
    const std::vector<std::string> f_axes = ffn_axes(layer);
    const bool split = std::find(f_axes.begin(), f_axes.end(), axes.tensor) != f_axes.end();
    // SwiGLU, as the experts are (TransformerConfig::validate refuses another kind with MoE).
    layer.shared_expert = MlpLayer::create(mesh, MlpKind::kSwiGLU, w.shared_expert,
                                           MlpAxes{.batch = {},
                                                   .sequence = {},
                                                   .weights = {},
                                                   .tensor = split ? axes.tensor : std::string()});
    layer.shared_expert_gate =
        detail::laid_out(mesh, w.shared_expert_gate, PartitionSpec({AxisRule(), AxisRule()}));
  }
  return layer;
}

namespace {

// The layer's weights registered with a program.
struct ProgramWeights {
  runtime::ShardedTensor& router;
  runtime::ShardedTensor& gate;
  runtime::ShardedTensor& up;
  runtime::ShardedTensor& down;
};

ProgramWeights use_weights(ProgramBuilder& pb, const MoeLayer& layer, const std::string& name) {
  return {pb.use(name + ".router", TensorRole::kWeight, layer.router),
          pb.use(name + ".w_gate", TensorRole::kWeight, layer.gate),
          pb.use(name + ".w_up", TensorRole::kWeight, layer.up),
          pb.use(name + ".w_down", TensorRole::kWeight, layer.down)};
}

// What both dispatches keep for the backward: the tokens as routed (`routed`; `x` as the
// caller laid them out), the weights as registered, each device's routing, and the placements
// of x, of the partial output and of y.
void keep_routing(MoeSaved& saved, runtime::ShardedTensor& routed, const runtime::ShardedTensor& x,
                  const ProgramWeights& w, const std::vector<RoutingTables*>& tables,
                  const std::vector<runtime::Tensor*>& probs,
                  const std::vector<sharding::Placement>& partial_placed,
                  const runtime::ShardedTensor& y) {
  const sharding::Mesh& m = x.mesh().mesh();
  const std::size_t rank = x.shape().size();
  saved.x = &routed;
  saved.router = &w.router, saved.gate = &w.gate, saved.up = &w.up, saved.down = &w.down;
  saved.tables = tables;
  saved.probs = probs;
  saved.x_placed = sharding::to_placements(x.spec(), m, rank);
  saved.partial_placed = partial_placed;
  saved.y_placed = sharding::to_placements(y.spec(), m, rank);
}

// Qwen2-MoE's shared expert, added into the layer's partial output before its one reduction:
// y_partial (x's rows, pending a sum over the axes Partial in y_placed) += sigmoid(x g) *
// shared_expert(x), the gate g in fp32 as the router. Fs is split over a subset of those axes
// (MoeLayer::create), so each device's product is a partial sum over them; along the other
// partial axes the devices hold the same rows, and each adds its contiguous share of them:
// every row's term is counted once and the work is spread. Returns `after` without a shared
// expert. With `saved`, keeps what the backward needs (MoeSaved's shared_ fields): the gate
// pre-activation gets a buffer of its own instead of turning into the activation in place.
runtime::Frontier emit_shared_expert(ProgramBuilder& pb, const MoeLayer& layer,
                                     runtime::ShardedTensor& x, runtime::ShardedTensor& y_partial,
                                     const std::vector<sharding::Placement>& y_placed,
                                     const runtime::Frontier& after, const std::string& name,
                                     MoeSaved* saved) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  if (!layer.shared_expert) return after;
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const MlpLayer& shared = *layer.shared_expert;
  runtime::ShardedTensor& gate = pb.use(name + ".shared_w_gate", TensorRole::kWeight, shared.gate);
  runtime::ShardedTensor& up = pb.use(name + ".shared_w_up", TensorRole::kWeight, shared.up);
  runtime::ShardedTensor& down = pb.use(name + ".shared_w_down", TensorRole::kWeight, shared.down);
  runtime::ShardedTensor& scale =
      pb.use(name + ".shared_gate", TensorRole::kWeight, layer.shared_expert_gate);
  const std::int64_t h = layer.hidden, rows = x.layout().elements_per_device() / h;
  const std::int64_t fl = up.layout().shard_shape()[0];  // MlpLayer stores up out-in, [Fs, H]
  const std::vector<sharding::Placement> fs_placed = sharding::to_placements(up.spec(), m, 2);
  std::vector<std::size_t> sharing;  // the partial axes Fs is not split over
  for (std::size_t a = 0; a < fs_placed.size(); ++a) {
    NUMESH_CHECK(
        !fs_placed[a].is_shard() || y_placed[a].is_partial(), ValueError,
        "{}: the shared expert is split over {}, which the experts' partial sum does not run over",
        name, m.names()[a]);
    if (y_placed[a].is_partial() && !fs_placed[a].is_shard()) sharing.push_back(a);
  }
  if (saved != nullptr) {
    const auto slots = static_cast<std::size_t>(mesh.size());
    saved->shared_gate = &gate, saved->shared_up = &up, saved->shared_down = &down;
    saved->shared_expert_gate = &scale;
    saved->shared_sharing = sharing;
    saved->shared_first.assign(slots, 0), saved->shared_count.assign(slots, 0);
    for (auto* v : {&saved->shared_gate_pre, &saved->shared_up_pre, &saved->shared_hidden,
                    &saved->shared_out}) {
      v->assign(slots, nullptr);
    }
  }
  return pb.per_device(name + ".shared", {&after}, [&](std::int64_t s) -> std::function<void()> {
    const std::vector<std::int64_t> coords = mesh.coords(s);
    std::int64_t share = 0, shares = 1;
    for (std::size_t a : sharing) {
      share = share * m.sizes()[a] + coords[a];
      shares *= m.sizes()[a];
    }
    const std::int64_t per = (rows + shares - 1) / shares;
    const std::int64_t first = std::min(rows, share * per), n = std::min(rows, first + per) - first;
    if (saved != nullptr) {
      saved->shared_first[static_cast<std::size_t>(s)] = first;
      saved->shared_count[static_cast<std::size_t>(s)] = n;
    }
    if (n == 0) return [] {};
    pb.add_flops(s, 2.0 * static_cast<double>(n * h) * (1.0 + 3.0 * static_cast<double>(fl)));
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& yp = y_partial.shard(s);
    runtime::Tensor& wg = gate.shard(s);
    runtime::Tensor& wu = up.shard(s);
    runtime::Tensor& wd = down.shard(s);
    runtime::Tensor& ws = scale.shard(s);
    runtime::Tensor& logit = pb.scratch(s, {n, 1});
    runtime::Tensor& hs = pb.scratch(s, {n, fl});
    runtime::Tensor& us = pb.scratch(s, {n, fl});
    runtime::Tensor& ys = pb.scratch(s, {n, h});
    runtime::Tensor& act =
        saved != nullptr ? pb.scratch(s, {n, fl}) : hs;  // in place without saved
    if (saved != nullptr) {
      const auto i = static_cast<std::size_t>(s);
      saved->shared_gate_pre[i] = &hs, saved->shared_up_pre[i] = &us;
      saved->shared_hidden[i] = &act, saved->shared_out[i] = &ys;
    }
    return [prec, &xs, &yp, &wg, &wu, &wd, &ws, &logit, &hs, &us, &act, &ys, first, n, h] {
      const ConstMatrixMap xm(xs.values().data() + first * h, n, h);
      router_gemm(xm, as_matrix(std::as_const(ws)), as_matrix(logit), prec);
      device_gemm(xm, as_out_in_weight(wg), as_matrix(hs), prec);
      device_gemm(xm, as_out_in_weight(wu), as_matrix(us), prec);
      if (&act != &hs) as_matrix(act) = as_matrix(std::as_const(hs));
      gated_inplace(Activation::kSilu, as_matrix(act), as_matrix(std::as_const(us)));
      device_gemm(as_matrix(std::as_const(act)), as_out_in_weight(wd), as_matrix(ys), prec);
      MatrixMap ym(yp.values().data() + first * h, n, h);
      for (std::int64_t i = 0; i < n; ++i) {
        // sigmoid; for a very negative logit exp overflows to inf and the scale to 0, no NaN.
        const float g = 1.0f / (1.0f + std::exp(-logit.values()[static_cast<std::size_t>(i)]));
        ym.row(i) += g * ConstMatrixMap(ys.values().data() + i * h, 1, h);
      }
    };
  });
}

// The all-to-all dispatch's sizes and its slot tensors at the tokens' devices and at the
// experts'.
struct AllToAllForward {
  std::int64_t h, e, k, le_count, fl, rows;
  std::int64_t ep;     // the devices the experts are split over
  std::int64_t slots;  // per expert and token block
  std::int64_t held_blocks;
  runtime::ShardedTensor& sent;
  runtime::ShardedTensor& received;
  runtime::ShardedTensor& counts;
  runtime::ShardedTensor& counts_received;
  runtime::ShardedTensor& computed;
  runtime::ShardedTensor& returned;
};

// The sizes, and the slot tensors [P, E, C, H] and their counts [P, E]: at the source split
// over the token axes, at the experts over the token axes the expert axes leave and the expert
// axes.
AllToAllForward moe_a2a_buffers(ProgramBuilder& pb, const MoeLayer& layer,
                                const runtime::ShardedTensor& x, const std::string& name,
                                const std::vector<std::string>& token_axes,
                                const std::vector<std::string>& expert_axes) {
  const sharding::Mesh& m = pb.mesh().mesh();
  const MoeConfig& c = layer.config;
  const std::int64_t h = layer.hidden, e = c.num_experts, k = c.top_k;
  const std::int64_t rows = x.layout().elements_per_device() / h;
  std::int64_t blocks = 1, ep = 1;
  for (const std::string& a : token_axes) blocks *= m.axis_size(a);
  for (const std::string& a : expert_axes) ep *= m.axis_size(a);
  const std::int64_t capacity = c.capacity_factor > 0.0f ? expert_capacity(c, rows) : rows;
  const std::int64_t slots = std::min(capacity, rows);  // an expert takes a token at most once

  auto tuple_of = [](const std::vector<std::string>& axes) {
    std::vector<AxisRule> members(axes.begin(), axes.end());
    if (members.empty()) return AxisRule();
    if (members.size() == 1) return members.front();
    return AxisRule::tuple(std::move(members));
  };
  std::vector<std::string> other_axes;
  for (const std::string& a : token_axes) {
    if (std::find(expert_axes.begin(), expert_axes.end(), a) == expert_axes.end())
      other_axes.push_back(a);
  }
  const PartitionSpec at_source({tuple_of(token_axes), AxisRule(), AxisRule(), AxisRule()});
  const PartitionSpec at_expert(
      {tuple_of(other_axes), tuple_of(expert_axes), AxisRule(), AxisRule()});
  const PartitionSpec counts_at_source({tuple_of(token_axes), AxisRule()});
  const PartitionSpec counts_at_expert({tuple_of(other_axes), tuple_of(expert_axes)});
  const std::vector<std::int64_t> slots_shape{blocks, e, slots, h};
  const std::vector<std::int64_t> counts_shape{blocks, e};
  runtime::ShardedTensor& sent =
      pb.tensor(name + ".dispatch", TensorRole::kActivation, slots_shape, at_source);
  runtime::ShardedTensor& received =
      pb.tensor(name + ".dispatched", TensorRole::kActivation, slots_shape, at_expert);
  runtime::ShardedTensor& counts =
      pb.tensor(name + ".counts", TensorRole::kActivation, counts_shape, counts_at_source);
  runtime::ShardedTensor& counts_received = pb.tensor(
      name + ".counts_dispatched", TensorRole::kActivation, counts_shape, counts_at_expert);
  runtime::ShardedTensor& computed =
      pb.tensor(name + ".expert_out", TensorRole::kActivation, slots_shape, at_expert);
  runtime::ShardedTensor& returned =
      pb.tensor(name + ".combined", TensorRole::kActivation, slots_shape, at_source);
  return AllToAllForward{.h = h,
                         .e = e,
                         .k = k,
                         .le_count = layer.local_experts,
                         .fl = layer.local_ffn,
                         .rows = rows,
                         .ep = ep,
                         .slots = slots,
                         .held_blocks = received.layout().shard_shape()[0],
                         .sent = sent,
                         .received = received,
                         .counts = counts,
                         .counts_received = counts_received,
                         .computed = computed,
                         .returned = returned};
}

// Per device: route its own tokens and pack each expert's into its slots of the dispatch
// tensor, with the slot counts. Fills tables and probs.
runtime::Frontier emit_a2a_forward_route(ProgramBuilder& pb, const MoeLayer& layer,
                                         const AllToAllForward& a2a, runtime::ShardedTensor& x,
                                         runtime::ShardedTensor& router, MoeRouting& routing,
                                         const runtime::Frontier& after, const std::string& name,
                                         std::vector<RoutingTables*>& tables,
                                         std::vector<runtime::Tensor*>& probs) {
  const MoeConfig& c = layer.config;
  const std::int64_t rows = a2a.rows, h = a2a.h, e = a2a.e, k = a2a.k, slots = a2a.slots;
  return pb.per_device(name + ".route", {&after}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    pb.add_flops(s, 2.0 * static_cast<double>(rows * h * e) +
                        3.0 * 2.0 * static_cast<double>(h * a2a.fl) *
                            static_cast<double>(rows * k) / static_cast<double>(a2a.ep));
    RoutingTables& r = pb.make<RoutingTables>(rows, k, e, e);
    tables[i] = &r;
    MoeStats& stats = routing.per_slot[i];
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& logits = pb.scratch(s, {rows, e});  // the probabilities after routing
    probs[i] = &logits;
    runtime::Tensor& wr = router.shard(s);
    runtime::Tensor& out = a2a.sent.shard(s);
    runtime::Tensor& n = a2a.counts.shard(s);
    const MatmulPrecision prec = pb.matmul_precision();
    return [&xs, &logits, &wr, &r, &stats, &out, &n, c, rows, h, e, slots, prec] {
      router_gemm(ConstMatrixMap(xs.values().data(), rows, h), as_matrix(std::as_const(wr)),
                  as_matrix(logits), prec);
      route_tokens(as_matrix(logits), c, 0, r, stats);
      for (std::int64_t ex = 0; ex < e; ++ex) {
        const std::int64_t count = r.expert_count[static_cast<std::size_t>(ex)];
        n.values()[static_cast<std::size_t>(ex)] = static_cast<float>(count);
        for (std::int64_t j = 0; j < count; ++j) {
          const std::int64_t row =
              r.expert_rows[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          std::copy_n(xs.values().data() + row * h, h, out.values().data() + (ex * slots + j) * h);
        }
      }
    };
  });
}

// Per device, at the experts: each local expert's SwiGLU on every source block's slots for it,
// packed into one GEMM, the outputs written back into those slots. With `saved`, every
// expert's intermediates get rows of their own.
runtime::Frontier emit_a2a_forward_experts(ProgramBuilder& pb, const AllToAllForward& a2a,
                                           const ProgramWeights& weights,
                                           const runtime::Frontier& slots_there,
                                           const runtime::Frontier& counts_there,
                                           const std::string& name, MoeSaved* saved) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const std::int64_t h = a2a.h, le_count = a2a.le_count, fl = a2a.fl, slots = a2a.slots,
                     held_blocks = a2a.held_blocks;
  if (saved != nullptr) {
    const auto n = static_cast<std::size_t>(pb.mesh().size());
    saved->gate_pre.assign(n, nullptr), saved->up_pre.assign(n, nullptr),
        saved->hidden.assign(n, nullptr);
  }
  return pb.per_device(name + ".experts", {&slots_there, &counts_there}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& in = a2a.received.shard(s);
    runtime::Tensor& n = a2a.counts_received.shard(s);
    runtime::Tensor& res = a2a.computed.shard(s);
    // With `saved`, every expert's slots get rows of their own (packed expert after expert).
    const std::int64_t buffer_rows = held_blocks * slots * (saved != nullptr ? le_count : 1);
    runtime::Tensor& xe = pb.scratch(s, {held_blocks * slots, h});
    runtime::Tensor& he = pb.scratch(s, {buffer_rows, fl});
    runtime::Tensor& ue = pb.scratch(s, {buffer_rows, fl});
    runtime::Tensor& ye = pb.scratch(s, {held_blocks * slots, h});
    runtime::Tensor* act =
        saved != nullptr ? &pb.scratch(s, {buffer_rows, fl}) : &he;  // in place without saved
    if (saved != nullptr) saved->gate_pre[i] = &he, saved->up_pre[i] = &ue, saved->hidden[i] = act;
    runtime::Tensor& wg = weights.gate.shard(s);
    runtime::Tensor& wu = weights.up.shard(s);
    runtime::Tensor& wd = weights.down.shard(s);
    const bool packed_rows = saved != nullptr;
    return [prec, &in, &n, &res, &xe, &he, &ue, act, &ye, &wg, &wu, &wd, held_blocks, le_count,
            slots, h, fl, packed_rows] {
      std::int64_t first = 0;  // the expert's first row in the saved buffers
      for (std::int64_t le = 0; le < le_count; ++le) {
        // Every source block's slots for this expert, packed into one GEMM.
        std::int64_t total = 0;
        for (std::int64_t b = 0; b < held_blocks; ++b) {
          const auto count =
              static_cast<std::int64_t>(n.values()[static_cast<std::size_t>(b * le_count + le)]);
          std::copy_n(in.values().data() + ((b * le_count + le) * slots) * h, count * h,
                      xe.values().data() + total * h);
          total += count;
        }
        if (total == 0) continue;
        MatrixMap hm(he.values().data() + first * fl, total, fl);
        MatrixMap um(ue.values().data() + first * fl, total, fl);
        MatrixMap am(act->values().data() + first * fl, total, fl);
        if (packed_rows) first += total;
        const ConstMatrixMap xm(xe.values().data(), total, h);
        const std::int64_t wgt = h * fl;
        device_gemm(xm, as_weight(wg, le * wgt, h, fl, WeightLayout::kOutIn), hm, prec);
        device_gemm(xm, as_weight(wu, le * wgt, h, fl, WeightLayout::kOutIn), um, prec);
        if (am.data() != hm.data()) am = hm;
        gated_inplace(Activation::kSilu, am, ConstMatrixMap(um.data(), total, fl));
        device_gemm(ConstMatrixMap(am.data(), total, fl),
                    as_weight(wd, le * wgt, fl, h, WeightLayout::kOutIn),
                    MatrixMap(ye.values().data(), total, h), prec);
        std::int64_t at = 0;
        for (std::int64_t b = 0; b < held_blocks; ++b) {
          const auto count =
              static_cast<std::int64_t>(n.values()[static_cast<std::size_t>(b * le_count + le)]);
          std::copy_n(ye.values().data() + at * h, count * h,
                      res.values().data() + ((b * le_count + le) * slots) * h);
          at += count;
        }
      }
    };
  });
}

// Per device, back at the tokens: the experts' outputs, scaled by their routing weights, added
// into their tokens' rows of the (zeroed) partial output.
runtime::Frontier emit_a2a_forward_unpack(ProgramBuilder& pb, const AllToAllForward& a2a,
                                          const std::vector<RoutingTables*>& tables,
                                          runtime::ShardedTensor& y_partial,
                                          const runtime::Frontier& home,
                                          const runtime::Frontier& packed,
                                          const std::string& name) {
  const std::int64_t e = a2a.e, slots = a2a.slots, h = a2a.h;
  return pb.per_device(name + ".unpack", {&home, &packed}, [&](std::int64_t s) {
    RoutingTables& r = *tables[static_cast<std::size_t>(s)];
    runtime::Tensor& back = a2a.returned.shard(s);
    runtime::Tensor& yp = y_partial.shard(s);
    return [&r, &back, &yp, e, slots, h] {
      std::fill(yp.values().begin(), yp.values().end(), 0.0f);
      for (std::int64_t ex = 0; ex < e; ++ex) {
        for (std::int64_t j = 0; j < r.expert_count[static_cast<std::size_t>(ex)]; ++j) {
          const std::int64_t row =
              r.expert_rows[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          const float w = r.expert_scale[static_cast<std::size_t>(ex)][static_cast<std::size_t>(j)];
          MatrixMap(yp.values().data() + row * h, 1, h) +=
              w * ConstMatrixMap(back.values().data() + (ex * slots + j) * h, 1, h);
        }
      }
    };
  });
}

// GShard's dispatch for tokens split over the expert axis: every device routes its own tokens
// (its routing group), packs them into a dispatch tensor [P, E, C, H] (P token blocks, C slots
// per expert: the capacity, or all its tokens when dropless), and one all-to-all over the
// expert axis moves each expert's slots to the device holding that expert (dim 0 split over
// the token axes becomes dim 1 split over the expert axis); the slot counts travel the same
// way. Experts run on the slots they received, a second all-to-all brings the outputs home,
// and each device adds them, scaled by their routing weights, into its tokens' rows. When F is
// split too, those rows are partial sums, all-reduced over the tensor axis at the end. With
// `saved`, keeps what the backward needs: the routing, the slot tensors, and each expert's
// intermediates packed expert after expert instead of one reused scratch.
runtime::Frontier emit_moe_all_to_all(ProgramBuilder& pb, const MoeLayer& layer,
                                      runtime::ShardedTensor& x, const runtime::Frontier& after,
                                      runtime::ShardedTensor& y, const std::string& name,
                                      MoeRouting& routing,
                                      const std::vector<std::string>& token_axes,
                                      const std::vector<std::string>& expert_axes,
                                      MoeSaved* saved) {
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const std::size_t rank = x.shape().size();
  const AllToAllForward a2a = moe_a2a_buffers(pb, layer, x, name, token_axes, expert_axes);
  const ProgramWeights weights = use_weights(pb, layer, name);
  runtime::ShardedTensor& y_partial =
      pb.tensor(name + ".partial", TensorRole::kActivation, x.shape(), x.spec());
  std::vector<sharding::Placement> y_placed = sharding::to_placements(x.spec(), m, rank);
  for (const std::string& a : ffn_axes(layer))
    y_placed[*m.find_axis(a)] = sharding::Placement::partial();

  std::vector<RoutingTables*> tables(static_cast<std::size_t>(mesh.size()));
  std::vector<runtime::Tensor*> probs(static_cast<std::size_t>(mesh.size()));
  const runtime::Frontier packed = emit_a2a_forward_route(pb, layer, a2a, x, weights.router,
                                                          routing, after, name, tables, probs);
  // Dispatch: the slots and their counts to the devices holding their experts.
  const auto placed = [&](const runtime::ShardedTensor& t) {
    return sharding::to_placements(t.spec(), m, t.shape().size());
  };
  const runtime::Frontier slots_there = pb.reshard(
      a2a.sent, placed(a2a.sent), a2a.received, placed(a2a.received), packed, name + ".dispatch");
  const runtime::Frontier counts_there =
      pb.reshard(a2a.counts, placed(a2a.counts), a2a.counts_received, placed(a2a.counts_received),
                 packed, name + ".dispatch_counts");
  const runtime::Frontier expert_done =
      emit_a2a_forward_experts(pb, a2a, weights, slots_there, counts_there, name, saved);
  // Combine: the outputs back to their tokens' devices (partial sums over the tensor axis travel
  // as they are: the move is linear).
  const runtime::Frontier home = pb.reshard(a2a.computed, placed(a2a.computed), a2a.returned,
                                            placed(a2a.returned), expert_done, name + ".combine");
  const runtime::Frontier done =
      emit_a2a_forward_unpack(pb, a2a, tables, y_partial, home, packed, name);
  if (saved != nullptr) {
    keep_routing(*saved, x, x, weights, tables, probs, y_placed, y);
    saved->dispatched = &a2a.received, saved->dispatched_counts = &a2a.counts_received,
    saved->combined = &a2a.returned;
  }
  const runtime::Frontier summed =
      emit_shared_expert(pb, layer, x, y_partial, y_placed, done, name, saved);
  return pb.reshard(y_partial, y_placed, y, sharding::to_placements(y.spec(), m, rank), summed,
                    name + ".out");
}

// Refuses an x or y that does not fit the layer ([..., H], H whole on every device).
void check_moe_shapes(const MoeLayer& layer, const runtime::ShardedTensor& x,
                      const runtime::ShardedTensor& y, const std::string& name) {
  const std::size_t rank = x.shape().size();
  const std::int64_t h = layer.hidden;
  NUMESH_CHECK(rank >= 2 && x.shape().back() == h && y.shape() == x.shape(), ShapeError,
               "{}: x [{}] and y [{}] do not fit hidden {}", name, fmt::join(x.shape(), ", "),
               fmt::join(y.shape(), ", "), h);
  NUMESH_CHECK(x.layout().shard_shape().back() == h, ShapeError, "{}: x {} splits the hidden dim",
               name, x.spec().repr());
}

// The axes splitting x's token dims (every dim but the last), in order.
std::vector<std::string> moe_token_axes(const runtime::ShardedTensor& x) {
  std::vector<std::string> token_axes;
  for (std::size_t dim = 0; dim + 1 < x.shape().size(); ++dim) {
    for (const std::string& a : detail::axes_of(x.spec(), dim)) token_axes.push_back(a);
  }
  return token_axes;
}

// The gathered dispatch's state: the tokens gathered over the weights' axes, the weights, the
// partial output and the sizes.
struct GatheredMoe {
  ProgramBuilder& pb;
  const MoeLayer& layer;
  const std::string& name;
  runtime::ShardedTensor& xc;
  const ProgramWeights& weights;
  runtime::ShardedTensor& y_partial;
  std::int64_t h, rows, e, k, le_count, fl;
};

// The partial output's placements: x's, pending a sum over every axis that splits the experts'
// weights.
std::vector<sharding::Placement> gathered_moe_partial_placements(const MoeLayer& layer,
                                                                 const runtime::ShardedTensor& xc,
                                                                 const sharding::Mesh& m,
                                                                 std::size_t rank) {
  std::vector<sharding::Placement> y_placed = sharding::to_placements(xc.spec(), m, rank);
  for (const auto& w : {layer.gate, layer.down}) {
    const auto placed = sharding::to_placements(w->spec(), m, 3);
    for (std::size_t a = 0; a < placed.size(); ++a) {
      if (placed[a].is_shard()) y_placed[a] = sharding::Placement::partial();
    }
  }
  return y_placed;
}

// Per device: route its tokens (router GEMM, softmax, top-k, capacity) and zero its partial
// output. Fills tables and probs.
runtime::Frontier emit_gathered_moe_route(const GatheredMoe& st, MoeRouting& routing,
                                          const runtime::Frontier& x_ready,
                                          std::vector<RoutingTables*>& tables,
                                          std::vector<runtime::Tensor*>& probs) {
  ProgramBuilder& pb = st.pb;
  const runtime::DeviceMesh& mesh = pb.mesh();
  const MoeConfig& c = st.layer.config;
  const std::int64_t h = st.h, rows = st.rows, e = st.e, k = st.k, le_count = st.le_count;
  // Expected FLOPs with balanced routing: each expert sees rows * k / E tokens.
  const double expert_flops = 3.0 * 2.0 * static_cast<double>(h * st.fl) *
                              static_cast<double>(rows * k) / static_cast<double>(e) *
                              static_cast<double>(le_count);
  const double router_flops = 2.0 * static_cast<double>(rows * h * e);
  const auto gate_pos = sharding::to_placements(st.layer.gate->spec(), mesh.mesh(), 3);
  const std::size_t expert_axis = [&] {
    for (std::size_t a = 0; a < gate_pos.size(); ++a) {
      if (gate_pos[a].is_shard() && gate_pos[a].dim == 0) return a;
    }
    return gate_pos.size();
  }();
  return pb.per_device(st.name + ".route", {&x_ready}, [&](std::int64_t s) {
    pb.add_flops(s, expert_flops + router_flops);
    const std::int64_t first_expert =
        expert_axis < gate_pos.size() ? mesh.coords(s)[expert_axis] * le_count : 0;
    RoutingTables& r = pb.make<RoutingTables>(rows, k, e, le_count);
    tables[static_cast<std::size_t>(s)] = &r;
    MoeStats& stats = routing.per_slot[static_cast<std::size_t>(s)];
    runtime::Tensor& xs = st.xc.shard(s);
    runtime::Tensor& logits = pb.scratch(s, {rows, e});
    probs[static_cast<std::size_t>(s)] = &logits;
    runtime::Tensor& wr = st.weights.router.shard(s);
    runtime::Tensor& yp = st.y_partial.shard(s);
    const MatmulPrecision prec = pb.matmul_precision();
    return [&xs, &logits, &wr, &r, &stats, &yp, c, rows, h, first_expert, prec] {
      router_gemm(ConstMatrixMap(xs.values().data(), rows, h), as_matrix(std::as_const(wr)),
                  as_matrix(logits), prec);
      route_tokens(as_matrix(logits), c, first_expert, r, stats);
      std::fill(yp.values().begin(), yp.values().end(), 0.0f);
    };
  });
}

// Per device, its local experts one after another, each on the rows routed to it. With
// `saved`, every expert's intermediates go to their own rows of the saved buffers (packed in
// expert order) instead of one reused scratch, and the activation is kept beside its input.
runtime::Frontier emit_gathered_moe_experts(const GatheredMoe& st,
                                            const std::vector<RoutingTables*>& tables,
                                            const runtime::Frontier& routed, MoeSaved* saved) {
  ProgramBuilder& pb = st.pb;
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const std::int64_t h = st.h, rows = st.rows, le_count = st.le_count, fl = st.fl;
  const std::int64_t assignments = rows * std::min(st.k, le_count);
  if (saved != nullptr) {
    const auto n = static_cast<std::size_t>(pb.mesh().size());
    saved->gate_pre.assign(n, nullptr), saved->up_pre.assign(n, nullptr);
    saved->hidden.assign(n, nullptr), saved->expert_out.assign(n, nullptr);
  }
  return pb.per_device(st.name + ".experts", {&routed}, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    RoutingTables& r = *tables[i];
    runtime::Tensor& xs = st.xc.shard(s);
    runtime::Tensor& xe = pb.scratch(s, {rows, h});
    const bool packed = saved != nullptr;
    const std::int64_t buffer_rows = packed ? assignments : rows;  // all experts' rows, or one's
    runtime::Tensor& he = pb.scratch(s, {buffer_rows, fl});
    runtime::Tensor& ue = pb.scratch(s, {buffer_rows, fl});
    runtime::Tensor& ye = pb.scratch(s, {buffer_rows, h});
    runtime::Tensor* act =
        packed ? &pb.scratch(s, {assignments, fl}) : &he;  // in place without saved
    if (packed) {
      saved->gate_pre[i] = &he;
      saved->up_pre[i] = &ue;
      saved->hidden[i] = act;
      saved->expert_out[i] = &ye;
    }
    runtime::Tensor& wg = st.weights.gate.shard(s);
    runtime::Tensor& wu = st.weights.up.shard(s);
    runtime::Tensor& wd = st.weights.down.shard(s);
    runtime::Tensor& yp = st.y_partial.shard(s);
    return [prec, &xs, &xe, &he, &ue, &ye, act, &wg, &wu, &wd, &yp, &r, le_count, h, fl, packed] {
      std::int64_t at = 0;  // the expert's first row in the packed buffers
      for (std::int64_t le = 0; le < le_count; ++le) {
        const std::int64_t n = r.expert_count[static_cast<std::size_t>(le)];
        if (n == 0) continue;
        const std::int64_t first = packed ? at : 0;
        at += n;
        const auto& rows_of = r.expert_rows[static_cast<std::size_t>(le)];
        const auto& scale = r.expert_scale[static_cast<std::size_t>(le)];
        const float* xv = xs.values().data();
        MatrixMap xm(xe.values().data(), n, h);
        for (std::int64_t j = 0; j < n; ++j) {
          xm.row(j) = ConstMatrixMap(xv + rows_of[static_cast<std::size_t>(j)] * h, 1, h);
        }
        MatrixMap hm(he.values().data() + first * fl, n, fl);
        MatrixMap um(ue.values().data() + first * fl, n, fl);
        MatrixMap am(act->values().data() + first * fl, n, fl);
        MatrixMap ym(ye.values().data() + first * h, n, h);
        const std::int64_t wgt = h * fl;
        const ConstMatrixMap xc(xm.data(), n, h);
        device_gemm(xc, as_weight(wg, le * wgt, h, fl, WeightLayout::kOutIn), hm, prec);
        device_gemm(xc, as_weight(wu, le * wgt, h, fl, WeightLayout::kOutIn), um, prec);
        if (am.data() != hm.data()) am = hm;
        gated_inplace(Activation::kSilu, am, ConstMatrixMap(um.data(), n, fl));
        device_gemm(ConstMatrixMap(am.data(), n, fl),
                    as_weight(wd, le * wgt, fl, h, WeightLayout::kOutIn), ym, prec);
        float* yv = yp.values().data();
        for (std::int64_t j = 0; j < n; ++j) {
          MatrixMap(yv + rows_of[static_cast<std::size_t>(j)] * h, 1, h) +=
              scale[static_cast<std::size_t>(j)] * ym.row(j);
        }
      }
    };
  });
}

}  // namespace

runtime::Frontier emit_moe(ProgramBuilder& pb, const MoeLayer& layer, runtime::ShardedTensor& x,
                           const runtime::Frontier& after, runtime::ShardedTensor& y,
                           const std::string& name, MoeRouting** routing_out, MoeSaved* saved) {
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const std::size_t rank = x.shape().size();
  check_moe_shapes(layer, x, y, name);
  const std::vector<std::string> token_axes = moe_token_axes(x);
  const std::vector<std::string> expert_axes = detail::axes_of(layer.gate->spec(), 0);
  const std::vector<std::string> f_axes = ffn_axes(layer);
  auto among_tokens = [&](const std::vector<std::string>& axes) {
    return std::any_of(axes.begin(), axes.end(), [&](const std::string& a) {
      return std::find(token_axes.begin(), token_axes.end(), a) != token_axes.end();
    });
  };
  MoeRouting& routing = pb.make<MoeRouting>();
  routing.per_slot.assign(static_cast<std::size_t>(mesh.size()),
                          MoeStats{.tokens_per_expert = std::vector<std::int64_t>(
                                       static_cast<std::size_t>(layer.config.num_experts), 0)});
  if (routing_out != nullptr) *routing_out = &routing;
  if (!expert_axes.empty() && among_tokens(expert_axes) && !among_tokens(f_axes)) {
    // Tokens split over the expert axis: GShard's all-to-all dispatch and combine.
    routing.set_groups(mesh, x.layout().replica_groups());
    return emit_moe_all_to_all(pb, layer, x, after, y, name, routing, token_axes, expert_axes,
                               saved);
  }
  // Otherwise tokens split over an axis that splits the experts' weights are gathered over it
  // (dispatch by all-gather) and their outputs reduce-scattered back (EasyDeL's ring of
  // experts); tokens replicated there need neither.
  std::vector<std::string> weight_axes;
  for (const auto& w : {layer.gate, layer.down}) {
    for (std::size_t dim = 0; dim < w->spec().size(); ++dim) {
      for (const std::string& axis : w->spec().entry_names(dim)) weight_axes.push_back(axis);
    }
  }
  runtime::Frontier x_ready = after;
  runtime::ShardedTensor& xc =
      pb.gather_over(x, weight_axes, TensorRole::kActivation, name + ".dispatch", x_ready);
  const ProgramWeights weights = use_weights(pb, layer, name);
  runtime::ShardedTensor& y_partial =
      pb.tensor(name + ".partial", TensorRole::kActivation, xc.shape(), xc.spec());
  const std::vector<sharding::Placement> y_placed =
      gathered_moe_partial_placements(layer, xc, m, rank);
  const std::int64_t h = layer.hidden;
  const GatheredMoe st{.pb = pb,
                       .layer = layer,
                       .name = name,
                       .xc = xc,
                       .weights = weights,
                       .y_partial = y_partial,
                       .h = h,
                       .rows = xc.layout().elements_per_device() / h,
                       .e = layer.config.num_experts,
                       .k = layer.config.top_k,
                       .le_count = layer.local_experts,
                       .fl = layer.local_ffn};
  routing.set_groups(mesh, xc.layout().replica_groups());

  // Per device: route its tokens and zero its partial output, then run its local experts on
  // the tokens routed to them.
  std::vector<RoutingTables*> tables(static_cast<std::size_t>(mesh.size()));
  std::vector<runtime::Tensor*> probs(static_cast<std::size_t>(mesh.size()));
  const runtime::Frontier routed = emit_gathered_moe_route(st, routing, x_ready, tables, probs);
  const runtime::Frontier done = emit_gathered_moe_experts(st, tables, routed, saved);
  if (saved != nullptr) keep_routing(*saved, xc, x, weights, tables, probs, y_placed, y);
  const runtime::Frontier summed =
      emit_shared_expert(pb, layer, xc, y_partial, y_placed, done, name, saved);
  return pb.reshard(y_partial, y_placed, y, sharding::to_placements(y.spec(), m, rank), summed,
                    name + ".out");
}

MoeGradients MoeGradients::like(const MoeLayer& layer) {
  MoeGradients g;
  g.router = gradient_like(*layer.router);
  g.gate = gradient_like(*layer.gate);
  g.up = gradient_like(*layer.up);
  g.down = gradient_like(*layer.down);
  if (layer.shared_expert) {
    g.shared_gate = gradient_like(*layer.shared_expert->gate);
    g.shared_up = gradient_like(*layer.shared_expert->up);
    g.shared_down = gradient_like(*layer.shared_expert->down);
    g.shared_expert_gate = gradient_like(*layer.shared_expert_gate);
  }
  return g;
}

ShardedMoe::ShardedMoe(runtime::DeviceMesh mesh, const MoeConfig& config, const MoeWeights& weights,
                       std::int64_t tokens, MoeAxes axes)
    : layer_(MoeLayer::create(mesh, config, weights, axes)), tokens_(tokens) {
  NUMESH_CHECK(tokens > 0, ShapeError, "moe: {} tokens; need at least one", tokens);
  ProgramBuilder pb(mesh, "moe");
  const std::vector<std::int64_t> shape{tokens, layer_.hidden};
  const PartitionSpec spec =
      sharding::correct_spec(
          shape, PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}),
          mesh.mesh())
          .spec;
  runtime::Frontier loaded;
  runtime::ShardedTensor& x = pb.input("x", shape, spec, loaded);
  runtime::ShardedTensor& y = pb.tensor("y", TensorRole::kOutput, shape, spec);
  pb.output("y", y, emit_moe(pb, layer_, x, loaded, y, "moe", &routing_));
  program_ = std::make_unique<Program>(std::move(pb).compile());
}

runtime::HostTensor ShardedMoe::forward(const runtime::HostTensor& x) {
  NUMESH_CHECK(x.shape == (std::vector<std::int64_t>{tokens_, layer_.hidden}), ShapeError,
               "moe: input is {} but the layer was compiled for [{}, {}]", shape_text(x), tokens_,
               layer_.hidden);
  return program_->run("x", x, "y");
}

}  // namespace numesh::ops
