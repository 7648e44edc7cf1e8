#include "numesh/ops/kernels/block_gemm.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/ops/kernels/blas_gemm.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/weight_order.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/weight_panels.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kSentinel = 777.0f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

std::string level_name(KernelLevel l) { return std::string(runtime::to_string(l)); }

// ---- Activations ------------------------------------------------------------------------------

struct Quantized {
  std::vector<std::int8_t> codes;
  std::vector<float> scales;
};

Quantized quantize(std::int64_t m, std::int64_t k, const std::vector<float>& a, std::int64_t lda,
                   KernelLevel level) {
  Quantized q{std::vector<std::int8_t>(static_cast<std::size_t>(m * k), 99),
              std::vector<float>(static_cast<std::size_t>(m * k / 32), kSentinel)};
  quantize_activations_q8(m, k, a.data(), lda, q.codes.data(), q.scales.data(), level);
  return q;
}

// Rows whose blocks span magnitudes from subnormal to 1e30: each block normal values times a
// random power of ten, some blocks all zero, some holding exact halves of their step.
std::vector<float> varied_activations(std::int64_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-42, 30), kind(0, 9);
  std::vector<float> a(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b * 32 < count; ++b) {
    const int what = kind(rng);
    const auto scale = static_cast<float>(std::pow(10.0, exponent(rng)));
    for (std::int64_t e = b * 32; e < std::min(count, b * 32 + 32); ++e) {
      float& x = a[static_cast<std::size_t>(e)];
      if (what == 0) {
        x = 0.0f;
      } else if (what == 1) {
        // amax 127 makes d = 1 and id = 1: every x + 0.5 is an exact tie.
        x = e == b * 32 ? 127.0f : std::floor(normal(rng) * 30.0f) + 0.5f;
      } else {
        x = normal(rng) * scale;
      }
    }
  }
  return a;
}

class BlockGemmLevelTest : public numesh::testing::KernelLevelTest {};

TEST_P(BlockGemmLevelTest, QuantizesActivationsAsTheScalarLevelBitForBit) {
  const std::int64_t m = 3, k = 4096 + 32, lda = k + 7;
  std::vector<float> a = varied_activations(m * lda, 11);
  a[100] = kNaN;
  a[static_cast<std::size_t>(lda + 700)] = -kInf;
  const Quantized scalar = quantize(m, k, a, lda, KernelLevel::kScalar);
  const Quantized got = quantize(m, k, a, lda, level());
  EXPECT_EQ(got.codes, scalar.codes) << level_name(level());
  for (std::size_t b = 0; b < scalar.scales.size(); ++b) {
    ASSERT_EQ(bits(got.scales[b]), bits(scalar.scales[b]))
        << level_name(level()) << ": scale of block " << b;
  }
}

// The definition on hand-made blocks: d = amax / 127, codes x / d rounded to nearest even.
TEST_P(BlockGemmLevelTest, QuantizesHandMadeBlocksByTheirDefinition) {
  const std::int64_t k = 6 * 32;
  std::vector<float> a(static_cast<std::size_t>(k), 0.0f);
  // Block 0: amax 127 so d = 1: ties go to even, -0.5 to 0.
  const std::vector<std::pair<float, int>> ties = {
      {127.0f, 127}, {0.5f, 0},  {1.5f, 2},     {2.5f, 2},       {-0.5f, 0},      {-1.5f, -2},
      {-2.5f, -2},   {3.49f, 3}, {126.5f, 126}, {-126.5f, -126}, {-127.0f, -127}, {0.0f, 0}};
  for (std::size_t e = 0; e < ties.size(); ++e) a[e] = ties[e].first;
  // Block 1: zeros (and a negative zero): scale 0, codes 0.
  a[32 + 3] = -0.0f;
  // Block 2: a NaN; block 3: an infinity: scale NaN, codes 0.
  for (std::int64_t e = 64; e < 128; ++e) a[static_cast<std::size_t>(e)] = 1.0f;
  a[64 + 31] = kNaN;
  a[96 + 5] = kInf;
  // Block 4: amax 2.54 (element 128, -2.54), d = 2.54f / 127: that element is code -127 and
  // the others x * (1 / d) rounded.
  for (std::int64_t e = 0; e < 32; ++e)
    a[static_cast<std::size_t>(128 + e)] = 2.54f * static_cast<float>(e - 16) / 16.0f;
  // Block 5: amax 1e-37: 1 / d overflows, so codes 0 (the scale is kept).
  a[160] = 1e-37f;
  a[161] = -5e-38f;

  const Quantized q = quantize(1, k, a, k, level());
  const std::string label = level_name(level());
  auto code = [&](std::int64_t e) {
    return static_cast<int>(q.codes[static_cast<std::size_t>(e)]);
  };
  EXPECT_EQ(q.scales[0], 1.0f) << label;
  for (std::size_t e = 0; e < ties.size(); ++e)
    EXPECT_EQ(code(static_cast<std::int64_t>(e)), ties[e].second) << label << ": " << ties[e].first;
  EXPECT_EQ(bits(q.scales[1]), 0u) << label;
  for (std::int64_t e = 32; e < 64; ++e) EXPECT_EQ(code(e), 0) << label;
  EXPECT_TRUE(std::isnan(q.scales[2])) << label;
  EXPECT_TRUE(std::isnan(q.scales[3])) << label;
  for (std::int64_t e = 64; e < 128; ++e) EXPECT_EQ(code(e), 0) << label << ": element " << e;
  EXPECT_EQ(q.scales[4], 2.54f / 127.0f) << label;
  EXPECT_EQ(code(128), -127) << label;
  for (std::int64_t e = 128; e < 160; ++e) {
    const float x = a[static_cast<std::size_t>(e)];
    EXPECT_EQ(code(e), static_cast<int>(std::nearbyint(x * (1.0f / (2.54f / 127.0f)))))
        << label << ": " << x;
  }
  EXPECT_EQ(q.scales[5], 1e-37f / 127.0f) << label;
  for (std::int64_t e = 160; e < 192; ++e) EXPECT_EQ(code(e), 0) << label;
}

// Whatever the magnitude, the largest element of a block is exactly +-127 and no code leaves
// [-127, 127] (the clamp is the guard; x * (1 / d) stays below 127.5).
TEST_P(BlockGemmLevelTest, TheLargestMagnitudeIsCode127AndCodesStayInRange) {
  const std::int64_t k = 512 * 32;
  std::vector<float> a = varied_activations(k, 5);
  const Quantized q = quantize(1, k, a, k, level());
  for (std::int64_t b = 0; b < k / 32; ++b) {
    const float* x = a.data() + b * 32;
    const std::int8_t* c = q.codes.data() + b * 32;
    const std::int64_t at =
        std::max_element(x, x + 32, [](float u, float v) { return std::abs(u) < std::abs(v); }) - x;
    if (std::abs(x[at]) < 4e-37f) continue;  // zeros, or 1 / d overflows: codes 0
    EXPECT_EQ(std::abs(static_cast<int>(c[at])), 127) << "block " << b << " x " << x[at];
    for (int e = 0; e < 32; ++e) EXPECT_TRUE(c[e] >= -127 && c[e] <= 127);
  }
}

TEST(BlockGemmTest, QuantizingRefusesKNotAWholeNumberOfBlocks) {
  std::vector<float> a(40, 1.0f);
  std::vector<std::int8_t> codes(40);
  std::vector<float> scales(2);
  EXPECT_THAT([&] { quantize_activations_q8(1, 40, a.data(), 40, codes.data(), scales.data()); },
              ThrowsMessage<ShapeError>(HasSubstr("k 40 is not a whole number of 32-element")));
}

// ---- Weights ------------------------------------------------------------------------------------

// A matrix of `outputs` rows of `ld` elements in a block format, from normal values, with the
// bytes and each element's value (widened_element, independent of the kernels).
struct Blocks {
  DType dtype;
  std::int64_t outputs, ld;
  std::vector<std::uint16_t> storage;  // 2-byte aligned, as BlockQ8_0 / BlockQ4_0
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(storage.data()); }
  const void* data() const { return storage.data(); }
  std::int64_t row_bytes() const { return numesh::row_bytes(dtype, ld); }
  float value(std::int64_t j, std::int64_t e) const {
    return widened_element(static_cast<const char*>(data()) + j * row_bytes(), dtype, e);
  }
  WeightMatrix matrix() const { return {data(), dtype, ld, outputs, WeightLayout::kOutIn, ld}; }
};

bool is_super_block(DType t) { return traits(t).block_elements == 256; }

// The super-block formats with minimums (d, dmin and Q4_K's 6-bit codes first).
bool has_minimums(DType t) { return traits(t).f16_scales[1] >= 0; }

// The super-block formats with sub-blocks of 16 (Q3_K, Q6_K): two scales an activation block.
bool has_two_scales(DType t) { return traits(t).scale_elements == 16; }

// Byte offset of a block's (first) f16 scale: Q3_K and Q6_K keep their d last.
std::int64_t scale_offset(DType t) { return traits(t).f16_scales[0]; }

