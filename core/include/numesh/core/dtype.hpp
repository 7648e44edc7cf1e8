#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// Element types of numesh tensors and weights, and the scalar conversions between them. Weights
// may be stored in bf16 or f16 (half the bytes a memory-bound decode reads); arithmetic
// accumulates in fp32. The conversions from fp32 round to nearest, ties to even, exactly as
// PyTorch's and NumPy's do, subnormals included (no flush to zero); NaN becomes the canonical
// quiet NaN with the input's sign (bf16 0x7FC0 / 0xFFC0, f16 0x7E00 / 0xFE00). PyTorch and NumPy
// agree with each other on every finite value and infinity but not on NaN bits (PyTorch's
// vectorized bf16 path writes 0xFFFF, NumPy keeps an f16 NaN's payload), so only NaN-ness is
// promised for NaN. The bulk, vectorized conversions are numesh/runtime/convert.hpp.

namespace numesh {

/// The element type of a tensor or a stored weight.
enum class DType : std::uint8_t {
  kF32,   ///< IEEE binary32
  kBF16,  ///< bfloat16: fp32's sign and 8-bit exponent, 7 stored mantissa bits
  kF16,   ///< IEEE binary16: 5-bit exponent, 10 stored mantissa bits
  kQ8_0,  ///< GGML's Q8_0: blocks of 32 weights, an f16 scale d and 32 int8 codes q (x = d q)
  kQ4_0,  ///< GGML's Q4_0: blocks of 32 weights, an f16 scale d and 32 4-bit codes (x = (q-8) d)
  /// GGML's Q5_0: blocks of 32 weights, an f16 scale d and 32 5-bit codes, their fifth bits in a
  /// word of their own (x = (q - 16) d); 5.5 bits a weight
  kQ5_0,
  /// GGML's IQ4_NL: blocks of 32 weights, an f16 scale d and 32 4-bit indices into a fixed
  /// codebook of 16 int8 values spaced for weights' bell shape, kIQ4_NLValues (x = d v[q]);
  /// Q4_0's 4.5 bits a weight
  kIQ4_NL,
  /// GGML's Q3_K: super-blocks of 256 weights, sixteen sub-blocks of 16 with 6-bit signed scales
  /// under an f16 d, 3-bit codes as 2 low bits and a high bit (x = d (sc - 32) (q - 4));
  /// 3.4375 bits a weight
  kQ3_K,
  /// GGML's Q4_K: super-blocks of 256 weights, eight sub-blocks of 32 with 6-bit scales and mins
  /// under f16 d and dmin, 4-bit codes (x = d sc q - dmin m); 4.5 bits a weight
  kQ4_K,
  /// GGML's Q5_K: Q4_K's super-blocks with 5-bit codes, their fifth bits in 32 bytes of their
  /// own (x = d sc q - dmin m); 5.5 bits a weight
  kQ5_K,
  /// GGML's Q6_K: super-blocks of 256 weights, sixteen sub-blocks of 16 with int8 scales under an
  /// f16 d, 6-bit codes (x = d sc (q - 32)); 6.5625 bits a weight
  kQ6_K,
  /// GGML's IQ4_XS: super-blocks of 256 weights, eight sub-blocks of 32 with 6-bit signed scales
  /// under an f16 d, 4-bit indices into IQ4_NL's codebook (x = d (sc - 32) v[q]); 4.25 bits a
  /// weight
  kIQ4_XS,
};

/// What a format is, for the code that treats every format alike (sizes, names, parsing): one
/// entry per DType in kDTypes. Element types (f32, bf16, f16) are blocks of one element; block
/// formats (quantized weights, a block of scales and codes per run of elements along a row) have
/// more. Adding a format is an enumerator and its entry here; code that must know each format
/// switches on DType exhaustively (-Wswitch with -Werror then names every place), and code that
/// treats every block format alike switches on element_type() instead (docs/ops.md, "What a new
/// block format touches").
struct DTypeTraits {
  DType dtype;
  std::string_view name;                    ///< what to_string gives and parse_dtype takes
  std::array<std::string_view, 2> aliases;  ///< other names parse_dtype takes ("" for none)
  std::int64_t block_elements;              ///< elements a block holds (1: an element type)
  std::int64_t block_bytes;                 ///< bytes a block takes
  /// Elements that share one scale: a pair format's whole block, a super-block format's
  /// sub-block (16 for Q3_K and Q6_K, 32 for Q4_K, Q5_K and IQ4_XS); 1 for an element type.
  std::int64_t scale_elements;
  /// A block format's f16 scales, as byte offsets in a block (-1: none): the block's values are
  /// finite exactly when these are (its codes are small integers), which is what a scan for
  /// NaN and infinities reads. Element types have none.
  std::array<std::int16_t, 2> f16_scales;
  /// The format's number in GGML's `ggml_type`, which GGUF files store for each tensor (every
  /// format numesh has is one of GGML's, bit for bit).
  std::uint32_t ggml_type;
  /// llama.cpp's `llama_ftype` for a GGUF file whose matrices are all in this format, written to
  /// `general.file_type` (Q4_K: its "Q4_K_M", the nearest of llama.cpp's mixes).
  std::uint32_t llama_file_type;
};

/// Every format, in the enumerators' order.
inline constexpr std::array<DTypeTraits, 12> kDTypes = {{
    // dtype, name, aliases, block elements and bytes, elements a scale, f16 scales, GGML type,
    // llama.cpp ftype
    {DType::kF32, "f32", {"fp32", "float32"}, 1, 4, 1, {-1, -1}, 0, 0},
    {DType::kBF16, "bf16", {"bfloat16", ""}, 1, 2, 1, {-1, -1}, 30, 32},
    {DType::kF16, "f16", {"fp16", "float16"}, 1, 2, 1, {-1, -1}, 1, 1},
    {DType::kQ8_0, "q8_0", {"Q8_0", ""}, 32, 34, 32, {0, -1}, 8, 7},            // d first
    {DType::kQ4_0, "q4_0", {"Q4_0", ""}, 32, 18, 32, {0, -1}, 2, 2},            // d first
    {DType::kQ5_0, "q5_0", {"Q5_0", ""}, 32, 22, 32, {0, -1}, 6, 8},            // d first
    {DType::kIQ4_NL, "iq4_nl", {"IQ4_NL", ""}, 32, 18, 32, {0, -1}, 20, 25},    // d first
    {DType::kQ3_K, "q3_k", {"Q3_K", "q3_K"}, 256, 110, 16, {108, -1}, 11, 12},  // d last
    {DType::kQ4_K, "q4_k", {"Q4_K", "q4_K"}, 256, 144, 32, {0, 2}, 12, 15},     // d, dmin first
    {DType::kQ5_K, "q5_k", {"Q5_K", "q5_K"}, 256, 176, 32, {0, 2}, 13, 17},     // d, dmin first
    {DType::kQ6_K, "q6_k", {"Q6_K", "q6_K"}, 256, 210, 16, {208, -1}, 14, 18},  // d last
    {DType::kIQ4_XS, "iq4_xs", {"IQ4_XS", ""}, 256, 136, 32, {0, -1}, 23, 30},  // d first
}};

namespace detail {
constexpr bool dtypes_in_order() {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(detail::dtypes_in_order(), "kDTypes lists every DType in the enumerators' order");
// A new enumerator fails -Wswitch here until it is listed (and then the assertion checks kDTypes
// holds it).
constexpr bool listed(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kIQ4_NL:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return static_cast<std::size_t>(t) < kDTypes.size();
  }
  return false;
}
static_assert(listed(DType::kIQ4_XS), "kDTypes holds the last enumerator");
}  // namespace detail

/// The traits of `t`.
constexpr const DTypeTraits& traits(DType t) noexcept {
  return kDTypes[static_cast<std::size_t>(t)];
}

/// Whether `t` is an element type (a block of one element: f32, bf16, f16), which tensors,
/// activations and collectives hold; block formats are for stored weights only.
constexpr bool is_element_dtype(DType t) noexcept { return traits(t).block_elements == 1; }

/// Bytes per element of an element type; 0 for a block format, which has no size per element
/// (see row_bytes).
constexpr std::size_t dtype_size(DType t) noexcept {
  return is_element_dtype(t) ? static_cast<std::size_t>(traits(t).block_bytes) : 0;
}

/// The element types alone, for code that treats every block format alike (one path for all of
/// them, or a refusal) and each element type apart: it tests is_element_dtype(t) first and then
/// switches on element_type(t), exhaustively, so that a new block format touches none of it.
enum class ElementType : std::uint8_t {
  kF32,   ///< DType::kF32
  kBF16,  ///< DType::kBF16
  kF16,   ///< DType::kF16
};

namespace detail {
constexpr std::size_t element_type_count() {
  std::size_t n = 0;
  for (const DTypeTraits& f : kDTypes) n += f.block_elements == 1 ? 1 : 0;
  return n;
}
// A new element type (a block of one element) needs its ElementType and a case below.
static_assert(element_type_count() == 3, "every element type of kDTypes is an ElementType");
}  // namespace detail

/// `t` as an element type. REQUIRES: is_element_dtype(t) (a block format gives kF32: test
/// is_element_dtype first).
constexpr ElementType element_type(DType t) noexcept {
  return t == DType::kBF16  ? ElementType::kBF16
         : t == DType::kF16 ? ElementType::kF16
                            : ElementType::kF32;
}

/// Bytes a weight stored as `t` takes, its blocks' scales included (f32 4, bf16 2, q8_0 1.0625,
/// q4_0 0.5625, q5_0 0.6875, iq4_nl 0.5625, q3_k 0.4296875, q4_k 0.5625, q5_k 0.6875, q6_k
/// 0.8203125, iq4_xs 0.53125).
constexpr double bytes_per_weight(DType t) noexcept {
  return static_cast<double>(traits(t).block_bytes) / static_cast<double>(traits(t).block_elements);
}

/// The format's name: "f32", "bf16", "f16", "q8_0", "q4_0", "q5_0", "iq4_nl", "q3_k", "q4_k",
/// "q5_k", "q6_k", "iq4_xs".
constexpr std::string_view to_string(DType t) noexcept { return traits(t).name; }

/// Whether `n` elements are whole blocks of every format: for buffers and runs that rows of any
/// format must fill or start in whole blocks.
constexpr bool whole_blocks_of_every_format(std::int64_t n) noexcept {
  for (const DTypeTraits& f : kDTypes) {
    if (n % f.block_elements != 0) return false;
  }
  return true;
}

/// Bytes of a row of `elements` elements stored as `t`.
/// Throws: ValueError naming the format and its block when `elements` is not a multiple of it;
/// ShapeError when the bytes pass 2^63 (a file's header may declare any extent).
inline std::int64_t row_bytes(DType t, std::int64_t elements) {
  const DTypeTraits& f = traits(t);
  NUMESH_CHECK(elements >= 0 && elements % f.block_elements == 0, ValueError,
               "{}: a row of {} elements is not a whole number of {}-element blocks", f.name,
               elements, f.block_elements);
  std::int64_t bytes = 0;
  NUMESH_CHECK(!__builtin_mul_overflow(elements / f.block_elements, f.block_bytes, &bytes),
               ShapeError, "{}: a row of {} elements takes more than 2^63 bytes", f.name, elements);
  return bytes;
}

/// The names of the formats `keep` holds (every format for nullptr), in kDTypes' order, as a
/// list for a message or a help text: "f32, bf16, f16, q8_0, q4_0, q5_0, iq4_nl, q3_k, q4_k, q5_k,
/// q6_k or iq4_xs",
/// so that help texts name a new format without being edited.
inline std::string dtype_choices(bool (*keep)(DType) noexcept = nullptr) {
  std::vector<std::string_view> names;
  for (const DTypeTraits& f : kDTypes) {
    if (keep == nullptr || keep(f.dtype)) names.push_back(f.name);
  }
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += names[i];
  }
  return text;
}

