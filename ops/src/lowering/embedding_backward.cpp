// The embedding's backward (declared in lowering/embedding.hpp, next to its forward).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/ops/lowering/embedding.hpp"
#include "numesh/ops/lowering/gradients.hpp"

namespace numesh::ops {

runtime::Frontier emit_embedding_backward(ProgramBuilder& pb, const EmbeddingLayer& layer,
                                          const std::vector<std::int32_t>* ids,
                                          runtime::ShardedTensor& dx,
                                          const runtime::Frontier& after,
                                          runtime::ShardedTensor& d_table,
                                          const std::string& name) {
  const auto& m = pb.mesh().mesh();
  const std::int64_t h = layer.hidden;
  NUMESH_CHECK(dx.shape().size() == 2 && dx.shape()[1] == h && dx.layout().shard_shape()[1] == h,
               ShapeError, "{}: dx {} {} does not fit hidden {} (dx is [tokens, H], H not split)",
               name, fmt::join(dx.shape(), "x"), dx.spec().repr(), h);
  check_laid_out_like(d_table, *layer.table, "the table's gradient", name);
  const std::vector<sharding::Placement> x_placed = sharding::to_placements(dx.spec(), m, 2);
  runtime::ShardedTensor& partial =
      weight_gradient_target(pb, d_table, x_placed, 2, d_table, name + ".grad_partial");
  const std::int64_t rows = dx.layout().shard_shape()[0];
  const runtime::Frontier added = pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& dxs = dx.shard(s);
    runtime::Tensor& ps = partial.shard(s);
    const std::int64_t first_row = dx.layout().tile_offset(s)[0];
    const std::int64_t v0 = partial.layout().tile_offset(s)[0],
                       v1 = partial.layout().tile_limit(s)[0];
    const float scale = layer.output_scale;  // x * 1 is x: the unscaled sums keep their bits
    return [&dxs, &ps, ids, rows, h, first_row, v0, v1, scale] {
      const float* g = dxs.values().data();
      float* table = ps.values().data();
      std::fill_n(table, (v1 - v0) * h, 0.0f);
      // Blocks of columns, each over every row in order: repeated tokens add up in the same
      // order whatever the threads.
      parallel_blocks(h, std::max<std::int64_t>(64, h / 16), [&](std::int64_t c0, std::int64_t c1) {
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t id = (*ids)[static_cast<std::size_t>(first_row + r)];
          if (id < v0 || id >= v1) continue;
          float* dst = table + (id - v0) * h;
          const float* src = g + r * h;
          for (std::int64_t c = c0; c < c1; ++c) dst[c] += scale * src[c];
        }
      });
    };
  });
  return reduce_weight_gradient(pb, partial, d_table, x_placed, 2, d_table, added, name + ".grad");
}

}  // namespace numesh::ops
