#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

// GGML's Q8_0, Q4_0, Q5_0 and IQ4_NL block formats (ggml/src/ggml-common.h's block_q8_0,
// block_q4_0, block_q5_0 and block_iq4_nl): a row of weights cut into runs of 32 elements, each
// stored as one f16 scale and 32 small integer codes (IQ4_NL's index a codebook of 16 values);
// and its Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS "super-block" formats (block_q3_K, block_q4_K,
// block_q5_K, block_q6_K, block_iq4_xs): runs of 256 elements, cut into sub-blocks (8 of 32 for
// Q4_K, Q5_K and IQ4_XS, 16 of 16 for Q3_K and Q6_K) whose own scales (and Q4_K's and Q5_K's
// minimums) are stored as 6- or 8-bit codes of one or two f16 super-block scales. The quantizers
// write exactly the bytes of GGML's reference quantizers (quantize_row_q8_0_ref,
// quantize_row_q4_0_ref, quantize_row_q5_0_ref, quantize_row_q3_K_ref, quantize_row_q4_K_ref,
// quantize_row_q5_K_ref, quantize_row_q6_K_ref in ggml-quants.c; for IQ4_NL and IQ4_XS
// quantize_iq4_nl and quantize_iq4_xs, which llama.cpp writes files with), so a numesh-written
// block and a GGUF file's block are interchangeable; the dequantizers compute exactly what GGML's
// dequantize_row_* compute. (For the K and IQ4 formats, GGML's quantizers follow these steps only
// without an importance matrix; with one they search differently, and numesh reads those blocks but
// does not write them.) tests/runtime/block_formats_check.py checks all nine against a NumPy
// transcription of GGML's definitions (and, given a built libggml-base, against GGML itself).
//
// Where GGML's reference is undefined or silently writes garbage, numesh decides:
// - A non-finite input (NaN, ±inf) is refused with ValueError naming the first one's index.
//   GGML writes a block that looks valid: its max skips a NaN (unless it is the block's last
//   element, which makes d NaN) and the NaN's code is an undefined conversion (0 on x86: 0 for
//   q8_0, but -8 d or -16 d, the opposite extreme, for q4_0 and q5_0); an infinity makes d
//   infinite and every other code 0 (q8_0), 8 (q4_0) or 16 (q5_0). The K formats' searches carry
//   it into their sums and still write bytes. A weight loader must not store that as if it were a
//   weight.
// - A block whose magnitudes are all below about 3.7e-37 (q8_0), 2.4e-38 (q4_0) or 4.7e-38
//   (q5_0) has a scale
//   whose reciprocal overflows to infinity; GGML then converts ±inf or NaN to an integer, which
//   C leaves undefined. numesh writes what x86-64 builds of GGML write there (the conversion
//   gives 0x80000000, low byte 0): every code 0, so q8_0 codes 0 and q4_0 and q5_0 bytes 0x00
//   (C does not promise that elsewhere). The scale is an f16 zero there, so the block dequantizes
//   to zeros (of either sign) whatever its codes.
// - A scale beyond f16's range (a block whose largest magnitude exceeds about 8.3e6 for q8_0,
//   5.2e5 for q4_0 or 1.05e6 for q5_0) is stored as f16 infinity, as GGML stores it; such a
//   block dequantizes to ±inf (and NaN for its zero codes). Q8_0, Q4_0 and Q5_0 are for weights
//   of ordinary magnitude.
//
// The K formats have no float-to-int conversion: they round with GGML's nearest_int, the low 23
// bits of f32(v + 1.5 * 2^23), which is round-half-to-even for |v| < 2^22 (not Q8_0's half away
// from zero). GGML asserts that range in debug builds only; release builds (what converts GGUF
// files) return the same bit arithmetic beyond it, and for inf and NaN, and clamp the result.
// That arithmetic is defined, so numesh computes it too and, repeating GGML's f32 operations in
// GGML's order, writes GGML's bytes on any IEEE machine, edge cases included:
// - A nearest_int argument beyond 2^22 happens in Q4_K when a sub-block's 6-bit minimum code is
//   much coarser than its scale (|x + dm| / d >= 2^22: a sub-block far below zero with a small
//   range), and in every K format once the searches' sums overflow (magnitudes beyond about 7e12
//   for Q3_K and Q6_K, whose weighted sums hold x^3, and 3e18 for Q4_K, x^2): inf and NaN scales,
//   which GGML's strict comparisons skip. numesh writes GGML's release bytes there; they are no
//   more a faithful weight than GGML's.
// - An all-zero block: Q4_K writes every byte 0 and dequantizes to +0. Q6_K writes every byte 0
//   (GGML's memset), and dequantizes to -0: code 0 means -32, and d * 0 * -32 is -0.
// - Tiny blocks: Q6_K writes all zero bytes whenever every 16-element sub-block's scale is below
//   GGML's 1e-15 (magnitudes all below about 3.2e-14). Above that, a super-block scale that
//   rounds to f16 zero (a largest magnitude below about 1.2e-4 for Q6_K, a largest sub-block
//   range below about 2.8e-5 for Q4_K) makes GGML skip its final rounding pass (its `if (!d)
//   continue`), so the codes stay those of each sub-block's search: non-zero bytes that
//   dequantize to zeros (Q6_K), or to -dmin * m alone (Q4_K). numesh keeps those codes, byte for
//   byte; the same holds for any sub-block whose 6- or 8-bit scale code rounds to 0, such as the
//   small sub-blocks of a block with an outlier.
// - A super-block scale beyond f16's range is stored as f16 infinity, as GGML stores it: Q4_K's d
//   for a largest sub-block scale above about 4.1e6 (a range of about 6.2e7) and dmin for a
//   sub-block minimum below about -4.1e6; Q6_K's d for magnitudes above about 2.7e8. Such a block
//   dequantizes to ±inf and NaN. Q4_K and Q6_K are for weights of ordinary magnitude as well.
// - Q3_K, in the same terms: an all-zero block is every byte 0 and dequantizes to +0 (d 0 times
//   scale code 0, that is -32, is -0, times code 0, that is -4, +0). It tests its largest
//   sub-block scale against exactly 0, not 1e-15, so only a block whose sixteen searches all
//   gave 0 keeps d and its scale codes 0. A d that rounds to f16 zero (a largest sub-block scale
//   below about 9.5e-7), and any sub-block whose scale code is 32 (a scale of 0), skip the final
//   pass and keep their searches' codes. d overflows f16 for a largest sub-block scale above
//   about 2.1e6 (d is that scale / -32).
// - IQ4_NL, in the same terms: a block whose magnitudes are all below GGML's 1e-15 (zeros
//   included) has scale 0, and every index then goes to the codebook value nearest 0 * x, that is
//   to 1 (index 8): bytes 0x88, dequantizing to +0. Its searches' sums hold x^3 v (|v| <= 127), so
//   magnitudes beyond about 1.4e12 (4.6e11 when all 32 share it) overflow them to inf and NaN as
//   in Q3_K and Q6_K, and a scale beyond f16's
//   range (a largest magnitude above about 7.4e6) is stored as f16 infinity; numesh writes
//   GGML's bytes there too. IQ4_XS: a sub-block below 1e-15 has scale 0; a block whose
//   sub-blocks all are has d -0 (f16 0x8000, as -0 / 32), every scale code 32 (a scale of 0)
//   and every index 8; its scale codes round with nearest_int (half to even), and a sub-block
//   whose coded scale is 0 takes index 8 throughout.
// - GGML's libggml-base is compiled without -march, so no FMA, and its sums are sequential;
//   numesh compiles these codecs with -ffp-contract=off for the same rounding of every product
//   and sum (runtime/CMakeLists.txt).

