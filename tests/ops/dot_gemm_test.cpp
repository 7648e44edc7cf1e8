#include "numesh/ops/kernels/dot_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;

// A product c[m, n] = a[m, k] b[n, k]^T with every leading dimension larger than its row.
struct Case {
  std::int64_t m, n, k;
};

struct Stored {
  std::vector<float> f32;          // the weights as fp32 (f32) or their widened 16-bit values
  std::vector<std::uint16_t> bits;  // 16-bit weights
  const void* data(DType t) const { return t == DType::kF32 ? static_cast<const void*>(f32.data()) : bits.data(); }
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
std::vector<float> run(const Case& cs, const std::vector<float>& a, std::int64_t lda, const Stored& w, DType t,
                       std::int64_t ldb, KernelLevel level, const std::string& label) {
  const std::int64_t ldc = cs.n + 3;
  constexpr float kSentinel = 777.0f;
  std::vector<float> c(static_cast<std::size_t>(cs.m * ldc), kSentinel);
  for (std::int64_t i = 0; i < cs.m; ++i) std::fill_n(c.begin() + i * ldc, cs.n, std::nanf(""));
  dot_gemm(cs.m, cs.n, cs.k, a.data(), lda, w.data(t), t, ldb, c.data(), ldc, level);
  std::vector<float> packed;
  for (std::int64_t i = 0; i < cs.m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float x = c[static_cast<std::size_t>(i * ldc + j)];
      if (j < cs.n) {
        packed.push_back(x);
      } else {
        EXPECT_EQ(x, kSentinel) << label << ": c's padding at [" << i << ", " << j << "] was written";
      }
    }
  }
  return packed;
}

// Every level this CPU runs gives the scalar kernel's bits, for every dtype, m from 1 to 16 and
// k that does and does not fill whole blocks of 32 and 64 (the tails are masked or padded); the
// scalar kernel is within fp32 accumulation of the float64 product of its inputs (a rounded to
// bf16 for bf16 weights, and not rounding it breaks that bound).
TEST(DotGemmTest, EveryLevelAndDtypeEqualsTheScalarKernelAndTheFloat64Product) {
  const std::vector<KernelLevel> levels = runtime::runnable_kernel_levels();
  if (levels.back() != KernelLevel::kAvx512Bf16) {
    std::cout << "[ SKIPPED  ] kernel levels above " << runtime::to_string(levels.back())
              << ": this CPU cannot run them\n";
  }
  std::uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case cs : {Case{1, 1, 1}, Case{1, 7, 31}, Case{2, 5, 32}, Case{3, 4, 33}, Case{4, 9, 64},
                          Case{5, 3, 65}, Case{7, 6, 100}, Case{16, 2, 130}, Case{1, 33, 1000}, Case{9, 1, 0}}) {
      const std::int64_t lda = cs.k + 1, ldb = cs.k + 5;
      const std::vector<float> a = testing::random_host({cs.m * lda}, seed++, 1.0f).data;
      const Stored w = store(testing::random_host({std::max<std::int64_t>(cs.n * ldb, 1)}, seed++, 1.0f).data, t);
      const std::string label = std::string(to_string(t)) + " m" + std::to_string(cs.m) + " n" +
                                std::to_string(cs.n) + " k" + std::to_string(cs.k);
      const std::vector<float> scalar = run(cs, a, lda, w, t, ldb, KernelLevel::kScalar, label);
      for (bool round_a : {true, false}) {
        if (!round_a && t != DType::kBF16) continue;
        bool within = true;
        for (std::int64_t i = 0; i < cs.m; ++i) {
          for (std::int64_t j = 0; j < cs.n; ++j) {
            double want = 0.0, magnitude = 0.0;
            for (std::int64_t r = 0; r < cs.k; ++r) {
              const float x = a[static_cast<std::size_t>(i * lda + r)];
              const double ar = t == DType::kBF16 && round_a ? f32_from_bf16(bf16_from_f32(x)) : x;
              const double prod = ar * w.f32[static_cast<std::size_t>(j * ldb + r)];
              want += prod;
              magnitude += std::abs(prod);
            }
            // (k + 2) u sum |a b|: one rounding per fma and per fold step (Higham, 3.1).
            const double bound = static_cast<double>(cs.k + 2) * std::ldexp(1.0, -24) * magnitude + 1e-30;
            within = within && std::abs(scalar[static_cast<std::size_t>(i * cs.n + j)] - want) <= bound;
          }
        }
        if (round_a) {
          EXPECT_TRUE(within) << label << ": the scalar kernel is off the float64 product";
        } else if (cs.k >= 31) {
          EXPECT_FALSE(within) << label << ": a was not rounded to bf16";
        }
      }
      for (KernelLevel l : levels) {
        const std::vector<float> got = run(cs, a, lda, w, t, ldb, l, label);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), scalar.begin(), [](float x, float y) {
          return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
        })) << label << " at " << runtime::to_string(l);
      }
    }
  }
}

// The lanes and the order of the header, on bf16 weights against a = 1 (2^24 + 1 rounds to 2^24):
// - elements 0 and 64 share s[0] and element 2 is s[1]: 2^24, 1, -2^24 give 1 (in one chain: 0);
// - the pair (0, 1) adds element 1 first: with elements 1, 0, 65, 64 = 2^24, 1, -2^24, 1 the
//   chain 2^24 + 1 - 2^24 + 1 gives 1 (even first, 1 + 2^24 + 1 - 2^24, gives 0).
TEST(DotGemmTest, PairsFromBlocksOf64ShareALaneAndTheOddElementGoesFirst) {
  const auto run_one = [](KernelLevel l, const std::vector<std::pair<int, float>>& weights) {
    const std::vector<float> a(128, 1.0f);
    std::vector<std::uint16_t> b(128, 0);
    for (const auto& [e, v] : weights) b[static_cast<std::size_t>(e)] = bf16_from_f32(v);
    float c = -1.0f;
    dot_gemm(1, 1, 128, a.data(), 128, b.data(), DType::kBF16, 128, &c, 1, l);
    return c;
  };
  constexpr float kBig = 16777216.0f;
  for (KernelLevel l : runtime::runnable_kernel_levels()) {
    EXPECT_EQ(run_one(l, {{0, kBig}, {2, 1.0f}, {64, -kBig}}), 1.0f) << runtime::to_string(l);
    EXPECT_EQ(run_one(l, {{1, kBig}, {0, 1.0f}, {65, -kBig}, {64, 1.0f}}), 1.0f) << runtime::to_string(l);
  }
}

}  // namespace
}  // namespace numesh::ops
