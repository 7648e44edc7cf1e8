#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "amx_tiles.hpp"
#include "block_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// packed_gemm_q8: the prefill tile of block-format weights by int8 products (block_gemm.hpp
// gives the orders; packed_panels.hpp the panels and each format's packer). The tile repacks 16
// outputs at a time so that one 512-bit register holds 4 consecutive weight codes of each of the
// 16: a row's 4 activation codes, broadcast, then meet all 16 outputs in one vpdpbusd, each weight
// load serves every row of the group, and a block's integer sums come out whole, one scale product
// and one fma per block, row and 16 outputs. The decode kernels (q8_dot_common.hpp) read the
// weights as stored instead, a block of one output against a block of one row, which suits one row
// but spends as many conversions and fmas as integer products. With AMX a tile product does the
// integer part of 16 rows by 16 outputs at once (tdpbssd: signed codes both sides, so no bias),
// and AVX-512 then applies the scales to its 256 sums in the same order.

namespace numesh::ops {

namespace {

using detail::kPanelGroups;
using detail::kPanelOutputs;
using detail::kQ8DotBlock;
using detail::PackedBlock;
using runtime::KernelLevel;

constexpr std::int64_t kRowsAtOnce = 4;  // rows of activations a kernel call takes

// How a format's packed blocks are multiplied: one scale a block or two (Q3_K, Q6_K: inputs 0-15
// and 16-31), with or without minimums (Q4_K and Q5_K: the activations' scaled block sums times
// -dmin m).
template <bool kTwo, bool kMins>
struct Form {
  static constexpr bool kTwoScales = kTwo;
  static constexpr bool kMinimums = kMins;
};
using PairForm = Form<false, false>;
using MinimumsForm = Form<false, true>;
using TwoScalesForm = Form<true, false>;

// The activations a call multiplies: codes (rows k apart; for the VNNI kernel as unsigned bytes
// x + 128), scales and, for Q4_K, the scaled block sums (rows k / 32 apart); and -kStoredOffset
// (128 or 8) times each block's sum of codes (rows k / 32 apart), which turns sums of the codes
// taken unsigned into the codes' own: for the VNNI kernel on stored Q8_0 or Q4_0 panels
// (rows512_stored's starting sums), and below VNNI for Q4_0, whose nibbles q rows256 takes as they
// are (PackedBlock's codes q - 8 with 8 added back, or a stored panel's as they lie).
struct Rows {
  const std::int8_t* codes;
  const std::uint8_t* unsigned_codes;
  const float* scales;
  const float* sums;
  std::int64_t k;
  std::int64_t blocks;
  const std::int32_t* corrections = nullptr;
};

// f.template operator()<R>() for R = rows, 1 .. kRowsAtOnce: the kernels' row counts as constants.
template <class F>
void with_rows(std::int64_t rows, const F& f) {
  static_assert(kRowsAtOnce == 4);
  switch (rows) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    default:
      return f.template operator()<4>();
  }
}

// ---- Scalar: the orders written out -------------------------------------------------------------

template <class Fm>
void rows_scalar(std::int64_t rows, const Rows& a, std::int64_t i0, const PackedBlock* panel,
                 std::int64_t count, float* c, std::int64_t ldc) {
  for (std::int64_t r = i0; r < i0 + rows; ++r) {
    for (std::int64_t o = 0; o < count; ++o) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t < a.blocks; ++t) {
        const PackedBlock& p = panel[t];
        const std::int8_t* x = a.codes + r * a.k + t * kQ8DotBlock;
        const float d_a = a.scales[r * a.blocks + t];
        std::int32_t isum[2] = {0, 0};
        for (std::int64_t g = 0; g < kPanelGroups; ++g) {
          const int half = Fm::kTwoScales && g >= kPanelGroups / 2 ? 1 : 0;
          for (int e = 0; e < 4; ++e)
            isum[half] += std::int32_t{x[4 * g + e]} * std::int32_t{p.codes[g][o][e]};
        }
        acc = std::fma(static_cast<float>(isum[0]), d_a * p.scales[o], acc);
        if constexpr (Fm::kTwoScales) {
          acc = std::fma(static_cast<float>(isum[1]), d_a * p.scales_high[o], acc);
        }
        if constexpr (Fm::kMinimums) acc = std::fma(a.sums[r * a.blocks + t], p.minimums[o], acc);
      }
      c[(r - i0) * ldc + o] = acc;
    }
  }
}

// ---- AVX2: 8 outputs a register -----------------------------------------------------------------

using detail::Codes256;  // how rows256 gives vpmaddubsw its unsigned operand

// Group g's step for one row: s += the integer sums of the row's 4 codes at x (broadcast) with
// the 8 outputs' 4 codes `w` (vpmaddubsw's unsigned operand `magnitude`): pair sums within 2 *
// 128 * 127, then vpmaddwd with ones.
template <Codes256 kCodes>
__attribute__((target("avx2,fma,f16c"))) inline __m256i group256(__m256i magnitude, __m256i w,
                                                                 const std::int8_t* x, __m256i s) {
  std::int32_t four;
  std::memcpy(&four, x, 4);
  __m256i xv = _mm256_set1_epi32(four);
  if constexpr (kCodes == Codes256::kSigned) xv = _mm256_sign_epi8(xv, w);
  s = _mm256_add_epi32(
      s, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xv), _mm256_set1_epi16(1)));
  // An empty asm the sum passes through: without it gcc 12 reassociates a block's 32 (row, group)
  // sums into a tree and holds them on the stack, a store and a load each (the tile at 0.85-0.9x).
  __asm__("" : "+x"(s));
  return s;
}

// f += f32(s) (d_a d_w), d_a row r's scale of block t: one block's (or half block's) sums into a
// row's accumulator.
__attribute__((target("avx2,fma,f16c"))) inline __m256 scale256(__m256i s, const Rows& a,
                                                                std::int64_t r, std::int64_t t,
                                                                __m256 d_w, __m256 f) {
  const __m256 d_a = _mm256_set1_ps(a.scales[r * a.blocks + t]);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d_a, d_w), f);
}

// vpmaddubsw's operands from a group's 8 outputs' codes: the unsigned one, and (for
// Codes256::kSigned) the codes whose signs the activations take.
struct Operands256 {
  __m256i magnitude;
  __m256i w;
};

