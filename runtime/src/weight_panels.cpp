#include "numesh/runtime/weight_panels.hpp"

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

// Bytes of a block's f16 scale, which leads it in both formats.
constexpr std::int64_t kScaleBytes = 2;
// Bytes of a unit of codes.
constexpr std::int64_t kUnitBytes = 4;

// The checks both directions share; returns the bytes of a row.
std::int64_t checked_row_bytes(const char* name, DType dtype, std::int64_t n, std::int64_t k,
                               std::size_t from_bytes, std::size_t to_bytes) {
  NUMESH_CHECK(has_panels(dtype), TypeError, "{}: {} weights have no panel layout (q8_0, q4_0 do)",
               name, to_string(dtype));
  const std::int64_t block = traits(dtype).block_elements;
  NUMESH_CHECK(n >= 0 && k >= 0 && k % block == 0, ShapeError,
               "{}: a [{}, {}] {} matrix: sizes must be >= 0 and each row whole blocks of {}", name,
               n, k, to_string(dtype), block);
  const std::int64_t row = row_bytes(dtype, k);
  const auto want = static_cast<std::size_t>(n * row);
  NUMESH_CHECK(from_bytes == want && to_bytes == want, ShapeError,
               "{}: a [{}, {}] {} matrix takes {} bytes; given {} and {}", name, n, k,
               to_string(dtype), want, from_bytes, to_bytes);
  return row;
}

// One panel: its 16 rows (`blocks` blocks each, one after the other) at `from` into the panel
// layout at `to`, or (kToPanels false) a panel at `from` back into its rows at `to`.
template <bool kToPanels>
void convert_panel(DType dtype, std::int64_t blocks, const std::byte* from, std::byte* to) {
  const std::int64_t block_bytes = traits(dtype).block_bytes;
  const std::int64_t units = (block_bytes - kScaleBytes) / kUnitBytes;
  const std::int64_t row = blocks * block_bytes;
  for (std::int64_t t = 0; t < blocks; ++t) {
    // Block t of the panel, and block t of output o's row.
    const std::int64_t panel_block = t * kPanelWidth * block_bytes;
    for (std::int64_t o = 0; o < kPanelWidth; ++o) {
      const std::int64_t row_block = o * row + t * block_bytes;
      const auto copy = [&](std::int64_t in_panel, std::int64_t in_row, std::int64_t bytes) {
        if constexpr (kToPanels) {
          std::memcpy(to + panel_block + in_panel, from + row_block + in_row, bytes);
        } else {
          std::memcpy(to + row_block + in_row, from + panel_block + in_panel, bytes);
        }
      };
      copy(kScaleBytes * o, 0, kScaleBytes);
      for (std::int64_t u = 0; u < units; ++u) {
        copy(kPanelWidth * kScaleBytes + kPanelWidth * kUnitBytes * u + kUnitBytes * o,
             kScaleBytes + kUnitBytes * u, kUnitBytes);
      }
    }
  }
}

// convert_panel<true> at the AVX-512 level, for blocks of kUnits units of codes (Q8_0: 8, Q4_0:
// 4): a block's codes across the 16 outputs are a 16 x kUnits matrix of 4-byte units, which the
// panel holds transposed. Each output's codes are one load and the transpose is done in
// registers, where the scalar version copies a unit at a time (16 kUnits copies a block): into
// new memory, 116 MB of Q8_0 took 17.0 ms on one thread against the scalar version's 21.8 (a
// memcpy 14.1; docs/benchmarks.md, session 54). The same bytes as convert_panel<true>.
// Transposes each 128-bit lane of in[0..3] as a 4 x 4 matrix of dwords (row i of lane L is in[i]'s
// lane L): out[j]'s lane L holds dword j of in[0..3]'s lane L, in that order.
__attribute__((target("avx512f"))) void transpose_lanes_4x4(const __m512i* in, __m512i* out) {
  const __m512i a0 = _mm512_unpacklo_epi32(in[0], in[1]), a1 = _mm512_unpackhi_epi32(in[0], in[1]);
  const __m512i a2 = _mm512_unpacklo_epi32(in[2], in[3]), a3 = _mm512_unpackhi_epi32(in[2], in[3]);
  out[0] = _mm512_unpacklo_epi64(a0, a2);
  out[1] = _mm512_unpackhi_epi64(a0, a2);
  out[2] = _mm512_unpacklo_epi64(a1, a3);
  out[3] = _mm512_unpackhi_epi64(a1, a3);
}