// `foreign`: codes GGML's quantizers do not write but a foreign file may hold.
Blocks make_blocks(DType t, std::int64_t outputs, std::int64_t ld, std::uint32_t seed,
                   bool foreign = false) {
  Blocks b{t, outputs, ld, {}};
  b.storage.resize(static_cast<std::size_t>((outputs * b.row_bytes() + 1) / 2));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(static_cast<std::size_t>(ld));
  for (std::int64_t j = 0; j < outputs; ++j) {
    for (float& x : row) x = normal(rng);
    // The runtime's codec: quantize_q8_0, q4_0, q4_k or q6_k on the row.
    runtime::convert_elements(row.data(), DType::kF32, b.bytes() + j * b.row_bytes(), t,
                              row.size());
  }
  if (foreign && t == DType::kQ8_0) {
    // -128 here and there, and block 1 of output 2 all -128 (its pair sums are the largest
    // vpmaddubsw sees).
    std::uniform_int_distribution<std::int64_t> pick(0, outputs * ld - 1);
    for (int i = 0; i < outputs * ld / 16; ++i) {
      const std::int64_t e = pick(rng), j = e / ld, r = e % ld;
      b.bytes()[j * b.row_bytes() + r / 32 * 34 + 2 + r % 32] = 0x80;
    }
    const std::int64_t j = std::min<std::int64_t>(2, outputs - 1);  // the first of dot_case's view
    for (int e = 0; e < 32; ++e) b.bytes()[j * b.row_bytes() + 34 + 2 + e] = 0x80;
  }
  if (foreign && is_super_block(t)) {
    // A quarter of the super-blocks random bytes but for their f16 scales: any 6-bit scale,
    // minimum and nibble (Q4_K), any int8 scale and 6-bit code (Q6_K); and super-block 1 of
    // output 2 at the extremes, the largest magnitudes the integer sums see (Q4_K: scales and
    // minimums 63, codes 15; Q6_K: scales -128, codes 0, that is -32; Q3_K: scale codes 0 and
    // codes 0, that is -32 and -4; IQ4_XS: scale codes 0 and indices 0, -32 and -127).
    const std::int64_t bytes = traits(t).block_bytes, keep = scale_offset(t);
    const std::int64_t kept = has_minimums(t) ? 4 : 2;  // Q4_K, Q5_K: d and dmin
    std::uniform_int_distribution<int> byte(0, 255), quarter(0, 3);
    for (std::int64_t s = 0; s < outputs * (ld / 256); ++s) {
      if (quarter(rng) != 0) continue;
      unsigned char* block = b.bytes() + s / (ld / 256) * b.row_bytes() + s % (ld / 256) * bytes;
      for (std::int64_t i = 0; i < bytes; ++i) {
        if (i < keep || i >= keep + kept) block[i] = static_cast<unsigned char>(byte(rng));
      }
    }
    if (ld >= 512) {
      unsigned char* block =
          b.bytes() + std::min<std::int64_t>(2, outputs - 1) * b.row_bytes() + bytes;
      if (has_minimums(t)) {
        // The 6-bit codes and the codes' bits (Q5_K's fifth bits too): codes 15 or 31.
        std::fill(block + 4, block + bytes, 0xFF);
      } else {
        // Every byte 0 but d's: the most negative codes and scale codes; Q6_K's int8 scales -128.
        std::fill(block, block + keep, 0x00);
        std::fill(block + keep + 2, block + bytes, 0x00);
        if (t == DType::kQ6_K) std::fill(block + 192, block + 208, 0x80);
      }
    }
  }
  return b;
}

using DotFn = void (*)(std::int64_t, const std::int8_t*, const float*, const WeightMatrix&, float*,
                       std::int64_t, KernelLevel);

// Every block format of core's table, so that the tests below check a new format's kernels (and
// that dot_gemm_blocks and packed_gemm_q8 find them: ops/src/kernels/block_kernels.hpp) unedited.
const std::vector<DType> kBlockFormats = [] {
  std::vector<DType> formats;
  for (const DTypeTraits& f : kDTypes) {
    if (!is_element_dtype(f.dtype)) formats.push_back(f.dtype);
  }
  return formats;
}();

// The super-block formats among them.
const std::vector<DType> kSuperBlockFormats = [] {
  std::vector<DType> formats;
  for (const DType t : kBlockFormats) {
    if (is_super_block(t)) formats.push_back(t);
  }
  return formats;
}();

// Runs the dot kernel into a c of NaN with a sentinel in its padding (which must survive);
// returns c packed to [m, n].
// `kernel` the dot kernel when not given (packed_gemm_q8 takes the same arguments).
std::vector<float> run_dot(std::int64_t m, const Quantized& q, const WeightMatrix& b,
                           KernelLevel level, const std::string& label, DotFn kernel = nullptr) {
  const std::int64_t n = b.cols, ldc = n + 3;
  std::vector<float> c(static_cast<std::size_t>(m * ldc), kSentinel);
  for (std::int64_t i = 0; i < m; ++i) std::fill_n(c.begin() + i * ldc, n, kNaN);
  (kernel != nullptr ? kernel : dot_gemm_blocks)(m, q.codes.data(), q.scales.data(), b, c.data(),
                                                 ldc, level);
  std::vector<float> packed;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float x = c[static_cast<std::size_t>(i * ldc + j)];
      if (j < n) {
        packed.push_back(x);
      } else {
        EXPECT_EQ(x, kSentinel) << label << ": c's padding at [" << i << ", " << j
                                << "] was written";
      }
    }
  }
  return packed;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(),
                                            [](float u, float v) { return bits(u) == bits(v); });
}

// One dot case: m rows of activations (rows k + 32 apart, quantized at the scalar level) and a
// view of n outputs starting at output 2 of a matrix of n + 5 outputs whose rows hold two blocks
// more than k (k + 64 inputs, k + 512 for the super-block formats).
struct DotCase {
  DType dtype;
  std::int64_t m, n, k;
  std::vector<float> a;
  Quantized q;
  Blocks w;
  WeightMatrix b;
  std::string label;
};

DotCase dot_case(DType t, std::int64_t m, std::int64_t n, std::int64_t k, std::uint32_t seed) {
  const std::int64_t lda = k + 32;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * lda));
  for (float& x : a) x = normal(rng);
  Quantized q = quantize(m, k, a, lda, KernelLevel::kScalar);
  Blocks w = make_blocks(t, n + 5, k + 2 * traits(t).block_elements, seed + 1, /*foreign=*/true);
  const WeightMatrix b = w.matrix().outputs(2, n).inputs(0, k);
  const std::string label = std::string(to_string(t)) + " m" + std::to_string(m) + " n" +
                            std::to_string(n) + " k" + std::to_string(k);
  return {t, m, n, k, std::move(a), std::move(q), std::move(w), b, label};
}

// Depths that are one, two, three and many blocks (an odd count among them), for a format.
std::vector<std::int64_t> dot_depths(DType t) {
  if (is_super_block(t)) return {256, 512, 768, 4096 + 256};
  return {32, 64, 96, 1024, 4096 + 32};
}

TEST_P(BlockGemmLevelTest, DotEqualsTheScalarLevelBitForBit) {
  std::uint32_t seed = 1;
  for (DType t : kBlockFormats) {
    for (std::int64_t m : {1, 2, 3, 4, 5, 8, 13, 16}) {
      for (std::int64_t n : {1, 7, 33}) {
        for (std::int64_t k : dot_depths(t)) {
          const DotCase cs = dot_case(t, m, n, k, seed += 3);
          const std::string label = cs.label + " at " + level_name(level());
          const std::vector<float> scalar = run_dot(m, cs.q, cs.b, KernelLevel::kScalar, label);
          const std::vector<float> got = run_dot(m, cs.q, cs.b, level(), label);
          ASSERT_TRUE(same_bits(got, scalar)) << label;
        }
      }
    }
  }
}

// Weight code e (0 .. 31) of a block, as the format defines it (q4_0: nibble - 8; q5_0: the
// nibble at byte 6 on and bit e of the word at byte 2 as its fifth bit, less 16; iq4_nl: the
// codebook's value at the nibble).
int weight_code(const unsigned char* block, DType t, std::int64_t e) {
  if (t == DType::kQ8_0) return static_cast<std::int8_t>(block[2 + e]);
  if (t == DType::kIQ4_NL) {
    return kIQ4_NLValues[e < 16 ? block[2 + e] & 0x0F : block[2 + e - 16] >> 4];
  }
  if (t == DType::kQ5_0) {
    const int nibble = e < 16 ? block[6 + e] & 0x0F : block[6 + e - 16] >> 4;
    return (nibble | (((block[2 + e / 8] >> (e % 8)) & 1) << 4)) - 16;
  }
  return (e < 16 ? block[2 + e] & 0x0F : block[2 + e - 16] >> 4) - 8;
}

float weight_scale(const unsigned char* block) {
  return f32_from_f16(static_cast<std::uint16_t>(block[0] | (block[1] << 8)));
}

