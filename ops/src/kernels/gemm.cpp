#include "numesh/ops/kernels/gemm.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/ops/kernels/gemm_16bit.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/ops/kernels/skinny_gemm.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "weight_kernels.hpp"

namespace numesh::ops {

namespace {
// Bytes of a stored row of `elements` (at least one) in `t`, rounded up to whole blocks: the
// blockings below size tasks by it and must not throw (a row that is not whole blocks is
// refused where the weights are laid out).
std::int64_t blocking_row_bytes(DType t, std::int64_t elements) noexcept {
  const DTypeTraits& f = traits(t);
  const std::int64_t blocks =
      (std::max<std::int64_t>(elements, 1) + f.block_elements - 1) / f.block_elements;
  return blocks * f.block_bytes;
}

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
// Decode: m is the batch (at most kSkinnyMaxRows) and the product is bound by reading b, so it is
// cut by b's bytes: one column strip per 256 KiB of b, at least 64 columns wide. (Large b goes
// to blocks of whole rows instead, below; the strips serve decode products under 1 MiB, where
// enough strips for the device's threads matter more than long runs of each row.)
constexpr std::int64_t kBytesPerSkinnyTile = std::int64_t{1} << 18;
constexpr std::int64_t kMinColBlockSkinny = 64;
// Blocks of whole rows for device_gemm's decode path: each block's partial product (m x n
// floats) is written and read back once more, 2 m / (rows per block) of the weights' traffic,
// so blocks are large: a sixteenth of the matrix, between 64 KiB and 1 MiB of weights (16 blocks
// keep a device's threads busy; at most kMaxTiles). Every decode product of 1 MiB or more (as
// fp32) takes them: the column strips of gemm_tiling read 128-256 bytes of each row in turn, and
// moving the attention projections (2-4 MiB) from strips to blocks took the 61 M-parameter
// model's decode from 1.68x to 1.84x the fp32 tokens/s with bf16 weights, and fp32's own step
// from 9.4 to 8.6 ms (numesh bench decode --policy numa, medians of five alternated runs).
constexpr std::int64_t kBytesPerSkinnyBlock = std::int64_t{1} << 20;
constexpr std::int64_t kMinBytesPerSkinnyBlock = std::int64_t{64} << 10;
constexpr std::int64_t kSkinnyBlocksWanted = 16;
constexpr std::int64_t kMinSkinnySplitBytes = std::int64_t{1} << 20;
}  // namespace

GemmTiling gemm_tiling(std::int64_t m, std::int64_t n, std::int64_t k, TileFloor floor) noexcept {
  if (m <= 0 || n <= 0) return {std::max<std::int64_t>(m, 0), std::max<std::int64_t>(n, 0)};
  if (m * n * k < kOneTileBelow) return {m, n};
  const bool skinny = m <= kSkinnyMaxRows;
  const std::int64_t wanted = std::clamp<std::int64_t>(
      skinny ? n * k * static_cast<std::int64_t>(sizeof(float)) / kBytesPerSkinnyTile
             : m * n * k / kWorkPerTile,
      1, kMaxTiles);
  // Column strips first (b, the weights, is then packed once per strip), rounded to
  // floor.col_multiple columns.
  const std::int64_t min_cols = skinny ? kMinColBlockSkinny : floor.cols;
  const std::int64_t col_multiple = std::max<std::int64_t>(1, floor.col_multiple);
  const std::int64_t col_block =
      std::min(n, std::max(min_cols, ((n + wanted - 1) / wanted + col_multiple - 1) / col_multiple *
                                         col_multiple));
  const std::int64_t col_tiles = (n + col_block - 1) / col_block;
  std::int64_t row_block = m;
  if (!skinny && col_tiles < wanted) {
    const std::int64_t row_tiles = (wanted + col_tiles - 1) / col_tiles;
    const std::int64_t rows = std::max(floor.rows, (m + row_tiles - 1) / row_tiles);
    const std::int64_t multiple = std::max<std::int64_t>(1, floor.row_multiple);
    row_block = std::min(m, (rows + multiple - 1) / multiple * multiple);
  }
  return {row_block, col_block};
}

std::int64_t skinny_k_block(std::int64_t n, std::int64_t k, DType b_type) noexcept {
  // A sixteenth of b per block (whole rows), within [64 KiB, 1 MiB], at most kMaxTiles blocks, a
  // multiple of 4 rows (skinny_gemm takes four or eight rows per update; a tail runs row by row).
  const std::int64_t row_bytes = blocking_row_bytes(b_type, n);
  const std::int64_t block_bytes = std::clamp<std::int64_t>(
      row_bytes * k / kSkinnyBlocksWanted, kMinBytesPerSkinnyBlock, kBytesPerSkinnyBlock);
  std::int64_t rows = std::max<std::int64_t>((block_bytes + row_bytes - 1) / row_bytes,
                                             (k + kMaxTiles - 1) / kMaxTiles);
  rows = (rows + 3) / 4 * 4;
  return std::max<std::int64_t>(1, std::min(rows, k));
}

// Decode: c = a b as blocks of whole rows of b, each block one task streaming contiguous memory
// (skinny_gemm over the block's rows into its own partial product), then the partial products
// summed in block order. Rows of b are read end to end: with column strips every row of a strip
// started a new run in another page, and decode streamed 61 % of a plain read (docs/benchmarks.md).
void device_decode_gemm(ConstMatrixMap a, const WeightMatrix& b, MatrixMap c) {
  const std::int64_t m = a.rows(), k = a.cols(), n = c.cols();
  NUMESH_CHECK(m >= 1 && m <= kSkinnyMaxRows && c.rows() == m, ShapeError,
               "decode gemm: a is [{}, {}] and c [{}, {}]; it takes 1 to {} rows, the same in both",
               m, k, c.rows(), n, kSkinnyMaxRows);
  const bool fits = b.layout == WeightLayout::kInOut && b.rows == k && b.cols == n;
  NUMESH_CHECK(fits, ShapeError,
               "decode gemm: a is [{}, {}] and c [{}, {}]; b must be [{}, {}] stored in-out, not "
               "[{}, {}] ({})",
               m, k, c.rows(), n, k, n, b.rows, b.cols,
               b.layout == WeightLayout::kInOut ? "in-out" : "out-in");
  const detail::RowsKernel skinny = detail::weight_kernels(b.dtype).skinny;
  NUMESH_CHECK(skinny != nullptr, TypeError,
               "decode gemm: {} weights are stored out-in only, not in-out", to_string(b.dtype));
  if (k == 0) {
    c.setZero();
    return;
  }
  const runtime::KernelLevel level = runtime::kernel_level();
  const std::int64_t kb = skinny_k_block(n, k, b.dtype), blocks = (k + kb - 1) / kb;
  if (blocks == 1) {
    skinny(m, a.data(), k, b, c.data(), n, level);
    return;
  }
  // The partial products of every block: the calling thread's buffer, kept between calls so
  // that a decode step does not allocate. Isolated: while this thread waits for the blocks it
  // must not pick up another node body of the arena, whose device_gemm would reuse the buffer.
  thread_local std::vector<float> partials;
  oneapi::tbb::this_task_arena::isolate([&] {
    const auto need = static_cast<std::size_t>(blocks * m * n);
    if (partials.size() < need) partials.resize(need);
    float* p = partials.data();
    parallel_blocks(blocks, 1, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t t = first; t < last; ++t) {
        const std::int64_t r0 = t * kb, rows = std::min(kb, k - r0);
        skinny(m, a.data() + r0, k, b.inputs(r0, rows), p + t * m * n, n, level);
      }
    });
    // Sum in block order, each element by one task: the same bits for any thread count. Block
    // by block over a range of elements, so the adds vectorize (element by element over the
    // blocks they did not: 4 % of a decode step).
    parallel_blocks(m * n, 1024, [&](std::int64_t first, std::int64_t last) {
      float* out = c.data();
      std::copy(p + first, p + last, out + first);
      for (std::int64_t t = 1; t < blocks; ++t) {
        const float* part = p + t * m * n;
        for (std::int64_t e = first; e < last; ++e) out[e] += part[e];
      }
    });
  });
}

