#pragma once

// PRIVATE to ops/src: the per-format kernel table behind device_gemm. device_gemm owns the
// tiling (which tasks compute which part of c, fixed by the shapes) and asks the weights'
// format for the single-threaded kernels each task runs. The block formats share one entry
// (their kernels dispatch on the weights' dtype through block_kernels.hpp), so adding a block
// format's kernels is its kernel file and its line there; an element type is its kernels and its
// entry in weight_kernels().

#include <cstdint>
#include <optional>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops::detail {

/// What a format multiplies: the activations as they are, rounded to bf16 first (bf16 weights,
/// so that every kernel level sees the same operands and products are exact), or quantized to 8
/// bits a 32-element block (block formats: integer dot products, as llama.cpp's).
enum class ActivationForm {
  kF32,
  kBF16,
  kQ8,
};

/// The activations of one device_gemm in the form its weights multiply, prepared once by the
/// calling thread and read by every task: `values` [m, k] (bf16-rounded for kBF16; for kQ8 only
/// its shape, over no data), for kBF16 their bits, rows k apart, and for kQ8 their codes (rows k
/// apart) and block scales (rows k / 32 apart; block_gemm.hpp's quantize_activations_q8).
struct PreparedActivations {
  ConstMatrixMap values;
  const std::uint16_t* bf16 = nullptr;
  const std::int8_t* q8_codes = nullptr;
  const float* q8_scales = nullptr;
};

/// c[rows, b.cols] = rows [r0, r0 + rows) of `a` times b stored out-in, on the calling thread:
/// a decode product (rows <= kSkinnyMaxRows), or any number of rows in kRowInvariant products and
/// from WeightKernels::dot_outruns_tiles_from; c's rows `ldc` apart.
using DotKernel = void (*)(const PreparedActivations& a, std::int64_t r0, std::int64_t rows,
                           const WeightMatrix& b, float* c, std::int64_t ldc,
                           runtime::KernelLevel level);
/// c[rows, b.cols] = rows [r0, r0 + rows) of `a` times b on the calling thread, c's rows `ldc`
/// apart: a prefill tile (more than kSkinnyMaxRows rows) of either layout (out-in only for the
/// block formats), or any number of rows of weights in panels from
/// WeightKernels::tiles_on_panels_from.
using TileKernel = DotKernel;
/// c[m, b.cols] = a[m, b.rows] b on the calling thread (a's rows `lda` apart, c's `ldc`): the
/// decode product on in-out weights (skinny_gemm's contract).
using RowsKernel = void (*)(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b,
                            float* c, std::int64_t ldc, runtime::KernelLevel level);

/// One format's kernels.
struct WeightKernels {
  ActivationForm activations = ActivationForm::kF32;
  DotKernel dot = nullptr;      ///< decode, out-in weights
  RowsKernel skinny = nullptr;  ///< decode, in-out weights
  TileKernel tile = nullptr;    ///< prefill tiles
  TileFloor tile_floor{};       ///< the smallest prefill tile `tile` runs at full speed
  /// The kernel level from which `dot` outruns `tile` at every number of rows, so that out-in
  /// weights take it for prefill too (bf16 at kAmx: tile products); none for most formats.
  std::optional<runtime::KernelLevel> dot_outruns_tiles_from{};
  /// The kernel level from which `tile` is as fast as `dot` on one row of weights stored in
  /// panels (WeightMatrix::panel_outputs) and faster on more, so that such weights take `tile`
  /// for every number of rows: decode, prefill and kRowInvariant products alike, one order for a
  /// row whatever the rows beside it (Q8_0 and Q4_0 from kAvx2: packed_gemm_q8
  /// reads stored panels where they lie); none for most formats. ops::panels_pay reads it: the
  /// layers store panels from this level.
  std::optional<runtime::KernelLevel> tiles_on_panels_from{};
};

/// The kernels of weights stored as `dtype`.
const WeightKernels& weight_kernels(DType dtype) noexcept;

}  // namespace numesh::ops::detail
