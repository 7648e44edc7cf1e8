#include "numesh/ops/kernels/gemm.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/matches_reference.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

RowMatrix pattern(Eigen::Index rows, Eigen::Index cols, float phase) {
  RowMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) {
      m(i, j) = std::sin(phase + 0.37f * static_cast<float>(i) + 0.11f * static_cast<float>(j));
    }
  }
  return m;
}

// c = a * b in double precision, the naive way.
Eigen::MatrixXd naive(const RowMatrix& a, const RowMatrix& b) {
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(a.rows(), b.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index j = 0; j < b.cols(); ++j) {
      for (Eigen::Index k = 0; k < a.cols(); ++k) c(i, j) += double(a(i, k)) * double(b(k, j));
    }
  }
  return c;
}

// `w` rounded to `t` and widened back (fp32: as it is).
RowMatrix rounded_to(const RowMatrix& w, DType t) {
  RowMatrix r = w;
  for (Eigen::Index i = 0; i < r.size() && t != DType::kF32; ++i) {
    r.data()[i] = t == DType::kBF16 ? f32_from_bf16(bf16_from_f32(w.data()[i]))
                                    : f32_from_f16(f16_from_f32(w.data()[i]));
  }
  return r;
}

using testing::close;

TEST(GemmTest, SmallAndLargeProductsMatchANaiveDoubleProduct) {
  // 4x5x3 takes the Eigen path; 64x48x80 the OpenBLAS path.
  for (auto [m, k, n] : {std::tuple{4, 5, 3}, std::tuple{64, 80, 48}}) {
    const RowMatrix a = pattern(m, k, 0.1f), b = pattern(k, n, 0.7f);
    RowMatrix c(m, n);
    gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n), MatrixMap(c.data(), m, n));
    EXPECT_TRUE(close(c, naive(a, b), 1e-4 * k)) << m << "x" << k << "x" << n;
  }
}

TEST(GemmTest, TransposedBAlphaAndBetaFollowTheFormula) {
  const Eigen::Index m = 40, k = 36, n = 32;
  const RowMatrix a = pattern(m, k, 0.3f), bt = pattern(n, k, 1.3f);  // b transposed: [N, K]
  RowMatrix c = pattern(m, n, 2.0f);
  const RowMatrix c0 = c;
  gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(bt.data(), n, k), MatrixMap(c.data(), m, n),
       2.0f, 0.5f, /*transpose_b=*/true);
  const RowMatrix b = bt.transpose();
  const Eigen::MatrixXd want = 2.0 * naive(a, b) + 0.5 * c0.cast<double>();
  EXPECT_TRUE(close(c, want, 1e-3));
}

TEST(GemmTest, ConcurrentCallsGiveIdenticalResults) {
  const Eigen::Index m = 96, k = 96, n = 96;
  const RowMatrix a = pattern(m, k, 0.2f), b = pattern(k, n, 0.9f);
  RowMatrix ref(m, n);
  gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n), MatrixMap(ref.data(), m, n));
  std::vector<RowMatrix> out(4, RowMatrix(m, n));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < out.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n),
             MatrixMap(out[t].data(), m, n));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const RowMatrix& o : out) EXPECT_EQ(o, ref);
}

