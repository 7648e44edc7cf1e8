#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

// PLACEHOLDER (being replaced by the vdpbf16ps kernel): converts b to fp32 and calls gemm().

namespace numesh::ops {

/// c[m, n] = a[m, k] b[k, n] on the calling thread, b bf16 or f16 bits (rows ldb apart).
void gemm_16bit(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, const void* b,
                DType b_type, std::int64_t ldb, float* c, std::int64_t ldc,
                runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
