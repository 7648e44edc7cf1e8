#include "numesh/ops/reference/norms.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using oracle::wide;

RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps) {
  NUMESH_CHECK(weight.rows() == 1 && weight.cols() == x.cols(), ShapeError,
               "rmsnorm: weight is [{}, {}], expected [1, {}] for x [{}, {}]", weight.rows(),
               weight.cols(), x.cols(), x.rows(), x.cols());
  NUMESH_CHECK(eps >= 0.0f, ValueError, "rmsnorm: eps {} is negative", eps);
  return oracle::narrow(oracle::rmsnorm(wide(x), wide(weight), eps));
}

}  // namespace numesh::ops
