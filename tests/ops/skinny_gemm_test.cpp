#include "numesh/ops/kernels/skinny_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "../common/matches_reference.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/convert.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;
using runtime::convert_f32_to_bf16;
using runtime::convert_f32_to_f16;

using testing::random_floats;

// Every level this CPU runs, for every weight dtype, rows 1..16 and column counts that do and do
// not fill whole vectors and strips: bitwise the scalar kernel's result; and the scalar kernel
// within fp32 rounding of a float64 product of the same (dtype-rounded) weights.
TEST(SkinnyGemmTest, EveryLevelAndDtypeEqualsTheScalarKernel) {
  const std::vector<KernelLevel> levels = runtime::runnable_kernel_levels();
  if (levels.back() != KernelLevel::kAvx512Bf16) {
    std::cout << "[ SKIPPED  ] kernel levels above " << runtime::to_string(levels.back())
              << ": this CPU cannot run them\n";
  }
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::int64_t m : {1, 2, 3, 4, 5, 7, 16}) {
      for (std::int64_t n : {1, 15, 16, 64, 200}) {
        const std::int64_t k = 37, ldb = n + 3, lda = k + 1, ldc = n + 5;
        const std::vector<float> a = random_floats(static_cast<std::size_t>(m * lda), 1);
        const std::vector<float> wf = random_floats(static_cast<std::size_t>(k * ldb), 2);
        std::vector<std::uint16_t> w16(wf.size());
        if (t == DType::kBF16) convert_f32_to_bf16(wf, w16, KernelLevel::kScalar);
        if (t == DType::kF16) convert_f32_to_f16(wf, w16, KernelLevel::kScalar);
        const void* b = t == DType::kF32 ? static_cast<const void*>(wf.data()) : static_cast<const void*>(w16.data());
        const std::string label = std::string(to_string(t)) + " m" + std::to_string(m) + " n" + std::to_string(n);
        // The float64 product of the weights as stored.
        std::vector<double> want(static_cast<std::size_t>(m * n), 0.0);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            for (std::int64_t r = 0; r < k; ++r) {
              const std::size_t at = static_cast<std::size_t>(r * ldb + j);
              const float w = t == DType::kF32 ? wf[at] : t == DType::kBF16 ? f32_from_bf16(w16[at]) : f32_from_f16(w16[at]);
              want[static_cast<std::size_t>(i * n + j)] += static_cast<double>(a[static_cast<std::size_t>(i * lda + r)]) * w;
            }
          }
        }
        std::vector<float> scalar(static_cast<std::size_t>(m * ldc), -1.0f);
        skinny_gemm(m, n, k, a.data(), lda, b, t, ldb, scalar.data(), ldc, KernelLevel::kScalar);
        std::vector<float> dense(static_cast<std::size_t>(m * n));
        for (std::int64_t i = 0; i < m; ++i) {
          std::copy_n(scalar.begin() + i * ldc, n, dense.begin() + i * n);
        }
        EXPECT_TRUE(numesh::testing::within_abs(std::span<const float>(dense), std::span<const double>(want), 1e-4)) << label;
        for (KernelLevel l : levels) {
          std::vector<float> got(static_cast<std::size_t>(m * ldc), -1.0f);
          skinny_gemm(m, n, k, a.data(), lda, b, t, ldb, got.data(), ldc, l);
          EXPECT_TRUE(std::equal(got.begin(), got.end(), scalar.begin(), [](float x, float y) {
            return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
          })) << label << " at " << runtime::to_string(l);
        }
      }
    }
  }
}

}  // namespace
}  // namespace numesh::ops