namespace numesh::runtime {

/// Elements in one Q8_0 block (GGML's QK8_0).
inline constexpr std::int64_t kQ8_0BlockElements = 32;
/// Elements in one Q4_0 block (GGML's QK4_0).
inline constexpr std::int64_t kQ4_0BlockElements = 32;
/// Elements in one Q5_0 block (GGML's QK5_0).
inline constexpr std::int64_t kQ5_0BlockElements = 32;
/// Elements in one IQ4_NL block (GGML's QK4_NL).
inline constexpr std::int64_t kIQ4_NLBlockElements = 32;
/// Elements in one Q4_K super-block (GGML's QK_K): 8 sub-blocks of 32.
inline constexpr std::int64_t kQ4_KBlockElements = 256;
/// Elements in one Q5_K super-block (GGML's QK_K): 8 sub-blocks of 32.
inline constexpr std::int64_t kQ5_KBlockElements = 256;
/// Elements in one Q3_K super-block (GGML's QK_K): 16 sub-blocks of 16.
inline constexpr std::int64_t kQ3_KBlockElements = 256;
/// Elements in one Q6_K super-block (GGML's QK_K): 16 sub-blocks of 16.
inline constexpr std::int64_t kQ6_KBlockElements = 256;
/// Elements in one IQ4_XS super-block (GGML's QK_K): 8 sub-blocks of 32.
inline constexpr std::int64_t kIQ4_XSBlockElements = 256;

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

/// GGML's block_q5_0: code q[j] (0 .. 31) has its low 4 bits where Q4_0 keeps its code (byte j of
/// qs low for j < 16, byte j - 16 high otherwise) and its fifth bit as bit j of the little-endian
/// word qh; element j of the block is (q[j] - 16) * f32(d).
struct BlockQ5_0 {
  std::uint16_t d;      ///< IEEE binary16 bits of the scale
  std::uint8_t qh[4];   ///< the codes' fifth bits, code j's as bit j of the little-endian word
  std::uint8_t qs[16];  ///< their low 4 bits, two a byte
};
static_assert(sizeof(BlockQ5_0) == 22 && alignof(BlockQ5_0) == 2, "GGML's block_q5_0 layout");
static_assert(offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6 &&
              std::is_trivially_copyable_v<BlockQ5_0>);

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

/// Quantizes x to Q5_0, block b from x[32 b, 32 b + 32), with GGML's quantize_row_q5_0_ref's
/// bytes: m = the block's element of largest magnitude (the first on ties; +0 for a block of
/// zeros), d = m / -16, q[j] = min(31, trunc(x[j] / d + 16.5)) in f32, so m itself is code 0 and
/// -m would be 32, clamped to 31.
/// Throws: as quantize_q8_0.
void quantize_q5_0(std::span<const float> x, std::span<BlockQ5_0> y);

/// x[32 b + j] = (q[j] - 16) * f32(y[b].d), as GGML's dequantize_row_q5_0.
/// Throws: ShapeError naming both sizes unless x.size() == 32 * y.size().
void dequantize_q5_0(std::span<const BlockQ5_0> y, std::span<float> x);

/// GGML's block_iq4_nl: Q4_0's layout (byte j holds index q[j] in its low nibble and q[j + 16]
/// in its high nibble), each index standing for a value of the codebook: element j of the block
/// is f32(d) * kIQ4_NLValues[q[j]].
struct BlockIQ4_NL {
  std::uint16_t d;      ///< IEEE binary16 bits of the scale
  std::uint8_t qs[16];  ///< two 4-bit indices a byte
};
static_assert(sizeof(BlockIQ4_NL) == 18 && alignof(BlockIQ4_NL) == 2, "GGML's block_iq4_nl layout");
static_assert(offsetof(BlockIQ4_NL, qs) == 2 && std::is_trivially_copyable_v<BlockIQ4_NL>);

/// Quantizes x to IQ4_NL, block b from x[32 b, 32 b + 32), with the bytes of GGML's
/// quantize_iq4_nl without an importance matrix, the quantizer llama.cpp writes IQ4_NL files
/// with (its quantize_row_iq4_nl_ref takes no trial scales and writes other bytes): weights x^2;
/// the scale of least weighted squared error (sum w v x / sum w v^2 over each element's nearest
/// codebook value v) from the scale that puts the block's extreme at +127 (so at the codebook's
/// 113), then from 15 trial scales that put it at -134 .. -120; then every index re-chosen
/// against that scale as f32 (the nearest value, the upper on ties), which is what the block
/// stores (d its f16).
/// Throws: as quantize_q8_0.
void quantize_iq4_nl(std::span<const float> x, std::span<BlockIQ4_NL> y);
/// quantize_iq4_nl with the scale search of kernel level `level` (vector lanes from kAvx2):
/// every level writes the same bytes. REQUIRES: `level` runs on this CPU. Throws: as above.
void quantize_iq4_nl(std::span<const float> x, std::span<BlockIQ4_NL> y, KernelLevel level);
/// x[32 b + j] = f32(y[b].d) * kIQ4_NLValues[q[j]], as GGML's dequantize_row_iq4_nl.
/// Throws: ShapeError naming both sizes unless x.size() == 32 * y.size().
void dequantize_iq4_nl(std::span<const BlockIQ4_NL> y, std::span<float> x);

/// GGML's block_q4_K: sub-block s (elements [32 s, 32 s + 32)) has a 6-bit scale code sc[s] and
/// a 6-bit minimum code m[s], and element i of it is f32(d) * sc[s] * q[i] - f32(dmin) * m[s]
/// with a 4-bit code q[i]. scales packs the 16 six-bit codes into 12 bytes (GGML's
/// get_scale_min_k4): for s < 4, sc[s] and m[s] are the low 6 bits of scales[s] and
/// scales[s + 4]; for s >= 4, their low 4 bits are the nibbles of scales[s + 4] (sc low, m high)
/// and their high 2 bits the top 2 bits of scales[s - 4] (sc) and scales[s] (m). Byte l of qs's
/// 32-byte chunk c holds the code of element 64 c + l in its low nibble and of 64 c + 32 + l in
/// its high nibble.
struct BlockQ4_K {
  std::uint16_t d;          ///< IEEE binary16 bits of the scales' scale
  std::uint16_t dmin;       ///< IEEE binary16 bits of the minimums' scale
  std::uint8_t scales[12];  ///< 8 scale and 8 minimum codes, 6 bits each
  std::uint8_t qs[128];     ///< two 4-bit codes a byte
};
static_assert(sizeof(BlockQ4_K) == 144 && alignof(BlockQ4_K) == 2, "GGML's block_q4_K layout");
static_assert(offsetof(BlockQ4_K, dmin) == 2 && offsetof(BlockQ4_K, scales) == 4 &&
              offsetof(BlockQ4_K, qs) == 16 && std::is_trivially_copyable_v<BlockQ4_K>);

/// GGML's block_q5_K: BlockQ4_K's scales, minimums and nibbles (element i of sub-block s is
/// f32(d) * sc[s] * q[i] - f32(dmin) * m[s]) with 5-bit codes q: the low 4 bits as BlockQ4_K's
/// nibbles, and the fifth bit of element 64 c + l (l < 32) as bit 2c of qh[l], of element
/// 64 c + 32 + l as bit 2c + 1.
struct BlockQ5_K {
  std::uint16_t d;          ///< IEEE binary16 bits of the scales' scale
  std::uint16_t dmin;       ///< IEEE binary16 bits of the minimums' scale
  std::uint8_t scales[12];  ///< 8 scale and 8 minimum codes, 6 bits each
  std::uint8_t qh[32];      ///< the codes' fifth bits
  std::uint8_t qs[128];     ///< their low 4 bits, two a byte
};
static_assert(sizeof(BlockQ5_K) == 176 && alignof(BlockQ5_K) == 2, "GGML's block_q5_K layout");
static_assert(offsetof(BlockQ5_K, dmin) == 2 && offsetof(BlockQ5_K, scales) == 4 &&
              offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48 &&
              std::is_trivially_copyable_v<BlockQ5_K>);

/// GGML's block_q3_K: sub-block g (elements [16 g, 16 g + 16)) has a 6-bit scale code sc_g
/// (0 .. 63), and element e of the block is f32(d) * (sc_g - 32) * (q_e - 4) with a 3-bit code
/// q_e: its low two bits at bits 2 ((e mod 128) / 32) of qs[32 (e / 128) + e mod 32], its high
/// bit as bit e / 32 of hmask[e mod 32]. scales packs the 16 codes into 12 bytes: sc_g's low 4
/// bits in the low (g < 8) or high nibble of scales[g mod 8], its high 2 bits at bits 2 (g / 4)
/// of scales[8 + g mod 4].
struct BlockQ3_K {
  std::uint8_t hmask[32];   ///< the codes' high bits
  std::uint8_t qs[64];      ///< their low bit pairs, four a byte
  std::uint8_t scales[12];  ///< the 16 sub-block scale codes, 6 bits each
  std::uint16_t d;          ///< IEEE binary16 bits of the scales' scale
};
static_assert(sizeof(BlockQ3_K) == 110 && alignof(BlockQ3_K) == 2, "GGML's block_q3_K layout");
static_assert(offsetof(BlockQ3_K, qs) == 32 && offsetof(BlockQ3_K, scales) == 96 &&
              offsetof(BlockQ3_K, d) == 108 && std::is_trivially_copyable_v<BlockQ3_K>);

/// GGML's block_q6_K: sub-block g (elements [16 g, 16 g + 16)) has an 8-bit signed scale code
/// scales[g], and element i of it is f32(d) * scales[g] * (q[i] - 32) with a 6-bit code q[i].
/// In each 128-element half h, byte l (l < 32) of the half's 64 ql bytes holds the low 4 bits of
/// elements l (low nibble) and l + 64 (high nibble), byte l + 32 those of l + 32 and l + 96;
/// byte l of the half's 32 qh bytes holds the high 2 bits of elements l, l + 32, l + 64 and
/// l + 96, from its lowest bit pair up (element numbers within the half).
struct BlockQ6_K {
  std::uint8_t ql[128];    ///< low 4 bits of the codes
  std::uint8_t qh[64];     ///< high 2 bits of the codes
  std::int8_t scales[16];  ///< sub-block scale codes, -128 .. 127
  std::uint16_t d;         ///< IEEE binary16 bits of the scales' scale
};
static_assert(sizeof(BlockQ6_K) == 210 && alignof(BlockQ6_K) == 2, "GGML's block_q6_K layout");
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 &&
              offsetof(BlockQ6_K, d) == 208 && std::is_trivially_copyable_v<BlockQ6_K>);