// device_gemm cuts c by shape only, so arenas of any size compute the same bits; the shapes
// cover one tile, skinny (decode) products split along n, and row x column tiles that do and
// do not divide the blocking.
TEST(GemmTest, DeviceGemmIsBitwiseTheSameForAnyThreadCount) {
  struct Shape {
    Eigen::Index m, k, n;
  };
  // Enough workers that an arena of 7 really runs 7 threads at once (on 2 cores too): the
  // per-thread scratch and the tiles are then used concurrently, not one after another.
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (const Shape sh :
       {Shape{4, 8, 8}, Shape{1, 128, 4096}, Shape{7, 300, 1000}, Shape{16, 96, 2050},
        Shape{64, 64, 64}, Shape{130, 48, 777}, Shape{200, 50, 300}, Shape{256, 40, 520},
        Shape{3, 2048, 1024}}) {  // from 1 MiB of b: blocks of whole rows, partials summed
    const RowMatrix a = pattern(sh.m, sh.k, 0.4f), b = pattern(sh.k, sh.n, 1.9f);
    const std::string label =
        std::to_string(sh.m) + "x" + std::to_string(sh.k) + "x" + std::to_string(sh.n);
    std::optional<RowMatrix> first;
    for (int threads : {1, 2, 3, 4, 7}) {
      RowMatrix c = RowMatrix::Constant(sh.m, sh.n, std::numeric_limits<float>::quiet_NaN());
      oneapi::tbb::task_arena arena(threads);
      arena.execute([&] {
        device_gemm(ConstMatrixMap(a.data(), sh.m, sh.k), ConstMatrixMap(b.data(), sh.k, sh.n),
                    MatrixMap(c.data(), sh.m, sh.n));
      });
      if (!first) {
        EXPECT_TRUE(close(c, naive(a, b), 1e-4 * static_cast<double>(sh.k))) << label;
        first = c;
      } else {
        EXPECT_TRUE(c == *first) << label << ": " << threads << " threads differ from 1";
      }
    }
    const GemmTiling t = gemm_tiling(sh.m, sh.n, sh.k);
    EXPECT_GE(t.row_block, 1) << label;
    EXPECT_LE(t.row_tiles(sh.m) * t.col_tiles(sh.n), 64 * 2) << label << ": tiles stay few";
  }
  // Decode: a single row is split along n; prefill-sized products in row and column tiles.
  EXPECT_EQ(gemm_tiling(1, 4096, 1024).row_block, 1);
  EXPECT_EQ(gemm_tiling(1, 4096, 1024).col_block, 64)
      << "strips (device_gemm takes them under 1 MiB)";
  EXPECT_EQ(skinny_k_block(4096, 1024), 64)
      << "1 MiB and more in blocks of a sixteenth, at most 1 MiB";
  EXPECT_EQ(skinny_k_block(1024, 4096), 256);
  EXPECT_EQ(skinny_k_block(1024, 1024), 64) << "4 MiB: 16 blocks of 256 KiB";
  EXPECT_EQ(skinny_k_block(1024, 1024, DType::kBF16), 64) << "the same rows for 16-bit weights";
  EXPECT_EQ(skinny_k_block(256, 256), 64) << "at least 64 KiB a block";
  EXPECT_EQ(gemm_tiling(512, 4096, 1024).col_block, 256) << "column strips first";
  EXPECT_EQ(gemm_tiling(512, 4096, 1024).row_block, 256) << "then row blocks, for 64 tiles";
  EXPECT_EQ(gemm_tiling(512, 512, 512).row_tiles(512) * gemm_tiling(512, 512, 512).col_tiles(512),
            4)
      << "16 tiles wanted, but no strip narrower than 256 nor block shorter than 256 rows";
  EXPECT_EQ(gemm_tiling(8, 8, 8).col_block, 8) << "small products are one tile";
  // The block formats' int8 tiles go down to 64 rows (whole groups of 16) by 32 outputs: a
  // 256-token prefill of a 768-output projection is 32 tiles where OpenBLAS's floor makes 3
  // (on two threads, one idle for a third of the product).
  constexpr TileFloor kInt8{64, 32, 16};
  EXPECT_EQ(gemm_tiling(256, 768, 768).col_tiles(768), 3);
  EXPECT_EQ(gemm_tiling(256, 768, 768).row_tiles(256), 1);
  EXPECT_EQ(gemm_tiling(256, 768, 768, kInt8).col_block, 48) << "18 tiles wanted: 16 strips";
  EXPECT_EQ(gemm_tiling(256, 768, 768, kInt8).row_block, 128) << "then 2 row blocks";
  EXPECT_EQ(gemm_tiling(300, 768, 3072, kInt8).col_block, 32);
  EXPECT_EQ(gemm_tiling(300, 768, 3072, kInt8).row_block, 112)
      << "64 tiles wanted: 24 strips, 3 row blocks of 100 rows rounded up to whole groups of 16";
  // Strips of whole pairs of 16-output panels (col_multiple 32, the floor the block formats
  // use): the 43 columns a strip of 18 would take round up to 64, 12 strips, then 2 row blocks.
  constexpr TileFloor kInt8Pairs{64, 32, 16, 32};
  EXPECT_EQ(gemm_tiling(256, 768, 768, kInt8Pairs).col_block, 64);
  EXPECT_EQ(gemm_tiling(256, 768, 768, kInt8Pairs).row_block, 128);
  EXPECT_EQ(gemm_tiling(256, 192, 768, kInt8Pairs).col_block % 32, 0);
}

// bf16 compute (MatmulPrecision::kBF16) on fp32 weights, in-out and out-in, and on a weight
// gradient's transposed product: bitwise the same in arenas of 1, 2 and 7 threads, and the
// product of the bf16-rounded operands (within fp32 accumulation of k terms, not fp32's own).
TEST(GemmTest, BfloatComputeIsBitwiseTheSameForAnyThreadCount) {
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (const Eigen::Index m : {Eigen::Index{5}, Eigen::Index{300}}) {
    const Eigen::Index k = 100, n = 700;  // m = 300: three tiles
    const RowMatrix a = pattern(m, k, 0.3f), b = pattern(k, n, 1.1f);
    const RowMatrix b_out_in = b.transpose();
    const Eigen::MatrixXd want = naive(rounded_to(a, DType::kBF16), rounded_to(b, DType::kBF16));
    const Eigen::MatrixXd unrounded = naive(a, b);
    for (const int kind : {0, 1, 2}) {  // in-out weights, out-in weights, a^T b
      const std::string label = "m" + std::to_string(m) + " kind " + std::to_string(kind);
      std::optional<RowMatrix> first;
      for (int threads : {1, 2, 7}) {
        RowMatrix c = RowMatrix::Constant(m, n, std::numeric_limits<float>::quiet_NaN());
        oneapi::tbb::task_arena arena(threads);
        arena.execute([&] {
          if (kind == 0) {
            device_gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n),
                        MatrixMap(c.data(), m, n), MatmulPrecision::kBF16);
          } else if (kind == 1) {
            device_gemm(ConstMatrixMap(a.data(), m, k),
                        WeightMatrix{b_out_in.data(), DType::kF32, k, n, WeightLayout::kOutIn},
                        MatrixMap(c.data(), m, n), MatmulPrecision::kBF16);
          } else {
            const RowMatrix at = a.transpose();  // [k, m]: c = at^T b
            device_gemm_transposed_a(ConstMatrixMap(at.data(), k, m),
                                     ConstMatrixMap(b.data(), k, n), MatrixMap(c.data(), m, n),
                                     0.0f, MatmulPrecision::kBF16);
          }
        });
        if (!first) {
          EXPECT_TRUE(close(c, want, 1e-5 * static_cast<double>(k))) << label;
          EXPECT_FALSE(close(c, unrounded, 1e-5 * static_cast<double>(k)))
              << label << ": nothing was rounded";
          first = c;
        } else {
          EXPECT_TRUE(c == *first) << label << ": " << threads << " threads differ from 1";
        }
      }
    }
  }
  RowMatrix c(2, 2);
  const RowMatrix a = pattern(2, 2, 0.1f);
  EXPECT_THAT(
      [&] {
        device_gemm_transposed_a(ConstMatrixMap(a.data(), 2, 2), ConstMatrixMap(a.data(), 2, 2),
                                 MatrixMap(c.data(), 2, 2), 0.5f, MatmulPrecision::kBF16);
      },
      ThrowsMessage<ValueError>(HasSubstr("beta 0.5 with bf16 compute")));
}

