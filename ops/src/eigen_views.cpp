#include "numesh/ops/eigen_views.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "shape_text.hpp"

namespace numesh::ops {

runtime::HostTensor transposed(const runtime::HostTensor& m) {
  const std::size_t rank = m.shape.size();
  NUMESH_CHECK(rank >= 2, ShapeError, "transposed: {} is not a matrix or a stack of matrices",
               detail::shape_text(m));
  std::vector<std::int64_t> shape = m.shape;
  std::swap(shape[rank - 2], shape[rank - 1]);
  const std::int64_t rows = m.shape[rank - 2], cols = m.shape[rank - 1];
  const std::int64_t matrices =
      std::accumulate(m.shape.begin(), m.shape.end() - 2, std::int64_t{1}, std::multiplies<>());
  // A weight given a shape and no values (not shape_only(): that one is never transposed).
  NUMESH_CHECK(static_cast<std::int64_t>(m.data.size()) == matrices * rows * cols, ShapeError,
               "transposed: {} holds {} values, expected {}", detail::shape_text(m), m.data.size(),
               matrices * rows * cols);
  runtime::HostTensor t = runtime::HostTensor::zeros(shape);
  // In 64 x 64 tiles: element by element, the strided writes touch one element a cache line
  // (a row-by-row loop took 12 % of a bench decode's set-up, which lays every weight out this way).
  constexpr std::int64_t kTile = 64;
  for (std::int64_t b = 0; b < matrices; ++b) {
    const float* from = m.data.data() + b * rows * cols;
    float* to = t.data.data() + b * rows * cols;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
        for (std::int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) {
          for (std::int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
            to[c * rows + r] = from[r * cols + c];
        }
      }
    }
  }
  return t;
}

runtime::HostTensor slice_tokens(const runtime::HostTensor& x, std::int64_t from, std::int64_t n) {
  NUMESH_CHECK(x.shape.size() >= 2 && from >= 0 && n >= 0 && from + n <= x.shape[1], ShapeError,
               "slice_tokens: tokens [{}, {}) of {} (needs [B, T, ...] and the range inside T)",
               from, from + n, detail::shape_text(x));
  std::vector<std::int64_t> shape = x.shape;
  const std::int64_t b = shape[0], t = shape[1];
  const std::int64_t inner =
      std::accumulate(shape.begin() + 2, shape.end(), std::int64_t{1}, std::multiplies<>());
  shape[1] = n;
  runtime::HostTensor out = runtime::HostTensor::zeros(shape);
  for (std::int64_t bi = 0; bi < b; ++bi) {
    std::copy_n(x.data.begin() + (bi * t + from) * inner, n * inner,
                out.data.begin() + bi * n * inner);
  }
  return out;
}

}  // namespace numesh::ops