/// GGML's block_iq4_xs: sub-block g (elements [32 g, 32 g + 32)) has a 6-bit scale code sc_g
/// (0 .. 63: its low 4 bits in the low (even g) or high nibble of scales_l[g / 2], its high 2
/// bits at bits 2 g of scales_h), and element j of it is (f32(d) * (sc_g - 32)) *
/// kIQ4_NLValues[q] with the index q as IQ4_NL keeps it in the sub-block's 16 bytes of qs.
struct BlockIQ4_XS {
  std::uint16_t d;           ///< IEEE binary16 bits of the scales' scale
  std::uint16_t scales_h;    ///< the 8 scale codes' high bit pairs
  std::uint8_t scales_l[4];  ///< their low 4 bits, two a byte
  std::uint8_t qs[128];      ///< two 4-bit indices a byte, 16 bytes a sub-block
};
static_assert(sizeof(BlockIQ4_XS) == 136 && alignof(BlockIQ4_XS) == 2,
              "GGML's block_iq4_xs layout");
static_assert(offsetof(BlockIQ4_XS, scales_h) == 2 && offsetof(BlockIQ4_XS, scales_l) == 4 &&
              offsetof(BlockIQ4_XS, qs) == 8 && std::is_trivially_copyable_v<BlockIQ4_XS>);

