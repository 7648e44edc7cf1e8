#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/runtime/convert.hpp"

// packed_gemm_q8: the prefill tile of Q8_0 and Q4_0 weights by int8 products (block_gemm.hpp
// gives the order). The tile repacks 16 outputs at a time so that one 512-bit register holds 4
// consecutive weight codes of each of the 16: a row's 4 activation codes, broadcast, then meet
// all 16 outputs in one vpdpbusd, each weight load serves every row of the group, and a block's
// integer sums come out whole, one scale product and one fma per block, row and 16 outputs. The
// decode kernels (q8_dot_common.hpp) read the weights as stored instead, a block of one output
// against a block of one row, which suits one row but spends as many conversions and fmas as
// integer products.

namespace numesh::ops {

namespace {

using runtime::KernelLevel;

constexpr std::int64_t kPackedBlockInputs = 32;  // inputs of a block (weights' and activations')
constexpr std::int64_t kGroups = 8;              // groups of 4 inputs in a block
constexpr std::int64_t kPanelOutputs = 16;       // outputs of a packed panel
constexpr std::int64_t kRowsAtOnce = 4;          // rows of activations a kernel call takes

// A block of 16 outputs, packed: group g's 4 codes of output o at codes[g][o], their f16 scales
// widened, and -128 times the sum of each output's 32 codes (the VNNI kernel's activations are
// unsigned, x + 128: this starts its sums where x w needs them). Outputs past the weights' last
// have codes 0 and scale 0.
struct alignas(64) PackedBlock {
  std::int8_t codes[kGroups][kPanelOutputs][4];
  float scales[kPanelOutputs];
  std::int32_t bias[kPanelOutputs];
};
static_assert(sizeof(PackedBlock) == 640, "a packed block is 10 cache lines");

// GGML's pair formats as the packing reads them: 32 signed codes and an f16 scale in the block's
// first two bytes (little-endian), in both. `codes` is the scalar reference; `codes256` the same
// bytes by AVX2 (the packing is exact either way: every level packs the same bytes).
struct Q8_0Blocks {
  static constexpr std::int64_t kBytes = 34;
  static void codes(const unsigned char* block, std::int8_t* q) {
    std::memcpy(q, block + 2, kPackedBlockInputs);
  }
  __attribute__((target("avx2"))) static void codes256(const unsigned char* block, std::int8_t* q) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(q),
                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)));
  }
};

// Byte j of the 16 holds q[j] in its low nibble and q[j + 16] in its high one; the code is q - 8.
struct Q4_0Blocks {
  static constexpr std::int64_t kBytes = 18;
  static void codes(const unsigned char* block, std::int8_t* q) {
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>((block[2 + j] & 0x0F) - 8);
      q[j + 16] = static_cast<std::int8_t>((block[2 + j] >> 4) - 8);
    }
  }
  __attribute__((target("avx2"))) static void codes256(const unsigned char* block, std::int8_t* q) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(bytes), _mm_srli_epi16(bytes, 4), 1);
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(q),
        _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8)));
  }
};

#define NUMESH_PACKED_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// The VNNI kernel's starting sums: -128 times each output's 32 codes (vpdpbusd of ones against
// each group's codes gives every output's sum of 4).
NUMESH_PACKED_AVX512 void add_bias(PackedBlock& p) {
  __m512i sum = _mm512_setzero_si512();
  for (std::int64_t g = 0; g < kGroups; ++g) {
    sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), _mm512_load_si512(p.codes[g]));
  }
  _mm512_store_si512(p.bias, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-128)));
}

// Outputs [0, count) (count <= 16) of the weights at `w` (rows `ldw` bytes apart), every block,
// into `out`: each output's block decoded to 32 codes, then the codes transposed 4 at a time.
// The bias only where the kernel reads it (`vnni`).
template <class F>
void pack_panel(const unsigned char* w, std::int64_t ldw, std::int64_t count, std::int64_t blocks,
                KernelLevel level, PackedBlock* out) {
  alignas(32) std::int8_t q[kPanelOutputs][kPackedBlockInputs] = {};
  std::uint16_t scale_bits[kPanelOutputs] = {};
  for (std::int64_t t = 0; t < blocks; ++t) {
    PackedBlock& p = out[t];
    for (std::int64_t o = 0; o < count; ++o) {
      const unsigned char* block = w + o * ldw + t * F::kBytes;
      if (level == KernelLevel::kScalar) {
        F::codes(block, q[o]);
      } else {
        F::codes256(block, q[o]);
      }
      scale_bits[o] = static_cast<std::uint16_t>(block[0] | (block[1] << 8));
    }
    for (std::int64_t g = 0; g < kGroups; ++g) {
      for (std::int64_t o = 0; o < kPanelOutputs; ++o) std::memcpy(p.codes[g][o], q[o] + 4 * g, 4);
    }
    runtime::convert_f16_to_f32(scale_bits, p.scales);
    if (level == KernelLevel::kAvx512Bf16) add_bias(p);
  }
}