// The scalar level is the fixed order's value: within (blocks / 2 + 5) 2^-24 sum |terms| of the
// same terms (isum times the f32 scale product) summed in float64. And the whole product is
// within the header's bound of the float64 product of the original activations and the
// dequantized weights: sum over blocks of d_a (1/2 + 2^-12) sum |w|, plus that accumulation.
TEST(BlockGemmTest, TheScalarDotIsItsOrdersValueAndWithinTheQuantizationBound) {
  std::uint32_t seed = 900;
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kIQ4_NL}) {
    for (std::int64_t k : {32, 96, 1024, 4096 + 32}) {
      const std::int64_t m = 3, n = 7, blocks = k / 32, lda = k + 32;
      const DotCase cs = dot_case(t, m, n, k, seed += 5);
      const std::vector<float> c = run_dot(m, cs.q, cs.b, KernelLevel::kScalar, cs.label);
      double used = 0.0;  // the largest share of the quantization bound an error takes
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          const auto* row = static_cast<const unsigned char*>(cs.b.stored_row(j));
          double order = 0.0, magnitude = 0.0, exact = 0.0, quantization = 0.0;
          for (std::int64_t b = 0; b < blocks; ++b) {
            const unsigned char* block = row + b * traits(t).block_bytes;
            const float d_a = cs.q.scales[static_cast<std::size_t>(i * blocks + b)];
            const float scale = d_a * weight_scale(block);  // one f32 product, as the order's
            double w_magnitude = 0.0;
            for (int l = 0; l < 8; ++l) {
              std::int64_t isum = 0;
              for (std::int64_t e = 4 * l; e < 4 * l + 4; ++e) {
                const std::int64_t at = b * 32 + e;
                isum += std::int64_t{cs.q.codes[static_cast<std::size_t>(i * k + at)]} *
                        weight_code(block, t, e);
                const double w = widened_element(row, t, at);
                exact += static_cast<double>(cs.a[static_cast<std::size_t>(i * lda + at)]) * w;
                w_magnitude += std::abs(w);
              }
              order += static_cast<double>(isum) * scale;
              magnitude += std::abs(static_cast<double>(isum) * scale);
            }
            quantization += static_cast<double>(d_a) * (0.5 + std::ldexp(1.0, -12)) * w_magnitude;
          }
          const double got = c[static_cast<std::size_t>(i * n + j)];
          const double order_bound =
              static_cast<double>(blocks / 2 + 5) * std::ldexp(1.0, -24) * magnitude;
          EXPECT_LE(std::abs(got - order), order_bound)
              << cs.label << " [" << i << ", " << j << "]";
          EXPECT_LE(std::abs(got - exact), quantization + order_bound)
              << cs.label << " [" << i << ", " << j << "]";
          used = std::max(used, std::abs(got - exact) / (quantization + order_bound));
        }
      }
      // The bound is tight enough to mean something: some error takes a good part of it.
      EXPECT_GT(used, 0.01) << cs.label;
    }
  }
}

// ---- Q4_K and Q6_K ---------------------------------------------------------------------------

// Input e (0 .. 255) of a super-block as the header reads it, decoded here from GGML's layout
// (runtime/block_formats.hpp), apart from the kernels: its weight code q_w (Q4_K: the nibble;
// Q3_K: q - 4; Q6_K: q - 32), its sub-block scale ds = d sc (Q3_K: d (sc - 32)) and (Q4_K)
// minimum dm = dmin m, exact in f32.
struct SuperElement {
  int code;
  float ds;
  float dm;
};

