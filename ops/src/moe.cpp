#include "numesh/ops/moe.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/activations.hpp"
#include "numesh/ops/gemm.hpp"
#include "lowering_util.hpp"

namespace numesh::ops {

namespace {

using sharding::AxisRule;
using sharding::PartitionSpec;
using detail::shape_text;

// Host-side routing tables of one slot, sized at emit time so the nodes never allocate.
struct SlotRouting {
  SlotRouting(std::int64_t rows, std::int64_t k, std::int64_t experts, std::int64_t local_experts)
      : choice(static_cast<std::size_t>(rows * k)),
        weight(static_cast<std::size_t>(rows * k)),
        kept(static_cast<std::size_t>(rows * k)),
        load(static_cast<std::size_t>(experts)),
        expert_rows(static_cast<std::size_t>(local_experts), std::vector<std::int64_t>(static_cast<std::size_t>(rows))),
        expert_scale(static_cast<std::size_t>(local_experts), std::vector<float>(static_cast<std::size_t>(rows))),
        expert_count(static_cast<std::size_t>(local_experts)) {}
  std::vector<std::int64_t> choice;  // [rows, k]: chosen experts, best first
  std::vector<float> weight;         // [rows, k]
  std::vector<char> kept;            // [rows, k]: within capacity
  std::vector<std::int64_t> load;    // [E]
  std::vector<std::vector<std::int64_t>> expert_rows;  // per local expert: its rows, token order
  std::vector<std::vector<float>> expert_scale;        // per local expert: the routing weights
  std::vector<std::int64_t> expert_count;
};

// Router softmax, top-k, capacity and the local experts' row lists for `rows` tokens whose
// logits are in `logits` [rows, E]: the same decisions as moe_reference, without allocating.
void route(MatrixMap logits, const MoeConfig& c, std::int64_t first_expert, SlotRouting& r, MoeStats& stats) {
  const std::int64_t rows = logits.rows(), e = c.num_experts, k = c.top_k;
  for (std::int64_t t = 0; t < rows; ++t) {
    auto row = logits.row(t);
    const float m = row.maxCoeff();
    row = (row.array() - m).exp().matrix();
    row /= row.sum();
    // Top-k: k passes of argmax; strict > keeps the lower index on ties (a stable sort).
    float total = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t ex = 0; ex < e; ++ex) {
        bool taken = false;
        for (std::int64_t p = 0; p < j; ++p) taken = taken || r.choice[static_cast<std::size_t>(t * k + p)] == ex;
        if (!taken && (best < 0 || row(ex) > row(best))) best = ex;
      }
      r.choice[static_cast<std::size_t>(t * k + j)] = best;
      r.weight[static_cast<std::size_t>(t * k + j)] = row(best);
      total += row(best);
    }
    if (c.renormalize) {
      for (std::int64_t j = 0; j < k; ++j) r.weight[static_cast<std::size_t>(t * k + j)] /= total;
    }
  }
  const std::int64_t capacity =
      c.capacity_factor > 0.0f
          ? static_cast<std::int64_t>(std::ceil(static_cast<double>(c.capacity_factor) *
                                                static_cast<double>(rows * k) / static_cast<double>(e)))
          : 0;
  std::fill(r.load.begin(), r.load.end(), 0);
  std::int64_t dropped = 0;
  // GShard's priority: every token's first choice before any second choice.
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t t = 0; t < rows; ++t) {
      const auto at = static_cast<std::size_t>(t * k + j);
      const auto ex = static_cast<std::size_t>(r.choice[at]);
      const bool keep = capacity == 0 || r.load[ex] < capacity;
      r.kept[at] = keep ? 1 : 0;
      if (keep) {
        ++r.load[ex];
      } else {
        ++dropped;
      }
    }
  }
  std::fill(r.expert_count.begin(), r.expert_count.end(), 0);
  const auto local = static_cast<std::int64_t>(r.expert_count.size());
  for (std::int64_t t = 0; t < rows; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(t * k + j);
      const std::int64_t le = r.choice[at] - first_expert;
      if (r.kept[at] == 0 || le < 0 || le >= local) continue;
      auto& n = r.expert_count[static_cast<std::size_t>(le)];
      r.expert_rows[static_cast<std::size_t>(le)][static_cast<std::size_t>(n)] = t;
      r.expert_scale[static_cast<std::size_t>(le)][static_cast<std::size_t>(n)] = r.weight[at];
      ++n;
    }
  }
  std::copy(r.load.begin(), r.load.end(), stats.tokens_per_expert.begin());
  stats.dropped = dropped;
  stats.capacity = capacity;
}

}  // namespace

