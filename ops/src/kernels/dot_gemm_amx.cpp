// dot_gemm_bf16 at the amx level: c = x b^T by AMX tile products. A tile product (tdpbf16ps)
// multiplies 16 outputs' weights (tile A: 16 rows of b, 32 values of k each, loaded from b where
// it lies) by 16 rows of x (tile B: the same 32 values of k, as 16 pairs a tile row, each pair
// one row of x's: x packed in blocks of k on the stack) into 16 x 16 fp32 sums (tile C, outputs
// by rows of x). The weights are never repacked, so one row of x reads them as fast as memory
// gives them, and 16 rows cost one tile product where the fma kernels took 16 times the work.

#include "dot_gemm_amx.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "amx_tiles.hpp"

namespace numesh::ops::detail {

namespace {

#define NUMESH_AMX_BF16 \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

constexpr std::int64_t kSide = 16;   // a tile's outputs (rows of A and C) and rows of x (of B, C)
constexpr std::int64_t kChunk = 32;  // the values of k a tile product takes: 16 pairs
// The B tiles packed at once: 32 KiB of stack, 32 chunks of k for 16 rows of x, 512 for one
// row. Past them, the sums wait in memory between blocks of k.
constexpr std::int64_t kPackedWords = 8192;
// Past one block of k, the outputs whose sums wait in memory between blocks (12 KiB of stack);
// each block's B tiles are packed again for each such span of outputs.
constexpr std::int64_t kSpanOutputs = 12 * kSide;

// A tile's 1 KiB: 16 rows of 64 bytes.
struct alignas(64) TileBytes {
  std::uint32_t row[kSide][kSide];
};

// Tile 0 holds sums (C: 16 outputs by `rows` rows of x), 1 weights (A: 16 outputs by 32 values
// of k), 2 packed rows of x (B: 16 pairs of k by `rows` rows). A tile product's cost and its B
// tiles' bytes grow with `rows`, so fewer than 16 rows take narrower tiles.
NUMESH_AMX_BF16 void configure_tiles(std::int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 3; ++t) {
    config.rows[t] = kSide;
    config.row_bytes[t] = static_cast<std::uint16_t>(t == 1 ? 64 : 4 * rows);
  }
  load_tile_config(config);
}

// r[0..15] (16 rows of 16 32-bit lanes) transposed in place: lane q of row p goes to lane p of
// row q.
NUMESH_AMX_BF16 inline void transpose16(__m512i* r) {
  __m512i t[kSide];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Then r[4g + q], in its 128-bit lane l, holds column 4l + q of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    r[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x88);  // lanes 0, 2 of each
    const __m512i u1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xdd);  // lanes 1, 3
    const __m512i v0 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xdd);
    t[q] = _mm512_shuffle_i32x4(u0, v0, 0x88);
    t[q + 8] = _mm512_shuffle_i32x4(u0, v0, 0xdd);
    t[q + 4] = _mm512_shuffle_i32x4(u1, v1, 0x88);
    t[q + 12] = _mm512_shuffle_i32x4(u1, v1, 0xdd);
  }
  for (int i = 0; i < kSide; ++i) r[i] = t[i];
}

// The mask of the 16-bit lanes of a chunk from value e0 that lie inside k (zeros past it).
inline __mmask32 chunk_mask(std::int64_t e0, std::int64_t k) {
  const std::int64_t valid = k - e0;
  return valid >= kChunk ? ~__mmask32{0} : static_cast<__mmask32>((1U << valid) - 1U);
}

// B tiles of chunks [c0, c0 + count) for rows [i0, i0 + rows) of x, `rows` columns each (the
// tiles' width): tile row p holds pair p of the chunk (values 2p and 2p + 1) of each row, values
// past k zero. Tile c starts at out + c * 16 * rows.
NUMESH_AMX_BF16 void pack_rows(const std::uint16_t* x, std::int64_t ldx, std::int64_t i0,
                               std::int64_t rows, std::int64_t k, std::int64_t c0,
                               std::int64_t count, std::uint32_t* out) {
  const auto columns = static_cast<__mmask16>((1U << rows) - 1U);
  for (std::int64_t c = 0; c < count; ++c) {
    const std::int64_t e0 = (c0 + c) * kChunk;
    const __mmask32 mask = chunk_mask(e0, k);
    std::uint32_t* tile = out + c * kSide * rows;
    if (rows == 1) {  // one column: the chunk itself
      _mm512_storeu_si512(tile, _mm512_maskz_loadu_epi16(mask, x + i0 * ldx + e0));
      continue;
    }
    __m512i r[kSide];
    for (std::int64_t i = 0; i < kSide; ++i) {
      r[i] = i < rows ? _mm512_maskz_loadu_epi16(mask, x + (i0 + i) * ldx + e0)
                      : _mm512_setzero_si512();
    }
    transpose16(r);
    for (int p = 0; p < kSide; ++p) _mm512_mask_storeu_epi32(tile + p * rows, columns, r[p]);
  }
  visible_to_tiles(out);
}