SuperElement super_element(const unsigned char* block, DType t, std::int64_t e) {
  auto f16 = [&](std::int64_t at) {
    return f32_from_f16(static_cast<std::uint16_t>(block[at] | (block[at + 1] << 8)));
  };
  if (has_minimums(t)) {
    const unsigned char* packed = block + 4;  // get_scale_min_k4
    // Q5_K: the nibbles after 32 bytes of fifth bits, bit j of byte e mod 32 element e's.
    const std::int64_t nibbles = t == DType::kQ5_K ? 48 : 16;
    const std::int64_t j = e / 32, byte = block[nibbles + 32 * (e / 64) + e % 32];
    const int sc = j < 4 ? packed[j] & 63 : (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    const int m = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    const int fifth = t == DType::kQ5_K ? (block[16 + e % 32] >> j) & 1 : 0;
    return {static_cast<int>(e % 64 < 32 ? byte & 0x0F : byte >> 4) | (fifth << 4),
            f16(0) * static_cast<float>(sc), f16(2) * static_cast<float>(m)};
  }
  if (t == DType::kIQ4_XS) {
    // d, the scale codes' high bit pairs (bits 2 g of a word), their low nibbles (byte g / 2),
    // then 16 bytes of indices a sub-block of 32.
    const std::int64_t g = e / 32, j = e % 32;
    const int high = ((block[2] | (block[3] << 8)) >> (2 * g)) & 3;
    const int sc = ((block[4 + g / 2] >> (4 * (g % 2))) & 0x0F) | (high << 4);
    const unsigned char byte = block[8 + 16 * g + j % 16];
    return {kIQ4_NLValues[j < 16 ? byte & 0x0F : byte >> 4], f16(0) * static_cast<float>(sc - 32),
            0.0f};
  }
  if (t == DType::kQ3_K) {
    // 32 bytes of high bits, 64 of low bit pairs, 12 of 6-bit scale codes, d.
    const std::int64_t g = e / 16;
    const int low = (block[32 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    const int high = (block[e % 32] >> (e / 32)) & 1;
    const int nibble = g < 8 ? block[96 + g] & 0x0F : block[96 + g - 8] >> 4;
    const int sc = nibble | (((block[104 + g % 4] >> (2 * (g / 4))) & 3) << 4);
    return {low + 4 * high - 4, f16(108) * static_cast<float>(sc - 32), 0.0f};
  }
  const std::int64_t half = e / 128, quarter = e % 128 / 32, l = e % 32;
  const int low = block[64 * half + 32 * (quarter % 2) + l];
  const int high = (block[128 + 32 * half + l] >> (2 * quarter)) & 3;
  const int q = (quarter < 2 ? low & 0x0F : low >> 4) | (high << 4);
  const auto sc = static_cast<std::int8_t>(block[192 + e / 16]);
  return {q - 32, f16(208) * static_cast<float>(sc), 0.0f};
}

// The header's Q4_K / Q6_K order written out from its text: output j of row i of a dot case.
float super_order(const DotCase& cs, std::int64_t i, std::int64_t j) {
  const auto* row = static_cast<const unsigned char*>(cs.b.stored_row(j));
  const std::int64_t blocks = cs.k / 32;
  const std::int8_t* q_a = cs.q.codes.data() + i * cs.k;
  const float* d_a = cs.q.scales.data() + i * blocks;
  float s[16] = {};
  for (std::int64_t b = 0; b < cs.k / 256; ++b) {
    const unsigned char* block = row + b * traits(cs.dtype).block_bytes;
    for (std::int64_t t = 8 * b; t < 8 * b + 8; ++t) {
      for (std::int64_t l = 0; l < 8; ++l) {
        std::int32_t isum = 0;
        for (std::int64_t e = 4 * l; e < 4 * l + 4; ++e)
          isum += q_a[32 * t + e] * super_element(block, cs.dtype, 32 * (t % 8) + e).code;
        const float scale = d_a[t] * super_element(block, cs.dtype, 32 * (t % 8) + 4 * l).ds;
        float& lane = s[(t % 2) * 8 + l];
        lane = std::fma(static_cast<float>(isum), scale, lane);
      }
    }
    if (has_minimums(cs.dtype)) {
      for (std::int64_t l = 0; l < 8; ++l) {
        const std::int64_t t = 8 * b + l;
        std::int32_t sum = 0;
        for (std::int64_t e = 0; e < 32; ++e) sum += q_a[32 * t + e];
        const float sum_a = d_a[t] * static_cast<float>(sum);
        s[l] = std::fma(sum_a, -super_element(block, cs.dtype, 32 * l).dm, s[l]);
      }
    }
  }
  float u[8];
  for (int l = 0; l < 8; ++l) u[l] = s[l] + s[l + 8];
  for (int l = 0; l < 4; ++l) u[l] += u[l + 4];
  for (int l = 0; l < 2; ++l) u[l] += u[l + 2];
  return u[0] + u[1];
}

// The scalar level is the header's order bit for bit (and every level the scalar one:
// DotEqualsTheScalarLevelBitForBit), on GGML's blocks and on foreign ones.
TEST(BlockGemmTest, SuperBlockDotIsTheHeadersOrderBitForBit) {
  std::uint32_t seed = 300;
  for (DType t : kSuperBlockFormats) {
    for (std::int64_t k : {256, 768, 4096 + 256}) {
      const DotCase cs = dot_case(t, 5, 9, k, seed += 7);
      const std::vector<float> c = run_dot(cs.m, cs.q, cs.b, KernelLevel::kScalar, cs.label);
      for (std::int64_t i = 0; i < cs.m; ++i) {
        for (std::int64_t j = 0; j < cs.n; ++j) {
          const float want = super_order(cs, i, j);
          ASSERT_EQ(bits(c[static_cast<std::size_t>(i * cs.n + j)]), bits(want))
              << cs.label << " [" << i << ", " << j << "]: " << want;
        }
      }
    }
  }
}

// The weights as the runtime's dequantizer gives them, output j's k inputs.
std::vector<float> dequantized(const DotCase& cs, std::int64_t j) {
  std::vector<float> w(static_cast<std::size_t>(cs.k));
  runtime::block_codec(cs.dtype).dequantize(cs.b.stored_row(j), w);
  return w;
}

// The header's bounds on random rows: against the float64 product of the quantized activations
// and runtime::dequantize_q4_k / q6_k's weights, (L + 5) 2^-24 (P + M) (Q4_K: plus 2^-24 (P + M)
// for the dequantizer's rounding); against the original activations, that plus the quantization
// term. Q6_K's dequantized weights are the kernel's exactly.
TEST(BlockGemmTest, SuperBlockDotIsWithinTheHeadersBounds) {
  std::uint32_t seed = 500;
  for (DType t : kSuperBlockFormats) {
    for (std::int64_t k : {256, 1024, 4096 + 256, 16384}) {
      const std::int64_t m = 3, n = 7, lda = k + 32;
      const DotCase cs = dot_case(t, m, n, k, seed += 5);
      const std::vector<float> c = run_dot(m, cs.q, cs.b, KernelLevel::kScalar, cs.label);
      const double lanes =
          has_minimums(t) ? 5.0 * static_cast<double>(k) / 256 : static_cast<double>(k) / 64;
      const double rounding = std::ldexp(1.0, -24);
      double used = 0.0, used_quantized = 0.0;  // the largest shares of the bounds errors take
      for (std::int64_t j = 0; j < n; ++j) {
        const auto* row = static_cast<const unsigned char*>(cs.b.stored_row(j));
        const std::vector<float> w = dequantized(cs, j);
        for (std::int64_t i = 0; i < m; ++i) {
          double product = 0.0, exact = 0.0, p = 0.0, mins = 0.0, quantization = 0.0;
          for (std::int64_t e = 0; e < k; ++e) {
            const std::int64_t t32 = e / 32;
            const double d_a = cs.q.scales[static_cast<std::size_t>(i * (k / 32) + t32)];
            const double a_q = cs.q.codes[static_cast<std::size_t>(i * k + e)] * d_a;
            const double we = w[static_cast<std::size_t>(e)];
            const SuperElement x = super_element(row + e / 256 * traits(t).block_bytes, t, e % 256);
            product += a_q * we;
            exact += static_cast<double>(cs.a[static_cast<std::size_t>(i * lda + e)]) * we;
            p += std::abs(a_q * x.ds * x.code);
            mins += std::abs(a_q * x.dm);
            quantization += d_a * (0.5 + std::ldexp(1.0, -12)) * std::abs(we);
          }
          const double dequantizing = has_minimums(t) ? 1.0 : 0.0;
          const double bound = (lanes + 5 + dequantizing) * rounding * (p + mins);
          const double got = c[static_cast<std::size_t>(i * n + j)];
          const std::string where =
              cs.label + " [" + std::to_string(i) + ", " + std::to_string(j) + "]";
          EXPECT_LE(std::abs(got - product), bound) << where;
          EXPECT_LE(std::abs(got - exact), quantization + bound) << where;
          used_quantized = std::max(used_quantized, std::abs(got - product) / bound);
          used = std::max(used, std::abs(got - exact) / (quantization + bound));
        }
      }
      // The bounds are tight enough to mean something: some error takes a part of each (of
      // the whole, 11 % at k = 256 down to 1.1 % at 16384; of the accumulation term, which
      // grows with k as a worst case where the errors grow as a random walk, 1.3-1.9 % down to
      // 0.02-0.04 %).
      EXPECT_GT(used, 0.005) << cs.label;
      EXPECT_GT(used_quantized, 1e-4) << cs.label;
    }
  }
}

// One output of Q8_0 weights with the given codes (32 a block) and f16 scale bits per block.
std::vector<std::uint16_t> q8_0_row(const std::vector<int>& codes, std::uint16_t scale_bits) {
  const std::size_t blocks = codes.size() / 32;
  std::vector<std::uint16_t> storage(blocks * 17);
  auto* bytes = reinterpret_cast<unsigned char*>(storage.data());
  for (std::size_t b = 0; b < blocks; ++b) {
    bytes[34 * b] = static_cast<unsigned char>(scale_bits & 0xFF);
    bytes[34 * b + 1] = static_cast<unsigned char>(scale_bits >> 8);
    for (std::size_t e = 0; e < 32; ++e)
      bytes[34 * b + 2 + e] = static_cast<unsigned char>(codes[32 * b + e]);
  }
  return storage;
}

float dot_one(KernelLevel level, const std::vector<int>& weight_codes,
              const std::vector<std::int8_t>& codes, const std::vector<float>& scales) {
  const std::vector<std::uint16_t> w = q8_0_row(weight_codes, 0x3C00);  // d_w = 1
  const auto k = static_cast<std::int64_t>(weight_codes.size());
  float c = kSentinel;
  dot_gemm_blocks(1, codes.data(), scales.data(),
                  WeightMatrix{w.data(), DType::kQ8_0, k, 1, WeightLayout::kOutIn}, &c, 1, level);
  return c;
}

// The lanes and the fold of the header, with 2^24 + 1 rounding to 2^24 (each case tells the
// header's order from the others that come to mind):
// - blocks 0 and 2 share lane 0 and block 1 has its own (s[8]): 2^24, 1, -2^24 give 1 (one chain
//   would give 0);
// - the fold adds u[l + 4] before u[l + 2] and u[l + 1]: s[0] = 2^24, s[1] = -2^24, s[4] = 1
//   give 0 (a sum in lane order would give 1).
TEST_P(BlockGemmLevelTest, EvenAndOddBlocksKeepTheirLanesAndTheFoldIsTheHeaders) {
  constexpr float kBig = 16777216.0f;
  std::vector<int> w(96, 0);
  w[0] = w[32] = w[64] = 1;
  std::vector<std::int8_t> q(96, 0);
  q[0] = q[32] = q[64] = 1;
  EXPECT_EQ(dot_one(level(), w, q, {kBig, 1.0f, -kBig}), 1.0f);

  std::fill(w.begin(), w.end(), 0);
  std::fill(q.begin(), q.end(), std::int8_t{0});
  w[0] = w[4] = w[64 + 16] = 1;  // lanes 0 and 1 of block 0, lane 4 of block 2
  q[0] = 1;
  q[4] = -1;
  q[64 + 16] = 1;
  EXPECT_EQ(dot_one(level(), w, q, {kBig, 1.0f, 1.0f}), 0.0f);

  // - the even and odd halves are added first: s[0] = 2^24, s[8] = -2^24, s[4] = 1 give 1
  //   (adding the 128-bit quarters of each half first would give 0).
  std::fill(w.begin(), w.end(), 0);
  std::fill(q.begin(), q.end(), std::int8_t{0});
  w[0] = w[32] = w[64 + 16] = 1;  // lane 0 of blocks 0 and 1, lane 4 of block 2
  q[0] = q[32] = q[64 + 16] = 1;
  EXPECT_EQ(dot_one(level(), w, q, {kBig, -kBig, 1.0f}), 1.0f);
}

// Codes of -128 multiply exactly: every lane's isum is 4 * -128 * 127 (and the pair sums
// -32512 do not saturate vpmaddubsw's int16).
TEST_P(BlockGemmLevelTest, WeightCodesOfMinus128MultiplyExactly) {
  const std::vector<int> w(64, -128);
  std::vector<std::int8_t> q(64, 127);
  for (int e = 32; e < 64; ++e) q[static_cast<std::size_t>(e)] = -127;
  EXPECT_EQ(dot_one(level(), w, q, {1.0f, 0.5f}), -128.0f * 127.0f * 32.0f * 0.5f);
}

// A NaN weight scale (f16 0x7E00) makes its output NaN in every row and no other; a NaN
// activation makes every output of its row NaN and no other row's.
TEST_P(BlockGemmLevelTest, NaNReachesExactlyTheOutputsItFeeds) {
  for (DType t : kBlockFormats) {
    const std::int64_t m = 6, n = 9, k = 5 * traits(t).block_elements;
    Blocks w = make_blocks(t, n, k, 17);
    unsigned char* block =
        w.bytes() + 4 * w.row_bytes() + 3 * traits(t).block_bytes + scale_offset(t);
    block[0] = 0x00;
    block[1] = 0x7E;
    if (has_minimums(t)) {  // its dmin too, on another super-block
      block[traits(t).block_bytes + 2] = 0x00;
      block[traits(t).block_bytes + 3] = 0x7E;
    }
    std::vector<float> a(static_cast<std::size_t>(m * k), 0.25f);
    a[static_cast<std::size_t>(2 * k + 77)] = kNaN;
    const std::string label = std::string(to_string(t)) + " at " + level_name(level());
    const Quantized q = quantize(m, k, a, k, level());
    const std::vector<float> c = run_dot(m, q, w.matrix(), level(), label);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        EXPECT_EQ(std::isnan(c[static_cast<std::size_t>(i * n + j)]), i == 2 || j == 4)
            << label << " [" << i << ", " << j << "]";
      }
    }
  }
}

// k = 0 writes zeros; m = 0 or n = 0 writes nothing.
TEST_P(BlockGemmLevelTest, EmptyDotProducts) {
  for (DType t : kBlockFormats) {
    const std::int64_t block = traits(t).block_elements;
    const std::string label = std::string(to_string(t)) + " at " + level_name(level());
    const std::vector<std::uint16_t> none(1, 0);
    const std::vector<std::int8_t> codes(1, 0);
    const std::vector<float> scales(1, 0.0f);
    std::vector<float> c(6, kSentinel);
    dot_gemm_blocks(2, codes.data(), scales.data(),
                    WeightMatrix{none.data(), t, 0, 3, WeightLayout::kOutIn}, c.data(), 3, level());
    for (float x : c) EXPECT_EQ(bits(x), 0u) << label;
    c.assign(6, kSentinel);
    dot_gemm_blocks(0, codes.data(), scales.data(),
                    WeightMatrix{none.data(), t, block, 3, WeightLayout::kOutIn}, c.data(), 3,
                    level());
    dot_gemm_blocks(2, codes.data(), scales.data(),
                    WeightMatrix{none.data(), t, block, 0, WeightLayout::kOutIn}, c.data(), 3,
                    level());
    for (float x : c) EXPECT_EQ(x, kSentinel) << label;
  }
}

TEST(BlockGemmTest, DotRefusesElementTypesInOutWeightsAndPartialBlocks) {
  const std::vector<std::uint16_t> w(64, 0);
  const std::vector<std::int8_t> codes(64, 0);
  const std::vector<float> scales(2, 1.0f);
  float c[2];
  EXPECT_THAT(
      [&] {
        dot_gemm_blocks(1, codes.data(), scales.data(),
                        WeightMatrix{w.data(), DType::kBF16, 32, 1, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<TypeError>(
          HasSubstr("dot_gemm_blocks: weights of dtype bf16; it takes the block formats")));
  EXPECT_THAT(
      [&] {
        dot_gemm_blocks(1, codes.data(), scales.data(),
                        WeightMatrix{w.data(), DType::kQ8_0, 32, 1, WeightLayout::kInOut}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("dot_gemm_blocks: q8_0 weights stored in-out")));
  EXPECT_THAT(
      [&] {
        dot_gemm_blocks(1, codes.data(), scales.data(),
                        WeightMatrix{w.data(), DType::kQ4_0, 40, 1, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("k 40 with ldb 40, ldc 1: sizes must be >= 0, k and "
                                          "ldb whole blocks of 32 (q4_0)")));
  EXPECT_THAT(
      [&] {
        dot_gemm_blocks(1, codes.data(), scales.data(),
                        WeightMatrix{w.data(), DType::kQ8_0, 32, 2, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("n 2, k 32 with ldb 32, ldc 1")));
}

TEST(BlockGemmTest, SuperBlockDotRefusesInOutWeightsAndPartialBlocks) {
  const std::vector<std::uint16_t> w(512, 0);
  const std::vector<std::int8_t> codes(1024, 0);
  const std::vector<float> scales(32, 1.0f);
  float c[4];
  const WeightLayout out_in = WeightLayout::kOutIn;
  auto matrix = [&](DType t, std::int64_t k, std::int64_t n, WeightLayout layout, std::int64_t ld) {
    return WeightMatrix{w.data(), t, k, n, layout, ld};
  };
  auto run = [&](std::int64_t m, const WeightMatrix& b, std::int64_t ldc) {
    dot_gemm_blocks(m, codes.data(), scales.data(), b, c, ldc, runtime::kernel_level());
  };
  // In-out weights, k or ldb not whole super-blocks, a negative size, a short ldb or ldc.
  struct Refusal {
    std::int64_t m;
    WeightMatrix b;
    std::int64_t ldc;
    const char* message;
  };
  for (const Refusal& r :
       {Refusal{1, matrix(DType::kQ6_K, 256, 1, WeightLayout::kInOut, 0), 1,
                "dot_gemm_blocks: q6_k weights stored in-out"},
        Refusal{1, matrix(DType::kQ4_K, 128, 1, out_in, 0), 1,
                "dot_gemm_blocks: m 1, n 1, k 128 with ldb 128, ldc 1: sizes must be >= 0, k "
                "and ldb whole blocks of 256 (q4_k)"},
        Refusal{1, matrix(DType::kQ6_K, 256, 1, out_in, 384), 1, "k 256 with ldb 384"},
        Refusal{-1, matrix(DType::kQ6_K, 256, 1, out_in, 0), 1,
                "dot_gemm_blocks: m -1, n 1, k 256"},
        Refusal{1, matrix(DType::kQ4_K, 512, 1, out_in, 256), 1, "k 512 with ldb 256"},
        Refusal{1, matrix(DType::kQ4_K, 256, 2, out_in, 0), 1, "n 2, k 256 with ldb 256, ldc 1"}}) {
    EXPECT_THAT([&] { run(r.m, r.b, r.ldc); }, ThrowsMessage<ShapeError>(HasSubstr(r.message)));
  }
}

// ---- Prefill by int8 products (packed_gemm_q8) -------------------------------------------------

// packed_gemm_q8 run as run_dot runs the dot kernel (c of NaN, its padding's sentinels kept).
std::vector<float> run_packed(std::int64_t m, const Quantized& q, const WeightMatrix& b,
                              KernelLevel level, const std::string& label) {
  return run_dot(m, q, b, level, label, packed_gemm_q8);
}

// The header's packed orders, transcribed: a block's exact integer sums (Q6_K: of inputs 0-15
// and 16-31), one f32 scale product and one fma each, Q4_K's minimum after, in block order from
// +0. The pair formats' codes and scales by weight_code / weight_scale, the K formats' by
// super_element.
float packed_order(const DotCase& cs, std::int64_t i, std::int64_t j) {
  const auto* row = static_cast<const unsigned char*>(cs.b.stored_row(j));
  const std::int64_t blocks = cs.k / 32;
  const bool super = is_super_block(cs.dtype);
  float acc = 0.0f;
  for (std::int64_t t = 0; t < blocks; ++t) {
    const float d_a = cs.q.scales[static_cast<std::size_t>(i * blocks + t)];
    const std::int8_t* x = cs.q.codes.data() + i * cs.k + t * 32;
    std::int32_t isum[2] = {0, 0};
    float ds[2] = {0.0f, 0.0f}, dm = 0.0f;
    std::int32_t code_sum = 0;
    for (std::int64_t e = 0; e < 32; ++e) {
      const int half = has_two_scales(cs.dtype) && e >= 16 ? 1 : 0;
      int code = 0;
      if (super) {
        const SuperElement w =
            super_element(row + t / 8 * traits(cs.dtype).block_bytes, cs.dtype, t % 8 * 32 + e);
        code = w.code;
        ds[half] = w.ds;
        dm = w.dm;
      } else {
        const unsigned char* block = row + t * traits(cs.dtype).block_bytes;
        code = weight_code(block, cs.dtype, e);
        ds[0] = weight_scale(block);
      }
      isum[half] += std::int32_t{x[e]} * code;
      code_sum += x[e];
    }
    acc = std::fma(static_cast<float>(isum[0]), d_a * ds[0], acc);
    if (has_two_scales(cs.dtype)) acc = std::fma(static_cast<float>(isum[1]), d_a * ds[1], acc);
    if (has_minimums(cs.dtype)) acc = std::fma(d_a * static_cast<float>(code_sum), -dm, acc);
  }
  return acc;
}

// Depths for the packed kernel: one, two, three and many blocks of a format.
std::vector<std::int64_t> packed_depths(DType t) {
  if (is_super_block(t)) return {256, 512, 768};
  return {32, 64, 96, 1024};
}

// Every level gives each element the order's bits, whatever the rows and outputs around it
// (m and n that do and do not fill the kernel's 4 rows, AMX's 16 and the 16- and 32-output
// panels), the weights holding codes GGML's quantizers do not write (dot_case's foreign ones).
TEST_P(BlockGemmLevelTest, PackedGemmIsTheHeadersOrderBitForBit) {
  std::uint32_t seed = 3000;
  for (DType t : kBlockFormats) {
    for (std::int64_t m : {1, 2, 3, 4, 5, 8, 13, 16, 17, 35}) {
      for (std::int64_t n : {1, 7, 16, 17, 32, 33, 50}) {
        for (std::int64_t k : packed_depths(t)) {
          const DotCase cs = dot_case(t, m, n, k, seed += 3);
          const std::string label = cs.label + " at " + level_name(level());
          const std::vector<float> got = run_packed(m, cs.q, cs.b, level(), label);
          bool same = true;
          for (std::int64_t i = 0; i < m; ++i) {
            for (std::int64_t j = 0; j < n; ++j) {
              same = same &&
                     bits(got[static_cast<std::size_t>(i * n + j)]) == bits(packed_order(cs, i, j));
            }
          }
          ASSERT_TRUE(same) << label;
        }
      }
    }
  }
}

// The order's value is the product of the quantized activations and the kernel's weights within
// the header's bound, (L k / 32 + 1) 2^-24 (P + M), and some error takes a share of it that only
// a sound bound leaves. The weights: the pair formats' exact values (widened_element); Q4_K's
// ds q - dm and Q6_K's ds (q - 32) from super_element, in float64.
TEST(BlockGemmTest, PackedGemmIsWithinItsBound) {
  std::uint32_t seed = 3500;
  for (DType t : kBlockFormats) {
    const double roundings = has_two_scales(t) ? 4.0 : has_minimums(t) ? 3.0 : 2.0;
    const std::vector<std::int64_t> depths = is_super_block(t)
                                                 ? std::vector<std::int64_t>{256, 1024, 4096 + 256}
                                                 : std::vector<std::int64_t>{32, 96, 1024, 4128};
    for (std::int64_t k : depths) {
      const std::int64_t m = 5, n = 19, blocks = k / 32;
      const DotCase cs = dot_case(t, m, n, k, seed += 5);
      const std::vector<float> c = run_packed(m, cs.q, cs.b, KernelLevel::kScalar, cs.label);
      double used = 0.0;
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          const auto* row = static_cast<const unsigned char*>(cs.b.stored_row(j));
          double exact = 0.0, magnitude = 0.0;
          for (std::int64_t e = 0; e < k; ++e) {
            const double x = static_cast<double>(cs.q.codes[static_cast<std::size_t>(i * k + e)]) *
                             cs.q.scales[static_cast<std::size_t>(i * blocks + e / 32)];
            if (is_super_block(t)) {
              const SuperElement w =
                  super_element(row + e / 256 * traits(t).block_bytes, t, e % 256);
              const double scaled = x * static_cast<double>(w.ds) * w.code;
              const double minimum = x * static_cast<double>(w.dm);
              exact += scaled - minimum;
              magnitude += std::abs(scaled) + std::abs(minimum);
            } else {
              const double p = x * widened_element(row, t, e);
              exact += p;
              magnitude += std::abs(p);
            }
          }
          const double bound =
              (roundings * static_cast<double>(blocks) + 1.0) * std::ldexp(1.0, -24) * magnitude;
          const double error = std::abs(c[static_cast<std::size_t>(i * n + j)] - exact);
          EXPECT_LE(error, bound) << cs.label << " [" << i << ", " << j << "]";
          used = std::max(used, error / bound);
        }
      }
      // The bound adds a rounding a block; random errors grow as their square root.
      EXPECT_GT(used, 0.02 / static_cast<double>(blocks)) << cs.label;
    }
  }
}

// Codes of -128 everywhere multiply exactly; a NaN weight scale reaches its output in every row
// and a NaN activation every output of its row, nothing else; k = 0 writes zeros, m = 0 or
// n = 0 nothing.
TEST_P(BlockGemmLevelTest, PackedGemmExtremesNaNAndEmptyProducts) {
  {
    const std::vector<int> w(64, -128);
    std::vector<std::int8_t> q(64, 127);
    for (int e = 32; e < 64; ++e) q[static_cast<std::size_t>(e)] = -127;
    const std::vector<std::uint16_t> row = q8_0_row(w, 0x3C00);
    const std::vector<float> scales{1.0f, 0.5f};
    float c = kSentinel;
    packed_gemm_q8(1, q.data(), scales.data(),
                   WeightMatrix{row.data(), DType::kQ8_0, 64, 1, WeightLayout::kOutIn}, &c, 1,
                   level());
    EXPECT_EQ(c, -128.0f * 127.0f * 32.0f * 0.5f);
  }
  for (DType t : kBlockFormats) {
    const std::int64_t m = 18, n = 37, k = 3 * traits(t).block_elements;
    Blocks w = make_blocks(t, n, k, 17);
    unsigned char* block =
        w.bytes() + 20 * w.row_bytes() + 2 * traits(t).block_bytes + scale_offset(t);
    block[0] = 0x00;
    block[1] = 0x7E;
    if (has_minimums(t)) {  // its dmin too, of another output
      unsigned char* other = w.bytes() + 30 * w.row_bytes() + 2;
      other[0] = 0x00;
      other[1] = 0x7E;
    }
    std::vector<float> a(static_cast<std::size_t>(m * k), 0.25f);
    a[static_cast<std::size_t>(5 * k + 77)] = kNaN;  // in AMX's 16 rows
    a[static_cast<std::size_t>(17 * k + 3)] = kNaN;  // past them
    const std::string label = std::string(to_string(t)) + " at " + level_name(level());
    const Quantized q = quantize(m, k, a, k, level());
    const std::vector<float> c = run_packed(m, q, w.matrix(), level(), label);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        const bool fed = i == 5 || i == 17 || j == 20 || (has_minimums(t) && j == 30);
        EXPECT_EQ(std::isnan(c[static_cast<std::size_t>(i * n + j)]), fed)
            << label << " [" << i << ", " << j << "]";
      }
    }
    const std::vector<std::uint16_t> none(1, 0);
    const std::vector<std::int8_t> codes(1, 0);
    const std::vector<float> scales(1, 0.0f);
    std::vector<float> empty(6, kSentinel);
    packed_gemm_q8(2, codes.data(), scales.data(),
                   WeightMatrix{none.data(), t, 0, 3, WeightLayout::kOutIn}, empty.data(), 3,
                   level());
    for (float x : empty) EXPECT_EQ(bits(x), 0u) << label;
    empty.assign(6, kSentinel);
    const std::int64_t one = traits(t).block_elements;
    packed_gemm_q8(0, codes.data(), scales.data(),
                   WeightMatrix{none.data(), t, one, 3, WeightLayout::kOutIn}, empty.data(), 3,
                   level());
    packed_gemm_q8(2, codes.data(), scales.data(),
                   WeightMatrix{none.data(), t, one, 0, WeightLayout::kOutIn}, empty.data(), 3,
                   level());
    for (float x : empty) EXPECT_EQ(x, kSentinel) << label;
  }
}

TEST(BlockGemmTest, PackedGemmRefusesOtherFormatsInOutWeightsAndPartialBlocks) {
  const std::vector<std::uint16_t> w(512, 0);
  const std::vector<std::int8_t> codes(256, 0);
  const std::vector<float> scales(8, 1.0f);
  float c[4];
  auto run = [&](std::int64_t m, const WeightMatrix& b, std::int64_t ldc) {
    packed_gemm_q8(m, codes.data(), scales.data(), b, c, ldc);
  };
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kBF16, 256, 1, WeightLayout::kOutIn}, 1);
      },
      ThrowsMessage<TypeError>(
          HasSubstr("packed_gemm_q8: weights of dtype bf16; it takes the block formats")));
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kQ8_0, 32, 1, WeightLayout::kInOut}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("packed_gemm_q8: q8_0 weights stored in-out")));
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kQ4_0, 40, 1, WeightLayout::kOutIn}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("packed_gemm_q8: m 1, n 1, k 40 with ldb 40, ldc 1")));
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kQ8_0, 64, 1, WeightLayout::kOutIn, 32}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("k 64 with ldb 32")));
  EXPECT_THAT(
      [&] {
        run(-1, WeightMatrix{w.data(), DType::kQ8_0, 32, 1, WeightLayout::kOutIn}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("packed_gemm_q8: m -1, n 1, k 32")));
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kQ8_0, 32, 2, WeightLayout::kOutIn}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("n 2, k 32 with ldb 32, ldc 1")));
  EXPECT_THAT(
      [&] {
        run(1, WeightMatrix{w.data(), DType::kQ4_K, 128, 1, WeightLayout::kOutIn}, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("packed_gemm_q8: m 1, n 1, k 128 with ldb 128, ldc 1: "
                                          "sizes must be >= 0, k and ldb whole blocks of 256 "
                                          "(q4_k)")));
}

