#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// packed_gemm_q8: the prefill tile of block-format weights by int8 products (block_gemm.hpp
// gives the orders; packed_panels.hpp the panels and each format's packer). The tile repacks 16
// outputs at a time so that one 512-bit register holds 4 consecutive weight codes of each of the
// 16: a row's 4 activation codes, broadcast, then meet all 16 outputs in one vpdpbusd, each weight
// load serves every row of the group, and a block's integer sums come out whole, one scale product
// and one fma per block, row and 16 outputs. The decode kernels (q8_dot_common.hpp) read the
// weights as stored instead, a block of one output against a block of one row, which suits one row
// but spends as many conversions and fmas as integer products.

namespace numesh::ops {

namespace {

using detail::kPanelGroups;
using detail::kPanelOutputs;
using detail::kQ8DotBlock;
using detail::PackedBlock;
using runtime::KernelLevel;

constexpr std::int64_t kRowsAtOnce = 4;  // rows of activations a kernel call takes

// How a format's packed blocks are multiplied: one scale a block or two (Q6_K: inputs 0-15 and
// 16-31), with or without Q4_K's minimums (the activations' scaled block sums times -dmin m).
template <bool kTwo, bool kMins>
struct Form {
  static constexpr bool kTwoScales = kTwo;
  static constexpr bool kMinimums = kMins;
};
using PairForm = Form<false, false>;
using Q4_KForm = Form<false, true>;
using Q6_KForm = Form<true, false>;

// The activations a call multiplies: codes (rows k apart; for the VNNI kernel as unsigned bytes
// x + 128), scales and, for Q4_K, the scaled block sums (rows k / 32 apart).
struct Rows {
  const std::int8_t* codes;
  const std::uint8_t* unsigned_codes;
  const float* scales;
  const float* sums;
  std::int64_t k;
  std::int64_t blocks;
};

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

// ---- AVX2: 8 outputs a register, llama.cpp's sign trick -----------------------------------------

// Half `h` (outputs 8h .. 8h + 7) of a panel for R rows from row i0: |w| as unsigned bytes (-128
// gives 128) times x given w's sign, vpmaddubsw's pair sums within 2 * 128 * 127, vpmaddwd with
// ones.
template <class Fm, int R>
__attribute__((target("avx2,fma,f16c"))) void rows256(const Rows& a, std::int64_t i0,
                                                      const PackedBlock* panel, int h,
                                                      std::int64_t count, float* c,
                                                      std::int64_t ldc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f[R];
  for (int r = 0; r < R; ++r) f[r] = _mm256_setzero_ps();
  for (std::int64_t t = 0; t < a.blocks; ++t) {
    const PackedBlock& p = panel[t];
    __m256 d_a[R];
    for (int r = 0; r < R; ++r) d_a[r] = _mm256_set1_ps(a.scales[(i0 + r) * a.blocks + t]);
    __m256i s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_si256();
    for (std::int64_t g = 0; g < kPanelGroups; ++g) {
      if (Fm::kTwoScales && g == kPanelGroups / 2) {
        const __m256 d_w = _mm256_load_ps(p.scales + 8 * h);
        for (int r = 0; r < R; ++r) {
          f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(d_a[r], d_w), f[r]);
          s[r] = _mm256_setzero_si256();
        }
      }
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(p.codes[g][8 * h]));
      const __m256i magnitude = _mm256_abs_epi8(w);
      for (int r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, a.codes + (i0 + r) * a.k + t * kQ8DotBlock + 4 * g, 4);
        const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(four), w);
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones));
      }
    }
    const __m256 d_w = _mm256_load_ps((Fm::kTwoScales ? p.scales_high : p.scales) + 8 * h);
    for (int r = 0; r < R; ++r)
      f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(d_a[r], d_w), f[r]);
    if constexpr (Fm::kMinimums) {
      const __m256 minimums = _mm256_load_ps(p.minimums + 8 * h);
      for (int r = 0; r < R; ++r) {
        f[r] = _mm256_fmadd_ps(_mm256_set1_ps(a.sums[(i0 + r) * a.blocks + t]), minimums, f[r]);
      }
    }
  }
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

