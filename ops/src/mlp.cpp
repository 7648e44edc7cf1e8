#include "numesh/ops/mlp.hpp"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/activations.hpp"
#include "numesh/ops/gemm.hpp"
#include "numesh/ops/reference.hpp"
#include "lowering_util.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

namespace {

using sharding::AxisRule;
using sharding::PartitionSpec;
using detail::shape_text;

}  // namespace

std::string_view to_string(MlpKind kind) noexcept {
  return kind == MlpKind::kGelu ? "gelu" : "swiglu";
}

MlpLayer MlpLayer::create(const runtime::DeviceMesh& mesh, MlpKind kind, const MlpWeights& w,
                          const MlpAxes& axes) {
  const char* what = kind == MlpKind::kGelu ? "mlp (gelu)" : "mlp (swiglu)";
  NUMESH_CHECK(w.up.shape.size() == 2 && w.down.shape.size() == 2, ShapeError,
               "{}: up {} and down {} must be matrices", what, shape_text(w.up), shape_text(w.down));
  MlpLayer layer;
  layer.kind = kind;
  layer.hidden = w.up.shape[0];
  layer.intermediate = w.up.shape[1];
  NUMESH_CHECK(w.down.shape == (std::vector<std::int64_t>{layer.intermediate, layer.hidden}), ShapeError,
               "{}: up {} and down {} do not chain (expected down [{}, {}])", what, shape_text(w.up),
               shape_text(w.down), layer.intermediate, layer.hidden);
  NUMESH_CHECK(kind == MlpKind::kGelu || w.gate.shape == w.up.shape, ShapeError,
               "{}: gate {} and up {} differ", what, shape_text(w.gate), shape_text(w.up));
  const AxisRule tp = mesh.mesh().has_axis(axes.tensor) ? AxisRule(axes.tensor) : AxisRule();
  layer.up = detail::sharded(mesh, w.up.shape, PartitionSpec({AxisRule(), tp}));
  layer.down = detail::sharded(mesh, w.down.shape, PartitionSpec({tp, AxisRule()}));
  runtime::scatter(w.up, *layer.up);
  runtime::scatter(w.down, *layer.down);
  if (kind == MlpKind::kSwiGLU) {
    layer.gate = detail::sharded(mesh, w.gate.shape, layer.up->spec());
    runtime::scatter(w.gate, *layer.gate);
  }
  return layer;
}