void pack_panel_of(DType dtype, const unsigned char* w, std::int64_t ldw, std::int64_t count,
                   std::int64_t blocks, KernelLevel level, PackedBlock* out) {
  if (dtype == DType::kQ4_0) {
    pack_panel<Q4_0Blocks>(w, ldw, count, blocks, level, out);
  } else {
    pack_panel<Q8_0Blocks>(w, ldw, count, blocks, level, out);
  }
}

// ---- Scalar: the order written out -------------------------------------------------------------

void rows_scalar(std::int64_t rows, const std::int8_t* codes, const float* d_a, std::int64_t k,
                 const PackedBlock* panel, std::int64_t count, float* c, std::int64_t ldc) {
  const std::int64_t blocks = k / kPackedBlockInputs;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < count; ++o) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t < blocks; ++t) {
        const std::int8_t* x = codes + r * k + t * kPackedBlockInputs;
        std::int32_t isum = 0;
        for (std::int64_t g = 0; g < kGroups; ++g) {
          for (int e = 0; e < 4; ++e) {
            isum += std::int32_t{x[4 * g + e]} * std::int32_t{panel[t].codes[g][o][e]};
          }
        }
        acc = std::fma(static_cast<float>(isum), d_a[r * blocks + t] * panel[t].scales[o], acc);
      }
      c[r * ldc + o] = acc;
    }
  }
}

// ---- AVX2: 8 outputs a register, llama.cpp's sign trick -----------------------------------------

// Half `h` (outputs 8h .. 8h + 7) of a panel for R rows: |w| as unsigned bytes (-128 gives 128)
// times x given w's sign, vpmaddubsw's pair sums within 2 * 128 * 127, vpmaddwd with ones.
template <int R>
__attribute__((target("avx2,fma,f16c"))) void rows256(const std::int8_t* codes, const float* d_a,
                                                      std::int64_t k, const PackedBlock* panel,
                                                      int h, std::int64_t count, float* c,
                                                      std::int64_t ldc) {
  const std::int64_t blocks = k / kPackedBlockInputs;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f[R];
  for (int r = 0; r < R; ++r) f[r] = _mm256_setzero_ps();
  for (std::int64_t t = 0; t < blocks; ++t) {
    const PackedBlock& p = panel[t];
    __m256i s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_si256();
    for (std::int64_t g = 0; g < kGroups; ++g) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(p.codes[g][8 * h]));
      const __m256i magnitude = _mm256_abs_epi8(w);
      for (int r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, codes + r * k + t * kPackedBlockInputs + 4 * g, 4);
        const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(four), w);
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones));
      }
    }
    const __m256 d_w = _mm256_load_ps(p.scales + 8 * h);
    for (int r = 0; r < R; ++r) {
      const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(d_a[r * blocks + t]), d_w);
      f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), scale, f[r]);
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

// Panels p0 and p1 (outputs c[0 .. n0) and c[16 .. 16 + n1); P = 1: p0 alone) for R rows
// whose codes are given as unsigned bytes, x + 128.
template <int R, int P>
NUMESH_PACKED_AVX512 void rows512(const std::uint8_t* codes, const float* d_a, std::int64_t k,
                                  const PackedBlock* p0, const PackedBlock* p1, std::int64_t n0,
                                  std::int64_t n1, float* c, std::int64_t ldc) {
  const std::int64_t blocks = k / kPackedBlockInputs;
  __m512 f[R][P];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < P; ++v) f[r][v] = _mm512_setzero_ps();
  }
  for (std::int64_t t = 0; t < blocks; ++t) {
    const PackedBlock* p[2] = {p0 + t, P > 1 ? p1 + t : p0 + t};
    __m512i s[R][P];
    for (int v = 0; v < P; ++v) {
      const __m512i bias = _mm512_load_si512(p[v]->bias);
      for (int r = 0; r < R; ++r) s[r][v] = bias;
    }
    for (std::int64_t g = 0; g < kGroups; ++g) {
      __m512i w[P];
      for (int v = 0; v < P; ++v) w[v] = _mm512_load_si512(p[v]->codes[g]);
      for (int r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, codes + r * k + t * kPackedBlockInputs + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(four);
        for (int v = 0; v < P; ++v) s[r][v] = _mm512_dpbusd_epi32(s[r][v], x, w[v]);
      }
    }
    for (int v = 0; v < P; ++v) {
      const __m512 d_w = _mm512_load_ps(p[v]->scales);
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d_a[r * blocks + t]), d_w);
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

template <int P>
void rows512_any(std::int64_t rows, const std::uint8_t* codes, const float* d_a, std::int64_t k,
                 const PackedBlock* p0, const PackedBlock* p1, std::int64_t n0, std::int64_t n1,
                 float* c, std::int64_t ldc) {
  switch (rows) {
    case 1:
      return rows512<1, P>(codes, d_a, k, p0, p1, n0, n1, c, ldc);
    case 2:
      return rows512<2, P>(codes, d_a, k, p0, p1, n0, n1, c, ldc);
    case 3:
      return rows512<3, P>(codes, d_a, k, p0, p1, n0, n1, c, ldc);
    default:
      return rows512<4, P>(codes, d_a, k, p0, p1, n0, n1, c, ldc);
  }
}