/// Parses a format's name or alias ("f32", "fp32", "float32", "bf16", "bfloat16", "f16", "fp16",
/// "float16", "q8_0", "Q8_0", "q4_0", "Q4_0", "q5_0", "Q5_0", "iq4_nl", "IQ4_NL", "q3_k", "Q3_K",
/// "q3_K", "q4_k", "Q4_K", "q4_K", "q5_k", "Q5_K", "q5_K", "q6_k", "Q6_K", "q6_K", "iq4_xs",
/// "IQ4_XS"). Throws: ValueError naming the text and the choices.
inline DType parse_dtype(std::string_view text) {
  for (const DTypeTraits& f : kDTypes) {
    if (text == f.name) return f.dtype;
    for (std::string_view alias : f.aliases) {
      if (!alias.empty() && text == alias) return f.dtype;
    }
  }
  throw ValueError(fmt::format("dtype '{}': expected {}", text, dtype_choices()));
}

/// fp32 to bfloat16 bits, rounding to nearest even.
constexpr std::uint16_t bf16_from_f32(float x) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<std::uint16_t>((bits >> 16) & 0x8000u) | 0x7FC0u;
  // Adding 0x7FFF plus the kept part's lowest bit rounds the dropped 16 bits to nearest, ties to
  // the even kept value; a carry into the exponent is the correct rounding (up to infinity).
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