std::int64_t dot_out_block(std::int64_t n, std::int64_t k, DType b_type) noexcept {
  // As skinny_k_block, over outputs: a sixteenth of b per task within [64 KiB, 1 MiB], at most
  // kMaxTiles tasks.
  const std::int64_t row_bytes = blocking_row_bytes(b_type, k);
  const std::int64_t block_bytes = std::clamp<std::int64_t>(
      row_bytes * n / kSkinnyBlocksWanted, kMinBytesPerSkinnyBlock, kBytesPerSkinnyBlock);
  const std::int64_t outputs = std::max<std::int64_t>((block_bytes + row_bytes - 1) / row_bytes,
                                                      (n + kMaxTiles - 1) / kMaxTiles);
  return std::max<std::int64_t>(1, std::min(outputs, n));
}

namespace {

// tile(r0, c0, rows, cols) for each tile of gemm_tiling(m, n, k, floor) (c's rows
// [r0, r0 + rows), columns [c0, c0 + cols)), one task each over the calling thread's arena:
// which thread runs a tile does not change what the tile computes.
template <typename Tile>
void for_each_tile(std::int64_t m, std::int64_t n, std::int64_t k, const Tile& tile,
                   TileFloor floor = {}) {
  const GemmTiling t = gemm_tiling(m, n, k, floor);
  const std::int64_t ct = t.col_tiles(n);
  parallel_blocks(t.row_tiles(m) * ct, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) {
      const std::int64_t r0 = (i / ct) * t.row_block, c0 = (i % ct) * t.col_block;
      tile(r0, c0, std::min(t.row_block, m - r0), std::min(t.col_block, n - c0));
    }
  });
}

