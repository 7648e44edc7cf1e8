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

// RMSNorm's and LayerNorm's reference gradients.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::matrix_dim;
using oracle::MatrixD;

RmsNormGrads rmsnorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                              const runtime::HostTensor& dy, double eps) {
  NUMESH_CHECK(eps >= 0.0, ValueError, "rmsnorm backward: eps {} is negative", eps);
  const std::int64_t rows = matrix_dim(x, 0, "rmsnorm backward: x"),
                     h = matrix_dim(x, 1, "rmsnorm backward: x");
  const MatrixD xm = checked_matrix(x, rows, h, "rmsnorm backward: x");
  const MatrixD w = checked_matrix(weight, 1, h, "rmsnorm backward: weight");
  MatrixD dx = checked_matrix(dy, rows, h, "rmsnorm backward: dy"), dw = MatrixD::Zero(1, h);
  for (std::int64_t r = 0; r < rows; ++r)
    oracle::rmsnorm_row_backward(xm.row(r), w.row(0), eps, dx.row(r), dw.row(0));
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(dw, {1, h})};
}

LayerNormGrads layernorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                                  const runtime::HostTensor& dy, double eps) {
  NUMESH_CHECK(eps >= 0.0, ValueError, "layernorm backward: eps {} is negative", eps);
  const std::int64_t rows = matrix_dim(x, 0, "layernorm backward: x"),
                     h = matrix_dim(x, 1, "layernorm backward: x");
  const MatrixD xm = checked_matrix(x, rows, h, "layernorm backward: x");
  const MatrixD w = checked_matrix(weight, 1, h, "layernorm backward: weight");
  const MatrixD g = checked_matrix(dy, rows, h, "layernorm backward: dy");
  // y = x̂ w + b with x̂ = (x - mean) s, s = (var + eps)^(-1/2): d x̂ = dy w, and through the
  // mean and the variance dx = s (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)).
  MatrixD dx(rows, h), dw = MatrixD::Zero(1, h);
  const auto n = static_cast<double>(h);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double mean = xm.row(r).sum() / n;
    const double s = 1.0 / std::sqrt((xm.row(r).array() - mean).square().sum() / n + eps);
    const Eigen::RowVectorXd xhat = ((xm.row(r).array() - mean) * s).matrix();
    const Eigen::RowVectorXd dxhat = g.row(r).cwiseProduct(w.row(0));
    dw.row(0) += g.row(r).cwiseProduct(xhat);
    dx.row(r) =
        (s * (dxhat.array() - dxhat.sum() / n - xhat.array() * dxhat.dot(xhat) / n)).matrix();
  }
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(dw, {1, h}),
          oracle::narrow(g.colwise().sum(), {1, h})};
}

}  // namespace numesh::ops