/// bfloat16 bits to fp32 (exact).
constexpr float f32_from_bf16(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// fp32 to IEEE binary16 bits, rounding to nearest even; too large for f16 becomes infinity,
/// too small rounds to a subnormal or to a signed zero.
constexpr std::uint16_t f16_from_f32(float x) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x47800000u) return sign | 0x7C00u;  // >= 65536 (and inf): beyond f16 after rounding
  if (abs < 0x38800000u) {
    // Below f16's smallest normal (2^-14): a subnormal with 2^-24 units, or zero. The implicit
    // bit joins the mantissa, then the value is shifted into place rounding to nearest even.
    if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself is the tie to 0)
    const std::uint32_t exponent = abs >> 23;  // 102 .. 112
    const std::uint32_t mantissa = (abs & 0x007FFFFFu) | 0x00800000u;
    const std::uint32_t shift = 126u - exponent;  // 14 .. 24
    const std::uint32_t kept = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    return sign | static_cast<std::uint16_t>(rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits; a carry may
  // bump the exponent, up to infinity (65520 and above).
  const std::uint32_t rebiased = abs - 0x38000000u;  // exponent - 112, in place
  const std::uint32_t rounding = 0x0FFFu + ((rebiased >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((rebiased + rounding) >> 13);
}

/// IEEE binary16 bits to fp32 (exact).
constexpr float f32_from_f16(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) {  // infinity, or NaN: quiet, payload kept (as x86's vcvtph2ps)
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) |
                                (mantissa != 0 ? 0x00400000u : 0u));
  }
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);  // signed zero
  // Subnormal: normalise the mantissa.
  std::uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
}