// What rows256 multiplies: half `h` (outputs 8h .. 8h + 7) of each block of a packed panel. Its
// codes meet the activations as kCodes says: Q8_0's and Q6_K's by the sign trick, Q4_K's as they
// are, and Q4_0's (q - 8) given back their 8, the 8 then taken off once a row and block
// (Rows::corrections).
template <Codes256 kCodes_>
struct PackedHalf {
  static constexpr Codes256 kCodes = kCodes_;
  const PackedBlock* panel;
  int h;

  __attribute__((target("avx2"))) Operands256 group(std::int64_t t, std::int64_t g) const {
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[t].codes[g][8 * h]));
    if constexpr (kCodes == Codes256::kSigned) return {_mm256_abs_epi8(w), w};
    if constexpr (kCodes == Codes256::kCorrected)
      return {_mm256_add_epi8(w, _mm256_set1_epi8(8)), w};
    return {w, w};
  }
  __attribute__((target("avx2"))) __m256 scales(std::int64_t t) const {
    return _mm256_load_ps(panel[t].scales + 8 * h);
  }
  __attribute__((target("avx2"))) __m256 scales_high(std::int64_t t) const {
    return _mm256_load_ps(panel[t].scales_high + 8 * h);
  }
  __attribute__((target("avx2"))) __m256 minimums(std::int64_t t) const {
    return _mm256_load_ps(panel[t].minimums + 8 * h);
  }
  void ahead(std::int64_t) const {}  // packed in the cache already
};

// Half `h` of each block of a stored Q8_0 or Q4_0 panel read where it lies
// (runtime/weight_panels.hpp: each block its 16 outputs' f16 scales, then its codes): Q8_0's
// signed codes by the sign trick; Q4_0's nibbles q as they are (line u's low nibbles group u, its
// high ones group u + 4), the 8 taken off through Rows::corrections. The integers and the
// scales are the packed half's, so rows256 gives the same bits without packing a copy.
template <DType kFormat>
struct StoredHalf {
  static constexpr Codes256 kCodes =
      kFormat == DType::kQ8_0 ? Codes256::kSigned : Codes256::kCorrected;
  static constexpr std::int64_t kBlockBytes = detail::kStoredBlockBytes<kFormat>;
  static constexpr auto kLine = static_cast<std::int64_t>(sizeof(PackedBlock::codes[0]));
  const unsigned char* panel;
  int h;

  __attribute__((target("avx2"))) Operands256 group(std::int64_t t, std::int64_t g) const {
    const unsigned char* codes = panel + t * kBlockBytes + detail::kStoredScaleBytes + 32 * h;
    if constexpr (kFormat == DType::kQ8_0) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + g * kLine));
      return {_mm256_abs_epi8(w), w};
    } else {
      const __m256i line =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + g % 4 * kLine));
      const __m256i q =
          _mm256_and_si256(g < 4 ? line : _mm256_srli_epi16(line, 4), _mm256_set1_epi8(0x0F));
      return {q, q};
    }
  }
  __attribute__((target("avx2,f16c"))) __m256 scales(std::int64_t t) const {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + t * kBlockBytes + 16 * h)));
  }
  __attribute__((target("avx2,f16c"))) __m256 scales_high(std::int64_t t) const {
    return scales(t);
  }
  __attribute__((target("avx2"))) __m256 minimums(std::int64_t) const {
    return _mm256_setzero_ps();
  }
  // The stream of the panel's blocks, asked for once (by the first half's calls).
  void ahead(std::int64_t t) const {
    if (h == 0) detail::stream_ahead(panel + t * kBlockBytes, kBlockBytes);
  }
};

// `half` for R rows from row i0 (Half: PackedHalf or StoredHalf). The sums are named variables,
// not arrays, which gcc 12 keeps on the stack.
template <class Fm, int R, class Half>
__attribute__((target("avx2,fma,f16c"))) void rows256(const Rows& a, std::int64_t i0,
                                                      const Half& half, std::int64_t count,
                                                      float* c, std::int64_t ldc) {
  constexpr Codes256 kCodes = Half::kCodes;
  static_assert(kCodes != Codes256::kCorrected || !Fm::kTwoScales, "one correction a block");
  static_assert(R >= 1 && R <= 4);
  __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
  const std::int8_t* x0 = a.codes + i0 * a.k;  // row i0's codes; row i0 + r's are r k on
  for (std::int64_t t = 0; t < a.blocks; ++t) {
    half.ahead(t);
    const std::int8_t* x = x0 + t * kQ8DotBlock;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    // The block's sums of rows i0 .. i0 + R - 1 into their accumulators, scaled by d_w.
    const auto flush = [&](__m256 d_w) __attribute__((target("avx2,fma,f16c"))) {
      f0 = scale256(s0, a, i0, t, d_w, f0);
      if constexpr (R > 1) f1 = scale256(s1, a, i0 + 1, t, d_w, f1);
      if constexpr (R > 2) f2 = scale256(s2, a, i0 + 2, t, d_w, f2);
      if constexpr (R > 3) f3 = scale256(s3, a, i0 + 3, t, d_w, f3);
    };
    // Groups [from, to) of the block's 8.
    const auto groups = [&](std::int64_t from, std::int64_t to)
        __attribute__((target("avx2,fma,f16c"))) {
      for (std::int64_t g = from; g < to; ++g) {
        const Operands256 o = half.group(t, g);
        s0 = group256<kCodes>(o.magnitude, o.w, x + 4 * g, s0);
        if constexpr (R > 1) s1 = group256<kCodes>(o.magnitude, o.w, x + a.k + 4 * g, s1);
        if constexpr (R > 2) s2 = group256<kCodes>(o.magnitude, o.w, x + 2 * a.k + 4 * g, s2);
        if constexpr (R > 3) s3 = group256<kCodes>(o.magnitude, o.w, x + 3 * a.k + 4 * g, s3);
      }
    };
    if constexpr (Fm::kTwoScales) {  // inputs 0-15 under the block's first scale
      groups(0, kPanelGroups / 2);
      flush(half.scales(t));
      s0 = s1 = s2 = s3 = _mm256_setzero_si256();
      groups(kPanelGroups / 2, kPanelGroups);
    } else {
      groups(0, kPanelGroups);
    }
    if constexpr (kCodes == Codes256::kCorrected) {
      const std::int32_t* correction = a.corrections + i0 * a.blocks + t;
      s0 = _mm256_add_epi32(s0, _mm256_set1_epi32(correction[0]));
      if constexpr (R > 1) s1 = _mm256_add_epi32(s1, _mm256_set1_epi32(correction[a.blocks]));
      if constexpr (R > 2) s2 = _mm256_add_epi32(s2, _mm256_set1_epi32(correction[2 * a.blocks]));
      if constexpr (R > 3) s3 = _mm256_add_epi32(s3, _mm256_set1_epi32(correction[3 * a.blocks]));
    }
    flush(Fm::kTwoScales ? half.scales_high(t) : half.scales(t));
    if constexpr (Fm::kMinimums) {
      const __m256 minimums = half.minimums(t);
      const float* sums = a.sums + i0 * a.blocks + t;
      f0 = _mm256_fmadd_ps(_mm256_set1_ps(sums[0]), minimums, f0);
      if constexpr (R > 1) f1 = _mm256_fmadd_ps(_mm256_set1_ps(sums[a.blocks]), minimums, f1);
      if constexpr (R > 2) f2 = _mm256_fmadd_ps(_mm256_set1_ps(sums[2 * a.blocks]), minimums, f2);
      if constexpr (R > 3) f3 = _mm256_fmadd_ps(_mm256_set1_ps(sums[3 * a.blocks]), minimums, f3);
    }
  }
  const __m256 f[4] = {f0, f1, f2, f3};
  for (int r = 0; r < R; ++r) {
    if (count == 8) {
      _mm256_storeu_ps(c + r * ldc, f[r]);
    } else {
      alignas(32) float out[8];
      _mm256_store_ps(out, f[r]);
      std::copy_n(out, count, c + r * ldc);
    }
  }
}