// How device_dot_gemm cuts an [m, k] x [k, n] product on out-in weights into tasks: blocks of
// dot_out_block() outputs (whole panels on weights in panels), and for more than kSkinnyMaxRows
// rows (row-invariant products, and prefill where the dot kernel outruns the tiles) groups of 16
// rows too when the output blocks alone are fewer tasks than the work wants (as gemm_tiling cuts
// rows when its strips are too few: a [256, 768] x [768, 256] projection is 7 output blocks, for a
// device of any number of threads). From the shapes only.
struct DotBlocking {
  std::int64_t block = 0, out_blocks = 0, row_block = 0, row_blocks = 0;
  std::int64_t tasks() const noexcept { return row_blocks * out_blocks; }
};

DotBlocking dot_blocking(std::int64_t m, const WeightMatrix& b) {
  const std::int64_t n = b.cols, k = b.rows;
  std::int64_t block = dot_out_block(n, k, b.dtype);
  // Whole panels a task: the block rounded up to a panel's outputs.
  constexpr std::int64_t kWidth = runtime::kPanelWidth;
  if (b.panel_outputs > 0) block = (block + kWidth - 1) / kWidth * kWidth;
  const std::int64_t out_blocks = (n + block - 1) / block;
  std::int64_t row_block = m;
  if (m > kSkinnyMaxRows) {
    const std::int64_t wanted = std::clamp<std::int64_t>(m * n * k / kWorkPerTile, 1, kMaxTiles);
    if (out_blocks < wanted) {
      const std::int64_t row_tiles = (wanted + out_blocks - 1) / out_blocks;
      row_block = std::max(kSkinnyMaxRows, ((m + row_tiles - 1) / row_tiles + kSkinnyMaxRows - 1) /
                                               kSkinnyMaxRows * kSkinnyMaxRows);
    }
  }
  return {block, out_blocks, row_block, (m + row_block - 1) / row_block};
}

