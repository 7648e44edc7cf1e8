#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <utility>
#include <vector>

#include "backward_detail.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/backward.hpp"

// The linear layer's and the MLPs' reference gradients.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::GatedGradsD;
using oracle::matrix_dim;
using oracle::MatrixD;

LinearGrads linear_backward(const runtime::HostTensor& x, const runtime::HostTensor& w,
                            const runtime::HostTensor& dy) {
  const std::int64_t rows = matrix_dim(x, 0, "linear backward: x"),
                     in = matrix_dim(x, 1, "linear backward: x");
  const std::int64_t out = matrix_dim(w, 1, "linear backward: w");
  const MatrixD xm = checked_matrix(x, rows, in, "linear backward: x");
  const MatrixD wm = checked_matrix(w, in, out, "linear backward: w");
  const MatrixD g = checked_matrix(dy, rows, out, "linear backward: dy");
  return {oracle::narrow(g * wm.transpose(), {rows, in}),
          oracle::narrow(xm.transpose() * g, {in, out})};
}

namespace {

// The gated MLP's gradients (`what`: "swiglu backward", ...).
MlpGrads gated_mlp_backward(const std::string& what, Activation act, const MatrixD& xm,
                            const MlpWeights& w, const MatrixD& g, std::int64_t h, std::int64_t f) {
  const auto label = [&](const char* part) { return fmt::format("{}: {}", what, part); };
  const MatrixD wg = checked_matrix(w.gate, h, f, label("gate").c_str());
  const MatrixD wu = checked_matrix(w.up, h, f, label("up").c_str());
  const MatrixD wd = checked_matrix(w.down, f, h, label("down").c_str());
  const auto bias = [&](const runtime::HostTensor& b, std::int64_t n, const char* part) {
    return b.shape.empty() ? MatrixD() : checked_matrix(b, 1, n, label(part).c_str());
  };
  const GatedGradsD d = oracle::gated_gradients(
      act, xm, wg, wu, wd, g, bias(w.gate_bias, f, "gate bias"), bias(w.up_bias, f, "up bias"));
  (void)bias(w.down_bias, h, "down bias");  // checks its shape
  MlpGrads out;
  out.dx = oracle::narrow(d.dx, {xm.rows(), h});
  out.dgate = oracle::narrow(d.dgate, {h, f});
  out.dup = oracle::narrow(d.dup, {h, f});
  out.ddown = oracle::narrow(d.ddown, {f, h});
  // Each bias' gradient keeps its bias' shape.
  if (!w.gate_bias.shape.empty()) out.dgate_bias = oracle::narrow(d.dgate_bias, w.gate_bias.shape);
  if (!w.up_bias.shape.empty()) out.dup_bias = oracle::narrow(d.dup_bias, w.up_bias.shape);
  if (!w.down_bias.shape.empty())
    out.ddown_bias = oracle::narrow(g.colwise().sum(), w.down_bias.shape);
  return out;
}

// The ungated MLP's gradients: y = act(x w_up + b_up) w_down + b_down.
MlpGrads plain_mlp_backward(const std::string& what, Activation act, const MatrixD& xm,
                            const MlpWeights& w, const MatrixD& g, std::int64_t h, std::int64_t f) {
  const auto label = [&](const char* part) { return fmt::format("{}: {}", what, part); };
  const MatrixD wu = checked_matrix(w.up, h, f, label("up").c_str());
  const MatrixD wd = checked_matrix(w.down, f, h, label("down").c_str());
  const std::int64_t rows = xm.rows();
  MatrixD b = xm * wu;  // pre-activation
  if (!w.up_bias.shape.empty())
    b.rowwise() += checked_matrix(w.up_bias, 1, f, label("up bias").c_str()).row(0);
  MatrixD hidden(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = act(b)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < f; ++j) {
      hidden(r, j) = oracle::activation(act, b(r, j));
      db(r, j) = dz(r, j) * oracle::activation_slope(act, b(r, j));
    }
  }
  MlpGrads out;
  out.dx = oracle::narrow(db * wu.transpose(), {rows, h});
  out.dup = oracle::narrow(xm.transpose() * db, {h, f});
  out.ddown = oracle::narrow(hidden.transpose() * g, {f, h});
  if (!w.up_bias.shape.empty()) out.dup_bias = oracle::narrow(db.colwise().sum(), w.up_bias.shape);
  if (!w.down_bias.shape.empty()) {
    (void)checked_matrix(w.down_bias, 1, h, label("down bias").c_str());  // checks its shape
    out.ddown_bias = oracle::narrow(g.colwise().sum(), w.down_bias.shape);
  }
  return out;
}

}  // namespace

MlpGrads mlp_backward(const runtime::HostTensor& x, MlpKind kind, const MlpWeights& w,
                      const runtime::HostTensor& dy) {
  const MlpKindTraits traits = mlp_traits(kind);
  const std::string what = fmt::format("{} backward", traits.name);
  NUMESH_CHECK(w.stored_as.all_are(DType::kF32), NotImplementedError,
               "{}: 16-bit weights are not differentiated yet", what);
  const std::int64_t rows = matrix_dim(x, 0, fmt::format("{}: x", what).c_str()),
                     h = matrix_dim(x, 1, fmt::format("{}: x", what).c_str());
  const std::int64_t f = matrix_dim(w.up, 1, fmt::format("{}: up", what).c_str());
  const MatrixD xm = checked_matrix(x, rows, h, fmt::format("{}: x", what).c_str());
  const MatrixD g = checked_matrix(dy, rows, h, fmt::format("{}: dy", what).c_str());
  return traits.gated ? gated_mlp_backward(what, traits.activation, xm, w, g, h, f)
                      : plain_mlp_backward(what, traits.activation, xm, w, g, h, f);
}

}  // namespace numesh::ops
