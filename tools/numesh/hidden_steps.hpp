#pragma once

#include <cstdint>

#include "numesh/runtime/tensor.hpp"

// Inputs of the stacks `numesh run` and `numesh bench decode` drive: they run in hidden space
// (no vocabulary), so prompts are random activations and each decode step feeds the model its
// own last output.

namespace numesh::tools {

/// [batch, tokens, hidden] normal(0, 1) activations from a seeded generator.
runtime::HostTensor random_tokens(std::int64_t batch, std::int64_t tokens, std::int64_t hidden,
                                  std::uint32_t seed);

/// The last position's rows of y [B, T, H] as the next step's input [B, 1, H].
/// REQUIRES: y has rank 3 and T >= 1.
runtime::HostTensor last_token(const runtime::HostTensor& y);

}  // namespace numesh::tools