// Task t of `blocking`: its rows and outputs of c by `kernel`, on the calling thread.
void dot_task(const detail::PreparedActivations& a, const WeightMatrix& b, MatrixMap c,
              detail::DotKernel kernel, runtime::KernelLevel level, const DotBlocking& blocking,
              std::int64_t t) {
  const std::int64_t m = a.values.rows(), n = b.cols;
  const std::int64_t r0 = t / blocking.out_blocks * blocking.row_block,
                     j0 = t % blocking.out_blocks * blocking.block;
  const std::int64_t rows = std::min(blocking.row_block, m - r0),
                     outputs = std::min(blocking.block, n - j0);
  kernel(a, r0, rows, b.outputs(j0, outputs), c.data() + r0 * n + j0, n, level);
}

// Out-in weights by `kernel` (the format's dot kernel, or its tile on panels it reads as fast),
// one task a block of dot_blocking(). Every element is one task's dot product: the same bits for
// any thread count, and no partial sums.
void device_dot_gemm(const detail::PreparedActivations& a, const WeightMatrix& b, MatrixMap c,
                     detail::DotKernel kernel, runtime::KernelLevel level) {
  const DotBlocking blocking = dot_blocking(a.values.rows(), b);
  for_each_task(blocking.tasks(),
                [&](std::int64_t t) { dot_task(a, b, c, kernel, level, blocking, t); });
}

// Whether weights in panels take the format's tile for every number of rows
// (WeightKernels::tiles_on_panels_from).
bool tiles_for_every_m(const WeightMatrix& b, const detail::WeightKernels& kernels,
                       runtime::KernelLevel level) {
  return b.layout == WeightLayout::kOutIn && b.panel_outputs > 0 && kernels.tiles_on_panels_from &&
         level >= *kernels.tiles_on_panels_from;
}

// The kernel device_gemm_prepared multiplies a product of m rows by `b` with through
// device_dot_gemm, or null when it takes another path. Out-in weights in kRowInvariant take the
// dot kernels for every m: each element is one dot product in an order fixed by k alone, so a
// row's bits do not depend on the rows beside it, and each task's block of weights is read once
// for all the rows (from L2 after the first group) where blocks of kSkinnyMaxRows rows read the
// whole matrix once a block. So do out-in weights of a format whose dot kernel outruns its tiles
// at this level (WeightKernels::dot_outruns_tiles_from). Weights in panels of a format whose tile
// reads them as fast as its dot kernel (WeightKernels::tiles_on_panels_from) take the tile
// instead, blocked the same way, for every m: its order is fixed by k alone too.
detail::DotKernel dot_path_kernel(std::int64_t m, const WeightMatrix& b,
                                  const detail::WeightKernels& kernels, MatmulPrecision precision,
                                  runtime::KernelLevel level) {
  const bool out_in = b.layout == WeightLayout::kOutIn;
  const bool dot_for_every_m =
      precision == MatmulPrecision::kRowInvariant ||
      (kernels.dot_outruns_tiles_from && level >= *kernels.dot_outruns_tiles_from);
  if (!out_in || m < 1 || (m > kSkinnyMaxRows && !dot_for_every_m)) return nullptr;
  return tiles_for_every_m(b, kernels, level) ? kernels.tile : kernels.dot;
}

