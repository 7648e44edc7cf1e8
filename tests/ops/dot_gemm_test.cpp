#include "numesh/ops/kernels/dot_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;

// A product c[m, n] = a[m, k] b[n, k]^T. Padded: every leading dimension larger than its row,
// so a vector tail that reads past a row stays inside the allocation; tight: every leading
// dimension its row length and every buffer exactly its size, so the last row ends at the end
// of its allocation, where ASan sees a read or write past it.
struct Case {
  std::int64_t m, n, k;
  bool tight = false;
  std::int64_t lda() const { return tight ? k : k + 1; }
  std::int64_t ldb() const { return tight ? k : k + 5; }
  std::int64_t ldc() const { return tight ? n : n + 3; }
  std::string text() const {
    return "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k) +
           (tight ? " tight" : "");
  }
};

// m from 1 to 101 (chunks of 96 rows and a tail, tiles of 6 outputs and their tails); k that does
// and does not fill whole blocks of 32 and 64 (the tails are masked or padded), below a block, and
// 0; k past what the amx kernel packs at once (1024 values for 16 rows, 16384 for one), with more
// outputs than it keeps sums of between blocks (192: 16 rows, 200 outputs, 1100 values); k
// that the vector tiles cut into spans (past 1024 values, spans of 512, for fp32 and f16
// weights; past 2048, spans of 1024, for bf16) ending on a span (1536, 3072), one past (1025,
// 2049: a last span of one block), and inside one; each padded and tight.
std::vector<Case> dot_cases() {
  std::vector<Case> out;
  for (const Case cs :
       {Case{1, 1, 1}, Case{2, 3, 2}, Case{3, 2, 16}, Case{1, 7, 31}, Case{2, 5, 32},
        Case{3, 4, 33}, Case{6, 2, 63}, Case{4, 9, 64}, Case{5, 3, 65}, Case{7, 6, 100},
        Case{2, 3, 128}, Case{16, 2, 130}, Case{1, 33, 1000}, Case{9, 1, 0}, Case{16, 12, 200},
        Case{19, 13, 97}, Case{34, 20, 48}, Case{16, 20, 1100}, Case{3, 200, 1056},
        Case{1, 3, 17000}, Case{16, 200, 1100}, Case{5, 7, 1025}, Case{6, 8, 1536},
        Case{3, 13, 2049}, Case{2, 7, 3072}, Case{17, 6, 2600}, Case{70, 9, 1100}, Case{67, 7, 300},
        Case{97, 7, 300}, Case{101, 13, 1100},
        // One row over whole blocks of 64: bf16's one-row kernel takes four outputs at a time.
        Case{1, 9, 128}, Case{1, 6, 1536}, Case{1, 13, 3072}}) {
    for (bool tight : {false, true}) out.push_back(Case{cs.m, cs.n, cs.k, tight});
  }
  return out;
}

struct Stored {
  std::vector<float> f32;           // the weights as fp32 (f32) or their widened 16-bit values
  std::vector<std::uint16_t> bits;  // 16-bit weights
  const void* data(DType t) const {
    return t == DType::kF32 ? static_cast<const void*>(f32.data()) : bits.data();
  }
};

Stored store(const std::vector<float>& values, DType t) {
  Stored s{values, std::vector<std::uint16_t>(values.size())};
  for (std::size_t i = 0; i < values.size() && t != DType::kF32; ++i) {
    s.bits[i] = t == DType::kBF16 ? bf16_from_f32(values[i]) : f16_from_f32(values[i]);
    s.f32[i] = t == DType::kBF16 ? f32_from_bf16(s.bits[i]) : f32_from_f16(s.bits[i]);
  }
  return s;
}

// Runs dot_gemm into a c of NaN with a sentinel in its padding (which must survive); returns
// c packed to [m, n].
std::vector<float> run(const Case& cs, const std::vector<float>& a, const Stored& w, DType t,
                       KernelLevel level, const std::string& label) {
  const std::int64_t lda = cs.lda(), ldb = cs.ldb(), ldc = cs.ldc();
  constexpr float kSentinel = 777.0f;
  std::vector<float> c(static_cast<std::size_t>(cs.m * ldc), kSentinel);
  for (std::int64_t i = 0; i < cs.m; ++i) std::fill_n(c.begin() + i * ldc, cs.n, std::nanf(""));
  dot_gemm(cs.m, a.data(), lda, WeightMatrix{w.data(t), t, cs.k, cs.n, WeightLayout::kOutIn, ldb},
           c.data(), ldc, level);
  std::vector<float> packed;
  for (std::int64_t i = 0; i < cs.m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float x = c[static_cast<std::size_t>(i * ldc + j)];
      if (j < cs.n) {
        packed.push_back(x);
      } else {
        EXPECT_EQ(x, kSentinel) << label << ": c's padding at [" << i << ", " << j
                                << "] was written";
      }
    }
  }
  return packed;
}

