#include "numesh/ops/kernels/gemm_16bit.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "flush_denormals.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/blas_gemm.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::ops {

namespace {

using runtime::convert_bf16_to_f32;
using runtime::convert_f16_to_f32;
using runtime::convert_f32_to_bf16;
using runtime::KernelLevel;

// ---- Widened panels and OpenBLAS ----------------------------------------------------------------

// Panels of b widened to fp32: at most kWidenRows rows by kWidenCols columns (4 MiB of fp32 at
// most, the calling thread's buffer, kept between calls), each handed to OpenBLAS with beta = 1
// after the first. Long rows suit OpenBLAS's own blocking: f16 ran at 0.95-0.98 of the fp32
// gemm() on [512, 1024] x [1024, 4096] with 256 x 4096 panels, 0.92-0.93 with 1024 x 1024 and
// 0.92-0.94 with 512 x 512 (a throwaway program, alternated runs); on a 256-column strip all
// were 0.94-1.0. The widening is one pass over b, about 2 % of the GEMM.
constexpr std::int64_t kWidenRows = 256;  // of k
constexpr std::int64_t kWidenCols = 4096;

void gemm_widened(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                  const std::uint16_t* b, DType b_type, std::int64_t ldb, float* c,
                  std::int64_t ldc, KernelLevel level, bool out_in) {
  thread_local std::vector<float> panel;
  const std::int64_t nc_max = std::min(n, kWidenCols), kc_max = std::min(k, kWidenRows);
  const auto need = static_cast<std::size_t>(nc_max * kc_max);
  if (panel.size() < need) panel.resize(need);
  for (std::int64_t j0 = 0; j0 < n; j0 += kWidenCols) {
    const std::int64_t cols = std::min(kWidenCols, n - j0);
    for (std::int64_t r0 = 0; r0 < k; r0 += kWidenRows) {
      const std::int64_t rows = std::min(kWidenRows, k - r0);
      // In-in panels are [rows, cols]; out-in ones [cols, rows], multiplied transposed.
      const std::int64_t runs = out_in ? cols : rows, run = out_in ? rows : cols;
      for (std::int64_t q = 0; q < runs; ++q) {
        const std::uint16_t* from = out_in ? b + (j0 + q) * ldb + r0 : b + (r0 + q) * ldb + j0;
        const std::span<const std::uint16_t> src(from, static_cast<std::size_t>(run));
        const std::span<float> dst(panel.data() + q * run, static_cast<std::size_t>(run));
        // (gemm_16bit takes bf16 and f16 weights only.)
        if (b_type == DType::kBF16) {
          convert_bf16_to_f32(src, dst, level);
        } else {
          convert_f16_to_f32(src, dst, level);
        }
      }
      gemm(m, cols, rows, 1.0f, a + r0, lda, panel.data(), run, /*transpose_b=*/out_in,
           r0 == 0 ? 0.0f : 1.0f, c + j0, ldc);
    }
  }
}

// ---- vdpbf16ps
// ------------------------------------------------------------------------------------

// The micro-kernel computes kMr x kNr of c: 24 zmm accumulators, two zmm of b and a broadcast
// pair of a in the 32 registers. Zen 4 issues one 512-bit vdpbf16ps a cycle at a latency of
// about 6, so 24 independent chains keep it busy; each pair step loads two vectors of b and 12
// dwords of a for 24 vdpbf16ps. With its data in L1 it ran at 227 GFLOP/s, the rate of bare
// independent vdpbf16ps chains (225); in the whole GEMM 14 rows were no faster, 10 slower.
constexpr int kMr = 12;
constexpr int kNr = 32;
// Blocking, measured on [512, 1024] x [1024, 4096] and on a 256-column strip of it: a row panel
// of a (kMr x kc in bf16, 6 KiB) stays in L1 while the micro-kernel sweeps it across every strip
// of a packed kc x nc block of b (512 KiB, in L2). Consecutive tiles of c then lie side by side
// in the same 12 rows, 12 sequential streams. Sweeping a strip of b down the rows instead (the
// textbook order) was 10-15 % slower (165-175 GFLOP/s against 185-197), nearly all of it in
// reloading c: its tiles' 12 rows lie 16 KiB apart (ldc = 4096), in one L1 set. kc = 320 or 384, nc
// = 512 to 2048 measured the same within noise; kc = 192 was slower (more passes over c). kc is
// even so that every block but the last holds whole pairs: each element's chain runs over the pairs
// in k order whatever the blocking, because the accumulators start from c's partial sums (see the
// header).
constexpr std::int64_t kKc = 256;
constexpr std::int64_t kNc = 1024;
// Rows of a packed at a time (bounds the buffer; the order above does not depend on it).
constexpr std::int64_t kMc = 16 * kMr;

// The calling thread's packing buffers, kept between calls (no allocation per tile).
struct PackBuffers {
  std::vector<std::uint16_t> a;  // kMc rows of kKc bf16 (whole pairs)
  std::vector<std::uint32_t> b;  // kKc / 2 x kNc pair dwords, as kNr-column strips
  std::vector<float> a_wide;     // a's rows widened for the fma steps (widen_pairs)
};

PackBuffers& pack_buffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

// Packs rows [r0, r0 + rows) and columns [j0, j0 + cols) of b into kNr-column strips of pair
// dwords: strip s holds, for each pair p, 32 dwords (b[r0 + 2p][j], b[r0 + 2p + 1][j]) for its
// columns j, columns past `cols` and the row past an odd `rows` zero.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b(const std::uint16_t* b,
                                                                 std::int64_t ldb, std::int64_t r0,
                                                                 std::int64_t rows, std::int64_t j0,
                                                                 std::int64_t cols,
                                                                 std::uint32_t* out) {
  const std::int64_t pairs = (rows + 1) / 2;
  // vpermt2w indices interleaving two rows of 32 16-bit elements: the low 16 columns of both
  // rows into the first vector, the high 16 into the second.
  alignas(64) std::uint16_t lo_index[32], hi_index[32];
  for (int j = 0; j < 16; ++j) {
    lo_index[2 * j] = static_cast<std::uint16_t>(j);
    lo_index[2 * j + 1] = static_cast<std::uint16_t>(32 + j);
    hi_index[2 * j] = static_cast<std::uint16_t>(16 + j);
    hi_index[2 * j + 1] = static_cast<std::uint16_t>(48 + j);
  }
  const __m512i lo = _mm512_load_si512(lo_index), hi = _mm512_load_si512(hi_index);
  for (std::int64_t s = 0; s < cols; s += kNr) {
    const std::int64_t width = std::min<std::int64_t>(kNr, cols - s);
    const auto mask = static_cast<__mmask32>(width == 32 ? 0xFFFFFFFFu : (1u << width) - 1u);
    std::uint32_t* strip = out + s * pairs;
    for (std::int64_t p = 0; p < pairs; ++p) {
      const std::uint16_t* even = b + (r0 + 2 * p) * ldb + j0 + s;
      const __m512i e = _mm512_maskz_loadu_epi16(mask, even);
      const __m512i o =
          2 * p + 1 < rows ? _mm512_maskz_loadu_epi16(mask, even + ldb) : _mm512_setzero_si512();
      _mm512_storeu_si512(strip + p * kNr, _mm512_permutex2var_epi16(e, lo, o));
      _mm512_storeu_si512(strip + p * kNr + 16, _mm512_permutex2var_epi16(e, hi, o));
    }
  }
}