// ---- Prefill on dequantized panels (gemm_dequantized) ------------------------------------------

// gemm_dequantized's definition spelled out: the whole matrix dequantized (by widened_element,
// not the kernel's dequantizer), then gemm() per panel of 256 inputs by 4096 outputs, adding
// into c after the first panel of k.
void panels_reference(std::int64_t m, const float* a, std::int64_t lda, const Blocks& w,
                      std::int64_t j_first, std::int64_t n, std::int64_t k, float* c,
                      std::int64_t ldc) {
  std::vector<float> dequantized(static_cast<std::size_t>(n * k));
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t e = 0; e < k; ++e)
      dequantized[static_cast<std::size_t>(j * k + e)] = w.value(j_first + j, e);
  }
  for (std::int64_t j0 = 0; j0 < n; j0 += 4096) {
    const std::int64_t cols = std::min<std::int64_t>(4096, n - j0);
    for (std::int64_t r0 = 0; r0 < k; r0 += 256) {
      gemm(m, cols, std::min<std::int64_t>(256, k - r0), 1.0f, a + r0, lda,
           dequantized.data() + j0 * k + r0, k, /*transpose_b=*/true, r0 == 0 ? 0.0f : 1.0f, c + j0,
           ldc);
    }
  }
}

TEST(BlockGemmTest, GemmDequantizedIsTheFp32GemmOfTheDequantizedPanels) {
  struct Shape {
    std::int64_t m, n, k;
  };
  std::uint32_t seed = 40;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (const Shape s : {Shape{1, 5, 32}, Shape{7, 33, 96}, Shape{17, 40, 256}, Shape{20, 37, 288},
                          Shape{33, 65, 800}, Shape{3, 4100, 64}}) {
      const std::string label = std::string(to_string(t)) + " m" + std::to_string(s.m) + " n" +
                                std::to_string(s.n) + " k" + std::to_string(s.k);
      const std::int64_t lda = s.k + 3, ldc = s.n + 2;
      std::mt19937 rng(seed += 7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> a(static_cast<std::size_t>(s.m * lda));
      for (float& x : a) x = normal(rng);
      const Blocks w = make_blocks(t, s.n + 3, s.k + 32, seed);
      const WeightMatrix b = w.matrix().outputs(1, s.n).inputs(0, s.k);
      // c holds NaN where it is written (never read) and a sentinel in its padding.
      std::vector<float> got(static_cast<std::size_t>(s.m * ldc), kSentinel);
      for (std::int64_t i = 0; i < s.m; ++i) std::fill_n(got.begin() + i * ldc, s.n, kNaN);
      std::vector<float> want = got;
      gemm_dequantized(s.m, a.data(), lda, b, got.data(), ldc);
      panels_reference(s.m, a.data(), lda, w, 1, s.n, s.k, want.data(), ldc);
      EXPECT_TRUE(same_bits(got, want)) << label;  // the padding's sentinels included
      for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = s.n; j < ldc; ++j)
          EXPECT_EQ(got[static_cast<std::size_t>(i * ldc + j)], kSentinel) << label;
      }
      // And it is the product: within fp32 accumulation of k terms of float64.
      bool within = true;
      for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < s.n; ++j) {
          double exact = 0.0, magnitude = 0.0;
          for (std::int64_t e = 0; e < s.k; ++e) {
            const double p =
                static_cast<double>(a[static_cast<std::size_t>(i * lda + e)]) * w.value(1 + j, e);
            exact += p;
            magnitude += std::abs(p);
          }
          within = within && std::abs(got[static_cast<std::size_t>(i * ldc + j)] - exact) <=
                                 static_cast<double>(s.k + 2) * std::ldexp(1.0, -24) * magnitude;
        }
      }
      EXPECT_TRUE(within) << label;
    }
  }
}