// The decode path with 16-bit weights: blocks of whole rows, partials summed in order; bitwise the
// same in arenas of 1, 2, 3, 4 and 7 threads, and the product of the weights as stored.
TEST(GemmTest, DecodeGemmOnSixteenBitWeightsIsTheSameForAnyThreadCount) {
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  const Eigen::Index m = 3, k = 2048, n = 1024;
  const RowMatrix a = pattern(m, k, 0.3f), w = pattern(k, n, 0.8f);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(k * n));
    RowMatrix stored(k, n);
    for (Eigen::Index i = 0; i < w.size(); ++i) {
      bits[static_cast<std::size_t>(i)] =
          t == DType::kBF16 ? bf16_from_f32(w.data()[i]) : f16_from_f32(w.data()[i]);
      stored.data()[i] = t == DType::kBF16 ? f32_from_bf16(bits[static_cast<std::size_t>(i)])
                                           : f32_from_f16(bits[static_cast<std::size_t>(i)]);
    }
    EXPECT_GT(k / skinny_k_block(n, k, t), 1) << "several blocks";
    std::optional<RowMatrix> first;
    for (int threads : {1, 2, 3, 4, 7}) {
      RowMatrix c = RowMatrix::Constant(m, n, std::numeric_limits<float>::quiet_NaN());
      oneapi::tbb::task_arena arena(threads);
      arena.execute([&] {
        device_decode_gemm(ConstMatrixMap(a.data(), m, k), WeightMatrix{bits.data(), t, k, n},
                           MatrixMap(c.data(), m, n));
      });
      if (!first) {
        EXPECT_TRUE(close(c, naive(a, stored), 1e-4 * static_cast<double>(k))) << to_string(t);
        first = c;
      } else {
        EXPECT_TRUE(c == *first) << to_string(t) << ": " << threads << " threads differ from 1";
      }
    }
  }
}

// device_gemm(a, w) in arenas of 1, 2, 3, 4 and 7 threads: within `bound` of the float64 product
// of a and `stored` (w's values), and bitwise the same in every arena.
void expect_the_product_for_any_thread_count(const RowMatrix& a, const WeightMatrix& w,
                                             const RowMatrix& stored, double bound,
                                             const std::string& label) {
  std::optional<RowMatrix> first;
  for (int threads : {1, 2, 3, 4, 7}) {
    RowMatrix c = RowMatrix::Constant(a.rows(), w.cols, std::numeric_limits<float>::quiet_NaN());
    oneapi::tbb::task_arena arena(threads);
    arena.execute([&] {
      device_gemm(ConstMatrixMap(a.data(), a.rows(), a.cols()), w,
                  MatrixMap(c.data(), c.rows(), c.cols()));
    });
    if (!first) {
      EXPECT_TRUE(close(c, naive(a, stored), bound)) << label;
      first = c;
    } else {
      EXPECT_TRUE(c == *first) << label << ": " << threads << " threads differ from 1";
    }
  }
}

// device_gemm on bf16 / f16 weights (WeightMatrix): the same tiling as fp32, so the same bits in
// arenas of 1, 2, 3, 4 and 7 threads, over shapes of one tile, decode strips, decode row blocks
// and prefill tiles that do and do not divide the blocking, with activations of one row block
// and of several; and the product of the weights as
// stored. bf16 weights multiply bf16-rounded activations on every path (gemm.hpp), so each
// product may be off by 2^-9 of |a| |w| <= 2^-9 (the pattern is within [-1, 1]) and the bound
// grows by k 2^-9.
TEST(GemmTest, DeviceGemmOnSixteenBitWeightsIsBitwiseTheSameForAnyThreadCount) {
  struct Shape {
    Eigen::Index m, k, n;
  };
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (DType t : {DType::kBF16, DType::kF16}) {
    // One tile; decode strips (under 1 MiB of b as fp32, 16 columns and not); decode row blocks
    // (1 MiB and more); prefill tiles.
    for (const Shape sh :
         {Shape{4, 8, 8}, Shape{4, 256, 512}, Shape{16, 96, 2050}, Shape{1, 128, 4096},
          Shape{7, 300, 1000}, Shape{130, 48, 777}, Shape{260, 40, 300}, Shape{3, 2048, 2048},
          // Activations of several 16 Ki-element row blocks, rounded to bf16 by
          // several threads (a 128-token bf16 prefill crashed there once: the
          // workers wrote to buffers of their own instead of the caller's).
          Shape{64, 1024, 256}, Shape{200, 768, 64}}) {
      const RowMatrix a = pattern(sh.m, sh.k, 0.4f), w = pattern(sh.k, sh.n, 1.9f);
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(w.size()));
      RowMatrix stored(sh.k, sh.n);
      for (Eigen::Index i = 0; i < w.size(); ++i) {
        const auto at = static_cast<std::size_t>(i);
        bits[at] = t == DType::kBF16 ? bf16_from_f32(w.data()[i]) : f16_from_f32(w.data()[i]);
        stored.data()[i] = t == DType::kBF16 ? f32_from_bf16(bits[at]) : f32_from_f16(bits[at]);
      }
      const std::string label = std::string(to_string(t)) + " " + std::to_string(sh.m) + "x" +
                                std::to_string(sh.k) + "x" + std::to_string(sh.n);
      const bool rounds_a = t == DType::kBF16;
      const double bound =
          (1e-4 + (rounds_a ? std::ldexp(1.0, -9) : 0.0)) * static_cast<double>(sh.k);
      expect_the_product_for_any_thread_count(a, WeightMatrix{bits.data(), t, sh.k, sh.n}, stored,
                                              bound, label);
    }
  }
  const std::vector<std::uint16_t> bits(12, 0);
  const RowMatrix a = RowMatrix::Zero(2, 3);
  RowMatrix c(2, 4);
  EXPECT_THAT(
      [&] {
        device_gemm(ConstMatrixMap(a.data(), 2, 3), WeightMatrix{bits.data(), DType::kBF16, 4, 3},
                    MatrixMap(c.data(), 2, 4));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("gemm: a is [2, 3], b is [4, 3] (bf16), c is [2, 4]: they do not multiply")));
}

