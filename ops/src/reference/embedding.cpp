#include "numesh/ops/reference/embedding.hpp"

#include "../shape_text.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops {

runtime::HostTensor embedding_reference(std::span<const std::int32_t> ids,
                                        const EmbeddingWeights& w) {
  NUMESH_CHECK(w.table.shape.size() == 2, ShapeError, "embedding: table {} must be [V, H]",
               detail::shape_text(w.table));
  const std::int64_t v = w.table.shape[0], h = w.table.shape[1];
  const runtime::HostTensor stored = runtime::rounded_to(w.table, w.stored_as);
  runtime::HostTensor x = runtime::HostTensor::zeros({static_cast<std::int64_t>(ids.size()), h});
  for (std::size_t r = 0; r < ids.size(); ++r) {
    NUMESH_CHECK(ids[r] >= 0 && ids[r] < v, IndexError,
                 "embedding: token {} at position {} is outside the vocabulary [0, {})", ids[r], r,
                 v);
    std::transform(stored.data.begin() + ids[r] * h, stored.data.begin() + (ids[r] + 1) * h,
                   x.data.begin() + static_cast<std::int64_t>(r) * h,
                   [s = w.output_scale](float value) { return value * s; });
  }
  return x;
}

}  // namespace numesh::ops
