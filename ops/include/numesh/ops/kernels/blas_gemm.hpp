#pragma once

#include <cstdint>

#include "numesh/ops/eigen_views.hpp"

// The single-threaded fp32 product every fp32 tile of a device GEMM is: OpenBLAS for products
// large enough to repay its call, Eigen below. Knows nothing of devices or weight formats.

namespace numesh::ops {

/// GEMMs of at least this many multiply-adds (M*N*K) go to OpenBLAS; smaller ones to Eigen,
/// whose call overhead is lower. On this machine kind OpenBLAS runs the MLP's 512 x 1024 x 4096
/// GEMM at 84-86% of fp32 peak on one core against Eigen's 64-67% (docs/benchmarks.md, MLP
/// forward, "The parts": BM_Gemm).
inline constexpr std::int64_t kBlasMinMultiplyAdds = std::int64_t{32} * 32 * 32;

/// c = alpha * a * op(b) + beta * c, row-major, where op(b) is b (shape [K, N]) or, with
/// `transpose_b`, b transposed (b has shape [N, K]); a is [M, K] and c is [M, N].
///
/// Runs on the calling thread only: OpenBLAS is switched to one thread the first time numesh
/// calls it (process-wide: openblas_set_num_threads(1)), because numesh's parallelism is its
/// devices' oneTBB threads and a second thread pool would oversubscribe the cores. Safe to
/// call concurrently from many threads (checked: concurrent single-threaded OpenBLAS calls
/// give bitwise-identical results).
/// Throws: ShapeError naming the three shapes when they do not agree.
void gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float alpha = 1.0f, float beta = 0.0f,
          bool transpose_b = false);

/// The strided form of gemm(): a is [m, k] with rows `lda` floats apart, b is [k, n] (or, with
/// `transpose_b`, [n, k]) with rows `ldb` apart, c is [m, n] with rows `ldc` apart; c = alpha a
/// op(b) + beta c. Lets callers multiply blocks of larger matrices (one head of a bthd
/// activation, a column block of a weight) without copying them.
/// REQUIRES: m, n, k >= 0; each leading dimension at least its matrix's row length.
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, bool transpose_b, float beta,
          float* c, std::int64_t ldc);

/// c = alpha a^T b + beta c on the calling thread, row-major: a is [k, m] with rows `lda` floats
/// apart, b is [k, n] (rows `ldb` apart), c is [m, n] (rows `ldc` apart). The weight-gradient
/// product (a sum over k rows); OpenBLAS from kBlasMinMultiplyAdds, Eigen below.
/// REQUIRES: m, n, k >= 0; leading dimensions at least the row lengths.
void gemm_transposed_a(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc);

}  // namespace numesh::ops
