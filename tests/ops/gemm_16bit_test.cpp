#include "numesh/ops/kernels/gemm_16bit.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using numesh::testing::runs_here;

using testing::random_floats;

// A product c[m, n] = a[m, k] b[k, n] with every leading dimension larger than its row (the
// padding of a and b is garbage, c's padding a sentinel the kernel must not touch), or `tight`:
// every leading dimension its row length and every buffer exactly its size, so the last row
// ends at the end of its allocation, where ASan sees a read or write past it.
struct Problem {
  std::int64_t m, n, k, lda, ldb, ldc;
  std::vector<float> a;
  std::vector<float> b_values;  // the weights before rounding to the 16-bit dtype
};

Problem make_problem(std::int64_t m, std::int64_t n, std::int64_t k, std::uint32_t seed,
                     bool tight = false) {
  Problem p =
      tight ? Problem{m, n, k, k, n, n, {}, {}} : Problem{m, n, k, k + 3, n + 5, n + 7, {}, {}};
  p.a = random_floats(static_cast<std::size_t>(m * p.lda), seed);
  p.b_values = random_floats(static_cast<std::size_t>(k * p.ldb), seed + 1);
  return p;
}

std::vector<std::uint16_t> weights_as(const std::vector<float>& values, DType t) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bits[i] = t == DType::kBF16 ? bf16_from_f32(values[i]) : f16_from_f32(values[i]);
  }
  return bits;
}

float weight_value(std::uint16_t bits, DType t) {
  return t == DType::kBF16 ? f32_from_bf16(bits) : f32_from_f16(bits);
}

constexpr float kSentinel = 12345.0f;

// c [m, ldc] packed to [m, n]; fails the test if c's padding no longer holds kSentinel.
std::vector<float> unpadded(const Problem& p, const std::vector<float>& c,
                            const std::string& label) {
  std::vector<float> packed(static_cast<std::size_t>(p.m * p.n));
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.ldc; ++j) {
      const float x = c[static_cast<std::size_t>(i * p.ldc + j)];
      if (j < p.n) {
        packed[static_cast<std::size_t>(i * p.n + j)] = x;
      } else if (std::bit_cast<std::uint32_t>(x) != std::bit_cast<std::uint32_t>(kSentinel)) {
        ADD_FAILURE() << label << ": c's padding at row " << i << ", column " << j
                      << " was overwritten";
        return packed;
      }
    }
  }
  return packed;
}

// Runs gemm_16bit on `p` into a c that holds NaN (c is output only) with kSentinel in its
// padding; fails the test if the padding changed. Returns c packed to [m, n].
std::vector<float> run(const Problem& p, const std::vector<std::uint16_t>& b, DType t,
                       KernelLevel level, const std::string& label,
                       WeightLayout layout = WeightLayout::kInOut, std::int64_t ldb = 0) {
  std::vector<float> c(static_cast<std::size_t>(std::max<std::int64_t>(p.m * p.ldc, 1)), kSentinel);
  for (std::int64_t i = 0; i < p.m; ++i) {
    std::fill_n(c.begin() + i * p.ldc, p.n, std::numeric_limits<float>::quiet_NaN());
  }
  gemm_16bit(p.m, p.a.data(), p.lda,
             WeightMatrix{b.data(), t, p.k, p.n, layout, ldb > 0 ? ldb : p.ldb}, c.data(), p.ldc,
             level);
  return unpadded(p, c, label);
}

// ---- The oracle of the vdpbf16ps path
// -------------------------------------------------------------

