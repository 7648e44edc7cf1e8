#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/embedding_config.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"

// The token embedding lowered onto a device mesh, vocabulary-parallel as Megatron and EasyDeL
// lay it out: each device holds a slice of the table's rows, writes the rows of the tokens that
// fall in its slice (zeros for the others), and an all-reduce over the vocabulary axis sums the
// devices' parts into every token's vector.

namespace numesh::ops {

/// Mesh axes the embedding is split over (eformer's names by default).
struct EmbeddingAxes {
  /// Tokens are split over these axes; replicated when the token count does not divide.
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// The table's rows (the vocabulary) are split over this axis; replicated when the mesh lacks
  /// it or V does not divide.
  std::string vocab = "tp";
};

/// The table laid out on a mesh: [V, H] P(vocab, None), stored as EmbeddingWeights::stored_as.
struct EmbeddingLayer {
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
  std::shared_ptr<runtime::ShardedTensor> table;
  float output_scale = 1.0f;  ///< EmbeddingWeights::output_scale

  /// Throws: ShapeError naming the shape when the table is not [V, H] with V, H >= 1;
  /// ValueError when output_scale is not finite or is 0.
  [[nodiscard]] static EmbeddingLayer create(const runtime::DeviceMesh& mesh,
                                             const EmbeddingWeights& weights,
                                             const EmbeddingAxes& axes = {});
};

/// Emits x[r, :] = table[ids[r], :] * output_scale into x [rows, H] (H not split): each device
/// fills its rows
/// from its slice of the table (zeros where a token lies outside it), then the devices' parts
/// are summed over the vocabulary axes (an all-reduce; nothing when the table is not split).
/// `ids` is read when the program runs, so one compiled program serves every call.
/// REQUIRES: *ids holds rows ids in [0, V) whenever the program runs, and outlives it (callers
/// check the ids first: ShardedEmbedding does).
/// Throws: ShapeError naming the shapes when x does not fit the layer.
runtime::Frontier emit_embedding(ProgramBuilder& program, const EmbeddingLayer& layer,
                                 const std::vector<std::int32_t>* ids,
                                 const runtime::Frontier& after, runtime::ShardedTensor& x,
                                 const std::string& name);

/// The backward of emit_embedding: given dx (the gradient of x, laid out like x), overwrites
/// d_table (laid out as the table: gradient_like) with each row of dx, times output_scale,
/// added into its token's row (repeated tokens accumulate, in row order). Each device adds the rows
/// whose tokens fall in its slice of the vocabulary into its slice; the slices are then all-reduced
/// over the axes splitting the tokens. The forward's all-reduce over the vocabulary axes has an
/// identity backward (gradients.hpp). REQUIRES: as emit_embedding, the same ids as the forward
/// read. Returns the frontier after which d_table is complete. Throws: ShapeError naming the shapes
/// when dx or d_table does not fit.
runtime::Frontier emit_embedding_backward(ProgramBuilder& program, const EmbeddingLayer& layer,
                                          const std::vector<std::int32_t>* ids,
                                          runtime::ShardedTensor& dx,
                                          const runtime::Frontier& after,
                                          runtime::ShardedTensor& d_table, const std::string& name);

/// The embedding lowered onto a device mesh for a fixed number of tokens, one program compiled
/// once. Not thread-safe: one thread drives an instance.
class ShardedEmbedding {
 public:
  /// Throws: as EmbeddingLayer::create; ShapeError when tokens < 1.
  ShardedEmbedding(runtime::DeviceMesh mesh, const EmbeddingWeights& weights, std::int64_t tokens,
                   EmbeddingAxes axes = {});
  /// The same over a table already laid out on `mesh` (programs for several token counts
  /// share it). Throws: ShapeError when tokens < 1.
  ShardedEmbedding(runtime::DeviceMesh mesh, EmbeddingLayer layer, std::int64_t tokens,
                   EmbeddingAxes axes = {});
  /// The vectors [tokens, H] of `ids`: the program's output, valid until the next call (copy it
  /// to keep it; a step that only reads it allocates nothing).
  /// Throws: ShapeError when ids.size() is not the token count; IndexError naming the position
  /// and the id when an id is outside [0, V) (before anything runs).
  const runtime::HostTensor& forward(std::span<const std::int32_t> ids);
  /// The table's spec after correction.
  const sharding::PartitionSpec& table_spec() const noexcept { return layer_.table->spec(); }
  /// The program (plan: the all-reduce when the table is split).
  Program& program() noexcept { return *program_; }

 private:
  EmbeddingLayer layer_;
  std::int64_t tokens_;
  std::vector<std::int32_t> ids_;  // read by the program's nodes
  std::unique_ptr<Program> program_;
};

/// Checks that every id lies in [0, vocab).
/// Throws: IndexError "embedding: token T at position P is outside the vocabulary [0, V)".
void check_token_ids(std::span<const std::int32_t> ids, std::int64_t vocab);

}  // namespace numesh::ops
