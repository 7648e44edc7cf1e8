#include "numesh/ops/reference/lm_head.hpp"

#include <cmath>

#include "../shape_text.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using detail::shape_text;

runtime::HostTensor lm_head_reference(const runtime::HostTensor& x, const LmHeadWeights& w) {
  NUMESH_CHECK(w.weight.shape.size() == 2 && x.shape.size() == 2 && x.shape[1] == w.weight.shape[0],
               ShapeError,
               "lm head: x {} and weight {} do not multiply (expected x [rows, H], weight [H, V])",
               shape_text(x), shape_text(w.weight));
  const std::int64_t rows = x.shape[0], h = w.weight.shape[0], v = w.weight.shape[1];
  const oracle::MatrixD xd = oracle::projection_input(oracle::widen(x, rows, h), w.stored_as);
  return oracle::narrow(xd * oracle::stored(w.weight, h, v, w.stored_as), {rows, v});
}

std::vector<std::int64_t> argmax_rows(const runtime::HostTensor& logits) {
  NUMESH_CHECK(logits.shape.size() == 2 && logits.shape[1] > 0, ShapeError,
               "argmax: logits {} must be [rows, V] with V >= 1", shape_text(logits));
  const std::int64_t rows = logits.shape[0], v = logits.shape[1];
  std::vector<std::int64_t> best(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data.data() + r * v;
    std::int64_t at = 0;
    for (std::int64_t j = 1; j < v; ++j) {
      if (std::isnan(row[at])) break;  // the first NaN wins
      if (std::isnan(row[j]) || row[j] > row[at]) at = j;
    }
    best[static_cast<std::size_t>(r)] = at;
  }
  return best;
}

}  // namespace numesh::ops