// A bf16 value as vdpbf16ps reads it: subnormals are zero (DAZ).
float bf16_daz(std::uint16_t h) {
  const float x = f32_from_bf16(h);
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

// One step of vdpbf16ps as Intel defines it: the exact product of two bf16 values added in fp32
// with one rounding to nearest even, a subnormal result flushed to zero (FTZ).
float dp_step(float acc, float x, float y) {
  const float s = std::fma(x, y, acc);  // x y is exact in fp32 for bf16 x, y in the normal range
  return std::fpclassify(s) == FP_SUBNORMAL ? std::copysign(0.0f, s) : s;
}

// The scalar emulation of the vdpbf16ps path (the header's formula): a rounded to bf16, k padded
// to whole pairs with zeros, each element one chain over the pairs in k order, the odd element of
// a pair added first.
std::vector<float> emulate_dpbf16(const Problem& p, const std::vector<std::uint16_t>& b) {
  std::vector<float> c(static_cast<std::size_t>(p.m * p.n));
  const auto a_at = [&](std::int64_t i, std::int64_t r) {
    return r < p.k ? bf16_daz(bf16_from_f32(p.a[static_cast<std::size_t>(i * p.lda + r)])) : 0.0f;
  };
  const auto b_at = [&](std::int64_t r, std::int64_t j) {
    return r < p.k ? bf16_daz(b[static_cast<std::size_t>(r * p.ldb + j)]) : 0.0f;
  };
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < p.k; r += 2) {
        acc = dp_step(acc, a_at(i, r + 1), b_at(r + 1, j));
        acc = dp_step(acc, a_at(i, r), b_at(r, j));
      }
      c[static_cast<std::size_t>(i * p.n + j)] = acc;
    }
  }
  return c;
}

// ---- The float64 reference and its bound
// ---------------------------------------------------------

// The float64 product of a (rounded to bf16 when `round_a`) and the stored weights, and for
// each element the sum of |a[i][r] b[r][j]|, which bounds the fp32 rounding error.
struct Reference {
  std::vector<double> value, magnitude;
};

Reference reference(const Problem& p, const std::vector<std::uint16_t>& b, DType t, bool round_a) {
  Reference ref{std::vector<double>(static_cast<std::size_t>(p.m * p.n), 0.0),
                std::vector<double>(static_cast<std::size_t>(p.m * p.n), 0.0)};
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t r = 0; r < p.k; ++r) {
      const float x = p.a[static_cast<std::size_t>(i * p.lda + r)];
      const double ar = round_a ? f32_from_bf16(bf16_from_f32(x)) : x;
      for (std::int64_t j = 0; j < p.n; ++j) {
        const double prod = ar * weight_value(b[static_cast<std::size_t>(r * p.ldb + j)], t);
        ref.value[static_cast<std::size_t>(i * p.n + j)] += prod;
        ref.magnitude[static_cast<std::size_t>(i * p.n + j)] += std::abs(prod);
      }
    }
  }
  return ref;
}

