#pragma once

// What the operators' fp32 products are computed in: part of the vocabulary, because a
// program chooses it (ProgramBuilder::set_matmul_precision) and the kernels honour it
// (device_gemm).

namespace numesh::ops {

/// The precision of a matmul on fp32 operands, as JAX and torch.autocast name it: kF32, or
/// kBF16, where both operands are rounded to bf16 and the products summed in fp32 (twice the
/// fp32 rate with AVX-512 BF16; gemm_16bit.hpp, gemm_bf16_compute()). Products of 16-bit
/// weights are bf16 or f16 whatever is asked.
/// kRowInvariant is kF32 (16-bit weights as ever) computed so that each row of the product
/// has the same bits whatever rows are beside it and however many: every row through the decode
/// kernels, whose sums run along k in an order fixed by the shapes n and k alone (weights stored
/// out-in: all the rows at once, each element one dot product; in-out: row blocks of at most
/// kSkinnyMaxRows rows one after the other), or, for q8_0 and q4_0 panels where they pay
/// (ops::panels_pay), through packed_gemm_q8, whose AMX tile products and rows give a row the
/// same bits. What a
/// serving engine's steps use (a request's tokens must not depend on the batch it runs in); prefill
/// is slower than kF32's tiles.
enum class MatmulPrecision { kF32, kBF16, kRowInvariant };

/// "f32", "bf16" or "f32-row-invariant".
constexpr const char* to_string(MatmulPrecision precision) noexcept {
  switch (precision) {
    case MatmulPrecision::kF32:
      return "f32";
    case MatmulPrecision::kBF16:
      return "bf16";
    case MatmulPrecision::kRowInvariant:
      return "f32-row-invariant";
  }
  return "?";
}

}  // namespace numesh::ops
