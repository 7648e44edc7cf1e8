#include "numesh/ops/mlp.hpp"

#include <fmt/format.h>

#include <utility>
#include <fmt/ranges.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

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

// Rows per parallel block inside one device: enough work per OpenBLAS call to stay efficient.
constexpr Eigen::Index kRowBlock = 64;

using detail::shape_text;

std::unique_ptr<runtime::ShardedTensor> sharded(const runtime::DeviceMesh& mesh,
                                                std::vector<std::int64_t> shape, PartitionSpec spec) {
  PartitionSpec corrected = sharding::correct_spec(shape, spec, mesh.mesh()).spec;
  return std::make_unique<runtime::ShardedTensor>(mesh, std::move(shape), std::move(corrected));
}

// out = a * b with the rows of a split over the calling device's threads.
void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap out) {
  const Eigen::Index rows = a.rows();
  if (oneapi::tbb::this_task_arena::max_concurrency() == 1 || rows <= kRowBlock) {
    gemm(a, b, out);  // one thread: one call, OpenBLAS's blocking works best on the whole
    return;
  }
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<Eigen::Index>(0, rows, kRowBlock),
      [&](const oneapi::tbb::blocked_range<Eigen::Index>& r) {
        const Eigen::Index n = r.end() - r.begin();
        gemm(ConstMatrixMap(a.data() + r.begin() * a.cols(), n, a.cols()), b,
             MatrixMap(out.data() + r.begin() * out.cols(), n, out.cols()));
      });
}

}  // namespace

std::string_view to_string(MlpKind kind) noexcept {
  return kind == MlpKind::kGelu ? "gelu" : "swiglu";
}

ShardedMlp::ShardedMlp(runtime::DeviceMesh mesh, MlpKind kind, const MlpWeights& w,
                       std::int64_t tokens, MlpAxes axes)
    : kind_(kind) {
  const char* what = kind == MlpKind::kGelu ? "mlp (gelu)" : "mlp (swiglu)";
  NUMESH_CHECK(w.up.shape.size() == 2 && w.down.shape.size() == 2, ShapeError,
               "{}: up {} and down {} must be matrices", what, shape_text(w.up), shape_text(w.down));
  hidden_ = w.up.shape[0];
  intermediate_ = w.up.shape[1];
  tokens_ = tokens;
  NUMESH_CHECK(w.down.shape == (std::vector<std::int64_t>{intermediate_, hidden_}), ShapeError,
               "{}: up {} and down {} do not chain (expected down [{}, {}])", what, shape_text(w.up),
               shape_text(w.down), intermediate_, hidden_);
  NUMESH_CHECK(kind == MlpKind::kGelu || w.gate.shape == w.up.shape, ShapeError,
               "{}: gate {} and up {} differ", what, shape_text(w.gate), shape_text(w.up));
  NUMESH_CHECK(tokens > 0, ShapeError, "{}: {} tokens; need at least one", what, tokens);

  const AxisRule tp = mesh.mesh().has_axis(axes.tensor) ? AxisRule(axes.tensor) : AxisRule();
  x_ = sharded(mesh, {tokens, hidden_}, PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}));
  up_ = sharded(mesh, {hidden_, intermediate_}, PartitionSpec({AxisRule(), tp}));
  down_ = sharded(mesh, {intermediate_, hidden_}, PartitionSpec({tp, AxisRule()}));
  if (kind == MlpKind::kSwiGLU) {
    gate_ = sharded(mesh, {hidden_, intermediate_}, up_->spec());
    runtime::scatter(w.gate, *gate_);
  }
  runtime::scatter(w.up, *up_);
  runtime::scatter(w.down, *down_);
  y_partial_ = std::make_unique<runtime::ShardedTensor>(mesh, x_->shape(), x_->spec());
  y_ = std::make_unique<runtime::ShardedTensor>(mesh, x_->shape(), x_->spec());

  // Placements of the partial output: x's, plus Partial(sum) on the axes that split F.
  const auto& m = mesh.mesh();
  std::vector<sharding::Placement> y_placed = sharding::to_placements(x_->spec(), m, 2);
  const std::vector<sharding::Placement> up_placed = sharding::to_placements(up_->spec(), m, 2);
  for (std::size_t a = 0; a < up_placed.size(); ++a) {
    if (up_placed[a].is_shard()) y_placed[a] = sharding::Placement::partial();
  }

  runtime::GraphBuilder b(mesh.device_set());
  runtime::Frontier done(static_cast<std::size_t>(mesh.size()), runtime::kReady);
  const std::int64_t rows = x_->layout().shard_shape()[0];
  const std::int64_t f_local = up_->layout().shard_shape()[1];
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    runtime::Device& device = mesh.device(s);
    h_.emplace_back(device, std::vector<std::int64_t>{rows, f_local});
    if (kind == MlpKind::kSwiGLU) u_.emplace_back(device, std::vector<std::int64_t>{rows, f_local});
  }
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& x = x_->shard(s);
    runtime::Tensor& h = h_[i];
    runtime::Tensor* u = kind == MlpKind::kSwiGLU ? &u_[i] : nullptr;
    runtime::Tensor& wu = up_->shard(s);
    runtime::Tensor* wg = gate_ ? &gate_->shard(s) : nullptr;
    runtime::Tensor& wd = down_->shard(s);
    runtime::Tensor& yp = y_partial_->shard(s);
    const int d = mesh.device(s).index();
    const runtime::NodeId up_node = b.add(d, fmt::format("mlp.up[{}]", s), [&x, &h, u, &wu, wg] {
      if (wg == nullptr) {  // GELU
        device_gemm(as_matrix(std::as_const(x)), as_matrix(std::as_const(wu)), as_matrix(h));
        gelu_inplace(as_matrix(h));
        return;
      }
      device_gemm(as_matrix(std::as_const(x)), as_matrix(std::as_const(*wg)), as_matrix(h));
      device_gemm(as_matrix(std::as_const(x)), as_matrix(std::as_const(wu)), as_matrix(*u));
      silu_mul_inplace(as_matrix(h), as_matrix(std::as_const(*u)));
    });
    done[i] = b.add(d, fmt::format("mlp.down[{}]", s),
                    [&h, &wd, &yp] { device_gemm(as_matrix(std::as_const(h)), as_matrix(std::as_const(wd)), as_matrix(yp)); }, {up_node});
  }
  reshard_ = reshard(b, *y_partial_, y_placed, *y_, sharding::to_placements(y_->spec(), m, 2), done,
                     "mlp.out");
  graph_ = std::make_unique<runtime::CompiledGraph>(b.compile());
}

runtime::HostTensor ShardedMlp::forward(const runtime::HostTensor& x) {
  NUMESH_CHECK(x.shape == (std::vector<std::int64_t>{tokens_, hidden_}), ShapeError,
               "mlp: input is {} but the MLP was compiled for [{}, {}]", shape_text(x), tokens_, hidden_);
  runtime::scatter(x, *x_);
  graph_->run();
  return runtime::gather(*y_);
}

}  // namespace numesh::ops
