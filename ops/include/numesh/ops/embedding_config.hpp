#pragma once

#include "numesh/runtime/tensor.hpp"

// What a token embedding is, independent of how it runs: the table whose row t is token t's
// vector.

namespace numesh::ops {

/// The token embedding's table, in host memory: row t is token t's hidden vector (Hugging
/// Face's embed_tokens.weight as it is).
struct EmbeddingWeights {
  runtime::HostTensor table;  ///< [V, H]
  /// The dtype the table is stored in (as MlpWeights::stored_as); lookups widen exactly.
  DType stored_as = DType::kF32;
};

}  // namespace numesh::ops
