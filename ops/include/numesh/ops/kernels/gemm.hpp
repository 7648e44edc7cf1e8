#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/blas_gemm.hpp"
#include "numesh/ops/matmul_precision.hpp"

// The device-level products: device_gemm and its kin spread one product over the calling
// device's threads in tiles fixed by the shapes, each tile a single-threaded product by the
// kernels of the weight's format (ops/src/kernels/weight_kernels.hpp's table: blas_gemm.hpp for
// fp32, gemm_16bit.hpp, skinny_gemm.hpp, dot_gemm.hpp).

namespace numesh::ops {

/// How device_gemm cuts c [m, n] into tiles, each one gemm() call: from the shapes only.
struct GemmTiling {
  std::int64_t row_block = 0;  ///< rows of a tile (the last one may be shorter)
  std::int64_t col_block = 0;  ///< columns of a tile (the last one may be narrower)
  /// Tiles along m and n.
  std::int64_t row_tiles(std::int64_t m) const noexcept {
    return row_block > 0 ? (m + row_block - 1) / row_block : 0;
  }
  std::int64_t col_tiles(std::int64_t n) const noexcept {
    return col_block > 0 ? (n + col_block - 1) / col_block : 0;
  }
};

/// The smallest prefill tile gemm_tiling cuts (the last along each side may be smaller), and
/// the multiple a row block is rounded up to: OpenBLAS's sgemm (the default) slows on tiles under
/// 256 x 256, while the block formats' int8 tiles (block_gemm.hpp) run groups of 16 rows by pairs
/// of 16-output panels at full speed down to 64 x 32: device_gemm asks each weight format for its
/// floor, so that a product whose 256-wide strips would be 1 to 3 tasks (a 768-output projection:
/// 3 tasks on 2 threads, one thread idle for a third of it) is cut finely enough to balance.
struct TileFloor {
  std::int64_t rows = 256;
  std::int64_t cols = 256;
  std::int64_t row_multiple = 1;
  /// Column strips are a multiple of this many columns (the int8 tiles take outputs in pairs of
  /// 16-output panels: a strip of an odd number of panels ran its last one alone, at about half
  /// the speed per output).
  std::int64_t col_multiple = 16;
};

/// The tiling device_gemm uses for an [m, k] x [k, n] product. It depends on the shapes (and the
/// weight format's floor) and never on the number of threads, so every element of c is computed
/// by a gemm() call of the same shape in every arena: results are bitwise identical for any
/// thread count. Small products are one tile. Others get one tile per ~8 M multiply-adds
/// (decode, m <= 16: per 256 KiB of b, the bytes it streams), at most 64 tiles: column strips at
/// least floor.cols wide (64 for decode) and a multiple of floor.col_multiple, then row blocks of
/// at least floor.rows rows (a multiple of floor.row_multiple) when the strips are too few.
GemmTiling gemm_tiling(std::int64_t m, std::int64_t n, std::int64_t k,
                       TileFloor floor = {}) noexcept;

/// Rows of b per task of a decode product (m <= 16): whole rows of b, about a sixteenth of b a
/// block but between 64 KiB and 1 MiB of it (rounded up to whole rows, a multiple of 4; a row
/// wider than 256 KiB gives a larger block), at most 64 blocks. Depends on the shapes only.
std::int64_t skinny_k_block(std::int64_t n, std::int64_t k, DType b_type = DType::kF32) noexcept;

/// Outputs per task of a decode product on out-in weights (m <= 16): about a sixteenth of b a
/// block but between 64 KiB and 1 MiB of it (whole outputs), at most 64 blocks. Depends on the
/// shapes only.
std::int64_t dot_out_block(std::int64_t n, std::int64_t k, DType b_type = DType::kF32) noexcept;

/// The decode path of device_gemm for weights stored in-out: c[m, n] = a[m, k] b, over the
/// calling thread's arena as blocks of skinny_k_block() whole rows of b, each the format's decode
/// kernel (skinny_gemm()) into a partial product, the partials summed in block order: bitwise
/// the same for any thread count.
/// Throws: ShapeError unless 1 <= m <= kSkinnyMaxRows, c has m rows and b is [k, n] stored
/// in-out; TypeError for a format stored out-in only.
void device_decode_gemm(ConstMatrixMap a, const WeightMatrix& b, MatrixMap c);

/// c = a * b for a weight matrix b [k, n] of any dtype, over the calling thread's arena: fp32
/// as the overload below; bf16 / f16 weights through the same tiling with skinny_gemm() (the
/// decode tiles, and device_decode_gemm() for decode products of 1 MiB or more counted as fp32)
/// and gemm_16bit() (prefill tiles). Weights stored out-in take dot_gemm() for every decode
/// product (blocks of dot_out_block() outputs, one task each) and the same prefill tiles read
/// transposed; bf16 ones at the amx level take dot_gemm() for every product (AMX tile products,
/// faster than the prefill tiles there). bf16 weights multiply bf16-rounded activations on every
/// path, f16 weights fp32 activations (docs/ops.md, "Weight dtypes"). Bitwise identical results for
/// any number of threads. With `precision` kBF16, fp32 weights multiply in bf16 compute: every
/// tile, decode-sized ones too, is one gemm_bf16_compute() call (16-bit weights are unaffected).
/// Block formats (GGML's, runtime/block_formats.hpp; stored out-in only) multiply activations
/// quantized to 8 bits a block of 32 (block_gemm.hpp): decode products by the format's integer dot
/// kernel, prefill tiles by packed_gemm_q8(); q8_0 and q4_0 weights stored in panels take
/// packed_gemm_q8() for every product where panels pay (ops::panels_pay: from avx2; it reads the
/// panels in place, one row as fast as the dot kernel). k = 0 writes zeros. Throws: ShapeError
/// naming the shapes when they do not multiply, or when a block format's k is not whole blocks of
/// 32; TypeError for a block format stored in-out.
void device_gemm(ConstMatrixMap a, const WeightMatrix& b, MatrixMap c,
                 MatmulPrecision precision = MatmulPrecision::kF32);
/// The most products device_gemms() runs as one loop; more run one after another.
inline constexpr std::size_t kMaxSharedProducts = 4;

/// One product of device_gemms(): c = a * b, a being the input the products share.
struct SharedInputProduct {
  WeightMatrix b;
  MatrixMap c;
};

/// c = a * b for each of `products`, each the bits device_gemm(a, b, c, precision) gives it.
/// Up to kMaxSharedProducts decode products that all take the dot or panel kernels from
/// activations of one form (a layer's q, k and v, or its gate and up, in one weight format) run as
/// one parallel loop over all their output blocks: `a` is rounded or quantized once, and the
/// device's threads meet once at the end instead of once a product (three meetings fewer a layer
/// of a decode step, each a few microseconds of an idle thread). Any other mix runs as
/// device_gemm runs each, in order. Allocates nothing once the calling thread's buffers have
/// grown to the shape. Throws: as device_gemm, naming the first product whose shapes do not
/// multiply before any is computed.
void device_gemms(ConstMatrixMap a, std::span<const SharedInputProduct> products,
                  MatmulPrecision precision = MatmulPrecision::kF32);
/// c = a * b over the calling thread's oneTBB arena (a device's threads when called from a
/// node body): the tiles of gemm_tiling() run as parallel tasks, each one single-threaded
/// gemm() call (skinny_gemm() for decode tiles of m <= 16 rows); decode products whose b has
/// 1 MiB or more instead run as blocks of skinny_k_block() whole rows of b, each skinny_gemm()
/// into a partial product, the partials summed in block order.
/// Bitwise identical results for any number of threads. `precision` as above.
/// Throws: as gemm().
void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c,
                 MatmulPrecision precision = MatmulPrecision::kF32);

/// c = a^T b + beta c for fp32 a [m, n] and b [m, k], c [n, k]: a weight's gradient dW = dy^T x
/// (dy [rows, out], x [rows, in], dW stored out-in [out, in]), summed over the rows. Over the
/// calling thread's arena in the tiles gemm_tiling(n, k, m) cuts c into, one single-threaded
/// product each (OpenBLAS with a transposed, Eigen below kBlasMinMultiplyAdds;
/// gemm_bf16_compute() with `precision` kBF16): bitwise the same for any thread count.
/// Throws: ShapeError naming the shapes when they do not fit; ValueError for kBF16 with a beta
/// other than 0 or 1.
void device_gemm_transposed_a(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float beta = 0.0f,
                              MatmulPrecision precision = MatmulPrecision::kF32);

}  // namespace numesh::ops
