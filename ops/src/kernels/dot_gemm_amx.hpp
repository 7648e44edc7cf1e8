#pragma once

// PRIVATE to ops/src/kernels: dot_gemm_bf16's kernel at the amx level, by tile products.

#include <cstdint>

namespace numesh::ops::detail {

/// c[m, n] = x b^T in AMX tile products (tdpbf16ps): x is m rows of k bf16 values (their bits,
/// rows `ldx` apart), b n rows of k bf16 values (one per output, `ldb` apart), c fp32 (rows `ldc`
/// apart; overwritten, k = 0 writes zeros). Each c[i][j] is the sum tdpbf16ps accumulates from
/// zero over k in blocks of 32 (k padded with zeros), in k order: its bits depend on row i of x,
/// row j of b and k alone, never on m, n or which outputs a call is given, so a row has the same
/// bits in a product of any number of rows. Those bits are the tile unit's own (it reads
/// subnormal inputs as zero, flushes subnormal results and rounds the two products of a pair and
/// the sum in its own way), not the other levels' vdpbf16ps steps.
/// REQUIRES: cpu_features().amx; m >= 1, n >= 1, k >= 0; ldx >= k, ldb >= k, ldc >= n.
void dot_rows_bf16_amx(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* x,
                       std::int64_t ldx, const std::uint16_t* b, std::int64_t ldb, float* c,
                       std::int64_t ldc);

}  // namespace numesh::ops::detail