// The inputs of one case: a and the weights, seeded by the case's index.
struct DotInputs {
  std::vector<float> a;
  Stored w;
};

DotInputs dot_inputs(const Case& cs, DType t, std::uint32_t seed) {
  return {
      testing::random_host({std::max<std::int64_t>(cs.m * cs.lda(), 1)}, 2 * seed + 1, 1.0f).data,
      store(testing::random_host({std::max<std::int64_t>(cs.n * cs.ldb(), 1)}, 2 * seed + 2, 1.0f)
                .data,
            t)};
}

// The scalar kernel is within fp32 accumulation of the float64 product of its inputs (a rounded
// to bf16 for bf16 weights, and not rounding it breaks that bound), for every dtype and case.
// Whether every element of `got` ([m, n]) is within (k + 2) u sum |a b| of the float64 product
// of the case's inputs, a rounded to bf16 first for bf16 weights when `round_a`: one rounding
// per fma and per fold step (Higham, 3.1), or per tile product and its pairs.
bool within_float64_product(const Case& cs, const DotInputs& in, DType t, bool round_a,
                            const std::vector<float>& got) {
  bool within = true;
  for (std::int64_t i = 0; i < cs.m; ++i) {
    for (std::int64_t j = 0; j < cs.n; ++j) {
      double want = 0.0, magnitude = 0.0;
      for (std::int64_t r = 0; r < cs.k; ++r) {
        const float x = in.a[static_cast<std::size_t>(i * cs.lda() + r)];
        const double ar = t == DType::kBF16 && round_a ? f32_from_bf16(bf16_from_f32(x)) : x;
        const double prod = ar * in.w.f32[static_cast<std::size_t>(j * cs.ldb() + r)];
        want += prod;
        magnitude += std::abs(prod);
      }
      const double bound = static_cast<double>(cs.k + 2) * std::ldexp(1.0, -24) * magnitude + 1e-30;
      within = within && std::abs(got[static_cast<std::size_t>(i * cs.n + j)] - want) <= bound;
    }
  }
  return within;
}

TEST(DotGemmTest, TheScalarKernelIsTheFloat64ProductOfItsInputs) {
  const std::vector<Case> cases = dot_cases();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::uint32_t index = 0; index < cases.size(); ++index) {
      const Case& cs = cases[index];
      const DotInputs in = dot_inputs(cs, t, index);
      const std::string label = std::string(to_string(t)) + " " + cs.text();
      const std::vector<float> scalar = run(cs, in.a, in.w, t, KernelLevel::kScalar, label);
      EXPECT_TRUE(within_float64_product(cs, in, t, /*round_a=*/true, scalar))
          << label << ": the scalar kernel is off the float64 product";
      // (Past a thousand values of k the bound is wider than what rounding a moves.)
      if (t == DType::kBF16 && cs.k >= 31 && cs.k <= 1000) {
        EXPECT_FALSE(within_float64_product(cs, in, t, /*round_a=*/false, scalar))
            << label << ": a was not rounded to bf16";
      }
    }
  }
}

// Each level gives the scalar kernel's bits, for every dtype and case; bf16 at the amx level has
// the tile unit's own bits, within the scalar kernel's bound of the float64 product.
class DotGemmLevelTest : public numesh::testing::KernelLevelTest {};

TEST_P(DotGemmLevelTest, EqualsTheScalarKernelBitForBit) {
  const std::vector<Case> cases = dot_cases();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::uint32_t index = 0; index < cases.size(); ++index) {
      const Case& cs = cases[index];
      const DotInputs in = dot_inputs(cs, t, index);
      const std::string label = std::string(to_string(t)) + " " + cs.text() + " at " +
                                std::string(runtime::to_string(level()));
      const std::vector<float> got = run(cs, in.a, in.w, t, level(), label);
      if (t == DType::kBF16 && level() == KernelLevel::kAmx) {
        EXPECT_TRUE(within_float64_product(cs, in, t, /*round_a=*/true, got))
            << label << ": the tile products are off the float64 product";
        continue;
      }
      const std::vector<float> scalar = run(cs, in.a, in.w, t, KernelLevel::kScalar, label);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), scalar.begin(), [](float x, float y) {
        return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
      })) << label;
    }
  }
}