// The f16 scales core's table names for each format (DTypeTraits::f16_scales) are these.
static_assert(traits(DType::kQ8_0).f16_scales[0] == offsetof(BlockQ8_0, d) &&
              traits(DType::kQ4_0).f16_scales[0] == offsetof(BlockQ4_0, d) &&
              traits(DType::kQ5_0).f16_scales[0] == offsetof(BlockQ5_0, d) &&
              traits(DType::kIQ4_NL).f16_scales[0] == offsetof(BlockIQ4_NL, d) &&
              traits(DType::kQ3_K).f16_scales[0] == offsetof(BlockQ3_K, d) &&
              traits(DType::kQ4_K).f16_scales[0] == offsetof(BlockQ4_K, d) &&
              traits(DType::kQ4_K).f16_scales[1] == offsetof(BlockQ4_K, dmin) &&
              traits(DType::kQ5_K).f16_scales[0] == offsetof(BlockQ5_K, d) &&
              traits(DType::kQ5_K).f16_scales[1] == offsetof(BlockQ5_K, dmin) &&
              traits(DType::kQ6_K).f16_scales[0] == offsetof(BlockQ6_K, d) &&
              traits(DType::kIQ4_XS).f16_scales[0] == offsetof(BlockIQ4_XS, d));

/// Quantizes x to Q3_K, block b from x[256 b, 256 b + 256), with GGML's quantize_row_q3_K_ref's
/// bytes: each sub-block's scale from GGML's search (make_q3_quants with weights x^2: codes
/// -4 .. 3, the element of largest magnitude at -4, then up to five passes moving one code at a
/// time while the fit improves), coded in 6 bits against the block's scale of largest magnitude
/// (d = 1 / (-32 / that scale), as f16; its code 0, that is -32), then every code re-rounded
/// against the coded scale (half to even).
/// Throws: as quantize_q4_k.
void quantize_q3_k(std::span<const float> x, std::span<BlockQ3_K> y);