template <class Fm, int P>
void rows512_any(std::int64_t rows, const Rows& a, std::int64_t i0, const PackedBlock* p0,
                 const PackedBlock* p1, std::int64_t n0, std::int64_t n1, float* c,
                 std::int64_t ldc) {
  switch (rows) {
    case 1:
      return rows512<Fm, 1, P>(a, i0, p0, p1, n0, n1, c, ldc);
    case 2:
      return rows512<Fm, 2, P>(a, i0, p0, p1, n0, n1, c, ldc);
    case 3:
      return rows512<Fm, 3, P>(a, i0, p0, p1, n0, n1, c, ldc);
    default:
      return rows512<Fm, 4, P>(a, i0, p0, p1, n0, n1, c, ldc);
  }
}

template <class Fm>
void rows256_any(std::int64_t rows, const Rows& a, std::int64_t i0, const PackedBlock* panel, int h,
                 std::int64_t count, float* c, std::int64_t ldc) {
  switch (rows) {
    case 1:
      return rows256<Fm, 1>(a, i0, panel, h, count, c, ldc);
    case 2:
      return rows256<Fm, 2>(a, i0, panel, h, count, c, ldc);
    case 3:
      return rows256<Fm, 3>(a, i0, panel, h, count, c, ldc);
    default:
      return rows256<Fm, 4>(a, i0, panel, h, count, c, ldc);
  }
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

// Every pair of panels: packed, then multiplied by every group of rows (the packed pair, 1.6
// bytes a weight of its 32 outputs, stays in cache while the rows pass).
template <class Fm>
void packed_panels(std::int64_t m, std::int64_t n, const Rows& a, const unsigned char* w,
                   std::int64_t ldw, detail::PanelPacker pack, float* c, std::int64_t ldc,
                   KernelLevel level) {
  thread_local std::vector<PackedBlock> packed;
  const auto need = static_cast<std::size_t>(2 * a.blocks);
  if (packed.size() < need) packed.resize(need);
  PackedBlock* p0 = packed.data();
  PackedBlock* p1 = packed.data() + a.blocks;
  for (std::int64_t j = 0; j < n; j += 2 * kPanelOutputs) {
    const std::int64_t n0 = std::min(kPanelOutputs, n - j);
    const std::int64_t n1 = std::min(kPanelOutputs, std::max<std::int64_t>(0, n - j - n0));
    pack(w + j * ldw, ldw, n0, a.blocks, level, p0);
    if (n1 > 0) pack(w + (j + n0) * ldw, ldw, n1, a.blocks, level, p1);
    for (std::int64_t i = 0; i < m; i += kRowsAtOnce) {
      const std::int64_t rows = std::min(kRowsAtOnce, m - i);
      float* out = c + i * ldc + j;
      switch (level) {
        case KernelLevel::kAvx512Bf16:
          if (n1 > 0) {
            rows512_any<Fm, 2>(rows, a, i, p0, p1, n0, n1, out, ldc);
          } else {
            rows512_any<Fm, 1>(rows, a, i, p0, p0, n0, 0, out, ldc);
          }
          break;
        case KernelLevel::kAvx512:
        case KernelLevel::kAvx2:
          for (int panel = 0; panel < 2; ++panel) {
            const std::int64_t count = panel == 0 ? n0 : n1;
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
  if (m == 0 || n == 0) return;
  const std::int64_t blocks = k / kQ8DotBlock;
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t ldw = ld / block * traits(b.dtype).block_bytes;
  thread_local std::vector<std::uint8_t> unsigned_codes;
  Rows a{codes, nullptr, scales, nullptr, k, blocks};
  if (level >= KernelLevel::kAvx512Bf16) {
    unsigned_codes.resize(static_cast<std::size_t>(m * k));
    to_unsigned(codes, m * k, unsigned_codes.data());
    a.unsigned_codes = unsigned_codes.data();
  }
  switch (b.dtype) {
    case DType::kQ8_0:
      return packed_panels<PairForm>(m, n, a, w, ldw, detail::pack_panel_q8_0, c, ldc, level);
    case DType::kQ4_0:
      return packed_panels<PairForm>(m, n, a, w, ldw, detail::pack_panel_q4_0, c, ldc, level);
    case DType::kQ4_K:
      a.sums = detail::q8dot_block_sums(m, blocks, codes, scales, level);
      return packed_panels<Q4_KForm>(m, n, a, w, ldw, detail::pack_panel_q4_k, c, ldc, level);
    case DType::kQ6_K:
      return packed_panels<Q6_KForm>(m, n, a, w, ldw, detail::pack_panel_q6_k, c, ldc, level);
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      return;  // refused above
  }
}

}  // namespace numesh::ops