// device_gemm on weights stored out-in, every dtype: decode products (dot_gemm over blocks of
// outputs, one and several blocks) and prefill tiles read transposed give the product of the
// weights as stored (bound as above), the same bits in arenas of 1, 2, 3, 4 and 7 threads.
TEST(GemmTest, DeviceGemmOnOutInWeightsIsTheProductForAnyThreadCount) {
  struct Shape {
    Eigen::Index m, k, n;
  };
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape sh :
         {Shape{1, 8, 8}, Shape{3, 1000, 70}, Shape{1, 1024, 4096}, Shape{16, 300, 257},
          Shape{17, 64, 100}, Shape{130, 48, 777}, Shape{260, 300, 40}}) {
      const RowMatrix a = pattern(sh.m, sh.k, 0.4f), w = pattern(sh.k, sh.n, 1.9f);
      const RowMatrix stored = rounded_to(w, t);
      std::vector<float> f32(static_cast<std::size_t>(w.size()));
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(w.size()));
      for (Eigen::Index r = 0; r < sh.k; ++r) {
        for (Eigen::Index j = 0; j < sh.n; ++j) {
          const auto at = static_cast<std::size_t>(j * sh.k + r);
          f32[at] = stored(r, j);
          bits[at] = t == DType::kBF16 ? bf16_from_f32(stored(r, j)) : f16_from_f32(stored(r, j));
        }
      }
      const void* data = t == DType::kF32 ? static_cast<const void*>(f32.data()) : bits.data();
      const std::string label = std::string(to_string(t)) + " " + std::to_string(sh.m) + "x" +
                                std::to_string(sh.k) + "x" + std::to_string(sh.n);
      const double bound =
          (1e-4 + (t == DType::kBF16 ? std::ldexp(1.0, -9) : 0.0)) * static_cast<double>(sh.k);
      expect_the_product_for_any_thread_count(
          a, WeightMatrix{data, t, sh.k, sh.n, WeightLayout::kOutIn}, stored, bound, label);
    }
  }
  EXPECT_EQ(dot_out_block(4096, 1024, DType::kBF16), 256) << "8 MiB: blocks of 512 KiB";
  EXPECT_EQ(dot_out_block(100, 64), 100) << "under 64 KiB: one block";
  EXPECT_EQ(dot_out_block(std::int64_t{1} << 25, 1), std::int64_t{1} << 19) << "at most 64 blocks";
}

// `a`'s rows quantized as the block formats' kernels quantize activations, from the definition
// (block_gemm.hpp): per 32 values d = max|x| / 127, codes to nearest even, value = code * d.
RowMatrix quantized_activations(const RowMatrix& a) {
  RowMatrix q = a;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index b = 0; b < a.cols(); b += 32) {
      float amax = 0.0f;
      for (Eigen::Index e = b; e < b + 32; ++e) amax = std::max(amax, std::fabs(a(i, e)));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      for (Eigen::Index e = b; e < b + 32; ++e) q(i, e) = std::nearbyint(a(i, e) * id) * d;
    }
  }
  return q;
}

