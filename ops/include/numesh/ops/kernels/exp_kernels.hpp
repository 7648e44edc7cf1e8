#pragma once

#include <cstdint>

#include "numesh/runtime/cpu_features.hpp"

// The exponential-based row kernels a model spends its non-GEMM time in (SiLU's sigmoid,
// attention's softmax), vectorized at every kernel level with the same bits at every level.
// A 256-token prefill of a Llama spent 8 % of its time in SiLU (Eigen's exp at the portable
// build's SSE2 width) and 8 % in the softmax's scalar std::exp (docs/benchmarks.md,
// "Session 36"). One exp is written once per width: Cephes' range reduction and polynomial
// (as Eigen's float exp), each step an explicit fused multiply-add or plain IEEE operation in
// the same order at every width (std::fma in the scalar one), so no level's result depends on
// what the compiler contracts. Its error is at most 2 ulp against the exact exp.

namespace numesh::ops {

/// y[i] = exp(x[i]) for i < n at kernel level `level` (the same bits at every level): +inf
/// above about 88.72, 0 below about -103.97 (subnormals between), NaN for NaN. `y` may be `x`.
void exp_rows(const float* x, float* y, std::int64_t n, runtime::KernelLevel level);

/// gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i] for i < n (silu(gate) .* up, a gated MLP's
/// middle) at kernel level `level`, the same bits at every level. Very negative gates give -0
/// or a tiny negative, never NaN.
void silu_mul_row(float* gate, const float* up, std::int64_t n, runtime::KernelLevel level);

/// The stable softmax of row[0, visible) in place (exponentials of the differences from the
/// maximum, divided by their sum taken in 16 lanes and folded in a fixed order), and zeros in
/// [visible, width), at kernel level `level`: the same bits at every level.
/// REQUIRES: 0 < visible <= width.
void softmax_row(float* row, std::int64_t visible, std::int64_t width, runtime::KernelLevel level);

}  // namespace numesh::ops