/// x[256 b + i] = (f32(d) * (sc_g - 32)) * (q_i - 4) for i's sub-block g, as GGML's
/// dequantize_row_q3_K (left to right in f32; every product exact).
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size().
void dequantize_q3_k(std::span<const BlockQ3_K> y, std::span<float> x);

/// Quantizes x to Q4_K, block b from x[256 b, 256 b + 256), with GGML's quantize_row_q4_K_ref's
/// bytes: each sub-block's scale and minimum from GGML's weighted least-squares search
/// (make_qkx2_quants: 4-bit codes, weights sqrt(mean x^2) + |x|, 21 trial scales), both coded in
/// 6 bits against the block's largest (d = max scale / 63, dmin = max minimum / 63, as f16),
/// then every code re-rounded against the coded scale and minimum (half to even).
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size(); ValueError naming the
/// index and value of the first non-finite element of x (blocks before its block are written,
/// the others are left as they were).
void quantize_q4_k(std::span<const float> x, std::span<BlockQ4_K> y);
/// quantize_q4_k with the sub-block searches of kernel level `level` (vector lanes from kAvx2):
/// every level writes the same bytes. REQUIRES: `level` runs on this CPU. Throws: as above.
void quantize_q4_k(std::span<const float> x, std::span<BlockQ4_K> y, KernelLevel level);