// pack_b for b stored out-in ([n, k], rows `ldb` apart): the same strips, each pair dword read
// whole from output j's row (its two elements lie side by side there).
void pack_b_out_in(const std::uint16_t* b, std::int64_t ldb, std::int64_t r0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, std::uint32_t* out) {
  const std::int64_t pairs = (rows + 1) / 2;
  for (std::int64_t s = 0; s < cols; s += kNr) {
    const std::int64_t width = std::min<std::int64_t>(kNr, cols - s);
    std::uint32_t* strip = out + s * pairs;
    for (std::int64_t jj = 0; jj < kNr; ++jj) {
      const std::uint16_t* row = b + (j0 + s + jj) * ldb + r0;
      for (std::int64_t p = 0; p < pairs; ++p) {
        std::uint32_t pair = 0;
        if (jj < width) {
          pair = row[2 * p];
          if (2 * p + 1 < rows) pair |= static_cast<std::uint32_t>(row[2 * p + 1]) << 16;
        }
        strip[p * kNr + jj] = pair;
      }
    }
  }
}

// Packs rows [i0, i0 + rows) and columns [k0, k0 + cols) of a, rounded to bf16, row after row,
// each padded with a zero to whole pairs (rows 2 * pairs elements apart; pair p of row r is the
// dword at element 2 (r * pairs + p)). Row-major needs no transposition: one vector conversion
// per row, a third of the time of a [pair][row] layout, which showed at 256 columns of b.
void pack_a(const float* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t k0,
            std::int64_t cols, KernelLevel level, std::uint16_t* out) {
  const std::int64_t pairs = (cols + 1) / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint16_t* row = out + r * 2 * pairs;
    convert_f32_to_bf16(
        std::span<const float>(a + (i0 + r) * lda + k0, static_cast<std::size_t>(cols)),
        std::span<std::uint16_t>(row, static_cast<std::size_t>(cols)), level);
    if (cols % 2 != 0) row[cols] = 0;
  }
}