// A NaN scale reaches the column it multiplies into, and only it; k = 0 writes zeros.
TEST(BlockGemmTest, GemmDequantizedNaNAndEmptyProducts) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    Blocks w = make_blocks(t, 6, 64, 3);
    unsigned char* block = w.bytes() + 2 * w.row_bytes() + traits(t).block_bytes;
    block[0] = 0x00;
    block[1] = 0x7E;
    const std::vector<float> a(5 * 64, 0.5f);
    std::vector<float> c(5 * 6, kSentinel);
    gemm_dequantized(5, a.data(), 64, w.matrix(), c.data(), 6);
    for (std::int64_t i = 0; i < 5; ++i) {
      for (std::int64_t j = 0; j < 6; ++j)
        EXPECT_EQ(std::isnan(c[static_cast<std::size_t>(i * 6 + j)]), j == 2) << i << ", " << j;
    }
    c.assign(c.size(), kSentinel);
    gemm_dequantized(5, a.data(), 64, WeightMatrix{w.data(), t, 0, 6, WeightLayout::kOutIn},
                     c.data(), 6);
    for (float x : c) EXPECT_EQ(bits(x), 0u);
  }
}

TEST(BlockGemmTest, GemmDequantizedRefusesOtherFormatsAndPartialBlocks) {
  const std::vector<std::uint16_t> w(64, 0);
  const std::vector<float> a(64, 1.0f);
  float c[2];
  EXPECT_THAT(
      [&] {
        gemm_dequantized(1, a.data(), 32,
                         WeightMatrix{w.data(), DType::kF16, 32, 1, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<TypeError>(
          HasSubstr("gemm_dequantized: weights of dtype f16; it takes the block formats")));
  EXPECT_THAT(
      [&] {
        gemm_dequantized(1, a.data(), 48,
                         WeightMatrix{w.data(), DType::kQ4_0, 48, 1, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("k 48 with lda 48, ldb 48")));
  EXPECT_THAT(
      [&] {
        gemm_dequantized(1, a.data(), 64,
                         WeightMatrix{w.data(), DType::kQ4_K, 64, 1, WeightLayout::kOutIn}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("k 64 with lda 64, ldb 64, ldc 1: sizes must be >= 0, k "
                                          "and ldb whole blocks of 256 (q4_k)")));
  EXPECT_THAT(
      [&] {
        gemm_dequantized(1, a.data(), 32,
                         WeightMatrix{w.data(), DType::kQ8_0, 32, 1, WeightLayout::kInOut}, c, 1);
      },
      ThrowsMessage<ShapeError>(HasSubstr("q8_0 weights stored in-out")));
}

// ---- Weights stored in panels (runtime/weight_panels.hpp)
// ----------------------------------------

// `rows` (ld = k) copied into the panel layout, and the matrix that reads it.
struct Panels {
  std::vector<std::uint16_t> storage;
  WeightMatrix matrix;
};

Panels panels_of(const Blocks& rows) {
  Panels p{std::vector<std::uint16_t>(rows.storage.size()), {}};
  const auto bytes = static_cast<std::size_t>(rows.outputs * rows.row_bytes());
  runtime::rows_to_panels(rows.dtype, rows.outputs, rows.ld,
                          std::span(reinterpret_cast<const std::byte*>(rows.data()), bytes),
                          std::span(reinterpret_cast<std::byte*>(p.storage.data()), bytes));
  p.matrix = {p.storage.data(),
              rows.dtype,
              rows.ld,
              rows.outputs,
              WeightLayout::kOutIn,
              rows.ld,
              runtime::panel_outputs(rows.outputs)};
  return p;
}

// Panels give the bits of their rows: decode (the panel kernel at avx512-bf16 and amx, the rows
// restored below) against the scalar level on rows, and the prefill tile against itself on rows,
// for whole panels, a tail of rows after them, and views that start at the second panel; the
// weights hold codes GGML's quantizers do not write (Q8_0's -128).
TEST_P(BlockGemmLevelTest, PanelsGiveTheBitsOfTheirRows) {
  std::uint32_t seed = 5000;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (std::int64_t n : {16, 21, 48, 53}) {
      for (std::int64_t k : {32, 96, 1024}) {
        const Blocks rows = make_blocks(t, n, k, seed += 7, /*foreign=*/true);
        const Panels panels = panels_of(rows);
        for (std::int64_t m : {1, 2, 3, 4, 5, 16, 17, 35}) {
          std::mt19937 rng(seed + static_cast<std::uint32_t>(m));
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> a(static_cast<std::size_t>(m * k));
          for (float& x : a) x = normal(rng);
          const Quantized q = quantize(m, k, a, k, KernelLevel::kScalar);
          const std::string label = std::string(to_string(t)) + " m" + std::to_string(m) + " n" +
                                    std::to_string(n) + " k" + std::to_string(k) + " at " +
                                    level_name(level());
          if (m <= 16) {
            ASSERT_TRUE(same_bits(run_dot(m, q, panels.matrix, level(), label),
                                  run_dot(m, q, rows.matrix(), KernelLevel::kScalar, label)))
                << label;
            ASSERT_TRUE(same_bits(
                run_dot(m, q, panels.matrix.outputs(16, n - 16), level(), label),
                run_dot(m, q, rows.matrix().outputs(16, n - 16), KernelLevel::kScalar, label)))
                << label << ", outputs from 16";
          }
          ASSERT_TRUE(same_bits(run_packed(m, q, panels.matrix, level(), label),
                                run_packed(m, q, rows.matrix(), level(), label)))
              << label << ", packed";
        }
      }
    }
  }
}

// A NaN scale inside a panel makes its own output NaN and no other.
TEST_P(BlockGemmLevelTest, ANaNScaleInAPanelReachesItsOutputOnly) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    const std::int64_t m = 3, n = 35, k = 96;
    Blocks rows = make_blocks(t, n, k, 23);
    unsigned char* block = rows.bytes() + 21 * rows.row_bytes() + traits(t).block_bytes;
    block[0] = 0x00;
    block[1] = 0x7E;
    const Panels panels = panels_of(rows);
    const Quantized q = quantize(m, k, std::vector<float>(m * k, 0.5f), k, level());
    const std::string label = std::string(to_string(t)) + " at " + level_name(level());
    for (const bool packed : {false, true}) {
      const std::vector<float> c = packed ? run_packed(m, q, panels.matrix, level(), label)
                                          : run_dot(m, q, panels.matrix, level(), label);
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(std::isnan(c[static_cast<std::size_t>(i * n + j)]), j == 21)
              << label << (packed ? " packed" : " dot") << " [" << i << ", " << j << "]";
        }
      }
    }
  }
}

TEST(BlockGemmTest, PanelsRefuseViewsThatCutThemAndKernelsThatCannotReadThem) {
  const Blocks rows = make_blocks(DType::kQ4_0, 48, 64, 31);
  const Panels panels = panels_of(rows);
  EXPECT_THAT([&] { (void)panels.matrix.outputs(8, 16); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "outputs [8, 24) of a weight matrix whose first 48 outputs are panels of 16: a "
                  "view of them takes whole panels")));
  EXPECT_THAT([&] { (void)panels.matrix.outputs(16, 8); },
              ThrowsMessage<ShapeError>(HasSubstr("outputs [16, 24) of a weight matrix")));
  EXPECT_EQ(panels.matrix.outputs(16, 32).panel_outputs, 32);
  EXPECT_EQ(panels.matrix.outputs(32, 16).panel_outputs, 16);
  EXPECT_THAT([&] { (void)panels.matrix.inputs(0, 32); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "inputs [0, 32) of a weight matrix stored in panels: panels cannot be cut by "
                  "inputs")));

  const std::vector<std::int8_t> codes(64, 1);
  const std::vector<float> scales(2, 1.0f);
  std::vector<float> c(48);
  WeightMatrix partial = panels.matrix;
  partial.panel_outputs = 8;
  EXPECT_THAT([&] { dot_gemm_blocks(1, codes.data(), scales.data(), partial, c.data(), 48); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("dot_gemm_blocks: 8 panel outputs of 48 q4_0 weights with ldb 64 for k "
                            "64: panels are whole")));
  EXPECT_THAT([&] { packed_gemm_q8(1, codes.data(), scales.data(), partial, c.data(), 48); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "packed_gemm_q8: 8 panel outputs of 48 q4_0 weights with ldb 64 for k 64")));
  WeightMatrix wide = panels.matrix;
  wide.rows = 32;  // the first block of each output, rows 64 apart: not packed
  EXPECT_THAT([&] { dot_gemm_blocks(1, codes.data(), scales.data(), wide, c.data(), 48); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("48 panel outputs of 48 q4_0 weights with ldb 64 for k 32")));
  const Blocks k_rows = make_blocks(DType::kQ4_K, 16, 256, 37);
  WeightMatrix k_panels = k_rows.matrix();
  k_panels.panel_outputs = 16;
  const std::vector<std::int8_t> k_codes(256, 1);
  const std::vector<float> k_scales(8, 1.0f);
  EXPECT_THAT(
      [&] { dot_gemm_blocks(1, k_codes.data(), k_scales.data(), k_panels, c.data(), 48); },
      ThrowsMessage<TypeError>(HasSubstr("dot_gemm_blocks: q4_k weights have no panel layout")));
  EXPECT_THAT(
      [&] { packed_gemm_q8(1, k_codes.data(), k_scales.data(), k_panels, c.data(), 48); },
      ThrowsMessage<TypeError>(HasSubstr("packed_gemm_q8: q4_k weights have no panel layout")));
  const std::vector<float> a(64, 1.0f);
  EXPECT_THAT([&] { gemm_dequantized(1, a.data(), 64, panels.matrix, c.data(), 48); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "gemm_dequantized: q4_0 weights stored in panels (48 outputs); it reads rows")));
}