MoeStats MoeRouting::total() const {
  MoeStats sum;
  for (std::int64_t s : group_leaders) {
    const MoeStats& g = per_slot[static_cast<std::size_t>(s)];
    if (sum.tokens_per_expert.empty()) sum.tokens_per_expert.assign(g.tokens_per_expert.size(), 0);
    for (std::size_t e = 0; e < g.tokens_per_expert.size(); ++e) sum.tokens_per_expert[e] += g.tokens_per_expert[e];
    sum.dropped += g.dropped;
    sum.capacity = g.capacity;
  }
  return sum;
}

MoeLayer MoeLayer::create(const runtime::DeviceMesh& mesh, const MoeConfig& c, const MoeWeights& w,
                          const MoeAxes& axes) {
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e, ValueError, "moe: top_k {} must be between 1 and the {} experts", k, e);
  NUMESH_CHECK(c.capacity_factor >= 0.0f, ValueError, "moe: capacity_factor {} is negative", c.capacity_factor);
  NUMESH_CHECK(w.router.shape.size() == 2 && w.router.shape[1] == e, ShapeError,
               "moe: router is {}, expected [H, {}] for {} experts", shape_text(w.router), e, e);
  const std::int64_t h = w.router.shape[0];
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) && w.up.shape == w.gate.shape &&
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
  layer.router = detail::sharded(mesh, w.router.shape, PartitionSpec({AxisRule(), AxisRule()}));
  layer.gate = detail::sharded(mesh, w.gate.shape, PartitionSpec({ep, AxisRule(), tp}));
  layer.up = detail::sharded(mesh, w.up.shape, layer.gate->spec());
  layer.down = detail::sharded(mesh, w.down.shape, PartitionSpec({ep, tp, AxisRule()}));
  runtime::scatter(w.router, *layer.router);
  runtime::scatter(w.gate, *layer.gate);
  runtime::scatter(w.up, *layer.up);
  runtime::scatter(w.down, *layer.down);
  layer.local_experts = layer.gate->layout().shard_shape()[0];
  layer.local_ffn = layer.gate->layout().shard_shape()[2];
  return layer;
}