/// GGML's kvalues_iq4nl: the 16 values an IQ4_NL index stands for (ggml-common.h), denser near 0
/// where most of a weight row's values lie.
inline constexpr std::array<std::int8_t, 16> kIQ4_NLValues = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/// Element `i` of a buffer of `dtype` (fp32 floats, bf16 / f16 bits, or blocks of a block
/// format counted from the buffer's start), widened to fp32 exactly as the format's dequantizer
/// gives it (runtime/block_formats.hpp). One element at a time: for references and scalar
/// fallbacks, not for kernels.
inline float widened_element(const void* data, DType dtype, std::int64_t i) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data);
  // A block's f16 scale, its first two bytes (little-endian, as GGML stores it).
  const auto scale = [](const unsigned char* block) {
    return f32_from_f16(static_cast<std::uint16_t>(block[0] | (block[1] << 8)));
  };
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return f32_from_bf16(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kF16:
      return f32_from_f16(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kQ8_0: {
      const unsigned char* block = bytes + i / 32 * 34;
      return static_cast<float>(static_cast<std::int8_t>(block[2 + i % 32])) * scale(block);
    }
    case DType::kQ4_0: {
      const unsigned char* block = bytes + i / 32 * 18;
      const std::int64_t j = i % 32;
      const int code = j < 16 ? block[2 + j] & 0x0F : block[2 + j - 16] >> 4;
      return static_cast<float>(code - 8) * scale(block);
    }
    case DType::kQ5_0: {
      // d, a little-endian word of the codes' fifth bits, then Q4_0's 16 bytes of nibbles.
      const unsigned char* block = bytes + i / 32 * 22;
      const std::int64_t j = i % 32;
      const int low = j < 16 ? block[6 + j] & 0x0F : block[6 + j - 16] >> 4;
      const int high = (block[2 + j / 8] >> (j % 8)) & 1;
      return static_cast<float>((low | (high << 4)) - 16) * scale(block);
    }
    case DType::kIQ4_NL: {
      // d, then Q4_0's 16 bytes of nibbles, each an index into the codebook.
      const unsigned char* block = bytes + i / 32 * 18;
      const std::int64_t j = i % 32;
      const int index = j < 16 ? block[2 + j] & 0x0F : block[2 + j - 16] >> 4;
      return scale(block) * static_cast<float>(kIQ4_NLValues[static_cast<std::size_t>(index)]);
    }
    case DType::kQ3_K: {
      // 32 bytes of high bits (element e's as bit e / 32 of byte e mod 32), 64 bytes of low bit
      // pairs (e's at bits 2 ((e mod 128) / 32) of byte 32 (e / 128) + e mod 32), 12 bytes of
      // 6-bit scale codes (sub-block g's low nibble in byte g mod 8, low for g < 8, and bits
      // 2 (g / 4) of byte 8 + g mod 4), then d.
      const unsigned char* block = bytes + i / 256 * 110;
      const std::int64_t e = i % 256, g = e / 16;
      const int low = (block[32 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
      const int high = (block[e % 32] >> (e / 32)) & 1;
      const unsigned char* sc = block + 96;
      const int nibble = g < 8 ? sc[g] & 0x0F : sc[g - 8] >> 4;
      const int code = nibble | (((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
      return scale(block + 108) * static_cast<float>(code - 32) *
             static_cast<float>(low + 4 * high - 4);
    }
    case DType::kQ4_K: {
      // d, dmin, 12 bytes of 6-bit scales and mins, then 128 bytes: each 64 elements' 32 bytes
      // hold the first 32 in their low nibbles and the next 32 in their high ones.
      const unsigned char* block = bytes + i / 256 * 144;
      const unsigned char* sm = block + 4;
      const std::int64_t e = i % 256, chunk = e / 64, w = e % 64, sub = e / 32;
      const unsigned char byte = block[16 + 32 * chunk + w % 32];
      const int code = w < 32 ? byte & 0x0F : byte >> 4;
      const int sc = sub < 4 ? sm[sub] & 63 : (sm[sub + 4] & 0x0F) | ((sm[sub - 4] >> 6) << 4);
      const int m = sub < 4 ? sm[sub + 4] & 63 : (sm[sub + 4] >> 4) | ((sm[sub] >> 6) << 4);
      const float d1 = scale(block) * static_cast<float>(sc);
      const float m1 = scale(block + 2) * static_cast<float>(m);
      // Rounded before the subtraction, as GGML's dequantizer rounds it: volatile keeps the
      // compiler from fusing the two into one fma.
      const volatile float product = d1 * static_cast<float>(code);
      return product - m1;
    }
    case DType::kQ5_K: {
      // Q4_K's d, dmin and 12 bytes of 6-bit scales and mins, then 32 bytes of fifth bits (bit
      // 2c + h of byte l for element 64 c + 32 h + l), then Q4_K's 128 bytes of nibbles.
      const unsigned char* block = bytes + i / 256 * 176;
      const unsigned char* sm = block + 4;
      const std::int64_t e = i % 256, chunk = e / 64, w = e % 64, sub = e / 32;
      const unsigned char byte = block[48 + 32 * chunk + w % 32];
      const int fifth = (block[16 + w % 32] >> (2 * chunk + w / 32)) & 1;
      const int code = (w < 32 ? byte & 0x0F : byte >> 4) | (fifth << 4);
      const int sc = sub < 4 ? sm[sub] & 63 : (sm[sub + 4] & 0x0F) | ((sm[sub - 4] >> 6) << 4);
      const int m = sub < 4 ? sm[sub + 4] & 63 : (sm[sub + 4] >> 4) | ((sm[sub] >> 6) << 4);
      const float d1 = scale(block) * static_cast<float>(sc);
      const float m1 = scale(block + 2) * static_cast<float>(m);
      const volatile float product = d1 * static_cast<float>(code);  // rounded, as Q4_K's
      return product - m1;
    }
    case DType::kQ6_K: {
      // 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, then d; each half of
      // 128 elements takes 64, 32 and 8 of them, in quarters of 32 elements.
      const unsigned char* block = bytes + i / 256 * 210;
      const std::int64_t e = i % 256, half = e / 128, quarter = e % 128 / 32, l = e % 32;
      const unsigned char low = block[64 * half + l + 32 * (quarter & 1)];
      const int code = ((quarter < 2 ? low & 0x0F : low >> 4) |
                        (((block[128 + 32 * half + l] >> (2 * quarter)) & 3) << 4)) -
                       32;
      const auto sc = static_cast<std::int8_t>(block[192 + 8 * half + l / 16 + 2 * quarter]);
      return scale(block + 208) * static_cast<float>(sc) * static_cast<float>(code);
    }
    case DType::kIQ4_XS: {
      // d, a little-endian word of the sub-block scale codes' high bit pairs (sub-block g's at
      // bits 2 g), 4 bytes of their low nibbles (g's in byte g / 2, low for even g), then 16
      // bytes a sub-block of 32 holding its indices as Q4_0 holds its codes.
      const unsigned char* block = bytes + i / 256 * 136;
      const std::int64_t e = i % 256, g = e / 32, j = e % 32;
      const int high = ((block[2] | (block[3] << 8)) >> (2 * g)) & 3;
      const int code = ((block[4 + g / 2] >> (4 * (g % 2))) & 0x0F) | (high << 4);
      const unsigned char byte = block[8 + 16 * g + j % 16];
      const int index = j < 16 ? byte & 0x0F : byte >> 4;
      return scale(block) * static_cast<float>(code - 32) *
             static_cast<float>(kIQ4_NLValues[static_cast<std::size_t>(index)]);
    }
  }
  return 0.0f;
}

}  // namespace numesh