// c[0 .. MR, 0 .. 32) (columns masked by mask0 / mask1) = (first ? 0 : c) + the pairs of MR rows
// of packed a times a strip of packed b ([pair][32] dwords). Packed a is row-major (pair p of row
// r is the dword r * pairs + p; pack_a) or, with kPairMajor, a panel of kMr rows pair after pair
// (the dword p * kMr + r; pack_a_transposed).
template <int MR, bool kPairMajor>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void micro_dpbf16(
    std::int64_t pairs, const std::uint16_t* a_rows, const std::uint32_t* b_strip, float* c,
    std::int64_t ldc, __mmask16 mask0, __mmask16 mask1, bool first) {
  __m512 acc0[MR], acc1[MR];
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      acc0[r] = _mm512_maskz_loadu_ps(mask0, c + r * ldc);
      acc1[r] = _mm512_maskz_loadu_ps(mask1, c + r * ldc + 16);
    }
  }
  for (std::int64_t p = 0; p < pairs; ++p) {
    const auto b0 = (__m512bh)_mm512_loadu_si512(b_strip + p * kNr);
    const auto b1 = (__m512bh)_mm512_loadu_si512(b_strip + p * kNr + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      std::int32_t pair;  // (a[r][2p], a[r][2p + 1]), broadcast to every lane
      const std::int64_t at = kPairMajor ? p * kMr + r : r * pairs + p;
      std::memcpy(&pair, a_rows + 2 * at, sizeof pair);
      const auto x = (__m512bh)_mm512_set1_epi32(pair);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], x, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], x, b1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, mask0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, mask1, acc1[r]);
  }
}

using MicroKernel = void (*)(std::int64_t, const std::uint16_t*, const std::uint32_t*, float*,
                             std::int64_t, __mmask16, __mmask16, bool);

// micro_dpbf16<MR, kPairMajor> for MR = 1 .. kMr, indexed by MR - 1.
template <bool kPairMajor, int... R>
constexpr auto make_micro_kernels(std::integer_sequence<int, R...>) {
  return std::array<MicroKernel, sizeof...(R)>{&micro_dpbf16<R + 1, kPairMajor>...};
}
constexpr auto kMicroKernels = make_micro_kernels<false>(std::make_integer_sequence<int, kMr>{});
constexpr auto kPairMajorMicroKernels =
    make_micro_kernels<true>(std::make_integer_sequence<int, kMr>{});

