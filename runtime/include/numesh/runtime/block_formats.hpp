#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

// GGML's Q8_0 and Q4_0 block formats (ggml/src/ggml-common.h's block_q8_0 and block_q4_0): a
// row of weights cut into runs of 32 elements, each stored as one f16 scale and 32 small integer
// codes. The quantizers write exactly the bytes of GGML's reference quantizers
// (quantize_row_q8_0_ref, quantize_row_q4_0_ref in ggml-quants.c), so a numesh-written block and
// a GGUF file's block are interchangeable; the dequantizers compute exactly what GGML's
// dequantize_row_q8_0 / dequantize_row_q4_0 compute. tests/runtime/block_formats_check.py checks
// both against a NumPy transcription of GGML's definitions (and, given a built libggml-base,
// against GGML itself).
//
// Where GGML's reference is undefined or silently writes garbage, numesh decides:
// - A non-finite input (NaN, ±inf) is refused with ValueError naming the first one's index.
//   GGML writes a block that looks valid: its max skips a NaN (unless it is the block's last
//   element, which makes d NaN) and the NaN's code is an undefined conversion (0 on x86: 0 for
//   q8_0, but -8 d, the opposite extreme, for q4_0); an infinity makes d infinite and every
//   other code 0 (q8_0) or 8 (q4_0). A weight loader must not store that as if it were a weight.
// - A block whose magnitudes are all below about 3.7e-37 (q8_0) or 2.4e-38 (q4_0) has a scale
//   whose reciprocal overflows to infinity; GGML then converts ±inf or NaN to an integer, which
//   C leaves undefined. numesh writes what x86-64 builds of GGML write there (the conversion
//   gives 0x80000000, low byte 0): every code 0, so q8_0 codes 0 and q4_0 bytes 0x00 (C does not
//   promise that elsewhere). The scale is an f16 zero there, so the block dequantizes to zeros
//   (of either sign) whatever its codes.
// - A scale beyond f16's range (a block whose largest magnitude exceeds about 8.3e6 for q8_0 or
//   5.2e5 for q4_0) is stored as f16 infinity, as GGML stores it; such a block dequantizes to
//   ±inf (and NaN for its zero codes). Q8_0 and Q4_0 are for weights of ordinary magnitude.

namespace numesh::runtime {

/// Elements in one Q8_0 block (GGML's QK8_0).
inline constexpr std::int64_t kQ8_0BlockElements = 32;
/// Elements in one Q4_0 block (GGML's QK4_0).
inline constexpr std::int64_t kQ4_0BlockElements = 32;

/// GGML's block_q8_0: element j of the block is f32(d) * qs[j].
struct BlockQ8_0 {
  std::uint16_t d;     ///< IEEE binary16 bits of the scale
  std::int8_t qs[32];  ///< codes, -127 .. 127 as written by quantize_q8_0
};
static_assert(sizeof(BlockQ8_0) == 34 && alignof(BlockQ8_0) == 2, "GGML's block_q8_0 layout");
static_assert(offsetof(BlockQ8_0, qs) == 2 && std::is_trivially_copyable_v<BlockQ8_0>);

/// GGML's block_q4_0: byte j holds code q[j] in its low nibble and q[j + 16] in its high
/// nibble; element j of the block is (q[j] - 8) * f32(d).
struct BlockQ4_0 {
  std::uint16_t d;      ///< IEEE binary16 bits of the scale
  std::uint8_t qs[16];  ///< two 4-bit codes a byte
};
static_assert(sizeof(BlockQ4_0) == 18 && alignof(BlockQ4_0) == 2, "GGML's block_q4_0 layout");
static_assert(offsetof(BlockQ4_0, qs) == 2 && std::is_trivially_copyable_v<BlockQ4_0>);

/// Quantizes x to Q8_0, block b from x[32 b, 32 b + 32), with GGML's quantize_row_q8_0_ref's
/// bytes: d = max|x| / 127 (f32, then f16 rounded to nearest even), qs[j] = x[j] / d rounded
/// half away from zero.
/// Throws: ShapeError naming both sizes unless x.size() == 32 * y.size(); ValueError naming the
/// index and value of the first non-finite element of x (blocks before its block are written,
/// the others are left as they were).
void quantize_q8_0(std::span<const float> x, std::span<BlockQ8_0> y);

/// x[32 b + j] = f32(y[b].d) * y[b].qs[j], as GGML's dequantize_row_q8_0.
/// Throws: ShapeError naming both sizes unless x.size() == 32 * y.size().
void dequantize_q8_0(std::span<const BlockQ8_0> y, std::span<float> x);

/// Quantizes x to Q4_0, block b from x[32 b, 32 b + 32), with GGML's quantize_row_q4_0_ref's
/// bytes: m = the block's element of largest magnitude (the first on ties; +0 for a block of
/// zeros), d = m / -8, q[j] = min(15, trunc(x[j] / d + 8.5)) in f32, so m itself is code 0 and
/// -m would be 16, clamped to 15.
/// Throws: as quantize_q8_0.
void quantize_q4_0(std::span<const float> x, std::span<BlockQ4_0> y);

/// x[32 b + j] = (q[j] - 8) * f32(y[b].d), as GGML's dequantize_row_q4_0.
/// Throws: ShapeError naming both sizes unless x.size() == 32 * y.size().
void dequantize_q4_0(std::span<const BlockQ4_0> y, std::span<float> x);

}  // namespace numesh::runtime