runtime::Frontier emit_moe(ProgramBuilder& pb, const MoeLayer& layer, runtime::ShardedTensor& x,
                           const runtime::Frontier& after, runtime::ShardedTensor& y, const std::string& name,
                           MoeRouting** routing_out) {
  const runtime::DeviceMesh& mesh = pb.mesh();
  const sharding::Mesh& m = mesh.mesh();
  const std::size_t rank = x.shape().size();
  const std::int64_t h = layer.hidden;
  NUMESH_CHECK(rank >= 2 && x.shape().back() == h && y.shape() == x.shape(), ShapeError,
               "{}: x [{}] and y [{}] do not fit hidden {}", name, fmt::join(x.shape(), ", "),
               fmt::join(y.shape(), ", "), h);
  NUMESH_CHECK(x.layout().shard_shape().back() == h, ShapeError, "{}: x {} splits the hidden dim", name,
               x.spec().repr());
  // Tokens split over an axis that splits the experts' weights (EasyDeL's ep-bound layouts) are
  // dispatched by an all-gather over it, and their outputs combined by a reduce-scatter back
  // (EasyDeL's ring-of-experts path); tokens replicated there need neither.
  std::vector<std::string> weight_axes;
  for (const auto& w : {layer.gate, layer.down}) {
    for (std::size_t dim = 0; dim < w->spec().size(); ++dim) {
      for (const std::string& axis : w->spec().entry_names(dim)) weight_axes.push_back(axis);
    }
  }
  runtime::Frontier x_ready = after;
  runtime::ShardedTensor& xc = pb.gather_over(x, weight_axes, TensorRole::kActivation, name + ".dispatch", x_ready);
  runtime::ShardedTensor& router = pb.use(name + ".router", TensorRole::kWeight, layer.router);
  runtime::ShardedTensor& gate = pb.use(name + ".w_gate", TensorRole::kWeight, layer.gate);
  runtime::ShardedTensor& up = pb.use(name + ".w_up", TensorRole::kWeight, layer.up);
  runtime::ShardedTensor& down = pb.use(name + ".w_down", TensorRole::kWeight, layer.down);
  runtime::ShardedTensor& y_partial = pb.tensor(name + ".partial", TensorRole::kActivation, xc.shape(), xc.spec());

  // The partial output is pending a sum over every axis that splits the experts' weights.
  std::vector<sharding::Placement> y_placed = sharding::to_placements(xc.spec(), m, rank);
  for (const auto& w : {layer.gate, layer.down}) {
    const auto placed = sharding::to_placements(w->spec(), m, 3);
    for (std::size_t a = 0; a < placed.size(); ++a) {
      if (placed[a].is_shard()) y_placed[a] = sharding::Placement::partial();
    }
  }

  const MoeConfig& c = layer.config;
  const std::int64_t rows = xc.layout().elements_per_device() / h;
  const std::int64_t e = c.num_experts, k = c.top_k, le_count = layer.local_experts, fl = layer.local_ffn;
  MoeRouting& routing = pb.make<MoeRouting>();
  routing.per_slot.assign(static_cast<std::size_t>(mesh.size()),
                          MoeStats{.tokens_per_expert = std::vector<std::int64_t>(static_cast<std::size_t>(e), 0)});
  for (const auto& group : xc.layout().replica_groups()) routing.group_leaders.push_back(group.front());
  if (routing_out != nullptr) *routing_out = &routing;

  // Expected FLOPs with balanced routing: each expert sees rows * k / E tokens.
  const double expert_flops = 3.0 * 2.0 * static_cast<double>(h * fl) * static_cast<double>(rows * k) /
                              static_cast<double>(e) * static_cast<double>(le_count);
  const double router_flops = 2.0 * static_cast<double>(rows * h * e);
  const auto gate_pos = sharding::to_placements(layer.gate->spec(), m, 3);
  const std::size_t expert_axis = [&] {
    for (std::size_t a = 0; a < gate_pos.size(); ++a) {
      if (gate_pos[a].is_shard() && gate_pos[a].dim == 0) return a;
    }
    return gate_pos.size();
  }();

  runtime::Frontier done(static_cast<std::size_t>(mesh.size()), runtime::kReady);
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    const int dev = mesh.device(s).index();
    pb.add_flops(s, expert_flops + router_flops);
    const std::int64_t first_expert = expert_axis < gate_pos.size() ? mesh.coords(s)[expert_axis] * le_count : 0;
    SlotRouting& r = pb.make<SlotRouting>(rows, k, e, le_count);
    MoeStats& stats = routing.per_slot[i];
    runtime::Tensor& xs = xc.shard(s);
    runtime::Tensor& logits = pb.scratch(s, {rows, e});
    runtime::Tensor& xe = pb.scratch(s, {rows, h});
    runtime::Tensor& he = pb.scratch(s, {rows, fl});
    runtime::Tensor& ue = pb.scratch(s, {rows, fl});
    runtime::Tensor& ye = pb.scratch(s, {rows, h});
    runtime::Tensor& wr = router.shard(s);
    runtime::Tensor& wg = gate.shard(s);
    runtime::Tensor& wu = up.shard(s);
    runtime::Tensor& wd = down.shard(s);
    runtime::Tensor& yp = y_partial.shard(s);
    const auto route_node = pb.graph().add(dev, fmt::format("{}.route[{}]", name, s),
                                           [&xs, &logits, &wr, &r, &stats, &yp, c, rows, h, first_expert] {
      gemm(ConstMatrixMap(xs.values().data(), rows, h), as_matrix(std::as_const(wr)), as_matrix(logits));
      route(as_matrix(logits), c, first_expert, r, stats);
      std::fill(yp.values().begin(), yp.values().end(), 0.0f);
    });
    if (!x_ready.empty() && x_ready[i] != runtime::kReady) pb.graph().depend(x_ready[i], route_node);
    done[i] = pb.graph().add(dev, fmt::format("{}.experts[{}]", name, s),
                             [&xs, &xe, &he, &ue, &ye, &wg, &wu, &wd, &yp, &r, le_count, h, fl] {
      for (std::int64_t le = 0; le < le_count; ++le) {
        const std::int64_t n = r.expert_count[static_cast<std::size_t>(le)];
        if (n == 0) continue;
        const auto& rows_of = r.expert_rows[static_cast<std::size_t>(le)];
        const auto& scale = r.expert_scale[static_cast<std::size_t>(le)];
        const float* xv = xs.values().data();
        MatrixMap xm(xe.values().data(), n, h);
        for (std::int64_t j = 0; j < n; ++j) {
          xm.row(j) = ConstMatrixMap(xv + rows_of[static_cast<std::size_t>(j)] * h, 1, h);
        }
        MatrixMap hm(he.values().data(), n, fl);
        MatrixMap um(ue.values().data(), n, fl);
        MatrixMap ym(ye.values().data(), n, h);
        const std::int64_t wgt = h * fl;
        device_gemm(ConstMatrixMap(xm.data(), n, h), ConstMatrixMap(wg.values().data() + le * wgt, h, fl), hm);
        device_gemm(ConstMatrixMap(xm.data(), n, h), ConstMatrixMap(wu.values().data() + le * wgt, h, fl), um);
        silu_mul_inplace(hm, ConstMatrixMap(um.data(), n, fl));
        device_gemm(ConstMatrixMap(hm.data(), n, fl), ConstMatrixMap(wd.values().data() + le * wgt, fl, h), ym);
        float* yv = yp.values().data();
        for (std::int64_t j = 0; j < n; ++j) {
          MatrixMap(yv + rows_of[static_cast<std::size_t>(j)] * h, 1, h) += scale[static_cast<std::size_t>(j)] * ym.row(j);
        }
      }
    }, {route_node});
  }
  return pb.reshard(y_partial, y_placed, y, sharding::to_placements(y.spec(), m, rank), done, name + ".out");
}

ShardedMoe::ShardedMoe(runtime::DeviceMesh mesh, const MoeConfig& config, const MoeWeights& weights,
                       std::int64_t tokens, MoeAxes axes)
    : layer_(MoeLayer::create(mesh, config, weights, axes)), tokens_(tokens) {
  NUMESH_CHECK(tokens > 0, ShapeError, "moe: {} tokens; need at least one", tokens);
  ProgramBuilder pb(mesh, "moe");
  const std::vector<std::int64_t> shape{tokens, layer_.hidden};
  const PartitionSpec spec =
      sharding::correct_spec(shape, PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}),
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
               "moe: input is {} but the layer was compiled for [{}, {}]", shape_text(x), tokens_, layer_.hidden);
  program_->set_input("x", x);
  program_->run();
  return program_->output("y");
}

}  // namespace numesh::ops
