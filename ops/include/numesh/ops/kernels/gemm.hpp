#pragma once

#include <cstdint>

#include "numesh/ops/tensor.hpp"

namespace numesh::ops {

/// GEMMs of at least this many multiply-adds (M*N*K) go to OpenBLAS; smaller ones to Eigen,
/// whose call overhead is lower. On this machine kind OpenBLAS reaches 87% of fp32 peak on one
/// core against Eigen's 70% (BASELINES.md section 1).
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

/// c = a * b with the rows of a split over the calling thread's oneTBB arena (a device's
/// threads when called from a node body) in blocks of 64 rows, each block one gemm() call; a
/// single gemm() call when the arena has one thread or a has at most 64 rows (OpenBLAS blocks
/// best on the whole). Throws: as gemm().
void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c);

}  // namespace numesh::ops