// The fma steps of vdpbf16ps, for CPUs where vdpbf16ps is slow: Intel's server cores (Sapphire
// and Emerald Rapids, the amx level) issue one 512-bit vdpbf16ps every two cycles (0.75 ns an
// instruction on Emerald Rapids: 86 GFLOP/s a core) and two fmas a cycle. Each pair step is two
// fmas, the odd element's product first, under MXCSR's DAZ and FTZ (set by gemm_dpbf16 around
// the calls): vdpbf16ps's definition and its bits (gemm_16bit_test checks them against the
// emulation, subnormals included). a comes widened (widen_pairs: per row, the pairs' odd values
// then their even values, as fp32), so that each step broadcasts from memory (load ports) rather
// than splitting a dword on the ports the fmas need.
template <int MR>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void micro_fma_bf16(
    std::int64_t pairs, const float* a_rows, const std::uint32_t* b_strip, float* c,
    std::int64_t ldc, __mmask16 mask0, __mmask16 mask1, bool first) {
  __m512 acc0[MR], acc1[MR];
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      acc0[r] = _mm512_maskz_loadu_ps(mask0, c + r * ldc);
      acc1[r] = _mm512_maskz_loadu_ps(mask1, c + r * ldc + 16);
    }
  }
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512i b0 = _mm512_loadu_si512(b_strip + p * kNr),
                  b1 = _mm512_loadu_si512(b_strip + p * kNr + 16);
    const __m512 b0_odd = _mm512_castsi512_ps(_mm512_and_si512(b0, high)),
                 b0_even = _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)),
                 b1_odd = _mm512_castsi512_ps(_mm512_and_si512(b1, high)),
                 b1_even = _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float* row = a_rows + r * 2 * pairs;
      const __m512 odd = _mm512_set1_ps(row[p]), even = _mm512_set1_ps(row[pairs + p]);
      acc0[r] = _mm512_fmadd_ps(b0_even, even, _mm512_fmadd_ps(b0_odd, odd, acc0[r]));
      acc1[r] = _mm512_fmadd_ps(b1_even, even, _mm512_fmadd_ps(b1_odd, odd, acc1[r]));
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, mask0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, mask1, acc1[r]);
  }
}

using FmaMicroKernel = void (*)(std::int64_t, const float*, const std::uint32_t*, float*,
                                std::int64_t, __mmask16, __mmask16, bool);

template <int... R>
constexpr auto make_fma_micro_kernels(std::integer_sequence<int, R...>) {
  return std::array<FmaMicroKernel, sizeof...(R)>{&micro_fma_bf16<R + 1>...};
}
constexpr auto kFmaMicroKernels = make_fma_micro_kernels(std::make_integer_sequence<int, kMr>{});

// `rows` rows of packed a (pack_a: row-major, `pairs` pair dwords a row) widened for
// micro_fma_bf16: row r's odd elements at out[r * 2 pairs + p], its even ones `pairs` further.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void widen_pairs(const std::uint16_t* packed,
                                                                      std::int64_t rows,
                                                                      std::int64_t pairs,
                                                                      float* out) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* in = packed + r * 2 * pairs;
    float* odd = out + r * 2 * pairs;
    float* even = odd + pairs;
    for (std::int64_t p = 0; p < pairs; p += 16) {
      const auto mask =
          static_cast<__mmask16>(pairs - p >= 16 ? 0xFFFFu : (1u << (pairs - p)) - 1u);
      const __m512i d = _mm512_maskz_loadu_epi32(mask, in + 2 * p);
      _mm512_mask_storeu_ps(odd + p, mask, _mm512_castsi512_ps(_mm512_and_si512(d, high)));
      _mm512_mask_storeu_ps(even + p, mask, _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)));
    }
  }
}

