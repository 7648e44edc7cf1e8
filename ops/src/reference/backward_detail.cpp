#include "backward_detail.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops::oracle {

// t as a [rows, cols] matrix, after checking it has that shape (2-D, or [cols] for rows 1).
MatrixD checked_matrix(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols,
                       const char* what) {
  const bool fits = (t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols) ||
                    (rows == 1 && t.shape.size() == 1 && t.shape[0] == cols);
  NUMESH_CHECK(fits, ShapeError, "{} is [{}], expected [{}, {}]", what, fmt::join(t.shape, ", "),
               rows, cols);
  return oracle::widen(t, rows, cols);
}

std::int64_t matrix_dim(const runtime::HostTensor& t, std::size_t i, const char* what) {
  NUMESH_CHECK(t.shape.size() == 2, ShapeError, "{} is [{}], expected a matrix", what,
               fmt::join(t.shape, ", "));
  return t.shape[i];
}

// A gated MLP's gradients in float64: x [rows, H], w_gate and w_up [H, F], w_down [F, H],
// g = dy [rows, H].
// `gate_bias` and `up_bias`: [1, F] rows added to the pre-activations (empty: none).
GatedGradsD gated_gradients(Activation act, const MatrixD& xm, const MatrixD& wg, const MatrixD& wu,
                            const MatrixD& wd, const MatrixD& g, const MatrixD& gate_bias,
                            const MatrixD& up_bias) {
  MatrixD a = xm * wg, b = xm * wu;  // gate and up pre-activations
  if (gate_bias.size() > 0) a.rowwise() += gate_bias.row(0);
  if (up_bias.size() > 0) b.rowwise() += up_bias.row(0);
  const Eigen::Index rows = xm.rows(), f = wg.cols();
  MatrixD hidden(rows, f), da(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = act(a) .* b
  for (Eigen::Index r = 0; r < rows; ++r) {
    for (Eigen::Index j = 0; j < f; ++j) {
      const double value = activation(act, a(r, j));
      hidden(r, j) = value * b(r, j);
      db(r, j) = dz(r, j) * value;
      da(r, j) = dz(r, j) * b(r, j) * activation_slope(act, a(r, j));
    }
  }
  return {da * wg.transpose() + db * wu.transpose(),
          xm.transpose() * da,
          xm.transpose() * db,
          hidden.transpose() * g,
          da.colwise().sum(),
          db.colwise().sum()};
}

// RMSNorm's backward for one row z of n values: y = z s w with s = (mean(z^2) + eps)^(-1/2)
// and ds/dz_j = -s^3 z_j / n. `g` holds dy and becomes dz; the row's term is added to dw.
void rmsnorm_row_backward(ConstRowRef z, ConstRowRef w, double eps, RowRef g, RowRef dw) {
  const auto n = static_cast<double>(z.size());
  const double s = 1.0 / std::sqrt(z.squaredNorm() / n + eps);
  const double gwz = (g.array() * w.array() * z.array()).sum();  // sum_j dy_j w_j z_j
  dw.array() += g.array() * z.array() * s;
  g = (s * g.array() * w.array() - s * s * s * z.array() * gwz / n).matrix();
}

}  // namespace numesh::ops::oracle