// device_gemm on GGML block formats (q8_0, q4_0, q4_k, q6_k; stored out-in, blocks along each
// output's inputs): decode products (the integer dot kernels over blocks of outputs) and prefill
// tiles (int8 products on packed panels) give the product of the quantized activations and the
// dequantized weights, the same bits in arenas of 1, 2, 3, 4 and 7 threads; a tail of 4 rows after
// 256 takes the dot kernel inside the prefill tiling.
TEST(GemmTest, DeviceGemmOnBlockFormatsIsTheProductForAnyThreadCount) {
  struct Shape {
    Eigen::Index m, k, n;
  };
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  const std::vector<Shape> blocks_of_32{
      Shape{1, 32, 8},    Shape{3, 1024, 70},  Shape{1, 1024, 4096}, Shape{16, 320, 257},
      Shape{17, 64, 100}, Shape{130, 96, 777}, Shape{260, 320, 40}};
  // The K formats' super-blocks of 256: k whole super-blocks, the same m and n.
  const std::vector<Shape> blocks_of_256{
      Shape{1, 256, 8},    Shape{3, 1024, 70},   Shape{1, 1024, 4096}, Shape{16, 512, 257},
      Shape{17, 256, 100}, Shape{130, 256, 777}, Shape{260, 512, 40}};
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kIQ4_NL, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K}) {
    for (const Shape sh : traits(t).block_elements == 256 ? blocks_of_256 : blocks_of_32) {
      const RowMatrix a = pattern(sh.m, sh.k, 0.4f), w = pattern(sh.k, sh.n, 1.9f);
      // Stored out-in: output j's k inputs, quantized as one row.
      RowMatrix out_in = w.transpose();
      std::vector<std::byte> blocks(static_cast<std::size_t>(sh.n * row_bytes(t, sh.k)));
      runtime::convert_elements(out_in.data(), DType::kF32, blocks.data(), t,
                                static_cast<std::size_t>(out_in.size()));
      RowMatrix stored(sh.k, sh.n);
      for (Eigen::Index j = 0; j < sh.n; ++j) {
        for (Eigen::Index r = 0; r < sh.k; ++r)
          stored(r, j) = widened_element(blocks.data(), t, j * sh.k + r);
      }
      const std::string label = std::string(to_string(t)) + " " + std::to_string(sh.m) + "x" +
                                std::to_string(sh.k) + "x" + std::to_string(sh.n);
      const WeightMatrix b{blocks.data(), t, sh.k, sh.n, WeightLayout::kOutIn};
      const Eigen::MatrixXd want = naive(quantized_activations(a), stored);
      std::optional<RowMatrix> first;
      for (int threads : {1, 2, 3, 4, 7}) {
        RowMatrix c = RowMatrix::Constant(sh.m, sh.n, std::numeric_limits<float>::quiet_NaN());
        oneapi::tbb::task_arena arena(threads);
        arena.execute([&] {
          device_gemm(ConstMatrixMap(a.data(), sh.m, sh.k), b, MatrixMap(c.data(), sh.m, sh.n));
        });
        if (!first) {
          // fp32 sums of k products of values within [-1, 1].
          EXPECT_TRUE(close(c, want, 1e-4 * static_cast<double>(sh.k))) << label;
          first = c;
        } else {
          EXPECT_TRUE(c == *first) << label << ": " << threads << " threads differ from 1";
        }
      }
    }
  }
}

// Prefill of block-format weights is packed_gemm_q8 on the activations quantized as for decode:
// where every row tile of gemm_tiling holds more than 16 rows (as in these shapes: 17 rows in one
// tile, 300 as 256 + 44, 520 as 260 + 260), device_gemm's tiles give, bit for bit, one call of it
// over the whole product (its order does not depend on the tile's rows and outputs), at this
// machine's level, in arenas of 1 to 3 threads. (A tail tile of 16 rows or fewer takes the decode
// kernel: DeviceGemmOnBlockFormatsIsTheProductForAnyThreadCount.)
TEST(GemmTest, BlockPrefillIsThePackedInt8Product) {
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            4);
  struct Shape {
    Eigen::Index m, k, n;
  };
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kIQ4_NL, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K}) {
    for (const Shape sh : {Shape{17, 256, 40}, Shape{300, 512, 600}, Shape{520, 256, 300}}) {
      const RowMatrix a = pattern(sh.m, sh.k, 0.4f), w = pattern(sh.n, sh.k, 1.9f);  // out-in
      std::vector<std::byte> blocks(static_cast<std::size_t>(sh.n * row_bytes(t, sh.k)));
      runtime::convert_elements(w.data(), DType::kF32, blocks.data(), t,
                                static_cast<std::size_t>(w.size()));
      const WeightMatrix b{blocks.data(), t, sh.k, sh.n, WeightLayout::kOutIn};
      std::vector<std::int8_t> codes(static_cast<std::size_t>(sh.m * sh.k));
      std::vector<float> scales(static_cast<std::size_t>(sh.m * sh.k / 32));
      quantize_activations_q8(sh.m, sh.k, a.data(), sh.k, codes.data(), scales.data());
      RowMatrix want(sh.m, sh.n);
      packed_gemm_q8(sh.m, codes.data(), scales.data(), b, want.data(), sh.n);
      const std::string label = std::string(to_string(t)) + " " + std::to_string(sh.m) + "x" +
                                std::to_string(sh.k) + "x" + std::to_string(sh.n);
      for (int threads : {1, 2, 3}) {
        RowMatrix c = RowMatrix::Constant(sh.m, sh.n, std::numeric_limits<float>::quiet_NaN());
        oneapi::tbb::task_arena arena(threads);
        arena.execute([&] {
          device_gemm(ConstMatrixMap(a.data(), sh.m, sh.k), b, MatrixMap(c.data(), sh.m, sh.n));
        });
        EXPECT_TRUE(c == want) << label << " on " << threads << " threads";
      }
    }
  }
}

// Block formats are stored out-in only and take inputs in whole blocks: the refusals name both.
TEST(GemmTest, BlockFormatsRefuseInOutWeightsAndPartialBlocks) {
  std::vector<std::byte> blocks(static_cast<std::size_t>(4 * row_bytes(DType::kQ8_0, 64)));
  const RowMatrix a = pattern(2, 64, 0.1f);
  RowMatrix c(2, 4);
  EXPECT_THAT(
      [&] {
        device_gemm(ConstMatrixMap(a.data(), 2, 64),
                    WeightMatrix{blocks.data(), DType::kQ8_0, 64, 4, WeightLayout::kInOut},
                    MatrixMap(c.data(), 2, 4));
      },
      ThrowsMessage<TypeError>(HasSubstr("q8_0 weights are stored out-in only, not in-out")));
  const RowMatrix a48 = pattern(2, 48, 0.1f);
  EXPECT_THAT(
      [&] {
        device_gemm(ConstMatrixMap(a48.data(), 2, 48),
                    WeightMatrix{blocks.data(), DType::kQ4_0, 48, 4, WeightLayout::kOutIn},
                    MatrixMap(c.data(), 2, 4));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("q4_0 weights take inputs in whole blocks of 32, not 48")));
  // No inputs: zeros, for decode and prefill shapes alike.
  for (Eigen::Index m : {2, 20}) {
    const RowMatrix empty(m, 0);
    RowMatrix z = RowMatrix::Constant(m, 4, 5.0f);
    device_gemm(ConstMatrixMap(empty.data(), m, 0),
                WeightMatrix{blocks.data(), DType::kQ8_0, 0, 4, WeightLayout::kOutIn},
                MatrixMap(z.data(), m, 4));
    EXPECT_EQ(z, RowMatrix::Zero(m, 4)) << m << " rows";
  }
}