// The vdpbf16ps GEMM over packers of its operands: pack_b(k0, kc, j0, nc, out) packs rows
// [k0, k0 + kc) and columns [j0, j0 + nc) of b as pack_b does; pack_a(i0, mc, k0, kc, out) packs
// rows [i0, i0 + mc) and columns [k0, k0 + kc) of a as pack_a does or, when `a_pair_major`, as
// pack_a_transposed does. `accumulate`: c += a b (else c = a b).
template <typename PackA, typename PackB>
void gemm_dpbf16(std::int64_t m, std::int64_t n, std::int64_t k, const PackA& pack_a_block,
                 bool a_pair_major, const PackB& pack_b_block, float* c, std::int64_t ldc,
                 bool accumulate, bool fma_steps) {
  PackBuffers& buf = pack_buffers();
  const std::int64_t a_rows = (std::min(m, kMc) + kMr - 1) / kMr * kMr,
                     a_pairs = (std::min(k, kKc) + 1) / 2;
  buf.a.resize(static_cast<std::size_t>(a_rows * 2 * a_pairs));
  buf.b.resize(static_cast<std::size_t>(a_pairs * ((std::min(n, kNc) + kNr - 1) / kNr * kNr)));
  const auto& kernels = a_pair_major ? kPairMajorMicroKernels : kMicroKernels;
  // The fma steps on row-major a only (pack_a_transposed's pair-major panels keep vdpbf16ps).
  const bool widened = fma_steps && !a_pair_major;
  if (widened) buf.a_wide.resize(buf.a.size());
  for (std::int64_t j0 = 0; j0 < n; j0 += kNc) {
    const std::int64_t nc = std::min(kNc, n - j0);
    for (std::int64_t k0 = 0; k0 < k; k0 += kKc) {
      const std::int64_t kc = std::min(kKc, k - k0), pairs = (kc + 1) / 2;
      pack_b_block(k0, kc, j0, nc, buf.b.data());
      for (std::int64_t i0 = 0; i0 < m; i0 += kMc) {
        const std::int64_t mc = std::min(kMc, m - i0);
        pack_a_block(i0, mc, k0, kc, buf.a.data());
        if (widened) widen_pairs(buf.a.data(), mc, pairs, buf.a_wide.data());
        for (std::int64_t q = 0; q < mc; q += kMr) {
          const std::int64_t mr = std::min<std::int64_t>(kMr, mc - q);
          const MicroKernel kernel = kernels[static_cast<std::size_t>(mr - 1)];
          // Row q's packed pairs: row-major rows are 2 * pairs elements apart, pair-major
          // panels 2 * kMr * pairs.
          const std::uint16_t* a_panel = buf.a.data() + q * 2 * pairs;
          for (std::int64_t s = 0; s < nc; s += kNr) {
            // Columns past n are masked off; their accumulators hold the packed zeros' products.
            const std::int64_t width = std::min<std::int64_t>(kNr, nc - s);
            const auto mask0 = static_cast<__mmask16>(width >= 16 ? 0xFFFFu : (1u << width) - 1u);
            const auto mask1 = static_cast<__mmask16>(width >= 32   ? 0xFFFFu
                                                      : width <= 16 ? 0u
                                                                    : (1u << (width - 16)) - 1u);
            float* c_tile = c + (i0 + q) * ldc + j0 + s;
            const bool first = k0 == 0 && !accumulate;
            if (widened) {
              const detail::FlushDenormals flush;
              kFmaMicroKernels[static_cast<std::size_t>(mr - 1)](
                  pairs, buf.a_wide.data() + q * 2 * pairs, buf.b.data() + s * pairs, c_tile, ldc,
                  mask0, mask1, first);
            } else {
              kernel(pairs, a_panel, buf.b.data() + s * pairs, c_tile, ldc, mask0, mask1, first);
            }
          }
        }
      }
    }
  }
}

// The 16-bit weights' product: a fp32 rounded by pack_a, b bf16 bits packed as they are.
void gemm_dpbf16_weights(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                         std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float* c,
                         std::int64_t ldc, KernelLevel level, bool out_in) {
  gemm_dpbf16(
      m, n, k,
      [&](std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc, std::uint16_t* out) {
        pack_a(a, lda, i0, mc, k0, kc, level, out);
      },
      false,
      [&](std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc, std::uint32_t* out) {
        if (out_in) {
          pack_b_out_in(b, ldb, k0, kc, j0, nc, out);
        } else {
          pack_b(b, ldb, k0, kc, j0, nc, out);
        }
      },
      c, ldc, /*accumulate=*/false, /*fma_steps=*/level == KernelLevel::kAmx);
}