// ---- AVX-512 with VNNI: 16 outputs a register, two panels at once
// --------------------------------

#define NUMESH_PACKED_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Panels p0 and p1 (outputs c[0 .. n0) and c[16 .. 16 + n1); P = 1: p0 alone) for R rows from
// row i0, their codes as unsigned bytes x + 128, the packed bias starting each sum.
template <class Fm, int R, int P>
NUMESH_PACKED_AVX512 void rows512(const Rows& a, std::int64_t i0, const PackedBlock* p0,
                                  const PackedBlock* p1, std::int64_t n0, std::int64_t n1, float* c,
                                  std::int64_t ldc) {
  __m512 f[R][P];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < P; ++v) f[r][v] = _mm512_setzero_ps();
  }
  for (std::int64_t t = 0; t < a.blocks; ++t) {
    const PackedBlock* p[2] = {p0 + t, P > 1 ? p1 + t : p0 + t};
    __m512i s[R][P];
    for (int v = 0; v < P; ++v) {
      const __m512i bias = _mm512_load_si512(p[v]->bias);
      for (int r = 0; r < R; ++r) s[r][v] = bias;
    }
    for (std::int64_t g = 0; g < kPanelGroups; ++g) {
      if (Fm::kTwoScales && g == kPanelGroups / 2) {
        for (int v = 0; v < P; ++v) {
          const __m512 d_w = _mm512_load_ps(p[v]->scales);
          const __m512i bias = _mm512_load_si512(p[v]->bias_high);
          for (int r = 0; r < R; ++r) {
            const __m512 scale =
                _mm512_mul_ps(_mm512_set1_ps(a.scales[(i0 + r) * a.blocks + t]), d_w);
            f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][v]), scale, f[r][v]);
            s[r][v] = bias;
          }
        }
      }
      __m512i w[P];
      for (int v = 0; v < P; ++v) w[v] = _mm512_load_si512(p[v]->codes[g]);
      for (int r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, a.unsigned_codes + (i0 + r) * a.k + t * kQ8DotBlock + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(four);
        for (int v = 0; v < P; ++v) s[r][v] = _mm512_dpbusd_epi32(s[r][v], x, w[v]);
      }
    }
    for (int v = 0; v < P; ++v) {
      const __m512 d_w = _mm512_load_ps(Fm::kTwoScales ? p[v]->scales_high : p[v]->scales);
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(a.scales[(i0 + r) * a.blocks + t]), d_w);
        f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][v]), scale, f[r][v]);
      }
      if constexpr (Fm::kMinimums) {
        const __m512 minimums = _mm512_load_ps(p[v]->minimums);
        for (int r = 0; r < R; ++r) {
          f[r][v] =
              _mm512_fmadd_ps(_mm512_set1_ps(a.sums[(i0 + r) * a.blocks + t]), minimums, f[r][v]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, static_cast<__mmask16>((1u << n0) - 1), f[r][0]);
    if constexpr (P > 1) {
      _mm512_mask_storeu_ps(c + r * ldc + kPanelOutputs, static_cast<__mmask16>((1u << n1) - 1),
                            f[r][1]);
    }
  }
}

// What a stored panel's codes are offset by as unsigned bytes: Q8_0's q + 128 (q ^ 0x80), Q4_0's
// nibble q + 8 as stored.
template <DType kFormat>
inline constexpr std::int32_t kStoredOffset = kFormat == DType::kQ8_0 ? 128 : 8;

