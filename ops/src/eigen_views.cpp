#include "numesh/ops/eigen_views.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "shape_text.hpp"

namespace numesh::ops {

runtime::HostTensor transposed(const runtime::HostTensor& m) {
  NUMESH_CHECK(m.shape.size() == 2, ShapeError, "transposed: {} is not a matrix",
               detail::shape_text(m));
  const std::int64_t rows = m.shape[0], cols = m.shape[1];
  runtime::HostTensor t = runtime::HostTensor::zeros({cols, rows});
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      t.data[static_cast<std::size_t>(c * rows + r)] =
          m.data[static_cast<std::size_t>(r * cols + c)];
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