// ---- bf16 compute: both operands fp32, rounded while packed -------------------------------------

// Packs rows [i0, i0 + rows) and columns [k0, k0 + cols) of op(a) = a^T, a stored [k, m] with
// rows `lda` apart (the sum runs down a's rows: a weight gradient's dy^T x), rounded to bf16 as
// vcvtneps2bf16 rounds (to nearest even), as pair-major panels of kMr rows: panel P, pair p, row
// r is the dword P * kMr * pairs + p * kMr + r; rows past `rows` and the element past an odd
// `cols` are zero.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void pack_a_transposed(
    const float* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t k0,
    std::int64_t cols, std::uint16_t* out) {
  const std::int64_t pairs = (cols + 1) / 2;
  auto* dwords = reinterpret_cast<std::uint32_t*>(out);
  for (std::int64_t q = 0; q < rows; q += kMr) {
    const std::int64_t width = std::min<std::int64_t>(kMr, rows - q);
    const auto mask = static_cast<__mmask16>((1u << width) - 1u);
    std::uint32_t* panel = dwords + (q / kMr) * kMr * pairs;
    for (std::int64_t p = 0; p < pairs; ++p) {
      const float* even = a + (k0 + 2 * p) * lda + i0 + q;
      const __m512 e = _mm512_maskz_loadu_ps(mask, even);
      const __m512 o =
          2 * p + 1 < cols ? _mm512_maskz_loadu_ps(mask, even + lda) : _mm512_setzero_ps();
      // Lane i: the bf16 of e[i] in the low half, of o[i] in the high half.
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(e));
      const __m512i hi =
          _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(o)), 16);
      _mm512_mask_storeu_epi32(panel + p * kMr, static_cast<__mmask16>(0x0FFFu),
                               _mm512_or_si512(lo, hi));
    }
  }
}

// Rounds b's block (rows [k0, k0 + kc), columns [j0, j0 + nc) of op(b); b stored [k, n] or, when
// `out_in`, [n, k], rows `ldb` apart) to bf16 into `bits` as stored (kc rows of nc, or nc rows of
// kc), then packs it as the bf16 weights' packers do.
void pack_b_rounded(const float* b, std::int64_t ldb, bool out_in, std::int64_t k0, std::int64_t kc,
                    std::int64_t j0, std::int64_t nc, KernelLevel level,
                    std::vector<std::uint16_t>& bits, std::uint32_t* out) {
  const std::int64_t runs = out_in ? nc : kc, run = out_in ? kc : nc;
  bits.resize(static_cast<std::size_t>(runs * run));
  for (std::int64_t q = 0; q < runs; ++q) {
    const float* from = out_in ? b + (j0 + q) * ldb + k0 : b + (k0 + q) * ldb + j0;
    convert_f32_to_bf16(
        std::span<const float>(from, static_cast<std::size_t>(run)),
        std::span<std::uint16_t>(bits.data() + q * run, static_cast<std::size_t>(run)), level);
  }
  if (out_in) {
    pack_b_out_in(bits.data(), kc, 0, kc, 0, nc, out);
  } else {
    pack_b(bits.data(), nc, 0, kc, 0, nc, out);
  }
}

// op(x) of a stored matrix, rounded to bf16 values kept as fp32, row-major [rows, cols]: the
// operands of the emulated product below.
void rounded_operand(const float* x, std::int64_t ld, bool transposed, std::int64_t rows,
                     std::int64_t cols, KernelLevel level, std::vector<std::uint16_t>& bits,
                     std::vector<float>& out) {
  const auto count = static_cast<std::size_t>(rows * cols);
  bits.resize(count);
  out.resize(count);
  if (transposed) {
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j)
        out[static_cast<std::size_t>(i * cols + j)] = x[j * ld + i];
    }
  } else {
    for (std::int64_t i = 0; i < rows; ++i) std::copy_n(x + i * ld, cols, out.begin() + i * cols);
  }
  convert_f32_to_bf16(out, bits, level);
  convert_bf16_to_f32(bits, out, level);
}

}  // namespace