// device_gemm once the activations are in the form the weights' format multiplies: the decode
// blocks (dot_path_kernel), or the tiles, each running the format's kernel.
void device_gemm_prepared(const detail::PreparedActivations& a, const WeightMatrix& b, MatrixMap c,
                          const detail::WeightKernels& kernels, MatmulPrecision precision) {
  const std::int64_t m = a.values.rows(), k = a.values.cols(), n = b.cols;
  const runtime::KernelLevel level = runtime::kernel_level();
  const bool out_in = b.layout == WeightLayout::kOutIn;
  const bool tile_for_every_m = tiles_for_every_m(b, kernels, level);
  if (const detail::DotKernel kernel = dot_path_kernel(m, b, kernels, precision, level)) {
    device_dot_gemm(a, b, c, kernel, level);
    return;
  }
  // The switch counts elements as fp32 bytes, so a 16-bit matrix takes the same path as its fp32
  // twin: its strips would be half as many bytes wide (128 B runs per row for bf16), and bf16
  // decode on two devices of one thread ran slower than fp32 when the 4 MiB bf16 MLP weights
  // took them (numesh bench decode --policy core: 0.77-0.92x of fp32).
  if (!out_in && m >= 1 && m <= kSkinnyMaxRows &&
      n * k * static_cast<std::int64_t>(sizeof(float)) >= kMinSkinnySplitBytes) {
    device_decode_gemm(a.values, b, c);
    return;
  }
  NUMESH_CHECK(out_in || kernels.skinny != nullptr, TypeError,
               "gemm: {} weights are stored out-in only, not in-out", to_string(b.dtype));
  for_each_tile(
      m, n, k,
      [&](std::int64_t r0, std::int64_t c0, std::int64_t rows, std::int64_t cols) {
        const WeightMatrix bt = b.outputs(c0, cols);
        float* ct = c.data() + r0 * n + c0;
        if (rows > kSkinnyMaxRows || tile_for_every_m) {
          kernels.tile(a, r0, rows, bt, ct, n, level);
        } else if (out_in) {
          // Decode: the kernel that streams each weight once (OpenBLAS's sgemm is not
          // at its best on a few rows; docs/benchmarks.md has the decode figures). Only
          // the tail of m reaches here for out-in weights.
          kernels.dot(a, r0, rows, bt, ct, n, level);
        } else {
          kernels.skinny(rows, a.values.data() + r0 * k, k, bt, ct, n, level);
        }
      },
      kernels.tile_floor);
}

// bf16 weights multiply bf16 activations on every path and every CPU (as PyTorch's bf16 linear
// and ggml's bf16 dot do): the products are then exact in fp32 and the vdpbf16ps kernel can run;
// every kernel sees the same inputs (their sums still differ in order). Block formats multiply
// activations quantized to 8 bits a 32-element block (as llama.cpp's do): codes and scales for
// the integer kernels, decode and prefill alike, so that a row multiplies the same operands in a
// decode step and in a prompt. with_prepared(a, form, b_dtype, f) calls f(prepared) with `a` in
// `form` (b_dtype names the weights in errors), the calling thread's buffers filled in row blocks
// over the arena; isolated for the reason device_decode_gemm's partials are.
template <class F>
void with_prepared(ConstMatrixMap a, detail::ActivationForm form, DType b_dtype, const F& f) {
  const std::int64_t m = a.rows(), k = a.cols();
  switch (form) {
    case detail::ActivationForm::kF32:
      f(detail::PreparedActivations{a});
      return;
    case detail::ActivationForm::kBF16: {
      thread_local std::vector<std::uint16_t> bits;
      thread_local std::vector<float> rounded;
      oneapi::tbb::this_task_arena::isolate([&] {
        const auto count = static_cast<std::size_t>(m * k);
        bits.resize(count);
        rounded.resize(count);
        // The calling thread's buffers by pointer: inside the tasks below, the names `bits` and
        // `rounded` would be each worker's own thread_local (a lambda does not capture them).
        std::uint16_t* const bits_of_caller = bits.data();
        float* const rounded_of_caller = rounded.data();
        parallel_blocks(m, row_block_for(k), [&](std::int64_t r0, std::int64_t r1) {
          const auto at = static_cast<std::size_t>(r0 * k),
                     len = static_cast<std::size_t>((r1 - r0) * k);
          runtime::convert_f32_to_bf16({a.data() + at, len}, {bits_of_caller + at, len});
          runtime::convert_bf16_to_f32({bits_of_caller + at, len}, {rounded_of_caller + at, len});
        });
        f(detail::PreparedActivations{ConstMatrixMap(rounded_of_caller, m, k), bits_of_caller});
      });
      return;
    }
    case detail::ActivationForm::kQ8: {
      NUMESH_CHECK(k % 32 == 0, ShapeError,
                   "gemm: {} weights take inputs in whole blocks of 32, not {}", to_string(b_dtype),
                   k);
      thread_local std::vector<std::int8_t> codes;
      thread_local std::vector<float> scales;
      oneapi::tbb::this_task_arena::isolate([&] {
        codes.resize(static_cast<std::size_t>(m * k));
        scales.resize(static_cast<std::size_t>(m * k / 32));
        std::int8_t* const codes_of_caller = codes.data();
        float* const scales_of_caller = scales.data();
        const runtime::KernelLevel level = runtime::kernel_level();
        parallel_blocks(m, row_block_for(k), [&](std::int64_t r0, std::int64_t r1) {
          quantize_activations_q8(r1 - r0, k, a.data() + r0 * k, k, codes_of_caller + r0 * k,
                                  scales_of_caller + r0 * (k / 32), level);
        });
        // The values' shape only: no kernel of a block format reads fp32 activations.
        f(detail::PreparedActivations{ConstMatrixMap(nullptr, m, k), nullptr, codes_of_caller,
                                      scales_of_caller});
      });
      return;
    }
  }
}

