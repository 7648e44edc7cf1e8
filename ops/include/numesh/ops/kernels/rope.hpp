#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numesh/ops/rope_scaling.hpp"

// Rotary position embedding on raw buffers: the kernel the lowered attention runs.

namespace numesh::ops {

/// The head_dim / 2 rotation frequencies of RoPE with base `theta` after `scaling`
/// (RopeScaling's formulas), in double.
/// REQUIRES: d even and positive, theta > 0, scaling valid (validate()).
std::vector<double> rope_frequencies(std::int64_t d, double theta, const RopeScaling& scaling = {});

/// Rotary position embedding (rotate-half form) in place on a raw row-major [b, t, h, d]
/// buffer whose token t sits at position first_position + t, frequencies from
/// rope_frequencies(); angles computed in double (Hugging Face computes them in fp32, which
/// loses digits at long positions).
/// With `inverse`, turns every pair back by its angle instead: the transpose of the rotation,
/// RoPE's backward (the gradient of the rotated values to that of the inputs).
/// REQUIRES: d even; scaling valid.
void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta, const RopeScaling& scaling = {},
                  bool inverse = false);

/// As above with the frequencies given (rope_frequencies(d, theta, scaling), d / 2 of them):
/// for callers that turn many calls' rows by the same RoPE (a ragged step turns each token
/// alone), so that the table is built once, not per call. Allocates nothing.
/// REQUIRES: d even; freq.size() == d / 2.
void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, std::span<const double> freq, bool inverse = false);

}  // namespace numesh::ops