// Group g's (inputs 4g .. 4g + 3 of a block) codes of the 16 outputs of a stored panel block whose
// codes start at `codes`, as unsigned bytes q + kStoredOffset: Q8_0's line g flipped, Q4_0's low
// nibbles of line g (g < 4) or high nibbles of line g - 4 (runtime/weight_panels.hpp).
template <DType kFormat>
NUMESH_PACKED_AVX512 inline __m512i stored_group(const unsigned char* codes, int g) {
  constexpr auto kLine = static_cast<std::int64_t>(sizeof(PackedBlock::codes[0]));
  if constexpr (kFormat == DType::kQ8_0) {
    return _mm512_xor_si512(_mm512_loadu_si512(codes + g * kLine),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m512i line = _mm512_loadu_si512(codes + (g % 4) * kLine);
    const __m512i low = _mm512_set1_epi8(0x0F);
    return g < 4 ? _mm512_and_si512(line, low) : _mm512_and_si512(_mm512_srli_epi16(line, 4), low);
  }
}

// Panels p0 and p1 of stored Q8_0 or Q4_0 weights read where they lie (runtime/weight_panels.hpp:
// each block its 16 outputs' f16 scales, then its codes; P = 1: p0 alone) for R rows from row i0:
// the codes as unsigned bytes q + kStoredOffset meet a row's 4 signed codes in vpdpbusd, each
// block's sums starting at -kStoredOffset times the row's block's sum of codes (Rows::
// corrections), so that they come out as rows512's, exact, and the scale products and fmas follow
// in its order: the same bits, without packing (a copy of every weight a call: one row ran at
// half the decode kernel's speed).
template <DType kFormat, int R, int P>
NUMESH_PACKED_AVX512 void rows512_stored(const Rows& a, std::int64_t i0, const unsigned char* p0,
                                         const unsigned char* p1, std::int64_t n0, std::int64_t n1,
                                         float* c, std::int64_t ldc) {
  constexpr std::int64_t kBlockBytes = detail::kStoredBlockBytes<kFormat>;
  __m512 f[R][P];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < P; ++v) f[r][v] = _mm512_setzero_ps();
  }
  for (std::int64_t t = 0; t < a.blocks; ++t) {
    const unsigned char* p[2] = {p0 + t * kBlockBytes, (P > 1 ? p1 : p0) + t * kBlockBytes};
    detail::stream_ahead(p[0], kBlockBytes);
    if constexpr (P > 1) detail::stream_ahead(p[1], kBlockBytes);
    // Two chains of vpdpbusd a row and panel (the even and the odd groups), added at the end:
    // integers, exact in any order; one chain of eight left a row waiting on their latency.
    __m512i s[R][P], odd[R][P];
    for (int r = 0; r < R; ++r) {
      const __m512i start = _mm512_set1_epi32(a.corrections[(i0 + r) * a.blocks + t]);
      for (int v = 0; v < P; ++v) {
        s[r][v] = start;
        odd[r][v] = _mm512_setzero_si512();
      }
    }
    std::int32_t x4[R][kPanelGroups];
    for (int r = 0; r < R; ++r) {
      std::memcpy(x4[r], a.codes + (i0 + r) * a.k + t * kQ8DotBlock, sizeof x4[r]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < kPanelGroups; ++g) {
      __m512i w[P];
      for (int v = 0; v < P; ++v) w[v] = stored_group<kFormat>(p[v] + detail::kStoredScaleBytes, g);
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(x4[r][g]);
        for (int v = 0; v < P; ++v) {
          if (g % 2 == 0) {
            s[r][v] = _mm512_dpbusd_epi32(s[r][v], w[v], x);
          } else {
            odd[r][v] = _mm512_dpbusd_epi32(odd[r][v], w[v], x);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < P; ++v) s[r][v] = _mm512_add_epi32(s[r][v], odd[r][v]);
    }
    for (int v = 0; v < P; ++v) {
      const __m512 d_w =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[v])));
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(a.scales[(i0 + r) * a.blocks + t]), d_w);
        f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][v]), scale, f[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, static_cast<__mmask16>((1u << n0) - 1), f[r][0]);
    if constexpr (P > 1) {
      _mm512_mask_storeu_ps(c + r * ldc + kPanelOutputs, static_cast<__mmask16>((1u << n1) - 1),
                            f[r][1]);
    }
  }
}

// rows512_stored for `rows` rows and the panel at `w` (outputs [0, n0)) with, when n1 > 0, the
// next one (outputs [16, 16 + n1)); stored panels are `ldw` bytes an output apart. Panels that
// come from memory (`streamed`: the first rows a pair meets) are taken one after the other, one
// stream; panels in the cache, the pair at once, each broadcast of a row's codes shared. On Zen 4
// the pair's two streams from memory decoded the 109 M Llama slower (a panel at a time: q8_0
// 1.1x and q4_0 1.4x faster with one sequence, 1.45x and 1.15x with four), and a panel at a
// time over the rows that follow (from the cache) prefilled q4_0 0.84x as fast
// (docs/benchmarks.md, "Session 59"). The bits are the same either way: each output's sums are
// its own.
template <DType kFormat>
void rows512_stored_any(std::int64_t rows, const Rows& a, std::int64_t i0, const unsigned char* w,
                        std::int64_t ldw, std::int64_t n0, std::int64_t n1, bool streamed, float* c,
                        std::int64_t ldc) {
  with_rows(rows, [&]<int R>() {
    const unsigned char* next = w + n0 * ldw;
    if (n1 > 0 && !streamed) return rows512_stored<kFormat, R, 2>(a, i0, w, next, n0, n1, c, ldc);
    rows512_stored<kFormat, R, 1>(a, i0, w, w, n0, 0, c, ldc);
    if (n1 > 0) rows512_stored<kFormat, R, 1>(a, i0, next, next, n1, 0, c + kPanelOutputs, ldc);
  });
}

template <class Fm, int P>
void rows512_any(std::int64_t rows, const Rows& a, std::int64_t i0, const PackedBlock* p0,
                 const PackedBlock* p1, std::int64_t n0, std::int64_t n1, float* c,
                 std::int64_t ldc) {
  with_rows(rows, [&]<int R>() { rows512<Fm, R, P>(a, i0, p0, p1, n0, n1, c, ldc); });
}

// ---- AMX: a block's integer sums of 16 rows by 16 outputs in one tile product ------------

#define NUMESH_PACKED_AMX \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

constexpr std::int64_t kTileRows = 16;  // rows of activations a tile product takes

// The rows of m that `level` gives to tile products: whole groups of 16 at the amx level, none
// below it (the rest go to the VNNI kernel, which gives the same bits).
std::int64_t rows_for_tiles(std::int64_t m, KernelLevel level) {
  return level == KernelLevel::kAmx ? m / kTileRows * kTileRows : 0;
}

// Tiles 0-3 hold int32 sums (16 rows of 16 outputs), 4 and 5 activation codes (16 rows), 6 and
// 7 packed weight codes (the VNNI layout: a tile row is 4 inputs of each of the 16 outputs, which
// is PackedBlock::codes). One scale a block: a whole block a product, four in flight. Two scales
// (Q6_K): a block's inputs 0-15 and 16-31 in tiles 4, 6 and 5, 7, two blocks in flight. Four sums
// in flight, because a product's sums can be stored only some tens of cycles after it starts:
// with two, tile_sums waited on them for most of its time.
template <class Fm>
NUMESH_PACKED_AMX void configure_tiles() {
  constexpr std::int64_t inputs = Fm::kTwoScales ? kQ8DotBlock / 2 : kQ8DotBlock;
  detail::TileConfig config;
  for (int t = 0; t < 4; ++t) {
    config.rows[t] = kTileRows;
    config.row_bytes[t] = kPanelOutputs * 4;
  }
  for (int t = 4; t < 6; ++t) {
    config.rows[t] = kTileRows;
    config.row_bytes[t] = inputs;
    config.rows[t + 2] = inputs / 4;
    config.row_bytes[t + 2] = kPanelOutputs * 4;
  }
  detail::load_tile_config(config);
}

NUMESH_PACKED_AMX void release_tiles() { _tile_release(); }

// (A struct, not std::array<__m512, 16>: the template argument would drop __m512's attributes.)
struct TileAccumulators {
  __m512 v[kTileRows];
};

