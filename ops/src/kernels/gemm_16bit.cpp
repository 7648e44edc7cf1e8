#include "numesh/ops/kernels/gemm_16bit.hpp"

#include <vector>

#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::ops {

void gemm_16bit(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, const void* b,
                DType b_type, std::int64_t ldb, float* c, std::int64_t ldc, runtime::KernelLevel level) {
  thread_local std::vector<float> wide;
  wide.resize(static_cast<std::size_t>(k * n));
  const auto* bits = static_cast<const std::uint16_t*>(b);
  for (std::int64_t r = 0; r < k; ++r) {
    const std::span<const std::uint16_t> src(bits + r * ldb, static_cast<std::size_t>(n));
    const std::span<float> dst(wide.data() + r * n, static_cast<std::size_t>(n));
    if (b_type == DType::kBF16) runtime::convert_bf16_to_f32(src, dst, level);
    else runtime::convert_f16_to_f32(src, dst, level);
  }
  gemm(m, n, k, 1.0f, a, lda, wide.data(), n, false, 0.0f, c, ldc);
}

}  // namespace numesh::ops
