#include "weight_kernels.hpp"

#include "numesh/ops/kernels/blas_gemm.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/ops/kernels/dot_gemm.hpp"
#include "numesh/ops/kernels/gemm_16bit.hpp"
#include "numesh/ops/kernels/skinny_gemm.hpp"
#include "numesh/ops/kernels/weight_order.hpp"

namespace numesh::ops::detail {

namespace {

using runtime::KernelLevel;

// fp32 and f16 weights: dot_gemm on the fp32 activations.
void dot_widened(const PreparedActivations& a, std::int64_t r0, std::int64_t rows,
                 const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  const std::int64_t k = a.values.cols();
  dot_gemm(rows, a.values.data() + r0 * k, k, b, c, ldc, level);
}

// bf16 weights: dot_gemm_bf16 on the activations' bf16 bits (rounded once, by device_gemm).
void dot_bf16(const PreparedActivations& a, std::int64_t r0, std::int64_t rows,
              const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  const std::int64_t k = a.values.cols();
  dot_gemm_bf16(rows, a.bf16 + r0 * k, k, b, c, ldc, level);
}

// fp32 prefill tiles: OpenBLAS (blas_gemm.hpp), b read transposed when stored out-in.
void tile_f32(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b, float* c,
              std::int64_t ldc, KernelLevel /*level*/) {
  gemm(m, b.cols, b.rows, 1.0f, a, lda, static_cast<const float*>(b.data), b.stride(),
       /*transpose_b=*/b.layout == WeightLayout::kOutIn, 0.0f, c, ldc);
}

// A prefill tile kernel on the fp32 values of the activations (tile_f32, gemm_16bit).
template <RowsKernel kTile>
void tile_on_values(const PreparedActivations& a, std::int64_t r0, std::int64_t rows,
                    const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  const std::int64_t k = a.values.cols();
  kTile(rows, a.values.data() + r0 * k, k, b, c, ldc, level);
}

// Block formats: their integer kernels (block_gemm.hpp) on the activations' 8-bit codes.
template <auto kDot>
void dot_q8(const PreparedActivations& a, std::int64_t r0, std::int64_t rows, const WeightMatrix& b,
            float* c, std::int64_t ldc, KernelLevel level) {
  const std::int64_t k = a.values.cols();
  kDot(rows, a.q8_codes + r0 * k, a.q8_scales + r0 * (k / 32), b, c, ldc, level);
}

constexpr WeightKernels kF32Kernels{ActivationForm::kF32, dot_widened, skinny_gemm,
                                    tile_on_values<tile_f32>};
// At the amx level dot_gemm_bf16 is AMX tile products, which outran gemm_16bit's fma tiles on a
// 256-token prefill 1.8x (docs/benchmarks.md, "bf16 rows by tile products").
constexpr WeightKernels kBF16Kernels{ActivationForm::kBF16,      dot_bf16,    skinny_gemm,
                                     tile_on_values<gemm_16bit>, TileFloor{}, KernelLevel::kAmx};
constexpr WeightKernels kF16Kernels{ActivationForm::kF32, dot_widened, skinny_gemm,
                                    tile_on_values<gemm_16bit>};
// Stored out-in only (their blocks run along each output's inputs): no in-out decode kernel;
// prefill by int8 products on panels the tiles pack, in tiles down to 64 rows (whole groups of
// 16, AMX's) by 32 outputs (a pair of panels; packed_gemm_q8 takes any width), strips whole pairs.
constexpr TileFloor kInt8TileFloor{64, 32, 16, 32};
// Q8_0 and Q4_0 panels with VNNI: packed_gemm_q8 reads them where they lie, one row as fast as
// the dot kernel (q4_0: 1.4x) and 8-16 rows 2-5x as fast (docs/benchmarks.md, "Session 40").
// Below VNNI too, from AVX2, where the tile's rows read a stored panel in place 8 outputs a
// register and one row both halves in a pass: q4_0's dot kernel spends a block's nibbles and
// scale on one output, where the tile shares them among 8 (one row 1.8-2x from the cache, 1.3-1.4x
// from memory, 8 rows 2.3x; decode of the 109 M Llama 1.2x and again 1.1x at the avx2 level),
// q8_0's one row from the cache 1.6x, level from memory, 8 rows 1.4x (decode 1.04x, prefill
// 1.11x): docs/benchmarks.md, "Session 56".
constexpr WeightKernels kBlockKernelsOnRows{ActivationForm::kQ8, dot_q8<dot_gemm_blocks>, nullptr,
                                            dot_q8<packed_gemm_q8>, kInt8TileFloor};
constexpr WeightKernels kBlockKernelsOnPanels{
    ActivationForm::kQ8, dot_q8<dot_gemm_blocks>, nullptr, dot_q8<packed_gemm_q8>, kInt8TileFloor,
    std::nullopt,        KernelLevel::kAvx2};

}  // namespace

const WeightKernels& weight_kernels(DType dtype) noexcept {
  if (dtype == DType::kF32) return kF32Kernels;
  if (dtype == DType::kBF16) return kBF16Kernels;
  if (dtype == DType::kF16) return kF16Kernels;
  // The block formats (each format's own kernels in block_kernels.hpp, which dot_gemm_blocks and
  // packed_gemm_q8 find by the weights' dtype): those with panels take the tile from avx2.
  return runtime::has_panels(dtype) ? kBlockKernelsOnPanels : kBlockKernelsOnRows;
}

}  // namespace numesh::ops::detail

namespace numesh::ops {

bool panels_pay(DType dtype, runtime::KernelLevel level) noexcept {
  const std::optional<runtime::KernelLevel> from =
      detail::weight_kernels(dtype).tiles_on_panels_from;
  return runtime::has_panels(dtype) && from.has_value() && level >= *from;
}

}  // namespace numesh::ops