// The blocks of one panel as the tile products read them: packed (PackedBlock, whatever the
// format), or a stored Q8_0 panel where it lies (runtime/weight_panels.hpp: each block its 16
// outputs' f16 scales, then its codes in PackedBlock's order), which spares the tile the panel's
// packing, a copy and a scale conversion a block (16 % of a 256-token q8_0 prefill's time).
struct PackedSource {
  const PackedBlock* blocks;
  const std::int8_t* codes(std::int64_t t) const noexcept { return &blocks[t].codes[0][0][0]; }
  NUMESH_PACKED_AMX __m512 scales(std::int64_t t) const noexcept {
    return _mm512_load_ps(blocks[t].scales);
  }
};
struct StoredQ8_0Source {
  static constexpr std::int64_t kBlockBytes = detail::kStoredBlockBytes<DType::kQ8_0>;
  const unsigned char* panel;
  const std::int8_t* codes(std::int64_t t) const noexcept {
    return reinterpret_cast<const std::int8_t*>(panel + t * kBlockBytes +
                                                detail::kStoredScaleBytes);
  }
  NUMESH_PACKED_AMX __m512 scales(std::int64_t t) const noexcept {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * kBlockBytes)));
  }
};

// f[r] = fma(f32(sums[r]), d_a[r] * d_w, f[r]) for the 16 rows (sums 16 int32 a row): the
// scalar kernel's step. The rows are a parameter pack so that every index is a constant and the
// accumulators stay in registers (a loop over them, even unrolled, left them on the stack).
template <std::size_t... R>
NUMESH_PACKED_AMX inline void scale_sums(const std::int32_t* sums, __m512 d_w, const float* d_a,
                                         std::int64_t stride, TileAccumulators& f,
                                         std::index_sequence<R...>) {
  ((f.v[R] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + R * kPanelOutputs)),
                             _mm512_mul_ps(_mm512_set1_ps(d_a[R * stride]), d_w), f.v[R])),
   ...);
}

// Q4_K: f[r] = fma(the activations' scaled block sum of row r, the block's -dmin m, f[r]).
template <std::size_t... R>
NUMESH_PACKED_AMX inline void add_minimums(const PackedBlock& p, const float* block_sums,
                                           std::int64_t stride, TileAccumulators& f,
                                           std::index_sequence<R...>) {
  const __m512 minimums = _mm512_load_ps(p.minimums);
  ((f.v[R] = _mm512_fmadd_ps(_mm512_set1_ps(block_sums[R * stride]), minimums, f.v[R])), ...);
}

// Blocks a tile16 pass multiplies before it scales them: their sums, 1 KiB a block (2 for two
// scales), stay in L1.
constexpr std::int64_t kTileBlocks = 16;

// One block's sums (one scale a block) into tile C from activation codes at `a` and packed codes
// at `b`, by way of tiles A and B.
#define NUMESH_TILE_BLOCK(C, A, B, a, b, k) \
  _tile_loadd(A, a, k);                     \
  _tile_loadd(B, b, kPanelOutputs * 4);     \
  _tile_zero(C);                            \
  _tile_dpbssd(C, A, B)

// The integer sums of blocks [t0, t0 + count) of 16 rows (codes at x, rows k apart) by one
// panel, 256 int32 a block (two scales: the block's inputs 0-15, then 16-31), into sums. The
// tile products run four in flight, and the sums are read only once all are stored: a vector
// load right after a tile store waited for it.
template <class Fm, class Source>
NUMESH_PACKED_AMX void tile_sums(const std::int8_t* x, std::int64_t k, const Source& panel,
                                 std::int64_t t0, std::int64_t count, std::int32_t* sums) {
  constexpr std::int64_t kRowBytes = kPanelOutputs * 4;
  constexpr std::int64_t kSums = kTileRows * kPanelOutputs;
  constexpr std::int64_t kHalf = kQ8DotBlock / 2;
  constexpr std::int64_t kHighCodes = kPanelGroups / 2 * kRowBytes;  // inputs 16-31's codes
  const std::int64_t end = t0 + count;
  std::int64_t t = t0;
  if constexpr (Fm::kTwoScales) {
    for (; t + 2 <= end; t += 2) {
      std::int32_t* out = sums + 2 * (t - t0) * kSums;
      const std::int8_t* a = x + t * kQ8DotBlock;
      NUMESH_TILE_BLOCK(0, 4, 6, a, panel.codes(t), k);
      NUMESH_TILE_BLOCK(1, 5, 7, a + kHalf, panel.codes(t) + kHighCodes, k);
      NUMESH_TILE_BLOCK(2, 4, 6, a + kQ8DotBlock, panel.codes(t + 1), k);
      NUMESH_TILE_BLOCK(3, 5, 7, a + kQ8DotBlock + kHalf, panel.codes(t + 1) + kHighCodes, k);
      _tile_stored(0, out, kRowBytes);
      _tile_stored(1, out + kSums, kRowBytes);
      _tile_stored(2, out + 2 * kSums, kRowBytes);
      _tile_stored(3, out + 3 * kSums, kRowBytes);
    }
    if (t < end) {
      std::int32_t* out = sums + 2 * (t - t0) * kSums;
      const std::int8_t* a = x + t * kQ8DotBlock;
      NUMESH_TILE_BLOCK(0, 4, 6, a, panel.codes(t), k);
      NUMESH_TILE_BLOCK(1, 5, 7, a + kHalf, panel.codes(t) + kHighCodes, k);
      _tile_stored(0, out, kRowBytes);
      _tile_stored(1, out + kSums, kRowBytes);
    }
  } else {
    for (; t + 4 <= end; t += 4) {
      std::int32_t* out = sums + (t - t0) * kSums;
      const std::int8_t* a = x + t * kQ8DotBlock;
      NUMESH_TILE_BLOCK(0, 4, 6, a, panel.codes(t), k);
      NUMESH_TILE_BLOCK(1, 5, 7, a + kQ8DotBlock, panel.codes(t + 1), k);
      NUMESH_TILE_BLOCK(2, 4, 6, a + 2 * kQ8DotBlock, panel.codes(t + 2), k);
      NUMESH_TILE_BLOCK(3, 5, 7, a + 3 * kQ8DotBlock, panel.codes(t + 3), k);
      _tile_stored(0, out, kRowBytes);
      _tile_stored(1, out + kSums, kRowBytes);
      _tile_stored(2, out + 2 * kSums, kRowBytes);
      _tile_stored(3, out + 3 * kSums, kRowBytes);
    }
    for (; t < end; ++t) {
      NUMESH_TILE_BLOCK(0, 4, 6, x + t * kQ8DotBlock, panel.codes(t), k);
      _tile_stored(0, sums + (t - t0) * kSums, kRowBytes);
    }
  }
}