// Whether every element is within the worst-case error of fp32 accumulation of the k products:
// any summation order of k terms with one rounding (unit roundoff u = 2^-24) per addition or
// fused multiply-add is within (k + 1) u sum |terms| of the exact sum to first order (Higham,
// Accuracy and Stability, 3.1). The vdpbf16ps chain makes at most k + 1 roundings (a zero pair
// pads an odd k), OpenBLAS k; the bound takes (k + 2) u sum |a b| plus 1e-30 for the sign of zero.
::testing::AssertionResult within_fp32_accumulation(const std::vector<float>& got,
                                                    const Reference& want, std::int64_t k) {
  const double unit = std::ldexp(1.0, -24);
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double bound = static_cast<double>(k + 2) * unit * want.magnitude[e] + 1e-30;
    const double err = std::abs(static_cast<double>(got[e]) - want.value[e]);
    if (!(err <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << e << ": got " << got[e] << ", want " << want.value[e] << ", error "
             << err << " > bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

struct Shape {
  std::int64_t m, n, k;
};

// Shapes that do and do not fill the blocking of both paths: the micro-kernel's 12 rows x 32
// columns, 192 rows of a per pack, 256 rows of b (k) per block and per widened panel, 1024
// columns per block of packed b and 4096 per widened panel; odd and even k. Small enough for
// the whole test to run in well under a second in a Debug build.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {1, 1, 1},     {3, 15, 2},     {8, 16, 31},   {13, 33, 64}, {64, 48, 255},
      {77, 257, 20}, {200, 17, 261}, {5, 40, 1000}, {1, 4100, 3}, {24, 1030, 33},
  };
  return s;
}

std::string label_of(const Shape& s, DType t, KernelLevel l) {
  return std::string(to_string(t)) + " m" + std::to_string(s.m) + " n" + std::to_string(s.n) +
         " k" + std::to_string(s.k) + " at " + std::string(runtime::to_string(l));
}

// The vdpbf16ps path gives the bits of the scalar emulation of Intel's definition (two fp32
// roundings per pair, the odd element first), on normal-range random data, for every shape; and
// so do the amx level's fma steps under DAZ and FTZ (micro_fma_bf16).
TEST(Gemm16BitTest, Avx512Bf16EqualsTheEmulationOfVdpbf16psBitForBit) {
  if (!runs_here(KernelLevel::kAvx512Bf16))
    GTEST_SKIP() << "kernel level avx512-bf16: this CPU cannot run it";
  std::uint32_t seed = 10;
  for (const Shape& s : shapes()) {
    const Problem p = make_problem(s.m, s.n, s.k, seed += 2);
    const std::vector<std::uint16_t> b = weights_as(p.b_values, DType::kBF16);
    const std::vector<float> want = emulate_dpbf16(p, b);
    for (const KernelLevel level : {KernelLevel::kAvx512Bf16, KernelLevel::kAmx}) {
      if (!runs_here(level)) continue;  // kAmx: counted by the level tests' skips
      const std::string label = label_of(s, DType::kBF16, level);
      const std::vector<float> got = run(p, b, DType::kBF16, level, label);
      std::int64_t differ = 0, first = -1;
      for (std::size_t e = 0; e < got.size(); ++e) {
        if (std::bit_cast<std::uint32_t>(got[e]) != std::bit_cast<std::uint32_t>(want[e])) {
          if (differ++ == 0) first = static_cast<std::int64_t>(e);
        }
      }
      EXPECT_EQ(differ, 0) << label << ": first at element " << first << ", got "
                           << (first >= 0 ? got[static_cast<std::size_t>(first)] : 0.0f) << " want "
                           << (first >= 0 ? want[static_cast<std::size_t>(first)] : 0.0f);
    }
  }
}

// The checks of Avx512Bf16TreatsSubnormalsAsIntelDefines at `level`.
void subnormals_as_intel_defines(KernelLevel level) {
  const auto p2 = [](int e) { return std::ldexp(1.0f, e); };
  // Weight 0x0001 (2^-133, subnormal) times 2^100: 2^-33 exactly, but read as zero.
  {
    const float a[1] = {p2(100)};
    const std::uint16_t b[1] = {0x0001};
    float c = -1.0f;
    gemm_16bit(1, a, 1, WeightMatrix{b, DType::kBF16, 1, 1}, &c, 1, level);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(c), 0u) << c;
  }
  // k = 4: the first pair leaves 2^-120; the second pair's odd product -(2^-120 - 2^-127)
  // takes it to 2^-127 (subnormal, flushed), then its even product 2^-126 is added: 2^-126,
  // where an unflushed chain would give 1.5 * 2^-126.
  {
    const float a[4] = {0.0f, p2(-60), p2(-63), -p2(-60)};
    const std::uint16_t b[4] = {0, bf16_from_f32(p2(-60)), bf16_from_f32(p2(-63)),
                                bf16_from_f32(p2(-60) * (1.0f - p2(-7)))};
    float c = -1.0f;
    gemm_16bit(1, a, 4, WeightMatrix{b, DType::kBF16, 4, 1}, &c, 1, level);
    EXPECT_EQ(c, p2(-126));
    const Problem prob{1, 1, 4, 4, 1, 1, std::vector<float>(a, a + 4), {}};
    EXPECT_EQ(emulate_dpbf16(prob, std::vector<std::uint16_t>(b, b + 4)).front(), p2(-126));
  }
}