void gemm_16bit(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& weights,
                float* c, std::int64_t ldc, KernelLevel level) {
  // ld as given (stride() would replace a bad 0 or negative one); a negative size is reported
  // below before any use.
  const std::int64_t n = weights.cols, k = weights.rows;
  const std::int64_t ldb = weights.ld != 0 ? weights.ld : weights.row_length();
  const void* b = weights.data;
  const DType b_type = weights.dtype;
  const WeightLayout b_layout = weights.layout;
  NUMESH_CHECK(b_type == DType::kBF16 || b_type == DType::kF16, ShapeError,
               "gemm_16bit: weights of dtype {}; it takes bf16 or f16 (fp32 weights go to gemm())",
               to_string(b_type));
  const bool out_in = b_layout == WeightLayout::kOutIn;
  NUMESH_CHECK(m >= 0 && n >= 0 && k >= 0 && lda >= k && ldb >= (out_in ? k : n) && ldc >= n,
               ShapeError,
               "gemm_16bit: m {}, n {}, k {} with lda {}, ldb {} ({}), ldc {}: sizes must be >= 0 "
               "and each leading "
               "dimension at least its row's length",
               m, n, k, lda, ldb, out_in ? "out-in" : "in-out", ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  const auto* w = static_cast<const std::uint16_t*>(b);
  if (level >= KernelLevel::kAvx512Bf16 && b_type == DType::kBF16) {
    gemm_dpbf16_weights(m, n, k, a, lda, w, ldb, c, ldc, level, out_in);
    return;
  }
  gemm_widened(m, n, k, a, lda, w, b_type, ldb, c, ldc, level, out_in);
}

void gemm_bf16_compute(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                       std::int64_t lda, bool transpose_a, const float* b, std::int64_t ldb,
                       bool transpose_b, bool accumulate, float* c, std::int64_t ldc,
                       KernelLevel level) {
  NUMESH_CHECK(m >= 0 && n >= 0 && k >= 0 && lda >= (transpose_a ? m : k) &&
                   ldb >= (transpose_b ? k : n) && ldc >= n,
               ShapeError,
               "gemm_bf16_compute: m {}, n {}, k {} with lda {}{}, ldb {}{}, ldc {}: sizes must be "
               ">= 0 and each "
               "leading dimension at least its row's length",
               m, n, k, lda, transpose_a ? " (transposed)" : "", ldb,
               transpose_b ? " (transposed)" : "", ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    }
    return;
  }
  if (level >= KernelLevel::kAvx512Bf16) {
    thread_local std::vector<std::uint16_t> b_bits;
    gemm_dpbf16(
        m, n, k,
        [&](std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
            std::uint16_t* out) {
          if (transpose_a) {
            pack_a_transposed(a, lda, i0, mc, k0, kc, out);
          } else {
            pack_a(a, lda, i0, mc, k0, kc, level, out);
          }
        },
        transpose_a,
        [&](std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
            std::uint32_t* out) {
          pack_b_rounded(b, ldb, transpose_b, k0, kc, j0, nc, level, b_bits, out);
        },
        c, ldc, accumulate, /*fma_steps=*/level == KernelLevel::kAmx);
    return;
  }
  // Below AVX-512 BF16: the same products (of bf16 values, exact in fp32) through the fp32
  // GEMM, on rounded copies of both operands.
  thread_local std::vector<std::uint16_t> bits;
  thread_local std::vector<float> a_rounded, b_rounded;
  rounded_operand(a, lda, transpose_a, m, k, level, bits, a_rounded);
  rounded_operand(b, ldb, transpose_b, k, n, level, bits, b_rounded);
  gemm(m, n, k, 1.0f, a_rounded.data(), k, b_rounded.data(), n, /*transpose_b=*/false,
       accumulate ? 1.0f : 0.0f, c, ldc);
}

}  // namespace numesh::ops