#undef NUMESH_TILE_BLOCK

// Rows i0 .. i0 + 15 by one panel (outputs c[0 .. count)), the tiles configured for Fm: each
// kTileBlocks blocks' integer sums by tile products, then their scale products and fmas in the
// scalar kernel's order.
template <class Fm, class Source>
NUMESH_PACKED_AMX void tile16(const Rows& a, std::int64_t i0, const Source& panel,
                              std::int64_t count, float* c, std::int64_t ldc) {
  constexpr std::int64_t kSums = kTileRows * kPanelOutputs;
  constexpr std::int64_t kPerBlock = Fm::kTwoScales ? 2 : 1;
  alignas(64) std::int32_t sums[kTileBlocks * kPerBlock * kSums];
  constexpr auto rows = std::make_index_sequence<kTileRows>();
  TileAccumulators f;
  for (auto& v : f.v) v = _mm512_setzero_ps();
  const std::int8_t* x = a.codes + i0 * a.k;
  const float* d_a = a.scales + i0 * a.blocks;
  for (std::int64_t t0 = 0; t0 < a.blocks; t0 += kTileBlocks) {
    const std::int64_t blocks = std::min(kTileBlocks, a.blocks - t0);
    tile_sums<Fm>(x, a.k, panel, t0, blocks, sums);
    for (std::int64_t t = t0; t < t0 + blocks; ++t) {
      const std::int32_t* block = sums + (t - t0) * kPerBlock * kSums;
      scale_sums(block, panel.scales(t), d_a + t, a.blocks, f, rows);
      if constexpr (Fm::kTwoScales) {
        scale_sums(block + kSums, _mm512_load_ps(panel.blocks[t].scales_high), d_a + t, a.blocks, f,
                   rows);
      }
      if constexpr (Fm::kMinimums) {
        add_minimums(panel.blocks[t], a.sums + i0 * a.blocks + t, a.blocks, f, rows);
      }
    }
  }
  const auto mask = static_cast<__mmask16>((1u << count) - 1);
  for (int r = 0; r < kTileRows; ++r) _mm512_mask_storeu_ps(c + r * ldc, mask, f.v[r]);
}

// rows256 for one row (i0) and both halves of a panel (`low` and `high`, 8 outputs each) in one
// pass: each of the panel's 64-byte lines is read whole once, where two passes of a half read
// half of every line each (the first from memory, at half its use); the row's 4 codes are
// broadcast once for both. The same sums in the same order as rows256's, so the same bits. For
// decode's single rows of stored panels.
template <class Fm, class Half>
__attribute__((target("avx2,fma,f16c"))) void row256_both(const Rows& a, std::int64_t i0,
                                                          const Half& low, const Half& high,
                                                          float* c) {
  constexpr Codes256 kCodes = Half::kCodes;
  static_assert(!Fm::kTwoScales && !Fm::kMinimums, "the pair formats");
  __m256 f0 = _mm256_setzero_ps(), f1 = f0;
  const std::int8_t* x0 = a.codes + i0 * a.k;
  for (std::int64_t t = 0; t < a.blocks; ++t) {
    low.ahead(t);
    const std::int8_t* x = x0 + t * kQ8DotBlock;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    for (std::int64_t g = 0; g < kPanelGroups; ++g) {
      const Operands256 o0 = low.group(t, g), o1 = high.group(t, g);
      s0 = group256<kCodes>(o0.magnitude, o0.w, x + 4 * g, s0);
      s1 = group256<kCodes>(o1.magnitude, o1.w, x + 4 * g, s1);
    }
    if constexpr (kCodes == Codes256::kCorrected) {
      const __m256i correction = _mm256_set1_epi32(a.corrections[i0 * a.blocks + t]);
      s0 = _mm256_add_epi32(s0, correction);
      s1 = _mm256_add_epi32(s1, correction);
    }
    f0 = scale256(s0, a, i0, t, low.scales(t), f0);
    f1 = scale256(s1, a, i0, t, high.scales(t), f1);
  }
  _mm256_storeu_ps(c, f0);
  _mm256_storeu_ps(c + 8, f1);
}

// rows256 for `rows` rows of half h of a packed panel.
template <class Fm>
void rows256_any(std::int64_t rows, const Rows& a, std::int64_t i0, const PackedBlock* panel, int h,
                 std::int64_t count, float* c, std::int64_t ldc) {
  with_rows(rows, [&]<int R>() {
    if constexpr (Fm::kMinimums) {
      return rows256<Fm, R>(a, i0, PackedHalf<Codes256::kUnsigned>{panel, h}, count, c,
                            ldc);  // Q4_K
    } else if constexpr (!Fm::kTwoScales) {
      if (a.corrections != nullptr) {  // Q4_0, below VNNI
        return rows256<Fm, R>(a, i0, PackedHalf<Codes256::kCorrected>{panel, h}, count, c, ldc);
      }
    }
    rows256<Fm, R>(a, i0, PackedHalf<Codes256::kSigned>{panel, h}, count, c, ldc);
  });
}

// rows256 for `rows` rows of the stored Q8_0 or Q4_0 panel at `panel` (16 outputs into c): one
// row both halves at once (row256_both), more rows a half at a time (each half's codes then
// serve up to 4 rows).
template <DType kFormat>
void rows256_stored(std::int64_t rows, const Rows& a, std::int64_t i0, const unsigned char* panel,
                    float* c, std::int64_t ldc) {
  const StoredHalf<kFormat> low{panel, 0}, high{panel, 1};
  if (rows == 1) return row256_both<PairForm>(a, i0, low, high, c);
  with_rows(rows, [&]<int R>() {
    rows256<PairForm, R>(a, i0, low, 8, c, ldc);
    rows256<PairForm, R>(a, i0, high, 8, c + 8, ldc);
  });
}

// The activations' codes as unsigned bytes, x + 128 (x ^ 0x80), for the VNNI kernel.
NUMESH_PACKED_AVX512 void to_unsigned(const std::int8_t* codes, std::int64_t count,
                                      std::uint8_t* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  std::int64_t e = 0;
  for (; e + 64 <= count; e += 64) {
    _mm512_storeu_si512(out + e, _mm512_xor_si512(_mm512_loadu_si512(codes + e), flip));
  }
  for (; e < count; ++e) out[e] = static_cast<std::uint8_t>(codes[e] ^ 0x80);
}