// MatmulPrecision::kRowInvariant on block formats (a serving engine's products): every row of a
// product of 17 to 100 rows, on rows and on panels, has the bits it gets alone (device_gemm: the
// dot kernels take all the rows at once, or the tile for q8_0 and q4_0 panels where they pay).
TEST(BlockGemmTest, RowInvariantProductsGiveEachRowTheBitsItGetsAlone) {
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const DType t : kBlockFormats) {
    const std::int64_t k = is_super_block(t) ? 512 : 96, n = 48;
    const Blocks rows = make_blocks(t, n, k, 43);
    const bool has_panels = t == DType::kQ8_0 || t == DType::kQ4_0;
    const Panels panels = has_panels ? panels_of(rows) : Panels{};
    for (const bool in_panels : {false, true}) {
      if (in_panels && !has_panels) continue;
      const WeightMatrix b = in_panels ? panels.matrix : rows.matrix();
      for (const std::int64_t m : {17, 40, 100}) {
        std::vector<float> a(static_cast<std::size_t>(m * k)), c(static_cast<std::size_t>(m * n));
        for (float& x : a) x = normal(rng);
        device_gemm(ConstMatrixMap(a.data(), m, k), b, MatrixMap(c.data(), m, n),
                    MatmulPrecision::kRowInvariant);
        for (std::int64_t r = 0; r < m; ++r) {
          std::vector<float> alone(static_cast<std::size_t>(n));
          device_gemm(ConstMatrixMap(a.data() + r * k, 1, k), b, MatrixMap(alone.data(), 1, n),
                      MatmulPrecision::kRowInvariant);
          ASSERT_EQ(std::vector<float>(c.begin() + r * n, c.begin() + (r + 1) * n), alone)
              << to_string(t) << (in_panels ? " in panels" : " in rows") << ", row " << r << " of "
              << m;
        }
      }
    }
  }
}

