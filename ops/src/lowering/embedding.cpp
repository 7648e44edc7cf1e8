#include "numesh/ops/lowering/embedding.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

namespace {

using detail::shape_text;
using sharding::AxisRule;
using sharding::PartitionSpec;

// Row `row` of a [rows, h] table shard of `dtype`, widened into `out`.
void widen_row(const runtime::Tensor& table, std::int64_t row, std::int64_t h, float* out) {
  const auto at = static_cast<std::size_t>(row * h), n = static_cast<std::size_t>(h);
  if (!is_element_dtype(table.dtype())) {
    // The row's blocks, dequantized (a row of the table is whole blocks: its shard exists).
    runtime::convert_elements(
        static_cast<const std::byte*>(table.data()) + row_bytes(table.dtype(), row * h),
        table.dtype(), out, DType::kF32, n);
    return;
  }
  switch (element_type(table.dtype())) {
    case ElementType::kF32:
      std::memcpy(out, table.values().data() + at, n * sizeof(float));
      return;
    case ElementType::kBF16:
      runtime::convert_bf16_to_f32(table.bits16().subspan(at, n), {out, n});
      return;
    case ElementType::kF16:
      runtime::convert_f16_to_f32(table.bits16().subspan(at, n), {out, n});
      return;
  }
}

}  // namespace

void check_token_ids(std::span<const std::int32_t> ids, std::int64_t vocab) {
  for (std::size_t r = 0; r < ids.size(); ++r) {
    NUMESH_CHECK(ids[r] >= 0 && ids[r] < vocab, IndexError,
                 "embedding: token {} at position {} is outside the vocabulary [0, {})", ids[r], r,
                 vocab);
  }
}

EmbeddingLayer EmbeddingLayer::create(const runtime::DeviceMesh& mesh, const EmbeddingWeights& w,
                                      const EmbeddingAxes& axes) {
  NUMESH_CHECK(w.table.shape.size() == 2 && w.table.shape[0] >= 1 && w.table.shape[1] >= 1,
               ShapeError, "embedding: table {} must be [V, H] with V, H >= 1",
               shape_text(w.table));
  NUMESH_CHECK(std::isfinite(w.output_scale) && w.output_scale != 0.0f, ValueError,
               "embedding: output_scale {} must be finite and not 0", w.output_scale);
  EmbeddingLayer layer;
  layer.output_scale = w.output_scale;
  layer.vocab = w.table.shape[0];
  layer.hidden = w.table.shape[1];
  const AxisRule vocab = mesh.mesh().has_axis(axes.vocab) ? AxisRule(axes.vocab) : AxisRule();
  layer.table = detail::laid_out(mesh, w.table, PartitionSpec({vocab, AxisRule()}), w.stored_as);
  return layer;
}

runtime::Frontier emit_embedding(ProgramBuilder& pb, const EmbeddingLayer& layer,
                                 const std::vector<std::int32_t>* ids,
                                 const runtime::Frontier& after, runtime::ShardedTensor& x,
                                 const std::string& name) {
  const auto& m = pb.mesh().mesh();
  NUMESH_CHECK(x.shape().size() == 2 && x.shape()[1] == layer.hidden &&
                   x.layout().shard_shape()[1] == layer.hidden,
               ShapeError, "{}: x {} {} does not fit hidden {} (x is [tokens, H], H not split)",
               name, fmt::join(x.shape(), "x"), x.spec().repr(), layer.hidden);
  runtime::ShardedTensor& table = pb.use(name + ".table", TensorRole::kWeight, layer.table);
  // Without a split table (no vocabulary axis, or one of size 1) each device looks its rows up
  // into x directly; with one, into a partial sum over the vocabulary axes that the reshard
  // all-reduces.
  const bool split = table.layout().shard_shape()[0] < layer.vocab;
  runtime::ShardedTensor& out =
      split ? pb.tensor(name + ".partial", TensorRole::kActivation, x.shape(), x.spec()) : x;
  const std::int64_t rows = x.layout().shard_shape()[0], h = layer.hidden;
  const runtime::Frontier looked_up = pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& ts = table.shard(s);
    runtime::Tensor& os = out.shard(s);
    const std::int64_t first_row = x.layout().tile_offset(s)[0];
    const std::int64_t v0 = table.layout().tile_offset(s)[0], v1 = table.layout().tile_limit(s)[0];
    const float scale = layer.output_scale;
    return [&ts, &os, ids, rows, h, first_row, v0, v1, scale] {
      float* dst = os.values().data();
      parallel_blocks(rows, row_block_for(h), [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const std::int64_t id = (*ids)[static_cast<std::size_t>(first_row + r)];
          if (id >= v0 && id < v1) {
            widen_row(ts, id - v0, h, dst + r * h);
            if (scale != 1.0f) {
              for (float* v = dst + r * h; v != dst + (r + 1) * h; ++v) *v *= scale;
            }
          } else {
            std::fill_n(dst + r * h, h, 0.0f);
          }
        }
      });
    };
  });
  if (!split) return looked_up;
  const std::size_t rank = x.shape().size();
  std::vector<sharding::Placement> from = sharding::to_placements(x.spec(), m, rank);
  const std::vector<sharding::Placement> table_placed = sharding::to_placements(table.spec(), m, 2);
  for (std::size_t a = 0; a < table_placed.size(); ++a) {
    if (table_placed[a].is_shard()) from[a] = sharding::Placement::partial();
  }
  return pb.reshard(out, from, x, sharding::to_placements(x.spec(), m, rank), looked_up,
                    name + ".sum");
}

ShardedEmbedding::ShardedEmbedding(runtime::DeviceMesh mesh, const EmbeddingWeights& weights,
                                   std::int64_t tokens, EmbeddingAxes axes)
    : ShardedEmbedding(mesh, EmbeddingLayer::create(mesh, weights, axes), tokens, axes) {}

ShardedEmbedding::ShardedEmbedding(runtime::DeviceMesh mesh, EmbeddingLayer layer,
                                   std::int64_t tokens, EmbeddingAxes axes)
    : layer_(std::move(layer)), tokens_(tokens) {
  NUMESH_CHECK(tokens >= 1, ShapeError, "embedding: {} tokens; need at least one", tokens);
  ids_.assign(static_cast<std::size_t>(tokens), 0);
  const std::vector<std::int64_t> shape{tokens, layer_.hidden};
  const PartitionSpec spec =
      sharding::correct_spec(
          shape, PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}),
          mesh.mesh())
          .spec;
  ProgramBuilder pb(mesh, "embedding");
  runtime::ShardedTensor& x = pb.tensor("x", TensorRole::kOutput, shape, spec);
  pb.output("x", x, emit_embedding(pb, layer_, &ids_, runtime::Frontier{}, x, "embedding"));
  program_ = std::make_unique<Program>(std::move(pb).compile());
}

const runtime::HostTensor& ShardedEmbedding::forward(std::span<const std::int32_t> ids) {
  NUMESH_CHECK(static_cast<std::int64_t>(ids.size()) == tokens_, ShapeError,
               "embedding: {} ids but the program was compiled for {} tokens", ids.size(), tokens_);
  check_token_ids(ids, layer_.vocab);
  std::copy(ids.begin(), ids.end(), ids_.begin());
  program_->run();
  return program_->output("x");
}

}  // namespace numesh::ops