template <std::int64_t kUnits>
__attribute__((target("avx512f"))) void rows_to_panel_avx512(std::int64_t blocks,
                                                             const std::byte* from, std::byte* to) {
  static_assert(kUnits == 8 || kUnits == 4);
  constexpr std::int64_t block_bytes = kScaleBytes + kUnits * kUnitBytes;
  const std::int64_t row = blocks * block_bytes;
  const auto codes = [&](std::int64_t o, std::int64_t t) {
    return from + o * row + t * block_bytes + kScaleBytes;
  };
  for (std::int64_t t = 0; t < blocks; ++t) {
    std::byte* panel = to + t * kPanelWidth * block_bytes;
    for (std::int64_t o = 0; o < kPanelWidth; ++o) {
      std::memcpy(panel + kScaleBytes * o, from + o * row + t * block_bytes, kScaleBytes);
    }
    // Line u of codes: 64 bytes at lines + 64 u (unaligned).
    std::byte* const lines = panel + kPanelWidth * kScaleBytes;
    if constexpr (kUnits == 8) {
      // r[o], o < 8: output o's 8 units in the low 256 bits, output o + 8's in the high ones; so
      // each 128-bit lane holds 4 units of one output (lanes: o's 0-3, o's 4-7, o+8's 0-3, o+8's
      // 4-7), and r[0..3] and r[4..7] are transposed lane by lane as two 4 x 4 matrices.
      __m512i r[8];
      for (int o = 0; o < 8; ++o) {
        r[o] = _mm512_inserti64x4(
            _mm512_castsi256_si512(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes(o, t)))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes(o + 8, t))), 1);
      }
      // c[q] (outputs 0-3 and 8-11) and c[q + 4] (outputs 4-7 and 12-15): in each lane unit q
      // (lanes 0 and 2) or q + 4 (lanes 1 and 3) of 4 outputs.
      __m512i c[8];
      transpose_lanes_4x4(r, c);
      transpose_lanes_4x4(r + 4, c + 4);
      // Line u < 4: lanes 0 and 2 of c[u] and c[u + 4] in output order; line u + 4: lanes 1, 3.
      const __m512i low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
      const __m512i high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
      for (int q = 0; q < 4; ++q) {
        _mm512_storeu_si512(lines + 64 * q, _mm512_permutex2var_epi64(c[q], low, c[q + 4]));
        _mm512_storeu_si512(lines + 64 * (q + 4), _mm512_permutex2var_epi64(c[q], high, c[q + 4]));
      }
    } else {
      // r[i], i < 4: lane L holds output i + 4L's 4 units; transposed lane by lane, line u's lane
      // L is unit u of outputs 4L .. 4L + 3: the panel's order.
      __m512i r[4];
      for (int i = 0; i < 4; ++i) {
        __m512i v =
            _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes(i, t))));
        v = _mm512_inserti32x4(
            v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes(i + 4, t))), 1);
        v = _mm512_inserti32x4(
            v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes(i + 8, t))), 2);
        r[i] = _mm512_inserti32x4(
            v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes(i + 12, t))), 3);
      }
      __m512i c[4];
      transpose_lanes_4x4(r, c);
      for (int u = 0; u < 4; ++u) _mm512_storeu_si512(lines + 64 * u, c[u]);
    }
  }
}

// One panel's rows into the panel layout at `level` (AVX-512 from kAvx512, else scalar).
void rows_to_panel(DType dtype, std::int64_t blocks, const std::byte* from, std::byte* to,
                   KernelLevel level) {
  if (level >= KernelLevel::kAvx512) {
    if (dtype == DType::kQ8_0) return rows_to_panel_avx512<8>(blocks, from, to);
    if (dtype == DType::kQ4_0) return rows_to_panel_avx512<4>(blocks, from, to);
  }
  convert_panel<true>(dtype, blocks, from, to);
}

template <bool kToPanels>
void convert(const char* name, DType dtype, std::int64_t n, std::int64_t k,
             std::span<const std::byte> from, std::span<std::byte> to, KernelLevel level) {
  const std::int64_t row = checked_row_bytes(name, dtype, n, k, from.size(), to.size());
  const std::int64_t blocks = k / traits(dtype).block_elements;
  const std::int64_t panelled = panel_outputs(n);
  for (std::int64_t j = 0; j < panelled; j += kPanelWidth) {
    if constexpr (kToPanels) {
      rows_to_panel(dtype, blocks, from.data() + j * row, to.data() + j * row, level);
    } else {
      (void)level;  // back to rows: scalar at every level (no load waits on it)
      convert_panel<false>(dtype, blocks, from.data() + j * row, to.data() + j * row);
    }
  }
  // The last n mod 16 outputs are rows in both layouts.
  if (panelled < n) {
    std::memcpy(to.data() + panelled * row, from.data() + panelled * row,
                static_cast<std::size_t>((n - panelled) * row));
  }
}

}  // namespace

void rows_to_panels(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> rows,
                    std::span<std::byte> panels, KernelLevel level) {
  convert<true>("rows_to_panels", dtype, n, k, rows, panels, level);
}

void panels_to_rows(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> panels,
                    std::span<std::byte> rows) {
  convert<false>("panels_to_rows", dtype, n, k, panels, rows, KernelLevel::kScalar);
}

void rows_to_panels_in_place(DType dtype, std::int64_t n, std::int64_t k,
                             std::span<std::byte> matrix, KernelLevel level) {
  const std::int64_t row =
      checked_row_bytes("rows_to_panels_in_place", dtype, n, k, matrix.size(), matrix.size());
  // A panel's bytes lie where its 16 rows lay: each panel is converted through a copy of them.
  std::vector<std::byte> staged(static_cast<std::size_t>(kPanelWidth * row));
  const std::int64_t blocks = k / traits(dtype).block_elements;
  for (std::int64_t j = 0; j < panel_outputs(n); j += kPanelWidth) {
    std::byte* at = matrix.data() + j * row;
    std::memcpy(staged.data(), at, staged.size());
    rows_to_panel(dtype, blocks, staged.data(), at, level);
  }
}

}  // namespace numesh::runtime