// The emulation's subnormal rules hold on this CPU: a bf16 subnormal weight reads as zero, and
// a subnormal partial sum is flushed to zero before the pair's second product is added; at the
// avx512-bf16 level (vdpbf16ps) and at amx (fma under DAZ and FTZ).
TEST(Gemm16BitTest, Avx512Bf16TreatsSubnormalsAsIntelDefines) {
  if (!runs_here(KernelLevel::kAvx512Bf16))
    GTEST_SKIP() << "kernel level avx512-bf16: this CPU cannot run it";
  for (const KernelLevel level : {KernelLevel::kAvx512Bf16, KernelLevel::kAmx}) {
    if (!runs_here(level)) continue;
    SCOPED_TRACE(runtime::to_string(level));
    subnormals_as_intel_defines(level);
  }
}

// Each level, both dtypes, every shape, strided a, b and c, and each shape once more tight:
// within the worst-case fp32 accumulation error of the float64 product of the same rounded
// inputs (a rounded to bf16 on the vdpbf16ps path, a as given otherwise); c's padding untouched.
// On the vdpbf16ps path the same bound rejects the product of the unrounded a, so the check sees
// the rounding it allows for.
class Gemm16BitLevelTest : public numesh::testing::KernelLevelTest {};

TEST_P(Gemm16BitLevelTest, MatchesTheFloat64ProductOfItsInputs) {
  const KernelLevel l = level();
  std::uint32_t seed = 100;
  for (const bool tight : {false, true}) {
    for (const Shape& s : shapes()) {
      const Problem p = make_problem(s.m, s.n, s.k, seed += 2, tight);
      for (DType t : {DType::kBF16, DType::kF16}) {
        const std::vector<std::uint16_t> b = weights_as(p.b_values, t);
        const Reference exact_a = reference(p, b, t, /*round_a=*/false);
        const std::string label = label_of(s, t, l) + (tight ? " tight" : "");
        const std::vector<float> got = run(p, b, t, l, label);
        if (l >= KernelLevel::kAvx512Bf16 && t == DType::kBF16) {
          EXPECT_TRUE(within_fp32_accumulation(got, reference(p, b, t, /*round_a=*/true), s.k))
              << label;
          EXPECT_FALSE(within_fp32_accumulation(got, exact_a, s.k))
              << label << ": a was not rounded to bf16";
        } else {
          EXPECT_TRUE(within_fp32_accumulation(got, exact_a, s.k)) << label;
        }
      }
    }
  }
}

// Weights stored out-in ([n, k], rows k + 2 apart): the vdpbf16ps path packs them into the very
// strips it packs from in-out weights, so it gives the same bits; the widened path multiplies
// its panels transposed, within the same bound of the float64 product.
TEST_P(Gemm16BitLevelTest, OutInWeightsGiveTheProductOfInOutOnes) {
  const KernelLevel l = level();
  std::uint32_t seed = 300;
  for (const Shape& s : shapes()) {
    const Problem p = make_problem(s.m, s.n, s.k, seed += 2);
    const std::int64_t ldt = s.k + 2;
    for (DType t : {DType::kBF16, DType::kF16}) {
      const std::vector<std::uint16_t> b = weights_as(p.b_values, t);
      std::vector<std::uint16_t> bt(static_cast<std::size_t>(std::max<std::int64_t>(s.n * ldt, 1)),
                                    0xFFFF);
      for (std::int64_t r = 0; r < s.k; ++r) {
        for (std::int64_t j = 0; j < s.n; ++j)
          bt[static_cast<std::size_t>(j * ldt + r)] = b[static_cast<std::size_t>(r * p.ldb + j)];
      }
      const std::string label = label_of(s, t, l) + " out-in";
      const std::vector<float> got = run(p, bt, t, l, label, WeightLayout::kOutIn, ldt);
      if (l >= KernelLevel::kAvx512Bf16 && t == DType::kBF16) {
        EXPECT_TRUE(got == run(p, b, t, l, label)) << label;
      } else {
        EXPECT_TRUE(within_fp32_accumulation(got, reference(p, b, t, /*round_a=*/false), s.k))
            << label;
      }
    }
  }
}

