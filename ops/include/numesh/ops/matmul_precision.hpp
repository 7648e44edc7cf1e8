#pragma once

// What the operators' fp32 products are computed in: part of the vocabulary, because a
// program chooses it (ProgramBuilder::set_matmul_precision) and the kernels honour it
// (device_gemm).

namespace numesh::ops {

/// The precision of a matmul on fp32 operands, as JAX and torch.autocast name it: kF32, or
/// kBF16, where both operands are rounded to bf16 and the products summed in fp32 (twice the
/// fp32 rate with AVX-512 BF16; gemm_16bit.hpp, gemm_bf16_compute()). Products of 16-bit
/// weights are bf16 or f16 whatever is asked.
enum class MatmulPrecision { kF32, kBF16 };

/// "f32" or "bf16".
constexpr const char* to_string(MatmulPrecision precision) noexcept {
  return precision == MatmulPrecision::kBF16 ? "bf16" : "f32";
}

}  // namespace numesh::ops