// Q8_0 and Q4_0 weights in panels where they pay (panels_pay: from avx2): device_gemm multiplies
// them by the prefill tile at every number of rows and in both precisions
// (WeightKernels::tiles_on_panels_from: packed_gemm_q8 reads the stored panels where they lie, one
// row as fast as the dot kernel), so a row has packed_gemm_q8's bits in a decode step, a prompt or
// a serving step alike. Below that (and on rows) decode keeps the dot kernel's order.
TEST(BlockGemmTest, PanelsWhereTheyPayTakeThePackedOrderAtEveryRowCount) {
  const KernelLevel level = runtime::kernel_level();
  std::mt19937 rng(47);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    std::int64_t k, n;
    std::vector<std::int64_t> ms;
  };
  // One task and one tile; prefill of 80 rows in tiles with a tail of 16 (k 8192 keeps the
  // tiles small); many tasks over panels (1024 outputs), with the row-stored tail of n = 1030.
  const std::vector<Shape> shapes = {
      {160, 80, {1, 3, 16, 17, 40}}, {8192, 32, {80}}, {1024, 1030, {1, 20}}};
  for (const DType t : {DType::kQ8_0, DType::kQ4_0}) {
    const bool tile = panels_pay(t, level);
    for (const Shape& shape : shapes) {
      const std::int64_t k = shape.k, n = shape.n;
      const Blocks rows = make_blocks(t, n, k, 49, /*foreign=*/true);
      const Panels panels = panels_of(rows);
      for (const MatmulPrecision precision :
           {MatmulPrecision::kF32, MatmulPrecision::kRowInvariant}) {
        for (const std::int64_t m : shape.ms) {
          std::vector<float> a(static_cast<std::size_t>(m * k)), c(static_cast<std::size_t>(m * n));
          for (float& x : a) x = normal(rng);
          device_gemm(ConstMatrixMap(a.data(), m, k), panels.matrix, MatrixMap(c.data(), m, n),
                      precision);
          const std::string label = fmt::format(
              "{} m {} [{}, {}] {} at {}", to_string(t), m, k, n,
              precision == MatmulPrecision::kF32 ? "f32" : "row-invariant", level_name(level));
          const Quantized q = quantize(m, k, a, k, level);
          // The kernel device_gemm must have taken: the tile where panels pay, elsewhere the dot
          // kernel (prefill of more than 16 rows there mixes tiles and a dot-kernel tail: not
          // checked).
          if (!tile && m > 16) continue;
          const std::vector<float> want = tile ? run_packed(m, q, panels.matrix, level, label)
                                               : run_dot(m, q, panels.matrix, level, label);
          for (std::int64_t r = 0; r < m; ++r) {
            for (std::int64_t j = 0; j < n; ++j) {
              ASSERT_EQ(bits(c[static_cast<std::size_t>(r * n + j)]),
                        bits(want[static_cast<std::size_t>(r * n + j)]))
                  << label << ", row " << r << ", output " << j;
            }
          }
        }
      }
    }
  }
}

NUMESH_INSTANTIATE_LEVELS(BlockGemmLevelTest);

}  // namespace
}  // namespace numesh::ops