// device_gemm's checks of one product's shapes.
void check_multiplies(ConstMatrixMap a, const WeightMatrix& b, MatrixMap c) {
  const std::int64_t m = a.rows(), k = a.cols(), n = b.cols;
  NUMESH_CHECK(b.rows == k && c.rows() == m && c.cols() == n, ShapeError,
               "gemm: a is [{}, {}], b is [{}, {}] ({}), c is [{}, {}]: they do not multiply", m, k,
               b.rows, b.cols, to_string(b.dtype), c.rows(), c.cols());
}

}  // namespace

void device_gemm(ConstMatrixMap a, const WeightMatrix& b, MatrixMap c, MatmulPrecision precision) {
  check_multiplies(a, b, c);
  const std::int64_t m = a.rows(), k = a.cols(), n = b.cols;
  if (precision == MatmulPrecision::kRowInvariant && m > kSkinnyMaxRows &&
      b.layout == WeightLayout::kInOut) {
    // In-out weights: row blocks of the decode size, one after the other, each as a decode
    // product: a row's sums do not see the rows beside it (each block's own tiles and k blocks
    // come from n and k; MatmulPrecision). Out-in weights take the dot kernels for all the rows
    // at once (device_gemm_prepared).
    for (std::int64_t r0 = 0; r0 < m; r0 += kSkinnyMaxRows) {
      const std::int64_t rows = std::min(kSkinnyMaxRows, m - r0);
      device_gemm(ConstMatrixMap(a.data() + r0 * k, rows, k), b,
                  MatrixMap(c.data() + r0 * n, rows, n), precision);
    }
    return;
  }
  if (precision == MatmulPrecision::kBF16 && b.dtype == DType::kF32) {
    // bf16 compute on fp32 weights: the prefill tiles for every shape, each rounding its
    // operands as it packs them (the level read here, once, for every tile).
    const bool out_in = b.layout == WeightLayout::kOutIn;
    const runtime::KernelLevel level = runtime::kernel_level();
    const auto* w = static_cast<const float*>(b.data);
    for_each_tile(
        m, n, k, [&](std::int64_t r0, std::int64_t c0, std::int64_t rows, std::int64_t cols) {
          gemm_bf16_compute(rows, cols, k, a.data() + r0 * k, k, /*transpose_a=*/false,
                            w + c0 * (out_in ? k : 1), out_in ? k : n, /*transpose_b=*/out_in,
                            /*accumulate=*/false, c.data() + r0 * n + c0, n, level);
        });
    return;
  }
  if (k == 0) {  // no inputs: every output is an empty sum (and no format's kernel need run)
    c.setZero();
    return;
  }
  const detail::WeightKernels& kernels = detail::weight_kernels(b.dtype);
  with_prepared(a, kernels.activations, b.dtype, [&](const detail::PreparedActivations& prepared) {
    device_gemm_prepared(prepared, b, c, kernels, precision);
  });
}