// `w` as stored in `dtype`: itself for f32, else its values rounded to bf16 or f16 (the bits in
// `sixteen`, which must outlive the matrix).
WeightMatrix stored_weights(const std::vector<float>& w, DType dtype, std::int64_t k,
                            std::int64_t n, WeightLayout layout,
                            std::vector<std::uint16_t>& sixteen) {
  if (dtype == DType::kF32) return WeightMatrix{w.data(), dtype, k, n, layout};
  sixteen.resize(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    sixteen[i] = dtype == DType::kBF16 ? bf16_from_f32(w[i]) : f16_from_f32(w[i]);
  }
  return WeightMatrix{sixteen.data(), dtype, k, n, layout};
}

// Each row `rows` of the product of a [m, b.rows] and b in `precision` has the bits that row
// gets alone; the first that does not fails the test, named with `label`.
void expect_rows_as_alone(const std::vector<float>& a, std::int64_t m, const WeightMatrix& b,
                          MatmulPrecision precision, const std::vector<std::int64_t>& rows,
                          const std::string& label) {
  const std::int64_t k = b.rows, n = b.cols;
  std::vector<float> c(static_cast<std::size_t>(m * n));
  device_gemm(ConstMatrixMap(a.data(), m, k), b, MatrixMap(c.data(), m, n), precision);
  for (const std::int64_t r : rows) {
    std::vector<float> alone(static_cast<std::size_t>(n));
    device_gemm(ConstMatrixMap(a.data() + r * k, 1, k), b, MatrixMap(alone.data(), 1, n),
                precision);
    ASSERT_EQ(std::vector<float>(c.begin() + r * n, c.begin() + (r + 1) * n), alone)
        << label << ", row " << r << " of " << m;
  }
}

// kRowInvariant: each row of a product has the same bits alone as among 4, 16, 17 or 40 rows,
// for every weight dtype and layout, on shapes that take the one-tile, tiled and k-split decode
// paths (whichever kernel level this process runs: scripts/test.sh runs ops_test at each). A
// serving engine's steps rest on it: a token's numbers must not depend on its batch.
TEST(GemmTest, RowInvariantProductsGiveEachRowTheBitsItGetsAlone) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    std::int64_t k, n;
  };
  for (const Shape shape : {Shape{24, 20}, Shape{96, 200}, Shape{600, 512}}) {
    const std::int64_t k = shape.k, n = shape.n;
    std::vector<float> w(static_cast<std::size_t>(k * n));
    for (float& x : w) x = normal(rng);
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
        std::vector<std::uint16_t> sixteen;
        const WeightMatrix b = stored_weights(w, dtype, k, n, layout, sixteen);
        for (const std::int64_t m : {4, 16, 17, 40, 100}) {
          std::vector<float> a(static_cast<std::size_t>(m * k));
          for (float& x : a) x = normal(rng);
          std::vector<std::int64_t> rows(static_cast<std::size_t>(m));
          for (std::int64_t r = 0; r < m; ++r) rows[static_cast<std::size_t>(r)] = r;
          expect_rows_as_alone(
              a, m, b, MatmulPrecision::kRowInvariant, rows,
              fmt::format("{} {} [{}, {}]", to_string(dtype),
                          layout == WeightLayout::kOutIn ? "out-in" : "in-out", k, n));
        }
      }
    }
  }
}

// A row-invariant product of 1000 rows by 200 outputs has fewer output blocks (8) than its work
// wants tasks (14), so device_gemm cuts its rows into groups of 16 as well: each row keeps the
// bits it gets alone, on either side of the cut (rows 0 .. 511 and 512 .. 999).
TEST(GemmTest, RowInvariantProductsOfManyRowsCutTheirRowsAndKeepEachRowsBits) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t m = 1000, k = 600, n = 200;
  std::vector<float> w(static_cast<std::size_t>(k * n)), a(static_cast<std::size_t>(m * k));
  for (float& x : w) x = normal(rng);
  for (float& x : a) x = normal(rng);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> sixteen;
    const WeightMatrix b = stored_weights(w, dtype, k, n, WeightLayout::kOutIn, sixteen);
    expect_rows_as_alone(a, m, b, MatmulPrecision::kRowInvariant,
                         {0, 1, 37, 255, 511, 512, 700, 999}, std::string(to_string(dtype)));
  }
}