// Where a tile of weights (outputs [j, j + 16), chunk from value e0) is read from: b itself when
// all of it lies inside n and k, else `spare`, filled with the part that does and zeros.
NUMESH_AMX_BF16 inline const void* weights_at(const std::uint16_t* b, std::int64_t ldb,
                                              std::int64_t n, std::int64_t k, std::int64_t j,
                                              std::int64_t e0, TileBytes& spare,
                                              std::int64_t& stride) {
  if (j + kSide <= n && e0 + kChunk <= k) {
    stride = ldb * 2;
    return b + j * ldb + e0;
  }
  const __mmask32 mask = chunk_mask(e0, k);
  for (std::int64_t r = 0; r < kSide; ++r) {
    const __m512i v =
        j + r < n ? _mm512_maskz_loadu_epi16(mask, b + (j + r) * ldb + e0) : _mm512_setzero_si512();
    _mm512_store_si512(spare.row[r], v);
  }
  visible_to_tiles(&spare);
  stride = 64;
  return &spare;
}

// Writes the sums of a C tile (outputs [j, j + 16) by rows [i0, i0 + rows)) into c, as rows of
// c: only outputs below n.
NUMESH_AMX_BF16 void store_sums(const TileBytes& sums, std::int64_t i0, std::int64_t rows,
                                std::int64_t j, std::int64_t n, float* c, std::int64_t ldc) {
  __m512i r[kSide];
  for (int o = 0; o < kSide; ++o) r[o] = _mm512_load_si512(sums.row[o]);
  transpose16(r);
  const std::int64_t outputs = std::min<std::int64_t>(kSide, n - j);
  const auto mask = static_cast<__mmask16>((1U << outputs) - 1U);
  for (std::int64_t i = 0; i < rows; ++i)
    _mm512_mask_storeu_ps(c + (i0 + i) * ldc + j, mask, _mm512_castsi512_ps(r[i]));
}

// One pass: the C tile of the 16 outputs from j, over chunks [c0, c0 + count) of k (their B
// tiles in `packed`), started from zero (`first`) or from `held`, then written to c (`last`) or
// kept in `held`. One tile of weights at a time: with the next 32 or 48 outputs' tiles read
// beside it (three C tiles in flight), one row decoded at 8-11 GB/s of weights, with one at
// 44-47 (`decode_bench`, k 4096: 16 rows of weights are 16 streams of memory, 48 too many).
NUMESH_AMX_BF16 void pass(const std::uint16_t* b, std::int64_t ldb, std::int64_t n, std::int64_t k,
                          std::int64_t j, std::int64_t c0, std::int64_t count,
                          const std::uint32_t* packed, bool first, bool last, TileBytes& held,
                          std::int64_t i0, std::int64_t rows, float* c, std::int64_t ldc) {
  if (first) {
    _tile_zero(0);
  } else {
    _tile_loadd(0, held.row, 64);
  }
  TileBytes spare;
  // The next 16 outputs' weights, asked for a chunk at a time across this pass: 16 rows of
  // weights are 16 short streams (a row of 768 values is 24 lines), too short for the hardware's
  // prefetchers to run ahead of.
  const std::int64_t ahead_rows = std::clamp<std::int64_t>(n - j - kSide, 0, kSide);
  const std::uint16_t* ahead = ahead_rows > 0 ? b + (j + kSide) * ldb : b;  // none past b
  for (std::int64_t t = 0; t < count; ++t) {
    const std::int64_t e0 = (c0 + t) * kChunk;
    for (std::int64_t r = 0; r < ahead_rows && e0 < k; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + r * ldb + e0), _MM_HINT_T1);
    std::int64_t stride = 0;
    const void* weights = weights_at(b, ldb, n, k, j, e0, spare, stride);
    _tile_loadd(1, weights, stride);
    _tile_loadd(2, packed + t * kSide * rows, 4 * rows);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, held.row, 64);
  if (last) store_sums(held, i0, rows, j, n, c, ldc);
}

NUMESH_AMX_BF16 void tile_products(std::int64_t m, std::int64_t n, std::int64_t k,
                                   const std::uint16_t* x, std::int64_t ldx, const std::uint16_t* b,
                                   std::int64_t ldb, float* c, std::int64_t ldc) {
  const std::int64_t chunks = (k + kChunk - 1) / kChunk;
  alignas(64) std::uint32_t packed[kPackedWords];
  TileBytes held[kSpanOutputs / kSide];
  std::int64_t configured = 0;
  for (std::int64_t i0 = 0; i0 < m; i0 += kSide) {
    const std::int64_t rows = std::min(kSide, m - i0);
    if (rows != configured) configure_tiles(configured = rows);
    // The chunks whose B tiles fit in `packed`; when all do, each is packed once for all n
    // outputs, else again for each span of outputs whose sums wait in `held`.
    const std::int64_t block = kPackedWords / (kSide * rows);
    const std::int64_t span = chunks <= block ? n : kSpanOutputs;
    for (std::int64_t s0 = 0; s0 < n; s0 += span) {
      const std::int64_t s1 = std::min(n, s0 + span);
      for (std::int64_t c0 = 0; c0 < chunks; c0 += block) {
        const std::int64_t count = std::min(block, chunks - c0);
        const bool first = c0 == 0, last = c0 + count == chunks;
        pack_rows(x, ldx, i0, rows, k, c0, count, packed);
        for (std::int64_t j = s0; j < s1; j += kSide) {
          TileBytes& sums = held[last && first ? 0 : (j - s0) / kSide];
          pass(b, ldb, n, k, j, c0, count, packed, first, last, sums, i0, rows, c, ldc);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

void dot_rows_bf16_amx(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* x,
                       std::int64_t ldx, const std::uint16_t* b, std::int64_t ldb, float* c,
                       std::int64_t ldc) {
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  tile_products(m, n, k, x, ldx, b, ldb, c, ldc);
}

}  // namespace numesh::ops::detail
