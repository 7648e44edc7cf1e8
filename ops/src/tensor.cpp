#include "numesh/ops/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "lowering_util.hpp"

namespace numesh::ops {

double relative_error(const runtime::HostTensor& got, const runtime::HostTensor& want) {
  NUMESH_CHECK(got.shape == want.shape && got.data.size() == want.data.size(), ShapeError,
               "relative_error: {} and {} differ in shape", detail::shape_text(got), detail::shape_text(want));
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.data.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(got.data[i] - want.data[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want.data[i])));
  }
  return scale == 0 ? err : err / scale;
}

runtime::HostTensor slice_tokens(const runtime::HostTensor& x, std::int64_t from, std::int64_t n) {
  NUMESH_CHECK(x.shape.size() >= 2 && from >= 0 && n >= 0 && from + n <= x.shape[1], ShapeError,
               "slice_tokens: tokens [{}, {}) of {} (needs [B, T, ...] and the range inside T)", from, from + n,
               detail::shape_text(x));
  std::vector<std::int64_t> shape = x.shape;
  const std::int64_t b = shape[0], t = shape[1];
  const std::int64_t inner =
      std::accumulate(shape.begin() + 2, shape.end(), std::int64_t{1}, std::multiplies<>());
  shape[1] = n;
  runtime::HostTensor out = runtime::HostTensor::zeros(shape);
  for (std::int64_t bi = 0; bi < b; ++bi) {
    std::copy_n(x.data.begin() + (bi * t + from) * inner, n * inner, out.data.begin() + bi * n * inner);
  }
  return out;
}

}  // namespace numesh::ops