// bf16 weights against `rows` rows of a = 1, k = 128 or `k`: c of the given (element, weight)
// pairs, which every row must have alike.
float bf16_dot_of_ones(KernelLevel level, const std::vector<std::pair<int, float>>& weights,
                       std::int64_t k = 128, std::int64_t rows = 1) {
  const std::vector<float> a(static_cast<std::size_t>(rows * k), 1.0f);
  std::vector<std::uint16_t> b(static_cast<std::size_t>(k), 0);
  for (const auto& [e, v] : weights) b[static_cast<std::size_t>(e)] = bf16_from_f32(v);
  std::vector<float> c(static_cast<std::size_t>(rows), -1.0f);
  dot_gemm(rows, a.data(), k, WeightMatrix{b.data(), DType::kBF16, k, 1, WeightLayout::kOutIn},
           c.data(), 1, level);
  for (std::int64_t r = 1; r < rows; ++r) EXPECT_EQ(c[static_cast<std::size_t>(r)], c[0]);
  return c[0];
}

// The lanes and the order of the header, on bf16 weights against a = 1 (2^24 + 1 rounds to 2^24):
// - elements 0 and 64 share s[0] and element 2 is s[1]: 2^24, 1, -2^24 give 1 (in one chain: 0);
// - the pair (0, 1) adds element 1 first: with elements 1, 0, 65, 64 = 2^24, 1, -2^24, 1 the
//   chain 2^24 + 1 - 2^24 + 1 gives 1 (even first, 1 + 2^24 + 1 - 2^24, gives 0).
TEST_P(DotGemmLevelTest, PairsFromBlocksOf64ShareALaneAndTheOddElementGoesFirst) {
  constexpr float kBig = 16777216.0f;
  if (level() == KernelLevel::kAmx) {
    // Tile products (AmxTileProductsAddChunksOf32InKOrderInFp32): one fp32 sum, no lanes, so
    // the 1 is lost to 2^24 before -2^24 comes.
    EXPECT_EQ(bf16_dot_of_ones(level(), {{0, kBig}, {2, 1.0f}, {64, -kBig}}), 0.0f);
    return;
  }
  EXPECT_EQ(bf16_dot_of_ones(level(), {{0, kBig}, {2, 1.0f}, {64, -kBig}}), 1.0f);
  EXPECT_EQ(bf16_dot_of_ones(level(), {{1, kBig}, {0, 1.0f}, {65, -kBig}, {64, 1.0f}}), 1.0f);
}

// At the amx level each tile product's sum of a chunk of 32 values is added to the fp32 sum of
// the chunks before it, in k order: with 2^24 in one chunk, 1 + 1 in the next gives 2^24 + 2 (the
// chunk's own sum is exact), where 1 and 1 in two chunks give 2^24 (2^24 + 1 rounds to even);
// 1, 2^24, -2^24 in three chunks give 0 (1 is lost to 2^24 first). The same past the values the
// kernel packs at once (16384 for one row, 1024 for 16), where the sums wait in memory between
// blocks: -2^24 in the first block, then 2^24 and 1 give 1 when the first block's sum goes on
// into the second (0 if the blocks were summed apart and added, 2^24 if the first were lost).
TEST(DotGemmTest, AmxTileProductsAddChunksOf32InKOrderInFp32) {
  if (!numesh::testing::runs_here(KernelLevel::kAmx)) GTEST_SKIP() << "kernel level amx";
  constexpr float kBig = 16777216.0f;
  for (const auto& [rows, block] :
       std::vector<std::pair<std::int64_t, int>>{{1, 16384}, {16, 1024}}) {
    for (const int b0 : {0, block}) {
      const std::int64_t k = b0 + 128;
      const std::string where = std::to_string(rows) + " rows, from " + std::to_string(b0);
      EXPECT_EQ(bf16_dot_of_ones(KernelLevel::kAmx, {{b0, kBig}, {b0 + 32, 1.0f}, {b0 + 33, 1.0f}},
                                 k, rows),
                kBig + 2.0f)
          << where;
      EXPECT_EQ(bf16_dot_of_ones(KernelLevel::kAmx, {{b0, kBig}, {b0 + 32, 1.0f}, {b0 + 64, 1.0f}},
                                 k, rows),
                kBig)
          << where;
      EXPECT_EQ(bf16_dot_of_ones(KernelLevel::kAmx, {{b0, 1.0f}, {b0 + 32, kBig}, {b0 + 64, -kBig}},
                                 k, rows),
                0.0f)
          << where;
    }
    EXPECT_EQ(bf16_dot_of_ones(KernelLevel::kAmx, {{0, -kBig}, {block, kBig}, {block + 32, 1.0f}},
                               block + 128, rows),
              1.0f)
        << rows << " rows: the first block's sum carried into the second";
  }
}

