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

// The LM head's mean cross-entropy and its reference gradients.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::matrix_dim;
using oracle::MatrixD;

CrossEntropyGrads lm_head_cross_entropy(const runtime::HostTensor& x, const runtime::HostTensor& w,
                                        std::span<const std::int32_t> targets) {
  const std::int64_t rows = matrix_dim(x, 0, "cross entropy: x"),
                     h = matrix_dim(x, 1, "cross entropy: x");
  const std::int64_t v = matrix_dim(w, 1, "cross entropy: w");
  NUMESH_CHECK(rows >= 1 && static_cast<std::int64_t>(targets.size()) == rows, ShapeError,
               "cross entropy: {} targets for {} rows (at least one)", targets.size(), rows);
  const MatrixD xm = checked_matrix(x, rows, h, "cross entropy: x");
  const MatrixD wm = checked_matrix(w, h, v, "cross entropy: w");
  const MatrixD logits = xm * wm;
  // d loss / d logits = (softmax(l) - onehot(target)) / rows.
  MatrixD dl(rows, v);
  double loss = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    NUMESH_CHECK(t >= 0 && t < v, IndexError,
                 "cross entropy: target {} at row {} is outside [0, {})", t, r, v);
    const double top = logits.row(r).maxCoeff();
    double sum = 0.0;
    for (std::int64_t j = 0; j < v; ++j) sum += std::exp(logits(r, j) - top);
    loss += top + std::log(sum) - logits(r, t);
    for (std::int64_t j = 0; j < v; ++j)
      dl(r, j) = std::exp(logits(r, j) - top) / sum / static_cast<double>(rows);
    dl(r, t) -= 1.0 / static_cast<double>(rows);
  }
  return {loss / static_cast<double>(rows), oracle::narrow(dl * wm.transpose(), {rows, h}),
          oracle::narrow(xm.transpose() * dl, {h, v})};
}

}  // namespace numesh::ops
