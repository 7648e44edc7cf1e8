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

RowMatrix layernorm_reference(const RowMatrix& x, const RowMatrix& weight, const RowMatrix& bias,
                              float eps) {
  NUMESH_CHECK(weight.rows() == 1 && weight.cols() == x.cols(), ShapeError,
               "layernorm: weight is [{}, {}], expected [1, {}] for x [{}, {}]", weight.rows(),
               weight.cols(), x.cols(), x.rows(), x.cols());
  NUMESH_CHECK(bias.size() == 0 || (bias.rows() == 1 && bias.cols() == x.cols()), ShapeError,
               "layernorm: bias is [{}, {}], expected [1, {}] or none", bias.rows(), bias.cols(),
               x.cols());
  NUMESH_CHECK(eps >= 0.0f, ValueError, "layernorm: eps {} is negative", eps);
  return oracle::narrow(oracle::layernorm(wide(x), wide(weight),
                                          bias.size() > 0 ? wide(bias) : oracle::MatrixD(), eps));
}

}  // namespace numesh::ops