// At each level a row has the same bits in a product of any number of rows (a serving engine's
// batch invariance rests on it), subnormal, tiny and huge values included, where the levels
// themselves may differ (vdpbf16ps reads subnormals as zero): rows of 2 to 19 against one row.
TEST_P(DotGemmLevelTest, ARowHasTheSameBitsInAProductOfAnyNumberOfRows) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t n = 13;
  // k = 2100: the amx kernel's blocks of k differ between one row (16384 values) and 16 (1024);
  // k = 1024: bf16's one row takes four outputs at a time.
  for (const auto& [t, k] : std::vector<std::pair<DType, std::int64_t>>{{DType::kF32, 200},
                                                                        {DType::kBF16, 200},
                                                                        {DType::kF16, 200},
                                                                        {DType::kBF16, 2100},
                                                                        {DType::kBF16, 1024}}) {
    // Outputs j of four scales (f16 holds neither 2^100 nor 2^-63), rows r of four: ordinary,
    // subnormal (2^-135), tiny (2^-70) and 2^-63. Subnormal rows against huge weights give
    // normal products that vdpbf16ps reads as zero, tiny rows against tiny weights subnormal
    // sums that it flushes, and 2^-63 against 2^-63 lane sums near 2^-126 whose fold may
    // cancel into a subnormal (flushed at the amx level).
    const int huge = t == DType::kF16 ? 14 : 100, small = t == DType::kF16 ? -10 : -70,
              edge = t == DType::kF16 ? -5 : -63;
    std::vector<float> w(static_cast<std::size_t>(k * n));
    for (std::int64_t j = 0; j < n; ++j) {
      const int scale = j % 4 == 0 ? 0 : j % 4 == 1 ? huge : j % 4 == 2 ? small : edge;
      for (std::int64_t e = 0; e < k; ++e) {
        w[static_cast<std::size_t>(j * k + e)] = std::ldexp(normal(rng), scale);
      }
    }
    const Stored stored = store(w, t);
    const WeightMatrix b{stored.data(t), t, k, n, WeightLayout::kOutIn, k};
    for (const std::int64_t m : {2, 5, 16, 19}) {
      std::vector<float> a(static_cast<std::size_t>(m * k)), c(static_cast<std::size_t>(m * n));
      for (std::int64_t r = 0; r < m; ++r) {
        const int scale = r % 4 == 0 ? 0 : r % 4 == 1 ? -135 : r % 4 == 2 ? -70 : -63;
        for (std::int64_t e = 0; e < k; ++e) {
          a[static_cast<std::size_t>(r * k + e)] = std::ldexp(normal(rng), scale);
        }
      }
      dot_gemm(m, a.data(), k, b, c.data(), n, level());
      for (std::int64_t r = 0; r < m; ++r) {
        std::vector<float> alone(static_cast<std::size_t>(n));
        dot_gemm(1, a.data() + r * k, k, b, alone.data(), n, level());
        for (std::int64_t j = 0; j < n; ++j) {
          const float got = c[static_cast<std::size_t>(r * n + j)];
          const float want = alone[static_cast<std::size_t>(j)];
          ASSERT_TRUE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want) ||
                      (std::isnan(got) && std::isnan(want)))
              << to_string(t) << " at " << runtime::to_string(level()) << ": row " << r << " of "
              << m << ", output " << j << " (k " << k << "): " << got << " in the product, " << want
              << " alone";
        }
      }
    }
  }
}

// At each level an output has the same bits whichever range of outputs a call is given (the
// tasks of device_gemm split the outputs; the amx kernel reads 16 outputs a tile and pads the
// last ones): ranges of 1 to 50 outputs from offsets 0 to 33 against the whole product.
TEST_P(DotGemmLevelTest, AnOutputHasTheSameBitsInAnyRangeOfOutputs) {
  const std::int64_t m = 5, n = 50, k = 300;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Case whole{m, n, k, /*tight=*/true};
    const DotInputs in = dot_inputs(whole, t, 3);
    const std::vector<float> all = run(whole, in.a, in.w, t, level(), "whole");
    for (const auto& [j0, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, 1}, {0, 17}, {1, 16}, {5, 33}, {16, 34}, {33, 17}, {49, 1}}) {
      std::vector<float> c(static_cast<std::size_t>(m * count));
      const WeightMatrix b{in.w.data(t), t, k, n, WeightLayout::kOutIn, k};
      dot_gemm(m, in.a.data(), k, b.outputs(j0, count), c.data(), count, level());
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < count; ++j) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(c[static_cast<std::size_t>(i * count + j)]),
                    std::bit_cast<std::uint32_t>(all[static_cast<std::size_t>(i * n + j0 + j)]))
              << to_string(t) << " at " << runtime::to_string(level()) << ": row " << i
              << ", output " << j0 + j << " of outputs [" << j0 << ", " << j0 + count << ")";
        }
      }
    }
  }
}

NUMESH_INSTANTIATE_LEVELS(DotGemmLevelTest);

}  // namespace
}  // namespace numesh::ops