void rows256_any(std::int64_t rows, const std::int8_t* codes, const float* d_a, std::int64_t k,
                 const PackedBlock* panel, int h, std::int64_t count, float* c, std::int64_t ldc) {
  switch (rows) {
    case 1:
      return rows256<1>(codes, d_a, k, panel, h, count, c, ldc);
    case 2:
      return rows256<2>(codes, d_a, k, panel, h, count, c, ldc);
    case 3:
      return rows256<3>(codes, d_a, k, panel, h, count, c, ldc);
    default:
      return rows256<4>(codes, d_a, k, panel, h, count, c, ldc);
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

}  // namespace

void packed_gemm_q8(std::int64_t m, const std::int8_t* codes, const float* scales,
                    const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  NUMESH_CHECK(b.dtype == DType::kQ8_0 || b.dtype == DType::kQ4_0, TypeError,
               "packed_gemm_q8: weights of dtype {}; it takes q8_0 and q4_0", to_string(b.dtype));
  NUMESH_CHECK(b.layout == WeightLayout::kOutIn, ShapeError,
               "packed_gemm_q8: {} weights stored in-out; block-format weights are stored out-in "
               "([n, k])",
               to_string(b.dtype));
  const std::int64_t n = b.cols, k = b.rows, ld = b.ld != 0 ? b.ld : k;
  NUMESH_CHECK(
      m >= 0 && n >= 0 && k >= 0 && k % kPackedBlockInputs == 0 && ld >= k &&
          ld % kPackedBlockInputs == 0 && ldc >= n,
      ShapeError,
      "packed_gemm_q8: m {}, n {}, k {} with ldb {}, ldc {}: sizes must be >= 0, k and ldb whole "
      "blocks of {} and each leading dimension at least its row's length",
      m, n, k, ld, ldc, kPackedBlockInputs);
  if (m == 0 || n == 0) return;
  const std::int64_t blocks = k / kPackedBlockInputs;
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t ldw = ld / kPackedBlockInputs * traits(b.dtype).block_bytes;
  // Two panels at a time (the AVX-512 kernel's), in buffers of the calling thread kept between
  // calls; the activations as unsigned bytes for the VNNI kernel.
  thread_local std::vector<PackedBlock> packed;
  thread_local std::vector<std::uint8_t> unsigned_codes;
  const auto need = static_cast<std::size_t>(2 * blocks);
  if (packed.size() < need) packed.resize(need);
  const bool vnni = level == KernelLevel::kAvx512Bf16;
  if (vnni) {
    unsigned_codes.resize(static_cast<std::size_t>(m * k));
    to_unsigned(codes, m * k, unsigned_codes.data());
  }
  for (std::int64_t j = 0; j < n; j += 2 * kPanelOutputs) {
    const std::int64_t n0 = std::min(kPanelOutputs, n - j);
    const std::int64_t n1 = std::min(kPanelOutputs, std::max<std::int64_t>(0, n - j - n0));
    PackedBlock* p0 = packed.data();
    PackedBlock* p1 = packed.data() + blocks;
    pack_panel_of(b.dtype, w + j * ldw, ldw, n0, blocks, level, p0);
    if (n1 > 0) pack_panel_of(b.dtype, w + (j + n0) * ldw, ldw, n1, blocks, level, p1);
    for (std::int64_t i = 0; i < m; i += kRowsAtOnce) {
      const std::int64_t rows = std::min(kRowsAtOnce, m - i);
      const float* d_a = scales + i * blocks;
      float* out = c + i * ldc + j;
      switch (level) {
        case KernelLevel::kAvx512Bf16:
          if (n1 > 0) {
            rows512_any<2>(rows, unsigned_codes.data() + i * k, d_a, k, p0, p1, n0, n1, out, ldc);
          } else {
            rows512_any<1>(rows, unsigned_codes.data() + i * k, d_a, k, p0, p0, n0, 0, out, ldc);
          }
          break;
        case KernelLevel::kAvx512:
        case KernelLevel::kAvx2:
          for (int panel = 0; panel < 2; ++panel) {
            const std::int64_t count = panel == 0 ? n0 : n1;
            for (int h = 0; h < 2 && 8 * h < count; ++h) {
              rows256_any(rows, codes + i * k, d_a, k, panel == 0 ? p0 : p1, h,
                          std::min<std::int64_t>(8, count - 8 * h), out + 16 * panel + 8 * h, ldc);
            }
          }
          break;
        case KernelLevel::kScalar:
          rows_scalar(rows, codes + i * k, d_a, k, p0, n0, out, ldc);
          if (n1 > 0) rows_scalar(rows, codes + i * k, d_a, k, p1, n1, out + kPanelOutputs, ldc);
          break;
      }
    }
  }
}

}  // namespace numesh::ops