TEST(Gemm16BitTest, RefusesAnOutInLeadingDimensionShorterThanK) {
  const std::vector<std::uint16_t> bits(8, 0);
  float c[4];
  EXPECT_THAT(
      [&] {
        gemm_16bit(1, c, 2, WeightMatrix{bits.data(), DType::kBF16, 2, 4, WeightLayout::kOutIn, 1},
                   c, 4, KernelLevel::kScalar);
      },
      ThrowsMessage<ShapeError>(HasSubstr("ldb 1 (out-in)")));
}

// k = 0 writes zeros; m = 0 or n = 0 writes nothing.
TEST_P(Gemm16BitLevelTest, EmptyProducts) {
  const KernelLevel l = level();
  for (DType t : {DType::kBF16, DType::kF16}) {
    const std::string label =
        std::string(to_string(t)) + " at " + std::string(runtime::to_string(l));
    const Problem p = make_problem(5, 40, 0, 7);
    const std::vector<float> got = run(p, {0}, t, l, label);
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) {
      return std::bit_cast<std::uint32_t>(x) == 0u;
    })) << label;
    float c = kSentinel;
    const float a = 1.0f;
    const std::uint16_t w = 0x3F80;
    gemm_16bit(0, &a, 1, WeightMatrix{&w, t, 1, 1}, &c, 1, l);
    gemm_16bit(1, &a, 1, WeightMatrix{&w, t, 1, 0, WeightLayout::kInOut, 1}, &c, 1, l);
    EXPECT_EQ(c, kSentinel) << label;
  }
}

// A NaN weight makes NaN exactly the column it multiplies into; an infinite one makes its column
// infinite with the sign of a's entries; every other output stays finite. The NaN sits in the
// zero-padded pair of an odd k and in the last, partial strip of columns.
TEST_P(Gemm16BitLevelTest, NanAndInfinityInTheWeightsReachExactlyTheirColumns) {
  const KernelLevel l = level();
  const std::int64_t m = 14, n = 45, k = 33, nan_row = 32, nan_col = 44, inf_row = 5, inf_col = 3;
  Problem p = make_problem(m, n, k, 3);
  for (float& x : p.a)
    x = x < 0.0f ? x - 0.5f : x + 0.5f;  // no zero (0 * inf is NaN), no subnormal
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> b = weights_as(p.b_values, t);
    b[static_cast<std::size_t>(nan_row * p.ldb + nan_col)] = t == DType::kBF16 ? 0x7FC0 : 0x7E00;
    b[static_cast<std::size_t>(inf_row * p.ldb + inf_col)] = t == DType::kBF16 ? 0x7F80 : 0x7C00;
    const std::string label =
        std::string(to_string(t)) + " at " + std::string(runtime::to_string(l));
    const std::vector<float> got = run(p, b, t, l, label);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        const float x = got[static_cast<std::size_t>(i * n + j)];
        if (j == nan_col) {
          EXPECT_TRUE(std::isnan(x)) << label << " [" << i << ", " << j << "] = " << x;
        } else if (j == inf_col) {
          const float sign =
              p.a[static_cast<std::size_t>(i * p.lda + inf_row)] < 0.0f ? -1.0f : 1.0f;
          EXPECT_EQ(x, sign * std::numeric_limits<float>::infinity())
              << label << " [" << i << ", " << j << "]";
        } else {
          EXPECT_TRUE(std::isfinite(x)) << label << " [" << i << ", " << j << "] = " << x;
        }
      }
    }
  }
}

