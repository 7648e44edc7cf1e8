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

// The token embedding's reference gradient.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::matrix_dim;
using oracle::MatrixD;

runtime::HostTensor embedding_backward(std::span<const std::int32_t> ids, std::int64_t vocab,
                                       const runtime::HostTensor& dy) {
  const auto rows = static_cast<std::int64_t>(ids.size());
  const std::int64_t h = matrix_dim(dy, 1, "embedding backward: dy");
  const MatrixD g = checked_matrix(dy, rows, h, "embedding backward: dy");
  MatrixD table = MatrixD::Zero(vocab, h);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t id = ids[static_cast<std::size_t>(r)];
    NUMESH_CHECK(id >= 0 && id < vocab, IndexError,
                 "embedding backward: token {} at row {} is outside [0, {})", id, r, vocab);
    table.row(id) += g.row(r);
  }
  return oracle::narrow(table, {vocab, h});
}

}  // namespace numesh::ops