/// x[256 b + i] = f32(d) * sc * q[i] - f32(dmin) * m for i's sub-block's codes sc and m, as
/// GGML's dequantize_row_q4_K (the two products in f32, then the difference).
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size().
void dequantize_q4_k(std::span<const BlockQ4_K> y, std::span<float> x);

/// Quantizes x to Q5_K, block b from x[256 b, 256 b + 256), with GGML's quantize_row_q5_K_ref's
/// bytes: quantize_q4_k's steps with 5-bit codes (make_qkx2_quants with 31 steps, rmin -0.5,
/// rdelta 0.1, 16 trial scales).
/// Throws: as quantize_q4_k.
void quantize_q5_k(std::span<const float> x, std::span<BlockQ5_K> y);
/// quantize_q5_k with the sub-block searches of kernel level `level` (vector lanes from kAvx2):
/// every level writes the same bytes. REQUIRES: `level` runs on this CPU. Throws: as above.
void quantize_q5_k(std::span<const float> x, std::span<BlockQ5_K> y, KernelLevel level);

/// x[256 b + i] = f32(d) * sc * q[i] - f32(dmin) * m, as GGML's dequantize_row_q5_K (the two
/// products in f32, then the difference).
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size().
void dequantize_q5_k(std::span<const BlockQ5_K> y, std::span<float> x);