// out[t] = -offset times the sum of the codes of block t, for `count` consecutive blocks of
// activation codes (rows k apart are consecutive blocks): rows512_stored's starting sums. The
// tile calls this for every tile of rows, so 8 blocks a step (a scalar loop took 13 % of a
// 256-token q4_0 prefill on Zen 5). AVX2 only: rows256 takes them too.
__attribute__((target("avx2"))) void stored_corrections(const std::int8_t* codes,
                                                        std::int64_t count, std::int32_t offset,
                                                        std::int32_t* out) {
  const __m256i times = _mm256_set1_epi32(-offset);
  std::int64_t t = 0;
  for (; t + detail::kKquantBlocks <= count; t += detail::kKquantBlocks) {
    const __m256i sums = detail::q8dot_code_sums8(codes + t * kQ8DotBlock);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t), _mm256_mullo_epi32(sums, times));
  }
  for (; t < count; ++t) {
    std::int32_t sum = 0;
    for (std::int64_t e = 0; e < kQ8DotBlock; ++e) sum += codes[t * kQ8DotBlock + e];
    out[t] = -offset * sum;
  }
}

// The stored weights as packed_panels packs them: rows of blocks `ldw` bytes apart, of which
// the first `panel_outputs` may be stored panels (runtime/weight_panels.hpp).
struct StoredWeights {
  const unsigned char* w;
  std::int64_t ldw;
  std::int64_t panel_outputs;
  DType dtype;
  std::int64_t k;
};

// Packs outputs [j, j + count) of `b` by `pack`, or from their stored panel (whose codes lie in
// the packed order already: a copy for Q8_0, the nibbles split for Q4_0).
void pack_outputs(const StoredWeights& b, std::int64_t j, std::int64_t count, std::int64_t blocks,
                  detail::PanelPacker pack, KernelLevel level, bool vnni_bias, PackedBlock* out) {
  if (j >= b.panel_outputs) {
    pack(b.w + j * b.ldw, b.ldw, count, blocks, level, vnni_bias, out);
  } else if (b.dtype == DType::kQ8_0) {
    detail::pack_stored_panel<DType::kQ8_0>(b.w + j * b.ldw, blocks, level, vnni_bias, out);
  } else {
    detail::pack_stored_panel<DType::kQ4_0>(b.w + j * b.ldw, blocks, level, vnni_bias, out);
  }
}

// Every pair of panels: packed, then multiplied by every group of rows (the packed pair, 1.6
// bytes a weight of its 32 outputs, stays in cache while the rows pass).
template <class Fm>
void packed_panels(std::int64_t m, std::int64_t n, const Rows& a, const StoredWeights& b,
                   detail::PanelPacker pack, float* c, std::int64_t ldc, KernelLevel level) {
  thread_local std::vector<PackedBlock> packed;
  const auto need = static_cast<std::size_t>(2 * a.blocks);
  if (packed.size() < need) packed.resize(need);
  PackedBlock* p0 = packed.data();
  PackedBlock* p1 = packed.data() + a.blocks;
  const std::int64_t tile_rows = rows_for_tiles(m, level);
  const bool vnni_bias = level >= KernelLevel::kAvx512Bf16 && tile_rows < m;
  if (tile_rows > 0) configure_tiles<Fm>();
  for (std::int64_t j = 0; j < n; j += 2 * kPanelOutputs) {
    const std::int64_t n0 = std::min(kPanelOutputs, n - j);
    const std::int64_t n1 = std::min(kPanelOutputs, std::max<std::int64_t>(0, n - j - n0));
    // The tile products read stored Q8_0 panels where they lie, and the rows (VNNI's, or AVX2's
    // below it) a pair of panels both stored (Q8_0 or Q4_0); the packed panels serve every other
    // panel and the rows of the scalar level.
    const bool stored0 = j < b.panel_outputs, stored1 = stored0 && j + n0 < b.panel_outputs;
    const bool direct0 = tile_rows > 0 && stored0 && b.dtype == DType::kQ8_0;
    const bool direct1 = direct0 && stored1;
    const bool rest = tile_rows < m;
    // (A stored panel means corrections wherever the rows need them: packed_gemm_q8.)
    const bool rest_direct = level >= KernelLevel::kAvx2 && stored0 && (n1 == 0 || stored1);
    const bool rest_packed = rest && !rest_direct;
    const bool tiles = tile_rows > 0;
    if ((tiles && !direct0) || rest_packed) {
      pack_outputs(b, j, n0, a.blocks, pack, level, vnni_bias, p0);
    }
    if (n1 > 0 && ((tiles && !direct1) || rest_packed)) {
      pack_outputs(b, j + n0, n1, a.blocks, pack, level, vnni_bias, p1);
    }
    // Rows r0 .. r0 + 15 by the panel of outputs [jp, jp + count): stored or packed.
    const auto tile_panel = [&](std::int64_t r0, std::int64_t jp, std::int64_t count, bool direct,
                                const PackedBlock* packed_panel) {
      float* out = c + r0 * ldc + jp;
      if constexpr (std::is_same_v<Fm, PairForm>) {
        if (direct) return tile16<Fm>(a, r0, StoredQ8_0Source{b.w + jp * b.ldw}, count, out, ldc);
      }
      tile16<Fm>(a, r0, PackedSource{packed_panel}, count, out, ldc);
    };
    for (std::int64_t r0 = 0; r0 < tile_rows; r0 += kTileRows) {
      tile_panel(r0, j, n0, direct0, p0);
      if (n1 > 0) tile_panel(r0, j + n0, n1, direct1, p1);
    }
    for (std::int64_t i = tile_rows; i < m; i += kRowsAtOnce) {
      const std::int64_t rows = std::min(kRowsAtOnce, m - i);
      float* out = c + i * ldc + j;
      switch (level) {
        case KernelLevel::kAmx:
        case KernelLevel::kAvx512Bf16:
          if (rest_direct && b.dtype == DType::kQ8_0 && rows == 1 && i == tile_rows) {
            // One row of q8_0 from memory by the AVX2 row (sign trick, both halves of each
            // line in a pass): the same integers and float steps as the VNNI rows, so the same
            // bits, and on Zen 4 1.2-1.45x the VNNI row's decode (`numesh bench decode`, 109 M
            // Llama's shape; level for q4_0, which keeps the VNNI row): docs/benchmarks.md,
            // "Session 59".
            rows256_stored<DType::kQ8_0>(1, a, i, b.w + j * b.ldw, out, ldc);
            if (n1 > 0)
              rows256_stored<DType::kQ8_0>(1, a, i, b.w + (j + n0) * b.ldw, out + 16, ldc);
          } else if (rest_direct) {
            const auto stored_any = b.dtype == DType::kQ8_0 ? rows512_stored_any<DType::kQ8_0>
                                                            : rows512_stored_any<DType::kQ4_0>;
            stored_any(rows, a, i, b.w + j * b.ldw, b.ldw, n0, n1, i == tile_rows, out, ldc);
          } else if (n1 > 0) {
            rows512_any<Fm, 2>(rows, a, i, p0, p1, n0, n1, out, ldc);
          } else {
            rows512_any<Fm, 1>(rows, a, i, p0, p0, n0, 0, out, ldc);
          }
          break;
        case KernelLevel::kAvx512:
        case KernelLevel::kAvx2:
          for (int panel = 0; panel < 2; ++panel) {
            const std::int64_t count = panel == 0 ? n0 : n1;
            if (rest_direct && count > 0) {  // whole stored panels
              const unsigned char* stored = b.w + (j + n0 * panel) * b.ldw;
              if (b.dtype == DType::kQ8_0) {
                rows256_stored<DType::kQ8_0>(rows, a, i, stored, out + 16 * panel, ldc);
              } else {
                rows256_stored<DType::kQ4_0>(rows, a, i, stored, out + 16 * panel, ldc);
              }
              continue;
            }
            for (int h = 0; h < 2 && 8 * h < count; ++h) {
              rows256_any<Fm>(rows, a, i, panel == 0 ? p0 : p1, h,
                              std::min<std::int64_t>(8, count - 8 * h), out + 16 * panel + 8 * h,
                              ldc);
            }
          }
          break;
        case KernelLevel::kScalar:
          rows_scalar<Fm>(rows, a, i, p0, n0, out, ldc);
          if (n1 > 0) rows_scalar<Fm>(rows, a, i, p1, n1, out + kPanelOutputs, ldc);
          break;
      }
    }
  }
  if (tile_rows > 0) release_tiles();
}

}  // namespace

