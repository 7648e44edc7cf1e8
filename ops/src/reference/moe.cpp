#include "numesh/ops/reference/moe.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "../shape_text.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using detail::shape_text;
using oracle::wide;

RowMatrix moe_reference(const RowMatrix& x, const MoeWeights& w, const MoeConfig& c,
                        MoeStats* stats) {
  const std::int64_t t = x.rows(), h = x.cols(), e = c.num_experts;
  check_moe_config(c);
  NUMESH_CHECK(w.router.shape == (std::vector<std::int64_t>{h, e}), ShapeError,
               "moe: router is {}, expected [{}, {}] for x [{}, {}] and {} experts",
               shape_text(w.router), h, e, t, h, e);
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) &&
                   w.up.shape == w.gate.shape &&
                   w.down.shape == (std::vector<std::int64_t>{e, f, h}),
               ShapeError,
               "moe: expert weights gate {}, up {}, down {} do not fit {} experts and hidden {} "
               "(expected [E, H, F], [E, H, F], [E, F, H])",
               shape_text(w.gate), shape_text(w.up), shape_text(w.down), e, h);
  check_shared_expert(w, h);
  return oracle::narrow(oracle::moe(wide(x), w, c, stats));
}

}  // namespace numesh::ops