/// Quantizes x to Q6_K, block b from x[256 b, 256 b + 256), with GGML's quantize_row_q6_K_ref's
/// bytes: each sub-block's scale from GGML's search (make_qx_quants with weights x^2: codes
/// -32 .. 31, the element of largest magnitude at -32, 19 trial scales), coded in 8 bits against
/// the block's scale of largest magnitude (d = 1 / (-128 / that scale), as f16; its code -128),
/// then every code re-rounded against the coded scale (half to even). A block whose sub-block
/// scales are all below 1e-15 in magnitude is all zero bytes.
/// Throws: as quantize_q4_k.
void quantize_q6_k(std::span<const float> x, std::span<BlockQ6_K> y);
/// quantize_q6_k with the sub-block searches of kernel level `level` (vector lanes from kAvx2):
/// every level writes the same bytes. REQUIRES: `level` runs on this CPU. Throws: as above.
void quantize_q6_k(std::span<const float> x, std::span<BlockQ6_K> y, KernelLevel level);

/// x[256 b + i] = f32(d) * scales[g] * (q[i] - 32) for i's sub-block g, as GGML's
/// dequantize_row_q6_K (left to right in f32).
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size().
void dequantize_q6_k(std::span<const BlockQ6_K> y, std::span<float> x);

/// Quantizes x to IQ4_XS, block b from x[256 b, 256 b + 256), with the bytes of GGML's
/// quantize_iq4_xs without an importance matrix (what quantize_row_iq4_xs_ref calls): each
/// sub-block of 32's scale from IQ4_NL's search (quantize_iq4_nl), coded in 6 bits against the
/// sub-block scale of largest magnitude (d = that scale / -32, its code 0, that is -32; codes
/// rounded half to even within -32 .. 31), then every index re-chosen against its coded scale as
/// f32 (d times the code, not d's f16).
/// Throws: as quantize_q4_k.
void quantize_iq4_xs(std::span<const float> x, std::span<BlockIQ4_XS> y);
/// quantize_iq4_xs with the scale search of kernel level `level`, as quantize_iq4_nl's.
/// REQUIRES: `level` runs on this CPU. Throws: as above.
void quantize_iq4_xs(std::span<const float> x, std::span<BlockIQ4_XS> y, KernelLevel level);
/// x[256 b + i] = (f32(d) * (sc_g - 32)) * kIQ4_NLValues[q_i] for i's sub-block g, as GGML's
/// dequantize_row_iq4_xs.
/// Throws: ShapeError naming both sizes unless x.size() == 256 * y.size().
void dequantize_iq4_xs(std::span<const BlockIQ4_XS> y, std::span<float> x);

