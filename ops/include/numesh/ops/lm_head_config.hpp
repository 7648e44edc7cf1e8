#pragma once

#include <cstdint>

#include "numesh/runtime/tensor.hpp"

// What a language model's head is, independent of how it runs: the matrix that turns the final
// hidden states into logits over the vocabulary, and how the next token is picked from them.

namespace numesh::ops {

/// The LM head's weight, in host memory: logits = x w, w [H, V] (Hugging Face's lm_head.weight
/// [V, H] transposed, or the token embedding's when the model ties them).
struct LmHeadWeights {
  runtime::HostTensor weight;  ///< [H, V]
  /// The dtype the head stores its matrix in (as MlpWeights::stored_as).
  DType stored_as = DType::kF32;
};

/// Vocabularies up to this size: a token id travels as an fp32 value between the devices and
/// the host (every integer up to 2^24 is exact in fp32).
inline constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;

}  // namespace numesh::ops
