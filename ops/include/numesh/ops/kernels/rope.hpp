#pragma once

#include <cstdint>

// Rotary position embedding on raw buffers: the kernel the lowered attention runs.

namespace numesh::ops {

/// Rotary position embedding (rotate-half form) in place on a raw row-major [b, t, h, d]
/// buffer whose token t sits at position first_position + t; angles computed in double.
/// REQUIRES: d even.
void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta);

}  // namespace numesh::ops
