#pragma once

#include "numesh/runtime/tensor.hpp"

// What a token embedding is, independent of how it runs: the table whose row t is token t's
// vector (times a constant scale).

namespace numesh::ops {

/// The token embedding's table, in host memory: row t is token t's hidden vector (Hugging
/// Face's embed_tokens.weight as it is).
struct EmbeddingWeights {
  runtime::HostTensor table;  ///< [V, H]
  /// The dtype the table is stored in (as MlpWeights::stored_as); lookups widen exactly.
  DType stored_as = DType::kF32;
  /// Every vector looked up is multiplied by it, in fp32 (Gemma: sqrt(H)); 1: as stored. An LM
  /// head tied to the table reads the table itself, unscaled.
  float output_scale = 1.0f;
};

}  // namespace numesh::ops
