#include "numesh/ops/reference/mlp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using oracle::wide;

namespace {

void check_mlp_shapes(const char* what, const RowMatrix& x, const RowMatrix& w_in,
                      const RowMatrix& w_out) {
  NUMESH_CHECK(w_in.rows() == x.cols() && w_out.rows() == w_in.cols() && w_out.cols() == x.cols(),
               ShapeError,
               "{}: x [{}, {}], up-projection [{}, {}] and down-projection [{}, {}] do not chain "
               "(expected [T, H], [H, F], [F, H])",
               what, x.rows(), x.cols(), w_in.rows(), w_in.cols(), w_out.rows(), w_out.cols());
}

// A weight matrix as stored in `dtype`, widened.
oracle::MatrixD stored(const RowMatrix& w, DType dtype) {
  return oracle::stored(w.data(), w.rows(), w.cols(), dtype);
}

}  // namespace

float gelu(float x) noexcept { return static_cast<float>(oracle::gelu(x)); }

float silu(float x) noexcept { return static_cast<float>(oracle::silu(x)); }

RowMatrix mlp_gelu_reference(const RowMatrix& x, const RowMatrix& w1, const RowMatrix& w2,
                             DType stored_as) {
  check_mlp_shapes("mlp_gelu", x, w1, w2);
  return oracle::narrow(oracle::gelu_mlp(wide(x), stored(w1, stored_as), stored(w2, stored_as),
                                         MlpFormats::all(stored_as)));
}

RowMatrix mlp_swiglu_reference(const RowMatrix& x, const RowMatrix& w_gate, const RowMatrix& w_up,
                               const RowMatrix& w_down, DType stored_as) {
  check_mlp_shapes("mlp_swiglu", x, w_gate, w_down);
  NUMESH_CHECK(w_up.rows() == w_gate.rows() && w_up.cols() == w_gate.cols(), ShapeError,
               "mlp_swiglu: gate [{}, {}] and up [{}, {}] projections differ in shape",
               w_gate.rows(), w_gate.cols(), w_up.rows(), w_up.cols());
  return oracle::narrow(oracle::swiglu_mlp(wide(x), stored(w_gate, stored_as),
                                           stored(w_up, stored_as), stored(w_down, stored_as),
                                           MlpFormats::all(stored_as)));
}

RowMatrix mlp_reference(const RowMatrix& x, MlpKind kind, const MlpWeights& w) {
  const bool gated = mlp_traits(kind).gated;
  NUMESH_CHECK(
      w.up.shape.size() == 2 && w.down.shape.size() == 2 && (!gated || w.gate.shape == w.up.shape),
      ShapeError, "mlp_{}: gate [{}], up [{}] and down [{}] must be matrices, gate shaped as up",
      to_string(kind), fmt::join(w.gate.shape, ", "), fmt::join(w.up.shape, ", "),
      fmt::join(w.down.shape, ", "));
  const std::int64_t h = w.up.shape[0], f = w.up.shape[1];
  NUMESH_CHECK(x.cols() == h && w.down.shape == (std::vector<std::int64_t>{f, h}), ShapeError,
               "mlp_{}: x [{}, {}], up [{}, {}] and down [{}] do not chain (expected [T, H], [H, "
               "F], [F, H])",
               to_string(kind), x.rows(), x.cols(), h, f, fmt::join(w.down.shape, ", "));
  check_biases(w, kind, h, f);
  return oracle::narrow(oracle::mlp(wide(x), kind, w));
}

}  // namespace numesh::ops