void packed_gemm_q8(std::int64_t m, const std::int8_t* codes, const float* scales,
                    const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  NUMESH_CHECK(!is_element_dtype(b.dtype), TypeError,
               "packed_gemm_q8: weights of dtype {}; it takes the block formats",
               to_string(b.dtype));
  NUMESH_CHECK(b.layout == WeightLayout::kOutIn, ShapeError,
               "packed_gemm_q8: {} weights stored in-out; block-format weights are stored out-in "
               "([n, k])",
               to_string(b.dtype));
  const std::int64_t n = b.cols, k = b.rows, ld = b.ld != 0 ? b.ld : k;
  const std::int64_t block = traits(b.dtype).block_elements;
  NUMESH_CHECK(
      m >= 0 && n >= 0 && k >= 0 && k % block == 0 && ld >= k && ld % block == 0 && ldc >= n,
      ShapeError,
      "packed_gemm_q8: m {}, n {}, k {} with ldb {}, ldc {}: sizes must be >= 0, k and "
      "ldb whole blocks of {} ({}) and each leading dimension at least its row's length",
      m, n, k, ld, ldc, block, to_string(b.dtype));
  NUMESH_CHECK(b.panel_outputs == 0 || runtime::has_panels(b.dtype), TypeError,
               "packed_gemm_q8: {} weights have no panel layout", to_string(b.dtype));
  NUMESH_CHECK(b.panel_outputs == 0 ||
                   (b.panel_outputs % runtime::kPanelWidth == 0 && b.panel_outputs <= n && ld == k),
               ShapeError,
               "packed_gemm_q8: {} panel outputs of {} {} weights with ldb {} for k {}: panels are "
               "whole (16 outputs), within the matrix and packed (ldb = k)",
               b.panel_outputs, n, to_string(b.dtype), ld, k);
  if (m == 0 || n == 0) return;
  const std::int64_t blocks = k / kQ8DotBlock;
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t ldw = ld / block * traits(b.dtype).block_bytes;
  thread_local std::vector<std::uint8_t> unsigned_codes;
  Rows a{codes, nullptr, scales, nullptr, k, blocks};
  const bool vnni = level >= KernelLevel::kAvx512Bf16;
  // The VNNI kernel's rows only: AMX multiplies the signed codes of whole groups of 16.
  const std::int64_t first = vnni ? rows_for_tiles(m, level) : 0;
  // Unsigned codes for the VNNI rows on packed panels only: none when every output is in stored
  // panels.
  if (vnni && b.panel_outputs < n) {
    unsigned_codes.resize(static_cast<std::size_t>(m * k));
    to_unsigned(codes + first * k, (m - first) * k, unsigned_codes.data() + first * k);
    a.unsigned_codes = unsigned_codes.data();
  }
  // Rows::corrections: the VNNI rows' starting sums on stored panels, and below VNNI Q4_0's,
  // whose nibbles rows256 takes unsigned.
  if (vnni ? b.panel_outputs > 0 : level >= KernelLevel::kAvx2 && b.dtype == DType::kQ4_0) {
    const std::int32_t offset =
        b.dtype == DType::kQ8_0 ? kStoredOffset<DType::kQ8_0> : kStoredOffset<DType::kQ4_0>;
    thread_local std::vector<std::int32_t> corrections;
    corrections.resize(static_cast<std::size_t>(m * blocks));
    stored_corrections(codes + first * k, (m - first) * blocks, offset,
                       corrections.data() + first * blocks);
    a.corrections = corrections.data();
  }
  const StoredWeights stored{w, ldw, b.panel_outputs, b.dtype, k};
  const detail::BlockKernels* found = detail::block_kernels(b.dtype);
  NUMESH_CHECK(found != nullptr, TypeError, "packed_gemm_q8: {} weights have no kernels",
               to_string(b.dtype));
  const detail::BlockKernels& kernels = *found;
  if (kernels.two_scales) {
    return packed_panels<TwoScalesForm>(m, n, a, stored, kernels.pack_panel, c, ldc, level);
  }
  if (kernels.minimums) {
    a.sums = detail::q8dot_block_sums(m, blocks, codes, scales, level);
    return packed_panels<MinimumsForm>(m, n, a, stored, kernels.pack_panel, c, ldc, level);
  }
  packed_panels<PairForm>(m, n, a, stored, kernels.pack_panel, c, ldc, level);
}

}  // namespace numesh::ops
