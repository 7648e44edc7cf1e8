#pragma once

#include <cstddef>
#include <cstdint>

#include "kquant_search.hpp"
#include "numesh/runtime/cpu_features.hpp"

// PRIVATE to runtime/src: what GGML's Q4_K and Q5_K reference quantizers (block_q4_k.cpp,
// block_q5_k.cpp) share. Both cut a super-block of 256 into eight sub-blocks of 32, fit each
// with make_qkx2_quants (x ~ scale * code + min, min <= 0) and code the eight scales and eight
// negated minimums in 6 bits against the largest (get_scale_min_k4's 12 bytes, f16 d and dmin);
// only the codes' width and the search's trial scales differ, and how the codes are packed.

namespace numesh::runtime::detail {

/// make_qkx2_quants's parameters: codes 0 .. max_code; trial step counts
/// max_code + rmin + rdelta * step for step 0 .. steps.
struct Qkx2Search {
  int max_code;
  float rmin;
  float rdelta;
  int steps;
};

/// GGML's get_scale_min_k4: sub-block s's 6-bit scale and minimum codes from the 12 packed bytes.
void kquant_scale_min(std::size_t s, const std::uint8_t* packed, int& scale, int& min);

/// quantize_row_q4_K_ref's and quantize_row_q5_K_ref's work on the super-block at `in` (256
/// finite values; the caller checks) but the packing of the codes: each sub-block's search, the
/// 6-bit codes in `packed` (12 bytes), d and dmin as f16 bits, and every code again against the
/// scale and minimum as stored, into codes[0 .. 256) (0 .. search.max_code). From kAvx2 the
/// eight sub-blocks' searches run side by side in vector lanes: the same bytes at every level.
void quantize_minimum_super_block(const float* in, const Qkx2Search& search, std::uint8_t* codes,
                                  std::uint8_t* packed, std::uint16_t& d, std::uint16_t& dmin,
                                  KernelLevel level);

/// Chunk c's (elements [64 c, 64 c + 64)) two sub-blocks' scales d sc and minimums dmin m from
/// the 12 packed bytes, as GGML's dequantizers compute them (one f32 product each).
struct ChunkScales {
  float d_low, min_low, d_high, min_high;
};
ChunkScales kquant_chunk_scales(const std::uint8_t* packed, float d, float dmin, std::size_t c);

}  // namespace numesh::runtime::detail