TEST(Gemm16BitTest, RejectsFp32WeightsAndNegativeSizes) {
  const float a[4] = {1, 2, 3, 4};
  float c[4] = {};
  EXPECT_THROW(gemm_16bit(2, a, 2, WeightMatrix{a, DType::kF32, 2, 2}, c, 2), ShapeError);
  const std::uint16_t w[4] = {};
  EXPECT_THROW(gemm_16bit(-1, a, 2, WeightMatrix{w, DType::kBF16, 2, 2}, c, 2), ShapeError);
  EXPECT_THROW(gemm_16bit(2, a, 1, WeightMatrix{w, DType::kF16, 2, 2}, c, 2), ShapeError);
}

// ---- bf16 compute: fp32 operands, each rounded to bf16
// -------------------------------------------

// gemm_bf16_compute on p's values with a and b stored as the transposes say (a transposed is
// [k, m] with rows m + 3 apart, b transposed [n, k] with rows k + 2 apart), into c (NaN unless
// `accumulate`, when it holds `c0`), c's padding checked as run() checks it. Returns c as [m, n].
std::vector<float> run_bf16_compute(const Problem& p, bool transpose_a, bool transpose_b,
                                    KernelLevel level, const std::string& label,
                                    const std::vector<float>* c0 = nullptr) {
  const std::int64_t lda = transpose_a ? p.m + 3 : p.lda, ldb = transpose_b ? p.k + 2 : p.ldb;
  std::vector<float> a(
      static_cast<std::size_t>(std::max<std::int64_t>(transpose_a ? p.k * lda : p.m * lda, 1)),
      7.0f);
  std::vector<float> b(
      static_cast<std::size_t>(std::max<std::int64_t>(transpose_b ? p.n * ldb : p.k * ldb, 1)),
      7.0f);
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t r = 0; r < p.k; ++r) {
      a[static_cast<std::size_t>(transpose_a ? r * lda + i : i * lda + r)] =
          p.a[static_cast<std::size_t>(i * p.lda + r)];
    }
  }
  for (std::int64_t r = 0; r < p.k; ++r) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      b[static_cast<std::size_t>(transpose_b ? j * ldb + r : r * ldb + j)] =
          p.b_values[static_cast<std::size_t>(r * p.ldb + j)];
    }
  }
  std::vector<float> c(static_cast<std::size_t>(std::max<std::int64_t>(p.m * p.ldc, 1)), kSentinel);
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      c[static_cast<std::size_t>(i * p.ldc + j)] =
          c0 != nullptr ? (*c0)[static_cast<std::size_t>(i * p.n + j)]
                        : std::numeric_limits<float>::quiet_NaN();
    }
  }
  gemm_bf16_compute(p.m, p.n, p.k, a.data(), lda, transpose_a, b.data(), ldb, transpose_b,
                    c0 != nullptr, c.data(), p.ldc, level);
  return unpadded(p, c, label);
}