// At the amx level bf16 weights stored out-in take the tile products (dot_gemm_bf16) for every
// row count, prefill included (WeightKernels::dot_outruns_tiles_from): a 40- or 300-row product
// in the default precision then gives each row the bits it gets alone, which the prefill tiles
// (gemm_16bit's fmas) would not.
TEST(GemmTest, Bf16PrefillAtTheAmxLevelTakesTheTileProducts) {
  if (runtime::kernel_level() != runtime::KernelLevel::kAmx) {
    GTEST_SKIP() << "kernel level amx (running at " << runtime::to_string(runtime::kernel_level())
                 << ")";
  }
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t k = 600, n = 200;
  std::vector<float> w(static_cast<std::size_t>(k * n));
  for (float& x : w) x = normal(rng);
  std::vector<std::uint16_t> sixteen;
  const WeightMatrix b = stored_weights(w, DType::kBF16, k, n, WeightLayout::kOutIn, sixteen);
  for (const std::int64_t m : {40, 300}) {
    std::vector<float> a(static_cast<std::size_t>(m * k));
    for (float& x : a) x = normal(rng);
    std::vector<std::int64_t> rows;
    for (std::int64_t r = 0; r < m; r += 7) rows.push_back(r);
    expect_rows_as_alone(a, m, b, MatmulPrecision::kF32, rows, "bf16 prefill");
  }
}

// `w` ([n, k] out-in, row after row) stored in `dtype` (as runtime::convert_elements rounds or
// quantizes it), in panels (runtime/weight_panels.hpp) when `panels`; the bytes in `storage`.
WeightMatrix out_in_weights(const std::vector<float>& w, DType dtype, std::int64_t k,
                            std::int64_t n, bool panels, std::vector<std::byte>& storage) {
  const auto bytes = static_cast<std::size_t>(n * row_bytes(dtype, k));
  storage.assign(bytes, std::byte{0});
  runtime::convert_elements(w.data(), DType::kF32, storage.data(), dtype, w.size());
  if (!panels) return WeightMatrix{storage.data(), dtype, k, n, WeightLayout::kOutIn};
  std::vector<std::byte> rows = storage;
  runtime::rows_to_panels(dtype, n, k, rows, storage);
  return WeightMatrix{storage.data(),           dtype, k, n, WeightLayout::kOutIn, k,
                      runtime::panel_outputs(n)};
}

// device_gemms gives each product the bits device_gemm gives it alone: products of one format
// (a layer's q, k and v: one block of outputs and several, panels whole and with a tail), decode
// rows and prefill rows (which device_gemm runs product by product), in the default and the
// row-invariant precision, in arenas of 1, 2 and 3 threads; and a mix of formats.
TEST(GemmTest, SharedInputProductsAreEachTheBitsOfDeviceGemm) {
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            4);
  std::mt19937 rng(33);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t k = 512;
  const std::vector<std::int64_t> outputs{1000, 136, 136};  // q, k and v
  std::vector<std::vector<float>> w;
  for (const std::int64_t n : outputs) {
    w.emplace_back(static_cast<std::size_t>(n * k));
    for (float& x : w.back()) x = normal(rng);
  }
  struct Case {
    std::vector<DType> dtypes;
    bool panels;
  };
  std::vector<Case> cases;
  for (const DTypeTraits& f : kDTypes) {
    const DType t = f.dtype;
    cases.push_back({{t, t, t}, false});
  }
  cases.push_back({{DType::kQ8_0, DType::kQ8_0, DType::kQ8_0}, true});
  cases.push_back({{DType::kQ4_0, DType::kQ4_0, DType::kQ4_0}, true});
  cases.push_back({{DType::kBF16, DType::kQ8_0, DType::kF32}, false});  // a mix: one at a time
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> storage(outputs.size());
    std::vector<WeightMatrix> b;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      b.push_back(out_in_weights(w[i], c.dtypes[i], k, outputs[i], c.panels, storage[i]));
    }
    for (const std::int64_t m : {1, 5, 40}) {
      std::vector<float> a(static_cast<std::size_t>(m * k));
      for (float& x : a) x = normal(rng);
      const ConstMatrixMap am(a.data(), m, k);
      for (const MatmulPrecision precision :
           {MatmulPrecision::kF32, MatmulPrecision::kRowInvariant}) {
        const std::string label =
            fmt::format("{}{}, {} rows, precision {}", to_string(c.dtypes[0]),
                        c.panels ? " in panels" : "", m, static_cast<int>(precision));
        std::vector<RowMatrix> alone;
        for (std::size_t i = 0; i < b.size(); ++i) {
          alone.emplace_back(m, outputs[i]);
          device_gemm(am, b[i], MatrixMap(alone[i].data(), m, outputs[i]), precision);
        }
        for (int threads : {1, 2, 3}) {
          std::vector<RowMatrix> together;
          std::vector<SharedInputProduct> products;
          for (std::size_t i = 0; i < b.size(); ++i) {
            together.push_back(
                RowMatrix::Constant(m, outputs[i], std::numeric_limits<float>::quiet_NaN()));
            products.push_back({b[i], MatrixMap(together[i].data(), m, outputs[i])});
          }
          oneapi::tbb::task_arena arena(threads);
          arena.execute([&] { device_gemms(am, products, precision); });
          for (std::size_t i = 0; i < b.size(); ++i) {
            EXPECT_TRUE(together[i] == alone[i])
                << label << ", product " << i << ", " << threads << " threads";
          }
        }
      }
    }
  }
}

// device_gemms checks every product's shapes before it computes any: the first that does not
// multiply is named, and the products before it are left as they were.
TEST(GemmTest, SharedInputProductsThatDoNotMultiplyAreRefusedBeforeAnyIsComputed) {
  const std::vector<float> a(2 * 64, 1.0f), w(64 * 8, 1.0f);
  RowMatrix c0 = RowMatrix::Constant(2, 8, 7.0f), c1(2, 5);
  const WeightMatrix b{w.data(), DType::kF32, 64, 8, WeightLayout::kOutIn};
  const std::vector<SharedInputProduct> products{{b, MatrixMap(c0.data(), 2, 8)},
                                                 {b, MatrixMap(c1.data(), 2, 5)}};
  EXPECT_THAT([&] { device_gemms(ConstMatrixMap(a.data(), 2, 64), products); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "gemm: a is [2, 64], b is [64, 8] (f32), c is [2, 5]: they do not multiply")));
  EXPECT_EQ(c0, RowMatrix::Constant(2, 8, 7.0f));
}

