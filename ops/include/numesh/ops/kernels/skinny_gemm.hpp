#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

// The decode kernel: c = a b for a few rows of a (the batch of a decode step, m <= 16) against a
// weight matrix b stored in fp32, bf16 or f16. Decode is bound by reading b, so the kernel reads
// each weight once: b's rows are streamed a few at a time across the given columns, every row
// of a accumulating into c, and 16-bit weights are widened to fp32 in registers (half the bytes
// read). device_gemm / device_decode_gemm spread it over a device's threads.
//
// Every element is c[i][j] = fma(a[i][K-1], b[K-1][j], ... fma(a[i][0], b[0][j], 0)), the
// products taken in k order with one rounding each, at every kernel level: the scalar, AVX2 and
// AVX-512 versions give the same bits.

namespace numesh::ops {

/// The most rows of a the decode kernel takes.
inline constexpr std::int64_t kSkinnyMaxRows = 16;

/// c[m, n] = a[m, k] b on the calling thread: a fp32 with rows `lda` floats apart, b [k, n]
/// stored in-out in fp32, bf16 or f16 (its rows b.stride() elements apart), c fp32 with rows
/// `ldc` apart (overwritten). REQUIRES: 1 <= m <= kSkinnyMaxRows; b.layout is kInOut and b.dtype
/// an element type; `level` runs on this CPU; lda >= k, ldc >= n.
void skinny_gemm(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b, float* c,
                 std::int64_t ldc, runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
