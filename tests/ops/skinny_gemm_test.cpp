#include "numesh/ops/kernels/skinny_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "../common/matches_reference.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/convert.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using runtime::convert_f32_to_bf16;
using runtime::convert_f32_to_f16;
using runtime::KernelLevel;

using testing::random_floats;

// The weights as the kernel reads them (fp32 floats or 16-bit bits), and as fp32 values.
struct SkinnyWeights {
  std::vector<float> f32;
  std::vector<std::uint16_t> bits;
  const void* data(DType t) const {
    return t == DType::kF32 ? static_cast<const void*>(f32.data()) : bits.data();
  }
  float value(DType t, std::size_t at) const {
    return t == DType::kF32    ? f32[at]
           : t == DType::kBF16 ? f32_from_bf16(bits[at])
                               : f32_from_f16(bits[at]);
  }
};

SkinnyWeights skinny_stored(const std::vector<float>& values, DType t) {
  SkinnyWeights w{values, std::vector<std::uint16_t>(values.size())};
  if (t == DType::kBF16) convert_f32_to_bf16(values, w.bits, KernelLevel::kScalar);
  if (t == DType::kF16) convert_f32_to_f16(values, w.bits, KernelLevel::kScalar);
  return w;
}

// One product's shape and layout. Padded leading dimensions keep a vector tail that reads past
// a row inside the allocation; tight ones (every leading dimension its row length, every
// buffer exactly its size) put the last row's end at the end of the allocation, where ASan
// sees a read or write past it.
struct SkinnyShape {
  std::int64_t m, n, k;
  bool tight;
  std::int64_t lda() const { return tight ? k : k + 1; }
  std::int64_t ldb() const { return tight ? n : n + 3; }
  std::int64_t ldc() const { return tight ? n : n + 5; }
  std::string text() const {
    return "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k) +
           (tight ? " tight" : "");
  }
};

// The shapes: rows 1..16; columns that do and do not fill whole vectors and strips; k below,
// at and past each level's unroll (4 rows of b for fp32 and AVX2, 8 for 16-bit weights on
// AVX-512), multiples and not; both layouts.
std::vector<SkinnyShape> skinny_shapes() {
  std::vector<SkinnyShape> out;
  for (std::int64_t m : {1, 2, 3, 4, 5, 7, 16}) {
    for (std::int64_t n : {1, 15, 16, 64, 200}) {
      for (std::int64_t k : {1, 3, 4, 7, 8, 9, 16, 37}) {
        for (bool tight : {false, true}) out.push_back({m, n, k, tight});
      }
    }
  }
  return out;
}

// c of the shape's layout from `level`: written by the kernel over NaN (every element must be
// written); padding columns must keep their sentinel.
std::vector<float> skinny_product(const SkinnyShape& s, const std::vector<float>& a,
                                  const SkinnyWeights& w, DType t, KernelLevel level) {
  constexpr float kSentinel = 777.0f;
  std::vector<float> c(static_cast<std::size_t>(s.m * s.ldc()), kSentinel);
  for (std::int64_t i = 0; i < s.m; ++i) std::fill_n(c.begin() + i * s.ldc(), s.n, std::nanf(""));
  skinny_gemm(s.m, a.data(), s.lda(),
              WeightMatrix{w.data(t), t, s.k, s.n, WeightLayout::kInOut, s.ldb()}, c.data(),
              s.ldc(), level);
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = s.n; j < s.ldc(); ++j) {
      EXPECT_EQ(c[static_cast<std::size_t>(i * s.ldc() + j)], kSentinel)
          << s.text() << ": c's padding at [" << i << ", " << j << "] was written at "
          << runtime::to_string(level);
    }
  }
  return c;
}

// The scalar kernel, for every weight dtype and shape, is within fp32 rounding of a float64
// product of the same (dtype-rounded) weights.
TEST(SkinnyGemmTest, TheScalarKernelIsTheFloat64ProductOfItsInputs) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const SkinnyShape& s : skinny_shapes()) {
      const std::vector<float> a = random_floats(static_cast<std::size_t>(s.m * s.lda()), 1);
      const SkinnyWeights w =
          skinny_stored(random_floats(static_cast<std::size_t>(s.k * s.ldb()), 2), t);
      std::vector<double> want(static_cast<std::size_t>(s.m * s.n), 0.0);
      for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < s.n; ++j) {
          for (std::int64_t r = 0; r < s.k; ++r) {
            want[static_cast<std::size_t>(i * s.n + j)] +=
                static_cast<double>(a[static_cast<std::size_t>(i * s.lda() + r)]) *
                w.value(t, static_cast<std::size_t>(r * s.ldb() + j));
          }
        }
      }
      const std::vector<float> c = skinny_product(s, a, w, t, KernelLevel::kScalar);
      std::vector<float> dense(static_cast<std::size_t>(s.m * s.n));
      for (std::int64_t i = 0; i < s.m; ++i)
        std::copy_n(c.begin() + i * s.ldc(), s.n, dense.begin() + i * s.n);
      EXPECT_TRUE(numesh::testing::within_abs(std::span<const float>(dense),
                                              std::span<const double>(want), 1e-4))
          << to_string(t) << " " << s.text();
    }
  }
}

// Each level, for every weight dtype and shape, gives the scalar kernel's bits.
class SkinnyGemmLevelTest : public numesh::testing::KernelLevelTest {};

TEST_P(SkinnyGemmLevelTest, EqualsTheScalarKernelBitForBit) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const SkinnyShape& s : skinny_shapes()) {
      const std::vector<float> a = random_floats(static_cast<std::size_t>(s.m * s.lda()), 1);
      const SkinnyWeights w =
          skinny_stored(random_floats(static_cast<std::size_t>(s.k * s.ldb()), 2), t);
      const std::vector<float> want = skinny_product(s, a, w, t, KernelLevel::kScalar);
      const std::vector<float> got = skinny_product(s, a, w, t, level());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(),
                             [](float x, float y) {
                               return std::bit_cast<std::uint32_t>(x) ==
                                      std::bit_cast<std::uint32_t>(y);
                             }))
          << to_string(t) << " " << s.text();
    }
  }
}

NUMESH_INSTANTIATE_LEVELS(SkinnyGemmLevelTest);

}  // namespace
}  // namespace numesh::ops