TEST(GemmTest, EmptyProductsAreNoOpsOrZeros) {
  // No rows: nothing to do, on the decode-sized and the small path alike.
  const RowMatrix none(0, 1024), w = pattern(1024, 1024, 0.1f);
  RowMatrix c0(0, 1024);
  device_gemm(ConstMatrixMap(none.data(), 0, 1024), ConstMatrixMap(w.data(), 1024, 1024),
              MatrixMap(c0.data(), 0, 1024));
  // No reduction: the decode path writes zeros.
  const RowMatrix a(2, 0);
  RowMatrix c = RowMatrix::Constant(2, 8, 5.0f);
  device_decode_gemm(ConstMatrixMap(a.data(), 2, 0), WeightMatrix{w.data(), DType::kF32, 0, 8},
                     MatrixMap(c.data(), 2, 8));
  EXPECT_EQ(c, RowMatrix::Zero(2, 8));
}

TEST(GemmTest, StridedOperandsMultiplyBlocksInPlace) {
  // c[:, 2:5] = a[1:4, 3:9] * b[3:9, 1:4] through leading dimensions, for both paths.
  for (Eigen::Index scale : {1, 8}) {
    const Eigen::Index m = 3 * scale, k = 6 * scale, n = 3 * scale;
    const RowMatrix a = pattern(m + 2, k + 5, 0.1f), b = pattern(k + 4, n + 3, 0.2f);
    RowMatrix c = RowMatrix::Zero(m, n + 4);
    gemm(m, n, k, 1.0f, a.data() + 1 * a.cols() + 3, a.cols(), b.data() + 3 * b.cols() + 1,
         b.cols(),
         /*transpose_b=*/false, 0.0f, c.data() + 2, c.cols());
    const RowMatrix want = a.block(1, 3, m, k) * b.block(3, 1, k, n);
    EXPECT_TRUE(close(c.block(0, 2, m, n), want.cast<double>(), 1e-4 * static_cast<double>(k)))
        << "scale " << scale;
    EXPECT_EQ(c.block(0, 0, m, 2), RowMatrix::Zero(m, 2)) << "columns outside the block untouched";
  }
}

// A weight matrix's views of outputs and inputs address their stored rows and columns in bytes of
// the format, for either layout, and keep the stride of the whole.
TEST(GemmTest, WeightMatrixViewsAddressTheirRowsAndColumns) {
  const std::vector<std::uint16_t> storage(4 * 6);
  const auto* base = reinterpret_cast<const char*>(storage.data());
  auto offset = [base](const WeightMatrix& w) { return static_cast<const char*>(w.data) - base; };
  const WeightMatrix in_out{storage.data(), DType::kBF16, 4, 6};  // [k 4, n 6], rows of 6
  EXPECT_EQ(in_out.stride(), 6);
  const WeightMatrix cols = in_out.outputs(2, 3), rows = in_out.inputs(1, 2);
  EXPECT_EQ(offset(cols), 2 * 2);
  EXPECT_EQ(cols.cols, 3);
  EXPECT_EQ(cols.stride(), 6);
  EXPECT_EQ(offset(rows), 6 * 2);
  EXPECT_EQ(rows.rows, 2);
  EXPECT_EQ(offset(rows.outputs(2, 3)), 8 * 2) << "a view of a view";
  const WeightMatrix out_in{storage.data(), DType::kBF16, 6, 4,
                            WeightLayout::kOutIn};  // [n 4, k 6]
  EXPECT_EQ(out_in.stride(), 6);
  EXPECT_EQ(offset(out_in.outputs(2, 2)), 2 * 6 * 2);
  EXPECT_EQ(offset(out_in.inputs(1, 3)), 1 * 2);
  EXPECT_EQ(out_in.inputs(1, 3).stride(), 6);
  EXPECT_EQ(out_in.stored_row(3), base + 3 * 6 * 2);
}

// The decode path on in-out weights refuses a b that is not [k, n] in-out, naming the shapes.
TEST(GemmTest, DecodeGemmRefusesWeightsThatDoNotFit) {
  const std::vector<float> a(2 * 4, 1.0f), w(4 * 3, 1.0f);
  std::vector<float> c(2 * 3);
  EXPECT_THAT(
      [&] {
        device_decode_gemm(ConstMatrixMap(a.data(), 2, 4),
                           WeightMatrix{w.data(), DType::kF32, 4, 3, WeightLayout::kOutIn},
                           MatrixMap(c.data(), 2, 3));
      },
      ThrowsMessage<ShapeError>(HasSubstr("b must be [4, 3] stored in-out, not [4, 3] (out-in)")));
}

TEST(GemmTest, MismatchedShapesNameAllThree) {
  RowMatrix a(2, 3), b(4, 5), c(2, 5);
  EXPECT_THAT(
      [&] {
        gemm(ConstMatrixMap(a.data(), 2, 3), ConstMatrixMap(b.data(), 4, 5),
             MatrixMap(c.data(), 2, 5));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("gemm: a is [2, 3], b is [4, 5], c is [2, 5]: they do not multiply")));
}

}  // namespace
}  // namespace numesh::ops