// Every transpose of either operand gives, with AVX-512 BF16, exactly the vdpbf16ps chain of the
// bf16-rounded operands (the oracle above), and at every level the float64 product of the rounded
// operands within fp32 accumulation, and not the product of the unrounded ones.
TEST_P(Gemm16BitLevelTest, BfloatComputeIsTheProductOfBothOperandsRoundedForEveryTranspose) {
  const KernelLevel l = level();
  std::uint32_t seed = 500;
  for (const Shape& s : shapes()) {
    const Problem p = make_problem(s.m, s.n, s.k, seed += 2);
    const std::vector<std::uint16_t> b = weights_as(p.b_values, DType::kBF16);
    const Reference rounded = reference(p, b, DType::kBF16, /*round_a=*/true);
    Reference exact{std::vector<double>(rounded.value.size(), 0.0),
                    std::vector<double>(rounded.value.size(), 0.0)};
    for (std::int64_t i = 0; i < s.m; ++i) {
      for (std::int64_t r = 0; r < s.k; ++r) {
        for (std::int64_t j = 0; j < s.n; ++j) {
          const double prod = static_cast<double>(p.a[static_cast<std::size_t>(i * p.lda + r)]) *
                              p.b_values[static_cast<std::size_t>(r * p.ldb + j)];
          exact.value[static_cast<std::size_t>(i * s.n + j)] += prod;
          exact.magnitude[static_cast<std::size_t>(i * s.n + j)] += std::abs(prod);
        }
      }
    }
    const std::vector<float> chain = emulate_dpbf16(p, b);
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const std::string label =
            label_of(s, DType::kBF16, l) + (ta ? " a^T" : "") + (tb ? " b^T" : "");
        const std::vector<float> got = run_bf16_compute(p, ta, tb, l, label);
        if (l >= KernelLevel::kAvx512Bf16) {
          EXPECT_TRUE(got == chain) << label << ": not the vdpbf16ps chain";
        }
        EXPECT_TRUE(within_fp32_accumulation(got, rounded, s.k)) << label;
        if (s.k >= 20) {
          EXPECT_FALSE(within_fp32_accumulation(got, exact, s.k))
              << label << ": nothing was rounded";
        }
      }
    }
  }
}

// `accumulate` adds the product to c: run twice, once to c = P and once more onto it, c = 2 P
// within twice the bound.
TEST_P(Gemm16BitLevelTest, BfloatComputeAccumulatesOntoC) {
  const KernelLevel l = level();
  const Problem p = make_problem(30, 70, 41, 900);
  Reference twice =
      reference(p, weights_as(p.b_values, DType::kBF16), DType::kBF16, /*round_a=*/true);
  for (std::size_t e = 0; e < twice.value.size(); ++e) {
    twice.value[e] *= 2.0;
    twice.magnitude[e] *= 2.0;
  }
  for (const bool ta : {false, true}) {
    const std::string label = std::string(runtime::to_string(l)) + (ta ? " a^T" : "");
    const std::vector<float> once = run_bf16_compute(p, ta, false, l, label);
    EXPECT_TRUE(
        within_fp32_accumulation(run_bf16_compute(p, ta, false, l, label, &once), twice, p.k))
        << label;
  }
  // k = 0: c = 0 without accumulate, untouched with it.
  const Problem empty = make_problem(3, 5, 0, 901);
  const std::vector<float> ones(15, 1.0f);
  EXPECT_TRUE(run_bf16_compute(empty, true, false, l, "k0") == std::vector<float>(15, 0.0f));
  EXPECT_TRUE(run_bf16_compute(empty, true, false, l, "k0 accumulate", &ones) == ones);
}

TEST(Gemm16BitTest, BfloatComputeRefusesShortLeadingDimensions) {
  const float x[8] = {};
  float c[8] = {};
  EXPECT_THAT(
      [&] { gemm_bf16_compute(2, 2, 3, x, 2, /*transpose_a=*/false, x, 2, false, false, c, 2); },
      ThrowsMessage<ShapeError>(HasSubstr("m 2, n 2, k 3 with lda 2, ldb 2, ldc 2")));
  EXPECT_THAT(
      [&] { gemm_bf16_compute(3, 2, 2, x, 2, /*transpose_a=*/true, x, 2, false, false, c, 2); },
      ThrowsMessage<ShapeError>(HasSubstr("lda 2 (transposed)")));
  EXPECT_THAT(
      [&] { gemm_bf16_compute(2, 2, 3, x, 3, false, x, 2, /*transpose_b=*/true, false, c, 2); },
      ThrowsMessage<ShapeError>(HasSubstr("ldb 2 (transposed)")));
}

NUMESH_INSTANTIATE_LEVELS(Gemm16BitLevelTest);

}  // namespace
}  // namespace numesh::ops
