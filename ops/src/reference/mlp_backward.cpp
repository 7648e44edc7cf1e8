#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "backward_detail.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/backward.hpp"

// The linear layer's and the MLPs' (SwiGLU, GELU) reference gradients.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::matrix_dim;
using oracle::MatrixD;
using oracle::SwigluGradsD;

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

MlpGrads swiglu_mlp_backward(const runtime::HostTensor& x, const MlpWeights& w,
                             const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.stored_as == DType::kF32, NotImplementedError,
               "swiglu backward: 16-bit weights are not differentiated yet");
  const std::int64_t rows = matrix_dim(x, 0, "swiglu backward: x"),
                     h = matrix_dim(x, 1, "swiglu backward: x");
  const std::int64_t f = matrix_dim(w.up, 1, "swiglu backward: up");
  const MatrixD xm = checked_matrix(x, rows, h, "swiglu backward: x");
  const MatrixD wg = checked_matrix(w.gate, h, f, "swiglu backward: gate");
  const MatrixD wu = checked_matrix(w.up, h, f, "swiglu backward: up");
  const MatrixD wd = checked_matrix(w.down, f, h, "swiglu backward: down");
  const MatrixD g = checked_matrix(dy, rows, h, "swiglu backward: dy");
  const auto bias = [&](const runtime::HostTensor& b, std::int64_t n, const char* what) {
    return b.shape.empty() ? MatrixD() : checked_matrix(b, 1, n, what);
  };
  const SwigluGradsD d = oracle::swiglu_gradients(
      xm, wg, wu, wd, g, bias(w.gate_bias, f, "swiglu backward: gate bias"),
      bias(w.up_bias, f, "swiglu backward: up bias"));
  (void)bias(w.down_bias, h, "swiglu backward: down bias");  // checks its shape
  MlpGrads out;
  out.dx = oracle::narrow(d.dx, {rows, h});
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

MlpGrads gelu_mlp_backward(const runtime::HostTensor& x, const MlpWeights& w,
                           const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.stored_as == DType::kF32, NotImplementedError,
               "gelu backward: 16-bit weights are not differentiated yet");
  const std::int64_t rows = matrix_dim(x, 0, "gelu backward: x"),
                     h = matrix_dim(x, 1, "gelu backward: x");
  const std::int64_t f = matrix_dim(w.up, 1, "gelu backward: up");
  const MatrixD xm = checked_matrix(x, rows, h, "gelu backward: x");
  const MatrixD wu = checked_matrix(w.up, h, f, "gelu backward: up");
  const MatrixD wd = checked_matrix(w.down, f, h, "gelu backward: down");
  const MatrixD g = checked_matrix(dy, rows, h, "gelu backward: dy");
  MatrixD b = xm * wu;  // pre-activation
  if (!w.up_bias.shape.empty())
    b.rowwise() += checked_matrix(w.up_bias, 1, f, "gelu backward: up bias").row(0);
  MatrixD act(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = gelu(b)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < f; ++j) {
      // gelu(b) = b Phi(b); gelu'(b) = Phi(b) + b phi(b).
      const double v = b(r, j);
      const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * std::numbers::pi);
      act(r, j) = v * cdf;
      db(r, j) = dz(r, j) * (cdf + v * pdf);
    }
  }
  MlpGrads out;
  out.dx = oracle::narrow(db * wu.transpose(), {rows, h});
  out.dup = oracle::narrow(xm.transpose() * db, {h, f});
  out.ddown = oracle::narrow(act.transpose() * g, {f, h});
  if (!w.up_bias.shape.empty()) out.dup_bias = oracle::narrow(db.colwise().sum(), w.up_bias.shape);
  if (!w.down_bias.shape.empty()) {
    (void)checked_matrix(w.down_bias, 1, h, "gelu backward: down bias");  // checks its shape
    out.ddown_bias = oracle::narrow(g.colwise().sum(), w.down_bias.shape);
  }
  return out;
}

}  // namespace numesh::ops