void device_gemms(ConstMatrixMap a, std::span<const SharedInputProduct> products,
                  MatmulPrecision precision) {
  for (const SharedInputProduct& p : products) check_multiplies(a, p.b, p.c);
  // Together when every product takes device_dot_gemm from activations of one form; any other
  // mix (or more than kMaxSharedProducts) runs as device_gemm runs each (the special paths of
  // fp32 weights in kBF16 and of k = 0 included). Fixed arrays: a decode step allocates nothing.
  const std::size_t count = products.size();
  const runtime::KernelLevel level = runtime::kernel_level();
  const std::int64_t m = a.rows();
  std::array<detail::DotKernel, kMaxSharedProducts> kernel_of{};
  bool together = count >= 2 && count <= kMaxSharedProducts;
  const auto form = count > 0 ? detail::weight_kernels(products[0].b.dtype).activations
                              : detail::ActivationForm::kF32;
  for (std::size_t i = 0; together && i < count; ++i) {
    const WeightMatrix& b = products[i].b;
    const detail::WeightKernels& kernels = detail::weight_kernels(b.dtype);
    const bool fp32_in_bf16 = precision == MatmulPrecision::kBF16 && b.dtype == DType::kF32;
    if (!fp32_in_bf16 && a.cols() > 0 && kernels.activations == form) {
      kernel_of[i] = dot_path_kernel(m, b, kernels, precision, level);
    }
    together = kernel_of[i] != nullptr;
  }
  if (!together) {
    for (const SharedInputProduct& p : products) device_gemm(a, p.b, p.c, precision);
    return;
  }
  std::array<DotBlocking, kMaxSharedProducts> blocking_of{};
  std::array<std::int64_t, kMaxSharedProducts + 1> first_task{};
  for (std::size_t i = 0; i < count; ++i) {
    blocking_of[i] = dot_blocking(m, products[i].b);
    first_task[i + 1] = first_task[i] + blocking_of[i].tasks();
  }
  with_prepared(a, form, products[0].b.dtype, [&](const detail::PreparedActivations& prepared) {
    for_each_task(first_task[count], [&](std::int64_t t) {
      std::size_t i = 0;
      while (t >= first_task[i + 1]) ++i;
      dot_task(prepared, products[i].b, products[i].c, kernel_of[i], level, blocking_of[i],
               t - first_task[i]);
    });
  });
}

void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, MatmulPrecision precision) {
  NUMESH_CHECK(b.rows() == a.cols() && c.rows() == a.rows() && c.cols() == b.cols(), ShapeError,
               "gemm: a is [{}, {}], b is [{}, {}], c is [{}, {}]: they do not multiply", a.rows(),
               a.cols(), b.rows(), b.cols(), c.rows(), c.cols());
  device_gemm(a, as_weight(b), c, precision);
}

void device_gemm_transposed_a(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float beta,
                              MatmulPrecision precision) {
  const std::int64_t m = a.rows(), n = a.cols(), k = b.cols();
  NUMESH_CHECK(
      b.rows() == m && c.rows() == n && c.cols() == k, ShapeError,
      "gemm: a is [{}, {}] (transposed), b is [{}, {}], c is [{}, {}]: they do not multiply", m, n,
      b.rows(), k, c.rows(), c.cols());
  const bool bf16 = precision == MatmulPrecision::kBF16;
  NUMESH_CHECK(!bf16 || beta == 0.0f || beta == 1.0f, ValueError,
               "gemm: beta {} with bf16 compute; it takes 0 (overwrite) or 1 (accumulate)", beta);
  if (n == 0 || k == 0) return;
  const runtime::KernelLevel level = bf16 ? runtime::kernel_level() : runtime::KernelLevel::kScalar;
  for_each_tile(
      n, k, m, [&](std::int64_t r0, std::int64_t c0, std::int64_t rows, std::int64_t cols) {
        if (bf16) {
          gemm_bf16_compute(rows, cols, m, a.data() + r0, n, /*transpose_a=*/true, b.data() + c0, k,
                            /*transpose_b=*/false,
                            /*accumulate=*/beta == 1.0f, c.data() + r0 * k + c0, k, level);
        } else {
          gemm_transposed_a(rows, cols, m, 1.0f, a.data() + r0, n, b.data() + c0, k, beta,
                            c.data() + r0 * k + c0, k);
        }
      });
}

}  // namespace numesh::ops
