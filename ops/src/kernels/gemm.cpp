#include "numesh/ops/kernels/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/ops/kernels/skinny_gemm.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace numesh::ops {

namespace {

void use_one_blas_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, bool transpose_b, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (m * n * k >= kBlasMinMultiplyAdds) {
    use_one_blas_thread();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
    return;
  }
  // Small products: Eigen, never `auto` on an expression (it would re-evaluate or dangle).
  using Strided = Eigen::OuterStride<>;
  const Eigen::Map<const RowMatrix, 0, Strided> am(a, m, k, Strided(lda));
  Eigen::Map<RowMatrix, 0, Strided> cm(c, m, n, Strided(ldc));
  if (beta == 0.0f) {
    cm.setZero();
  } else if (beta != 1.0f) {
    cm *= beta;
  }
  if (transpose_b) {
    cm.noalias() += alpha * (am * Eigen::Map<const RowMatrix, 0, Strided>(b, n, k, Strided(ldb)).transpose());
  } else {
    cm.noalias() += alpha * (am * Eigen::Map<const RowMatrix, 0, Strided>(b, k, n, Strided(ldb)));
  }
}

void gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float alpha, float beta, bool transpose_b) {
  const Eigen::Index m = a.rows(), k = a.cols();
  const Eigen::Index n = transpose_b ? b.rows() : b.cols();
  const Eigen::Index kb = transpose_b ? b.cols() : b.rows();
  NUMESH_CHECK(kb == k && c.rows() == m && c.cols() == n, ShapeError,
               "gemm: a is [{}, {}], b{} is [{}, {}], c is [{}, {}]: they do not multiply", m, k,
               transpose_b ? " (transposed)" : "", b.rows(), b.cols(), c.rows(), c.cols());
  gemm(m, n, k, alpha, a.data(), k, b.data(), b.cols(), transpose_b, beta, c.data(), n);
}

namespace {
// Products below this many multiply-adds are one tile: splitting them costs more in task
// overhead (~1-2 us per fork/join) than it saves.
constexpr std::int64_t kOneTileBelow = std::int64_t{1} << 18;
// Up to this many tiles: enough for a NUMA node of 64 cores.
constexpr std::int64_t kMaxTiles = 64;
// Prefill-sized products get one tile per this many multiply-adds (about 0.1 ms of one core),
// as column strips at least kMinColBlock wide, cut into row blocks of at least kMinRowBlock rows
// when the strips alone are too few. Single-threaded OpenBLAS on [512, 1024] x [1024, n] ran at
// 100 GFLOP/s for n = 2048, 96 for n = 256, 93 for 256 x 512 tiles, 88 for 128 x 512 and 78 for
// 64 x 256 (this machine, a throwaway program calling cblas_sgemm per tile). Measured with
// mlp_bench and numesh run, three alternations (docs/benchmarks.md, "One device, all its
// threads"): these sizes keep the two-device sharded MLP within ~3 % of one call per device and
// bring one device of two threads to the speed of two devices of one.
constexpr std::int64_t kWorkPerTile = std::int64_t{1} << 23;
constexpr std::int64_t kMinColBlock = 256;
constexpr std::int64_t kMinRowBlock = 256;
// Decode: m is the batch (at most kSkinnyMaxRows) and the product is bound by reading b, so it is
// cut by b's bytes: one column strip per 256 KiB of b, at least 512 columns (2 KiB of a row)
// wide, so that skinny_gemm reads long contiguous runs of each row.
constexpr std::int64_t kBytesPerSkinnyTile = std::int64_t{1} << 18;
constexpr std::int64_t kMinColBlockSkinny = 512;
}  // namespace

GemmTiling gemm_tiling(std::int64_t m, std::int64_t n, std::int64_t k) noexcept {
  if (m <= 0 || n <= 0) return {std::max<std::int64_t>(m, 0), std::max<std::int64_t>(n, 0)};
  if (m * n * k < kOneTileBelow) return {m, n};
  const bool skinny = m <= kSkinnyMaxRows;
  const std::int64_t wanted =
      std::clamp<std::int64_t>(skinny ? n * k * static_cast<std::int64_t>(sizeof(float)) / kBytesPerSkinnyTile
                                      : m * n * k / kWorkPerTile,
                               1, kMaxTiles);
  // Column strips first (b, the weights, is then packed once per strip), rounded to 16 columns.
  const std::int64_t min_cols = skinny ? kMinColBlockSkinny : kMinColBlock;
  const std::int64_t col_block = std::min(n, std::max(min_cols, ((n + wanted - 1) / wanted + 15) / 16 * 16));
  const std::int64_t col_tiles = (n + col_block - 1) / col_block;
  std::int64_t row_block = m;
  if (!skinny && col_tiles < wanted) {
    const std::int64_t row_tiles = (wanted + col_tiles - 1) / col_tiles;
    row_block = std::min(m, std::max(kMinRowBlock, (m + row_tiles - 1) / row_tiles));
  }
  return {row_block, col_block};
}

void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c) {
  const std::int64_t m = a.rows(), k = a.cols(), n = b.cols();
  NUMESH_CHECK(b.rows() == k && c.rows() == m && c.cols() == n, ShapeError,
               "gemm: a is [{}, {}], b is [{}, {}], c is [{}, {}]: they do not multiply", m, k, b.rows(), b.cols(),
               c.rows(), c.cols());
  const GemmTiling t = gemm_tiling(m, n, k);
  const std::int64_t rt = t.row_tiles(m), ct = t.col_tiles(n);
  auto tile = [&](std::int64_t i) {
    const std::int64_t r0 = (i / ct) * t.row_block, c0 = (i % ct) * t.col_block;
    const std::int64_t rows = std::min(t.row_block, m - r0), cols = std::min(t.col_block, n - c0);
    if (rows <= kSkinnyMaxRows) {
      // Decode: the kernel that streams each weight once (OpenBLAS's sgemm is not at its best on
      // a few rows; docs/benchmarks.md has the decode figures).
      skinny_gemm(rows, cols, k, a.data() + r0 * k, k, b.data() + c0, DType::kF32, n, c.data() + r0 * n + c0, n);
      return;
    }
    gemm(rows, cols, k, 1.0f, a.data() + r0 * k, k, b.data() + c0, n, /*transpose_b=*/false, 0.0f,
         c.data() + r0 * n + c0, n);
  };
  // One task per tile: which thread runs a tile does not change what the tile computes.
  parallel_blocks(rt * ct, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) tile(i);
  });
}

}  // namespace numesh::ops