runtime::Frontier emit_mlp(ProgramBuilder& pb, const MlpLayer& layer, runtime::ShardedTensor& x,
                           const runtime::Frontier& after, runtime::ShardedTensor& y,
                           const std::string& name) {
  const runtime::DeviceMesh& mesh = pb.mesh();
  const auto& m = mesh.mesh();
  const std::size_t rank = x.shape().size();
  NUMESH_CHECK(rank >= 2 && x.shape().back() == layer.hidden && x.layout().shard_shape().back() == layer.hidden &&
                   y.shape() == x.shape(),
               ShapeError, "{}: x {} {} and y {} do not fit hidden {} (H must be last and not split)", name,
               fmt::join(x.shape(), "x"), x.spec().repr(), fmt::join(y.shape(), "x"), layer.hidden);
  runtime::ShardedTensor& up = pb.use(name + ".w_up", TensorRole::kWeight, layer.up);
  runtime::ShardedTensor& down = pb.use(name + ".w_down", TensorRole::kWeight, layer.down);
  runtime::ShardedTensor* gate =
      layer.gate ? &pb.use(name + ".w_gate", TensorRole::kWeight, layer.gate) : nullptr;
  runtime::ShardedTensor& y_partial = pb.tensor(name + ".partial", TensorRole::kActivation, x.shape(), x.spec());

  // Placements of the partial output: x's, plus Partial(sum) on the axes that split F.
  std::vector<sharding::Placement> y_placed = sharding::to_placements(x.spec(), m, rank);
  const std::vector<sharding::Placement> up_placed = sharding::to_placements(up.spec(), m, 2);
  for (std::size_t a = 0; a < up_placed.size(); ++a) {
    if (up_placed[a].is_shard()) y_placed[a] = sharding::Placement::partial();
  }

  runtime::Frontier done(static_cast<std::size_t>(mesh.size()), runtime::kReady);
  const std::int64_t rows = x.layout().elements_per_device() / layer.hidden;
  const std::int64_t f_local = up.layout().shard_shape()[1];
  const std::int64_t h = layer.hidden;
  const double flops = 2.0 * static_cast<double>(rows * h * f_local) * (gate != nullptr ? 3.0 : 2.0);
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& hs = pb.scratch(s, {rows, f_local});
    runtime::Tensor* us = gate != nullptr ? &pb.scratch(s, {rows, f_local}) : nullptr;
    runtime::Tensor& wu = up.shard(s);
    runtime::Tensor* wg = gate != nullptr ? &gate->shard(s) : nullptr;
    runtime::Tensor& wd = down.shard(s);
    runtime::Tensor& yp = y_partial.shard(s);
    const int d = mesh.device(s).index();
    pb.add_flops(s, flops);
    const runtime::NodeId up_node = pb.graph().add(d, fmt::format("{}.up[{}]", name, s), [&xs, &hs, us, &wu, wg, rows, h] {
      const ConstMatrixMap xm(xs.values().data(), rows, h);
      if (wg == nullptr) {  // GELU
        device_gemm(xm, as_matrix(std::as_const(wu)), as_matrix(hs));
        gelu_inplace(as_matrix(hs));
        return;
      }
      device_gemm(xm, as_matrix(std::as_const(*wg)), as_matrix(hs));
      device_gemm(xm, as_matrix(std::as_const(wu)), as_matrix(*us));
      silu_mul_inplace(as_matrix(hs), as_matrix(std::as_const(*us)));
    });
    if (!after.empty() && after[i] != runtime::kReady) pb.graph().depend(after[i], up_node);
    done[i] = pb.graph().add(d, fmt::format("{}.down[{}]", name, s), [&hs, &wd, &yp, rows, h] {
      device_gemm(as_matrix(std::as_const(hs)), as_matrix(std::as_const(wd)), MatrixMap(yp.values().data(), rows, h));
    }, {up_node});
  }
  return pb.reshard(y_partial, y_placed, y, sharding::to_placements(y.spec(), m, rank), done, name + ".out");
}

ShardedMlp::ShardedMlp(runtime::DeviceMesh mesh, MlpKind kind, const MlpWeights& w,
                       std::int64_t tokens, MlpAxes axes)
    : layer_(MlpLayer::create(mesh, kind, w, axes)), tokens_(tokens) {
  NUMESH_CHECK(tokens > 0, ShapeError, "mlp ({}): {} tokens; need at least one", to_string(kind), tokens);
  ProgramBuilder pb(mesh, fmt::format("mlp ({})", to_string(kind)));
  const std::vector<std::int64_t> shape{tokens, layer_.hidden};
  const PartitionSpec spec =
      sharding::correct_spec(shape, PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}),
                             mesh.mesh())
          .spec;
  x_ = &pb.tensor("x", TensorRole::kInput, shape, spec);
  y_ = &pb.tensor("y", TensorRole::kOutput, shape, spec);
  emit_mlp(pb, layer_, *x_, {}, *y_, "mlp");
  program_ = std::make_unique<Program>(std::move(pb).compile());
}

runtime::HostTensor ShardedMlp::forward(const runtime::HostTensor& x) {
  NUMESH_CHECK(x.shape == (std::vector<std::int64_t>{tokens_, layer_.hidden}), ShapeError,
               "mlp: input is {} but the MLP was compiled for [{}, {}]", shape_text(x), tokens_, layer_.hidden);
  runtime::scatter(x, *x_);
  program_->run();
  return runtime::gather(*y_);
}

}  // namespace numesh::ops