/// A block format's quantizer and dequantizer on untyped blocks, for the code that treats every
/// block format alike (conversion through fp32, the prefill's dequantized tiles): a new format is
/// its block, its two functions above and its line in block_codec below.
struct BlockCodec {
  /// Quantizes x (whole blocks of the format) into the blocks at `blocks`, aligned for the
  /// format's block; throws as the format's quantizer does.
  void (*quantize)(std::span<const float> x, void* blocks);
  /// Dequantizes x.size() elements (whole blocks) from the blocks at `blocks`, aligned as above.
  void (*dequantize)(const void* blocks, std::span<float> x);
};

namespace detail {
/// The codec of format kFormat from its typed functions.
template <DType kFormat, class Block, void (*kQuantize)(std::span<const float>, std::span<Block>),
          void (*kDequantize)(std::span<const Block>, std::span<float>)>
constexpr BlockCodec codec_of() noexcept {
  static_assert(sizeof(Block) == traits(kFormat).block_bytes, "the format's block");
  constexpr auto kElements = static_cast<std::size_t>(traits(kFormat).block_elements);
  return {[](std::span<const float> x, void* blocks) {
            kQuantize(x, {static_cast<Block*>(blocks), x.size() / kElements});
          },
          [](const void* blocks, std::span<float> x) {
            kDequantize({static_cast<const Block*>(blocks), x.size() / kElements}, x);
          }};
}
}  // namespace detail

/// The codec of block format `t`. REQUIRES: !is_element_dtype(t) (an element type gives q8_0's).
inline const BlockCodec& block_codec(DType t) noexcept {
  static constexpr BlockCodec kQ8_0 =
      detail::codec_of<DType::kQ8_0, BlockQ8_0, quantize_q8_0, dequantize_q8_0>();
  static constexpr BlockCodec kQ4_0 =
      detail::codec_of<DType::kQ4_0, BlockQ4_0, quantize_q4_0, dequantize_q4_0>();
  static constexpr BlockCodec kQ5_0 =
      detail::codec_of<DType::kQ5_0, BlockQ5_0, quantize_q5_0, dequantize_q5_0>();
  static constexpr BlockCodec kIQ4_NL =
      detail::codec_of<DType::kIQ4_NL, BlockIQ4_NL, quantize_iq4_nl, dequantize_iq4_nl>();
  static constexpr BlockCodec kQ3_K =
      detail::codec_of<DType::kQ3_K, BlockQ3_K, quantize_q3_k, dequantize_q3_k>();
  static constexpr BlockCodec kQ4_K =
      detail::codec_of<DType::kQ4_K, BlockQ4_K, quantize_q4_k, dequantize_q4_k>();
  static constexpr BlockCodec kQ5_K =
      detail::codec_of<DType::kQ5_K, BlockQ5_K, quantize_q5_k, dequantize_q5_k>();
  static constexpr BlockCodec kQ6_K =
      detail::codec_of<DType::kQ6_K, BlockQ6_K, quantize_q6_k, dequantize_q6_k>();
  static constexpr BlockCodec kIQ4_XS =
      detail::codec_of<DType::kIQ4_XS, BlockIQ4_XS, quantize_iq4_xs, dequantize_iq4_xs>();
  switch (t) {
    case DType::kIQ4_XS:
      return kIQ4_XS;
    case DType::kQ4_0:
      return kQ4_0;
    case DType::kQ5_0:
      return kQ5_0;
    case DType::kIQ4_NL:
      return kIQ4_NL;
    case DType::kQ3_K:
      return kQ3_K;
    case DType::kQ4_K:
      return kQ4_K;
    case DType::kQ5_K:
      return kQ5_K;
    case DType::kQ6_K:
      return kQ6_K;
    case DType::kQ8_0:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      break;
  }
  return kQ8_0;
}

}  // namespace numesh::runtime
