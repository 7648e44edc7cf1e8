#include "numesh/ops/kernels/dot_gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <vector>

#include "dot_gemm_amx.hpp"
#include "numesh/runtime/convert.hpp"
#include "stream_ahead.hpp"

namespace numesh::ops {

namespace {

using detail::stream_ahead;
using runtime::KernelLevel;

constexpr int kLanes = 32;

// The fold every level ends with (see the header): s[0..31] to one sum.
float fold(const float* s) {
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = s[l] + s[l + 16];
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) t[l] += t[l + w];
  }
  return t[0];
}

// ---- Scalar: the order written out
// ---------------------------------------------------------------

// Output j of fp32 / f16 weights b (stored out-in): blocks of 32, element e into s[e mod 32],
// zeros past k.
float dot_scalar(std::int64_t k, const float* x, const WeightMatrix& b, std::int64_t j) {
  const void* w = b.stored_row(j);
  float s[kLanes] = {};
  const std::int64_t padded = (k + kLanes - 1) / kLanes * kLanes;
  for (std::int64_t e = 0; e < padded; ++e) {
    const float xe = e < k ? x[e] : 0.0f, we = e < k ? widened_element(w, b.dtype, e) : 0.0f;
    s[e % kLanes] = std::fma(we, xe, s[e % kLanes]);
  }
  return fold(s);
}

// One output of bf16 weights against bf16 activations: blocks of 64, the pair (e, e + 1) into
// s[(e mod 64) / 2], odd element first.
float dot_scalar_bf16(std::int64_t k, const std::uint16_t* x, const std::uint16_t* w) {
  float s[kLanes] = {};
  const std::int64_t padded = (k + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
  auto at = [k](const std::uint16_t* v, std::int64_t e) {
    return e < k ? f32_from_bf16(v[e]) : 0.0f;
  };
  for (std::int64_t e = 0; e < padded; e += 2) {
    float& acc = s[(e % (2 * kLanes)) / 2];
    acc = std::fma(at(w, e + 1), at(x, e + 1), acc);
    acc = std::fma(at(w, e), at(x, e), acc);
  }
  return fold(s);
}

// ---- AVX-512 ------------------------------------------------------------------------------------

__attribute__((target("avx512f,avx512bw,avx512vl"))) inline float fold_avx512(__m512 low,
                                                                              __m512 high) {
  const __m512 t = _mm512_add_ps(low, high);  // t[l] = s[l] + s[l + 16]
  const __m256 high8 =
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1));  // AVX-512F only
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(t), high8);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// 16 elements of w from `at`, the lanes of `mask` (zero elsewhere), widened to fp32.
template <DType T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load_w16(const void* w,
                                                                            std::int64_t at,
                                                                            __mmask16 mask) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + at);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(w) + at);
    if constexpr (T == DType::kBF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
  }
}

// The weights a tile takes next (the next block of k of its outputs' rows, or the next tile's
// first block), asked for a few lines a step while the tile computes from L1: a tile of several
// rows is compute-bound once its weights are in, and waiting for them at its first step left a
// thread reading 7-8 GB/s of fp32 weights at 16 rows where it reads 15-20 alone. `runs` runs of
// `run_bytes`, `stride` apart. Addresses as integers: hints past the matrix's end are never
// pointers formed past it.
struct TileAhead {
  std::uintptr_t run = 0;  // the current run's start
  std::uintptr_t at = 0;   // the next line to ask for
  std::uintptr_t run_bytes = 0;
  std::uintptr_t stride = 0;
  std::int64_t runs = 0;  // runs left, the current one included
  std::int64_t lines_per_step = 0;

  // A tile's step: the next lines_per_step lines, until the last run's end.
  void step() noexcept {
    for (std::int64_t q = 0; q < lines_per_step && runs > 0; ++q) {
      _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
      at += 64;
      if (at >= run + run_bytes) {
        run += stride;
        at = run;
        --runs;
      }
    }
  }
};

// The elements [begin, end) of k a tile call sums (whole blocks of the level's order, the last
// call's end the padded k): the first call starts its 32 lane sums at zero, the others take them
// from the caller's partial sums, and the last folds them into c where the others store them
// back. The sums run over the same elements in the same order however k is cut: a lane's sum
// stored and loaded again is the same float.
struct KSpan {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool first = true;
  bool last = true;
};

// One step of dot_tile_avx512: 16 elements from `at` (the lanes of `mask`) of O outputs' weights
// (rows `row_bytes` apart from w) and R rows of a, into the R * O accumulators.
template <DType T, int R, int O>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void tile_step(
    const char* w, std::int64_t row_bytes, const float* a, std::int64_t lda, std::int64_t at,
    __mmask16 mask, __m512* acc) {
  __m512 wv[O];
#pragma GCC unroll 8
  for (int o = 0; o < O; ++o) wv[o] = load_w16<T>(w + o * row_bytes, at, mask);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 x = _mm512_maskz_loadu_ps(mask, a + r * lda + at);
#pragma GCC unroll 8
    for (int o = 0; o < O; ++o) acc[r * O + o] = _mm512_fmadd_ps(wv[o], x, acc[r * O + o]);
  }
}

// Outputs [j0, j0 + O) for R rows of a (fp32 / f16 weights) over the elements of `span`, the 32
// partial sums of each in two passes: lanes e mod 32 < 16 first, then the rest. The passes keep
// one accumulator per (row, output) instead of two, so a tile of 4 rows by 6 outputs holds 24
// accumulators and each step makes 10 loads for 24 fmas (the pairs of two outputs for 4 rows
// made 12 for 16); the second pass reads the span's weights from L1. Each lane's sum runs in e
// order over the same padded blocks as the scalar kernel's (its zero steps included: fma(0, 0,
// -0) is +0), and the fold starts with s[l] + s[l + 16] as it does: the same bits. `part` holds
// the 32 lane sums of each (row, output) between the spans of k (KSpan).
template <DType T, int R, int O>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dot_tile_avx512(
    std::int64_t k, const float* a, std::int64_t lda, const void* b, std::int64_t ldb,
    std::int64_t j0, KSpan span, float* part, float* c, std::int64_t ldc, TileAhead& ahead) {
  const auto row_bytes = ldb * static_cast<std::int64_t>(dtype_size(T));
  const char* w = static_cast<const char*>(b) + j0 * row_bytes;
  TileAhead near = ahead;  // a local copy stays in registers
  __m512 low[R * O], acc[R * O];
  for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 32
    for (int t = 0; t < R * O; ++t)
      acc[t] = span.first ? _mm512_setzero_ps() : _mm512_load_ps(part + t * kLanes + 16 * half);
    std::int64_t e = span.begin + 16 * half;
    for (; e < span.end && e + 16 <= k; e += kLanes) {  // whole steps, unmasked
      near.step();
      tile_step<T, R, O>(w, row_bytes, a, lda, e, 0xFFFF, acc);
    }
    for (; e < span.end; e += kLanes) {  // the masked tail, zeros past k
      const std::int64_t left = k - e;
      const auto mask = static_cast<__mmask16>(left <= 0 ? 0u : (1u << left) - 1u);
      tile_step<T, R, O>(w, row_bytes, a, lda, std::min(e, k), mask, acc);
    }
    if (!span.last) {
#pragma GCC unroll 32
      for (int t = 0; t < R * O; ++t) _mm512_store_ps(part + t * kLanes + 16 * half, acc[t]);
    } else if (half == 0) {
#pragma GCC unroll 32
      for (int t = 0; t < R * O; ++t) low[t] = acc[t];
    }
  }
  ahead = near;
  if (!span.last) return;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < O; ++o) c[r * ldc + j0 + o] = fold_avx512(low[r * O + o], acc[r * O + o]);
  }
}

// Outputs [j0, j1) for one row of a (fp32 / f16 weights), one output at a time, streaming the
// weights (a step is bound by reading them; reading two of their rows at once made it slower:
// 50 against 60 tokens/s through the server).
template <DType T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dot_row_avx512(
    std::int64_t k, const float* x, const void* b, std::int64_t ldb, std::int64_t j0,
    std::int64_t j1, float* c) {
  const auto elem = static_cast<std::int64_t>(dtype_size(T));
  for (std::int64_t j = j0; j < j1; ++j) {
    const void* w = static_cast<const char*>(b) + j * ldb * elem;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (std::int64_t e = 0; e < k; e += kLanes) {
      const std::int64_t left = k - e;
      const auto m0 = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
      const auto m1 = static_cast<__mmask16>(left >= 32   ? 0xFFFF
                                             : left <= 16 ? 0u
                                                          : (1u << (left - 16)) - 1u);
      stream_ahead(static_cast<const char*>(w) + e * elem, 32 * elem);
      acc0 = _mm512_fmadd_ps(load_w16<T>(w, e, m0), _mm512_maskz_loadu_ps(m0, x + e), acc0);
      acc1 =
          _mm512_fmadd_ps(load_w16<T>(w, e + 16, m1), _mm512_maskz_loadu_ps(m1, x + e + 16), acc1);
    }
    c[j] = fold_avx512(acc0, acc1);
  }
}

// The element mask of the 32 bf16 values from `e` (k - e of them left).
inline __mmask32 mask32(std::int64_t left) {
  return left >= 32 ? 0xFFFFFFFFu : left <= 0 ? 0u : static_cast<__mmask32>((1u << left) - 1u);
}

// One step over 16 pairs of bf16 weights `wv` and activations `xv`: vdpbf16ps, or the same two
// roundings with fma (the odd elements are the high halves of the dwords).
template <bool kDpbf16>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline __m512 pair_step(
    __m512 acc, __m512i wv, __m512i xv) {
  if constexpr (kDpbf16) {
    return _mm512_dpbf16_ps(acc, (__m512bh)xv, (__m512bh)wv);
  } else {
    const __m512i odd = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wv, odd)),
                          _mm512_castsi512_ps(_mm512_and_si512(xv, odd)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wv, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(xv, 16)), acc);
  }
}

// Outputs [j0, j0 + O) for R rows of bf16 activations `x` (rows `ldx` apart) and bf16 weights
// over the elements of `span`, in two passes as dot_tile_avx512: pairs from e mod 64 < 32 first
// (lanes 0-15), then the rest (lanes 16-31), over the same padded blocks as the one-row kernel;
// the pair steps taken with fma (kAvx512) or vdpbf16ps (kAvx512Bf16). The target names
// avx512bf16 for both: the fma instantiation holds no bf16 instruction, and runs where kAvx512
// does.
template <bool kDpbf16, int R, int O>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void dot_tile_bf16_avx512(
    std::int64_t k, const std::uint16_t* x, std::int64_t ldx, const std::uint16_t* b,
    std::int64_t ldb, std::int64_t j0, KSpan span, float* part, float* c, std::int64_t ldc,
    TileAhead& ahead) {
  const std::uint16_t* w = b + j0 * ldb;
  __m512 low[R * O], acc[R * O];
  for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 32
    for (int t = 0; t < R * O; ++t)
      acc[t] = span.first ? _mm512_setzero_ps() : _mm512_load_ps(part + t * kLanes + 16 * half);
    for (std::int64_t e = span.begin + kLanes * half; e < span.end; e += 2 * kLanes) {
      const __mmask32 mask = mask32(k - e);
      const std::int64_t at = std::min(e, k);  // the address of a step past k reads nothing
      ahead.step();
      __m512i wv[O];
#pragma GCC unroll 8
      for (int o = 0; o < O; ++o) wv[o] = _mm512_maskz_loadu_epi16(mask, w + o * ldb + at);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_maskz_loadu_epi16(mask, x + r * ldx + at);
#pragma GCC unroll 8
        for (int o = 0; o < O; ++o) acc[r * O + o] = pair_step<kDpbf16>(acc[r * O + o], wv[o], xv);
      }
    }
    if (!span.last) {
#pragma GCC unroll 32
      for (int t = 0; t < R * O; ++t) _mm512_store_ps(part + t * kLanes + 16 * half, acc[t]);
    } else if (half == 0) {
#pragma GCC unroll 32
      for (int t = 0; t < R * O; ++t) low[t] = acc[t];
    }
  }
  if (!span.last) return;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < O; ++o) c[r * ldc + j0 + o] = fold_avx512(low[r * O + o], acc[r * O + o]);
  }
}

// Outputs [j0, j1) for one row of bf16 activations and bf16 weights, one output at a time:
// one stream through memory (the pair steps as dot_tile_bf16_avx512's). Four outputs at a time
// (four streams, more chains of vdpbf16ps in flight) decoded the 109 M Llama's bf16 1.12x faster
// on a Zen 5 ("Session 58") but read 0.6-0.7x as fast on a Zen 4, where one output at a time
// decoded it 1.35x faster (docs/benchmarks.md, "Session 59").
template <bool kDpbf16>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void dot_row_bf16_avx512(
    std::int64_t k, const std::uint16_t* x, const std::uint16_t* b, std::int64_t ldb,
    std::int64_t j0, std::int64_t j1, float* c) {
  const auto step = pair_step<kDpbf16>;
  for (std::int64_t j = j0; j < j1; ++j) {
    const std::uint16_t* w = b + j * ldb;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    std::int64_t e = 0;
    for (; e + 2 * kLanes <= k; e += 2 * kLanes) {
      stream_ahead(w + e, 2 * kLanes * 2);
      acc0 = step(acc0, _mm512_loadu_si512(w + e), _mm512_loadu_si512(x + e));
      acc1 = step(acc1, _mm512_loadu_si512(w + e + kLanes), _mm512_loadu_si512(x + e + kLanes));
    }
    if (e < k) {  // the last block, zero past k
      const __mmask32 m0 = mask32(k - e), m1 = mask32(k - e - kLanes);
      acc0 = step(acc0, _mm512_maskz_loadu_epi16(m0, w + e), _mm512_maskz_loadu_epi16(m0, x + e));
      acc1 = step(acc1, _mm512_maskz_loadu_epi16(m1, w + e + kLanes),
                  _mm512_maskz_loadu_epi16(m1, x + e + kLanes));
    }
    c[j] = fold_avx512(acc0, acc1);
  }
}

// ---- AVX2: the 32 partial sums in four vectors -------------------------------------------------

__attribute__((target("avx2,fma,f16c"))) inline float fold_avx2(__m256 s0, __m256 s1, __m256 s2,
                                                                __m256 s3) {
  const __m256 t8 =
      _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));  // (s[l] + s[l+16]) + (...)
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// 8 elements of w from `at` widened to fp32; only the first `count` (<= 8) are read, the rest 0.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_w8(const void* w, std::int64_t at,
                                                               std::int64_t count) {
  if (count >= 8) {
    if constexpr (T == DType::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(w) + at);
    } else {
      const __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(w) + at));
      if constexpr (T == DType::kBF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      return _mm256_cvtph_ps(h);
    }
  }
  alignas(32) float tmp[8] = {};
  for (std::int64_t i = 0; i < count; ++i) tmp[i] = widened_element(w, T, at + i);
  return _mm256_load_ps(tmp);
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 load_x8(const float* x, std::int64_t count) {
  if (count >= 8) return _mm256_loadu_ps(x);
  alignas(32) float tmp[8] = {};
  for (std::int64_t i = 0; i < count; ++i) tmp[i] = x[i];
  return _mm256_load_ps(tmp);
}

// Outputs [j0, j1) for one row of a (fp32 / f16 weights).
template <DType T>
__attribute__((target("avx2,fma,f16c"))) void dot_row_avx2(std::int64_t k, const float* x,
                                                           const void* b, std::int64_t ldb,
                                                           std::int64_t j0, std::int64_t j1,
                                                           float* c) {
  const auto elem = static_cast<std::int64_t>(dtype_size(T));
  const std::int64_t whole = k / kLanes * kLanes;
  for (std::int64_t j = j0; j < j1; ++j) {
    const void* w = static_cast<const char*>(b) + j * ldb * elem;
    // Four named accumulators, the whole blocks without a bound per load: with an array and a
    // clamped count per load, GCC kept the sums on the stack, a store and a load around every
    // fma (f16 decode ran at 0.56x ggml's AVX2 build, docs/benchmarks.md, "Session 55").
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    std::int64_t e = 0;
    for (; e < whole; e += kLanes) {
      stream_ahead(static_cast<const char*>(w) + e * elem, kLanes * elem);
      s0 = _mm256_fmadd_ps(load_w8<T>(w, e, 8), _mm256_loadu_ps(x + e), s0);
      s1 = _mm256_fmadd_ps(load_w8<T>(w, e + 8, 8), _mm256_loadu_ps(x + e + 8), s1);
      s2 = _mm256_fmadd_ps(load_w8<T>(w, e + 16, 8), _mm256_loadu_ps(x + e + 16), s2);
      s3 = _mm256_fmadd_ps(load_w8<T>(w, e + 24, 8), _mm256_loadu_ps(x + e + 24), s3);
    }
    if (e < k) {  // the last block, padded with zeros as the scalar order pads it
      // A group past k reads nothing, from k (no pointer formed past the row).
      const auto left = [&](std::int64_t at) { return std::clamp<std::int64_t>(k - at, 0, 8); };
      const auto at = [&](std::int64_t g) { return std::min(e + 8 * g, k); };
      s0 = _mm256_fmadd_ps(load_w8<T>(w, at(0), left(e)), load_x8(x + at(0), left(e)), s0);
      s1 = _mm256_fmadd_ps(load_w8<T>(w, at(1), left(e + 8)), load_x8(x + at(1), left(e + 8)), s1);
      s2 =
          _mm256_fmadd_ps(load_w8<T>(w, at(2), left(e + 16)), load_x8(x + at(2), left(e + 16)), s2);
      s3 =
          _mm256_fmadd_ps(load_w8<T>(w, at(3), left(e + 24)), load_x8(x + at(3), left(e + 24)), s3);
    }
    c[j] = fold_avx2(s0, s1, s2, s3);
  }
}

// The end of a pass of an AVX2 tile: its accumulators stored in `part` (lane group q of each
// (row, output), 32 floats apart) when the span is not k's last, else kept for the fold.
template <int kTiles>
__attribute__((target("avx2,fma,f16c"))) inline void store_or_keep_avx2(KSpan span,
                                                                        const __m256* acc,
                                                                        float* part, __m256* kept) {
#pragma GCC unroll 16
  for (int t = 0; t < kTiles; ++t) {
    if (span.last) {
      kept[t] = acc[t];
    } else {
      _mm256_store_ps(part + t * kLanes, acc[t]);
    }
  }
}

// c[r][o] (rows ldc apart) = the fold of the four passes' sums of (row r, output o).
template <int R, int O>
__attribute__((target("avx2,fma,f16c"))) inline void fold_tile_avx2(const __m256 (*sums)[R * O],
                                                                    float* c, std::int64_t ldc) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < O; ++o) {
      const int t = r * O + o;
      c[r * ldc + o] = fold_avx2(sums[0][t], sums[1][t], sums[2][t], sums[3][t]);
    }
  }
}

// Outputs [j0, j0 + O) for R rows of a (fp32 / f16 weights) on AVX2 over the elements of
// `span`: the 32 partial sums of each in four passes, one per group of 8 lanes (e mod 32 in
// [8q, 8q + 8)), so that a row and an output hold one accumulator in the 16 registers (4 rows by
// 3 outputs: 12 accumulators, 3 weights and a row's activations), over the same padded blocks as
// the scalar kernel's, then fold_avx2 of the four passes' sums: the same bits as dot_row_avx2
// and the scalar kernel. `part` holds the 32 lane sums between the spans of k.
template <DType T, int R, int O>
__attribute__((target("avx2,fma,f16c"))) void dot_tile_avx2(std::int64_t k, const float* a,
                                                            std::int64_t lda, const void* b,
                                                            std::int64_t ldb, std::int64_t j0,
                                                            KSpan span, float* part, float* c,
                                                            std::int64_t ldc, TileAhead& ahead) {
  const auto row_bytes = ldb * static_cast<std::int64_t>(dtype_size(T));
  const char* w = static_cast<const char*>(b) + j0 * row_bytes;
  __m256 sums[4][R * O];
  for (int q = 0; q < 4; ++q) {
    __m256 acc[R * O];
#pragma GCC unroll 16
    for (int t = 0; t < R * O; ++t)
      acc[t] = span.first ? _mm256_setzero_ps() : _mm256_load_ps(part + t * kLanes + 8 * q);
    for (std::int64_t e = span.begin + 8 * q; e < span.end; e += kLanes) {
      ahead.step();
      const std::int64_t left = std::clamp<std::int64_t>(k - e, 0, 8);
      const std::int64_t at = std::min(e, k);  // the address of a step past k reads nothing
      __m256 wv[O];
#pragma GCC unroll 8
      for (int o = 0; o < O; ++o) wv[o] = load_w8<T>(w + o * row_bytes, at, left);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 x =
            left == 8 ? _mm256_loadu_ps(a + r * lda + at) : load_x8(a + r * lda + at, left);
#pragma GCC unroll 8
        for (int o = 0; o < O; ++o) acc[r * O + o] = _mm256_fmadd_ps(wv[o], x, acc[r * O + o]);
      }
    }
    store_or_keep_avx2<R * O>(span, acc, part + 8 * q, sums[q]);
  }
  if (span.last) fold_tile_avx2<R, O>(sums, c + j0, ldc);
}

// 16 bf16 values from `at`, the first `count` of them (the rest 0), as 8 dwords.
__attribute__((target("avx2,fma,f16c"))) inline __m256i load_bf16x16(const std::uint16_t* v,
                                                                     std::int64_t count) {
  if (count >= 16) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  alignas(32) std::uint16_t tmp[16] = {};
  for (std::int64_t i = 0; i < count; ++i) tmp[i] = v[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}

// 16 bf16 values from `v`, all of them.
__attribute__((target("avx2,fma,f16c"))) inline __m256i load_bf16x16_whole(const std::uint16_t* v) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
}

// acc plus the products of 8 pairs of bf16 values w and x (dwords), the odd elements' first;
// `odd` masks each dword's high half.
__attribute__((target("avx2,fma,f16c"))) inline __m256 bf16_pairs_avx2(__m256i wv, __m256i xv,
                                                                       __m256i odd, __m256 acc) {
  acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(wv, odd)),
                        _mm256_castsi256_ps(_mm256_and_si256(xv, odd)), acc);
  return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(wv, 16)),
                         _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16)), acc);
}

// Outputs [j0, j1) for one row of bf16 activations and bf16 weights: each 16-value load holds
// 8 pairs, four loads a block of 64.
__attribute__((target("avx2,fma,f16c"))) void dot_row_bf16_avx2(std::int64_t k,
                                                                const std::uint16_t* x,
                                                                const std::uint16_t* b,
                                                                std::int64_t ldb, std::int64_t j0,
                                                                std::int64_t j1, float* c) {
  const __m256i odd = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const std::int64_t whole = k / (2 * kLanes) * (2 * kLanes);
  for (std::int64_t j = j0; j < j1; ++j) {
    const std::uint16_t* w = b + j * ldb;
    // Named accumulators and whole blocks without bounds, as dot_row_avx2.
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    std::int64_t e = 0;
    for (; e < whole; e += 2 * kLanes) {
      stream_ahead(w + e, 2 * kLanes * 2);
      s0 = bf16_pairs_avx2(load_bf16x16_whole(w + e), load_bf16x16_whole(x + e), odd, s0);
      s1 = bf16_pairs_avx2(load_bf16x16_whole(w + e + 16), load_bf16x16_whole(x + e + 16), odd, s1);
      s2 = bf16_pairs_avx2(load_bf16x16_whole(w + e + 32), load_bf16x16_whole(x + e + 32), odd, s2);
      s3 = bf16_pairs_avx2(load_bf16x16_whole(w + e + 48), load_bf16x16_whole(x + e + 48), odd, s3);
    }
    if (e < k) {  // the last block, padded with zeros; a group past k reads nothing, from k
      const auto left = [&](std::int64_t at) { return std::clamp<std::int64_t>(k - at, 0, 16); };
      const auto at = [&](std::int64_t g) { return std::min(e + 16 * g, k); };
      s0 = bf16_pairs_avx2(load_bf16x16(w + at(0), left(e)), load_bf16x16(x + at(0), left(e)), odd,
                           s0);
      s1 = bf16_pairs_avx2(load_bf16x16(w + at(1), left(e + 16)),
                           load_bf16x16(x + at(1), left(e + 16)), odd, s1);
      s2 = bf16_pairs_avx2(load_bf16x16(w + at(2), left(e + 32)),
                           load_bf16x16(x + at(2), left(e + 32)), odd, s2);
      s3 = bf16_pairs_avx2(load_bf16x16(w + at(3), left(e + 48)),
                           load_bf16x16(x + at(3), left(e + 48)), odd, s3);
    }
    c[j] = fold_avx2(s0, s1, s2, s3);
  }
}

// Outputs [j0, j0 + O) for R rows of bf16 activations and bf16 weights on AVX2, in four passes
// over k as dot_tile_avx2: pass q takes the pairs of e mod 64 in [16q, 16q + 16) (lanes 8q to
// 8q + 7), the odd element's product first, over the same padded blocks as dot_row_bf16_avx2:
// its bits. 4 rows by 2 outputs: 8 accumulators, each weight's odd and even halves, and a row's.
template <int R, int O>
__attribute__((target("avx2,fma,f16c"))) void dot_tile_bf16_avx2(
    std::int64_t k, const std::uint16_t* x, std::int64_t ldx, const std::uint16_t* b,
    std::int64_t ldb, std::int64_t j0, KSpan span, float* part, float* c, std::int64_t ldc,
    TileAhead& ahead) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const std::uint16_t* w = b + j0 * ldb;
  __m256 sums[4][R * O];
  for (int q = 0; q < 4; ++q) {
    __m256 acc[R * O];
#pragma GCC unroll 16
    for (int t = 0; t < R * O; ++t)
      acc[t] = span.first ? _mm256_setzero_ps() : _mm256_load_ps(part + t * kLanes + 8 * q);
    for (std::int64_t e = span.begin + 16 * q; e < span.end; e += 2 * kLanes) {
      ahead.step();
      const std::int64_t left = std::clamp<std::int64_t>(k - e, 0, 16);
      const std::int64_t at = std::min(e, k);  // the address of a step past k reads nothing
      __m256 w_odd[O], w_even[O];
#pragma GCC unroll 8
      for (int o = 0; o < O; ++o) {
        const __m256i wv = load_bf16x16(w + o * ldb + at, left);
        w_odd[o] = _mm256_castsi256_ps(_mm256_and_si256(wv, high));
        w_even[o] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i xv = load_bf16x16(x + r * ldx + at, left);
        const __m256 x_odd = _mm256_castsi256_ps(_mm256_and_si256(xv, high)),
                     x_even = _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16));
#pragma GCC unroll 8
        for (int o = 0; o < O; ++o) {
          const int t = r * O + o;
          acc[t] = _mm256_fmadd_ps(w_even[o], x_even, _mm256_fmadd_ps(w_odd[o], x_odd, acc[t]));
        }
      }
    }
    store_or_keep_avx2<R * O>(span, acc, part + 8 * q, sums[q]);
  }
  if (span.last) fold_tile_avx2<R, O>(sums, c + j0, ldc);
}

// ---- Dispatch
// ------------------------------------------------------------------------------------

// Rows of a tile, and its outputs: on AVX-512 (32 registers) and on AVX2 (16).
constexpr int kTileRows = 4, kTileOutputs = 6, kTileOutputsAvx2 = 3, kTileOutputsBf16Avx2 = 2;
// Rows whose activations stay near (L2) while every tile of outputs passes over them: a tile's
// weights come into L1 once for the chunk, and the more rows they serve there the fewer times a
// task's block of weights is read again from L2. On a Zen 5 (1 MiB L2) a task of 96 rows by 168
// fp32 outputs of k = 768 (a prefill step's MLP block) ran at 132-137 GFLOP/s a thread in chunks
// of 16, 147-157 in 32 or 64, 157-165 in 96, 158-165 in 128, with a second thread doing the same
// (each call a new 504 KiB block from memory); an Emerald Rapids (2 MiB L2) had measured 64 no
// faster than 16. 96 rows of k = 768 fp32 are 288 KiB of activations beside a task's block of at
// most 1 MiB of weights (dot_out_block), and the chunk's lane sums (part, below) 72 KiB of stack.
constexpr std::int64_t kTileChunkRows = 96;
// A tile takes rows of k whole up to kWholeRowBytes, and longer ones in spans of k of
// kSpanRowBytes (KSpan; bytes of the wider of a weight row and an activation row), so that the
// tile's weights for a span (6 outputs' 2 KiB each in fp32: 12 KiB) stay in L1 while every group
// of the chunk's rows passes over them (their activations from L2, a group's 8 KiB): whole rows of
// 16 KiB (k = 4096 in fp32) left a thread at 34-38 GFLOP/s, reading the weights from L2 at every
// step; spans of 2 KiB took it to 55-60. Spans cost a store and a load of each (row, output)'s 32
// lane sums per span: rows of k = 768 in fp32 ran at 0.75-0.85x a whole-row tile when cut.
constexpr std::int64_t kWholeRowBytes = 4096, kSpanRowBytes = 2048;

// The tiles of fp32 / f16 weights (dot_tile_avx512) on fp32 activations.
template <DType T>
struct WidenedTiles {
  std::int64_t k;
  const float* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  float* c;
  std::int64_t ldc;
  static constexpr std::int64_t kBlock = kLanes;  // elements a lane's step takes, every pass
  static constexpr int kPasses = 2, kOutputs = kTileOutputs;
  static constexpr std::int64_t kWeightBytes = static_cast<std::int64_t>(dtype_size(T));

  template <int R, int O>
  void tile(std::int64_t i, std::int64_t j0, KSpan span, float* part, TileAhead& ahead) const {
    dot_tile_avx512<T, R, O>(k, a + i * lda, lda, b, ldb, j0, span, part, c + i * ldc, ldc, ahead);
  }
};

// The tiles of bf16 weights (dot_tile_bf16_avx512) on bf16 activations.
template <bool kDpbf16>
struct Bf16Tiles {
  std::int64_t k;
  const std::uint16_t* a;
  std::int64_t lda;
  const std::uint16_t* b;
  std::int64_t ldb;
  float* c;
  std::int64_t ldc;
  static constexpr std::int64_t kBlock = 2 * kLanes;
  static constexpr int kPasses = 2, kOutputs = kTileOutputs;
  static constexpr std::int64_t kWeightBytes = 2;

  template <int R, int O>
  void tile(std::int64_t i, std::int64_t j0, KSpan span, float* part, TileAhead& ahead) const {
    dot_tile_bf16_avx512<kDpbf16, R, O>(k, a + i * lda, lda, b, ldb, j0, span, part, c + i * ldc,
                                        ldc, ahead);
  }
};

// The tiles of fp32 / f16 weights on AVX2 (dot_tile_avx2).
template <DType T>
struct WidenedTilesAvx2 {
  std::int64_t k;
  const float* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  float* c;
  std::int64_t ldc;
  static constexpr std::int64_t kBlock = kLanes;
  static constexpr int kPasses = 4, kOutputs = kTileOutputsAvx2;
  static constexpr std::int64_t kWeightBytes = static_cast<std::int64_t>(dtype_size(T));

  template <int R, int O>
  void tile(std::int64_t i, std::int64_t j0, KSpan span, float* part, TileAhead& ahead) const {
    dot_tile_avx2<T, R, O>(k, a + i * lda, lda, b, ldb, j0, span, part, c + i * ldc, ldc, ahead);
  }
};

// The tiles of bf16 weights on AVX2 (dot_tile_bf16_avx2) on bf16 activations.
struct Bf16TilesAvx2 {
  std::int64_t k;
  const std::uint16_t* a;
  std::int64_t lda;
  const std::uint16_t* b;
  std::int64_t ldb;
  float* c;
  std::int64_t ldc;
  static constexpr std::int64_t kBlock = 2 * kLanes;
  static constexpr int kPasses = 4, kOutputs = kTileOutputsBf16Avx2;
  static constexpr std::int64_t kWeightBytes = 2;

  template <int R, int O>
  void tile(std::int64_t i, std::int64_t j0, KSpan span, float* part, TileAhead& ahead) const {
    dot_tile_bf16_avx2<R, O>(k, a + i * lda, lda, b, ldb, j0, span, part, c + i * ldc, ldc, ahead);
  }
};

// Outputs [j0, j0 + O) for rows [i0, i0 + rows) over `span`: groups of kTileRows, then the rest,
// the g-th group's lane sums at part + g * kTileRows * O * kLanes.
template <int O, typename Tiles>
void tile_rows(const Tiles& tiles, std::int64_t i0, std::int64_t rows, std::int64_t j0, KSpan span,
               float* part, TileAhead& ahead) {
  constexpr std::int64_t kGroupSums = kTileRows * O * kLanes;
  std::int64_t i = i0;
  for (; i + kTileRows <= i0 + rows; i += kTileRows, part += kGroupSums) {
    tiles.template tile<kTileRows, O>(i, j0, span, part, ahead);
  }
  switch (i0 + rows - i) {
    case 3:
      return tiles.template tile<3, O>(i, j0, span, part, ahead);
    case 2:
      return tiles.template tile<2, O>(i, j0, span, part, ahead);
    case 1:
      return tiles.template tile<1, O>(i, j0, span, part, ahead);
    default:
      return;
  }
}

// c = a b for m >= 2 rows: chunks of kTileChunkRows rows, each in tiles of Tiles::kOutputs
// outputs (outputs outer, so a tile's weights come from memory once for the chunk), each tile
// over spans of k of kSpanRowBytes a weight row (KSpan; the lane sums kept between spans in
// a buffer on the stack), the weights of the tile's next span asked for across the steps of
// this one.
template <typename Tiles>
void tiled_rows(const Tiles& tiles, std::int64_t m, std::int64_t n) {
  constexpr int kWidth = Tiles::kOutputs;
  const std::int64_t k = tiles.k, padded = (k + Tiles::kBlock - 1) / Tiles::kBlock * Tiles::kBlock;
  // Bytes of an element of k in a row: of the weights or of the activations, whichever is wider.
  constexpr std::int64_t kBytes = std::max<std::int64_t>(Tiles::kWeightBytes, sizeof(*tiles.a));
  const std::int64_t span_length =
      padded * kBytes <= kWholeRowBytes
          ? padded
          : std::max(Tiles::kBlock, kSpanRowBytes / kBytes / Tiles::kBlock * Tiles::kBlock);
  const std::int64_t row_bytes = tiles.ldb * Tiles::kWeightBytes;
  const auto from = reinterpret_cast<std::uintptr_t>(static_cast<const void*>(tiles.b));
  static_assert(kWidth <= kTileOutputs, "part holds the lane sums of kTileOutputs outputs a row");
  alignas(64) float part[kTileChunkRows * kTileOutputs * kLanes];  // 72 KiB on the stack
  // The weights of outputs [j, j + outputs), elements [e, e + count) of each, asked for over
  // `steps` steps of a tile.
  auto ahead_of = [&](std::int64_t j, std::int64_t outputs, std::int64_t e, std::int64_t count,
                      std::int64_t steps) {
    const auto bytes =
        static_cast<std::uintptr_t>(std::max<std::int64_t>(count, 0) * Tiles::kWeightBytes);
    const std::uintptr_t run =
        from + static_cast<std::uintptr_t>(j * row_bytes + e * Tiles::kWeightBytes);
    const std::int64_t lines = outputs * static_cast<std::int64_t>((bytes + 63) / 64);
    return TileAhead{run,
                     run,
                     bytes,
                     static_cast<std::uintptr_t>(row_bytes),
                     bytes > 0 ? outputs : 0,
                     (lines + steps - 1) / std::max<std::int64_t>(steps, 1)};
  };
  // The spans of k in order (one, empty, for k = 0: the tiles then write zeros).
  auto for_each_span = [&](const auto& fn) {
    std::int64_t e = 0;
    do {
      fn(KSpan{e, std::min(e + span_length, padded), e == 0, e + span_length >= padded});
      e += span_length;
    } while (e < padded);
  };
  for (std::int64_t i0 = 0; i0 < m; i0 += kTileChunkRows) {
    const std::int64_t rows = std::min(kTileChunkRows, m - i0);
    const std::int64_t groups = (rows + kTileRows - 1) / kTileRows;
    std::int64_t j = 0;
    for (; j + kWidth <= n; j += kWidth) {
      for_each_span([&](KSpan span) {
        const std::int64_t steps =
            groups * Tiles::kPasses * ((span.end - span.begin) / Tiles::kBlock);
        // Next: this tile's next span, or the next tile's first.
        TileAhead ahead =
            span.last ? ahead_of(j + kWidth, std::min<std::int64_t>(kWidth, n - j - kWidth), 0,
                                 std::min(span_length, k), steps)
                      : ahead_of(j, kWidth, span.end, std::min(span_length, k - span.end), steps);
        tile_rows<kWidth>(tiles, i0, rows, j, span, part, ahead);
      });
    }
    for (; j < n; ++j) {
      for_each_span([&](KSpan span) {
        TileAhead none;
        tile_rows<1>(tiles, i0, rows, j, span, part, none);
      });
    }
  }
}

template <DType T>
void rows_avx512(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 const void* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  if (m == 1) return dot_row_avx512<T>(k, a, b, ldb, 0, n, c);
  tiled_rows(WidenedTiles<T>{k, a, lda, b, ldb, c, ldc}, m, n);
}

template <DType T>
void rows_avx2(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
               const void* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  if (m == 1) return dot_row_avx2<T>(k, a, b, ldb, 0, n, c);
  tiled_rows(WidenedTilesAvx2<T>{k, a, lda, b, ldb, c, ldc}, m, n);
}

template <bool kDpbf16>
void rows_bf16_avx512(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* x,
                      std::int64_t ldx, const std::uint16_t* b, std::int64_t ldb, float* c,
                      std::int64_t ldc) {
  if (m == 1) return dot_row_bf16_avx512<kDpbf16>(k, x, b, ldb, 0, n, c);
  tiled_rows(Bf16Tiles<kDpbf16>{k, x, ldx, b, ldb, c, ldc}, m, n);
}

}  // namespace

void dot_gemm_bf16(std::int64_t m, const std::uint16_t* a, std::int64_t lda, const WeightMatrix& w,
                   float* c, std::int64_t ldc, KernelLevel level) {
  NUMESH_CHECK(w.layout == WeightLayout::kOutIn && w.dtype == DType::kBF16, ShapeError,
               "dot_gemm_bf16: {} weights stored {}; it reads bf16 stored out-in",
               to_string(w.dtype), w.layout == WeightLayout::kOutIn ? "out-in" : "in-out");
  const std::int64_t n = w.cols, k = w.rows, ldb = w.stride();
  const auto* b = static_cast<const std::uint16_t*>(w.data);
  if (m <= 0 || n <= 0) return;
  if (level == KernelLevel::kAmx) return detail::dot_rows_bf16_amx(m, n, k, a, lda, b, ldb, c, ldc);
  if (level == KernelLevel::kAvx512Bf16)
    return rows_bf16_avx512<true>(m, n, k, a, lda, b, ldb, c, ldc);
  if (level == KernelLevel::kAvx512)
    return rows_bf16_avx512<false>(m, n, k, a, lda, b, ldb, c, ldc);
  if (level == KernelLevel::kAvx2) {
    if (m == 1) return dot_row_bf16_avx2(k, a, b, ldb, 0, n, c);
    return tiled_rows(Bf16TilesAvx2{k, a, lda, b, ldb, c, ldc}, m, n);
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j)
      c[i * ldc + j] = dot_scalar_bf16(k, a + i * lda, b + j * ldb);
  }
}

void dot_gemm(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& w, float* c,
              std::int64_t ldc, KernelLevel level) {
  NUMESH_CHECK(w.layout == WeightLayout::kOutIn, ShapeError,
               "dot_gemm: weights stored in-out; it reads out-in ones (skinny_gemm reads in-out)");
  const std::int64_t n = w.cols, k = w.rows, ldb = w.stride();
  const void* b = w.data;
  const DType b_type = w.dtype;
  if (m <= 0 || n <= 0) return;
  NUMESH_CHECK(is_element_dtype(b_type), TypeError,
               "dot_gemm: {} weights take their own dot kernel (block_gemm.hpp)",
               to_string(b_type));
  switch (element_type(b_type)) {
    case ElementType::kBF16: {
      // a's bf16 bits, row after row (the calling thread's buffer).
      thread_local std::vector<std::uint16_t> bits;
      bits.resize(static_cast<std::size_t>(m * k));
      for (std::int64_t i = 0; i < m; ++i) {
        runtime::convert_f32_to_bf16(
            std::span<const float>(a + i * lda, static_cast<std::size_t>(k)),
            std::span<std::uint16_t>(bits.data() + i * k, static_cast<std::size_t>(k)), level);
      }
      dot_gemm_bf16(m, bits.data(), k, w, c, ldc, level);
      return;
    }
    case ElementType::kF32:
    case ElementType::kF16:
      break;  // below: the vector kernels' two-way choices are between these two
  }
  switch (level) {
    case KernelLevel::kAvx512:
    case KernelLevel::kAvx512Bf16:
    case KernelLevel::kAmx:
      if (b_type == DType::kF32) return rows_avx512<DType::kF32>(m, n, k, a, lda, b, ldb, c, ldc);
      return rows_avx512<DType::kF16>(m, n, k, a, lda, b, ldb, c, ldc);
    case KernelLevel::kAvx2:
      if (b_type == DType::kF32) return rows_avx2<DType::kF32>(m, n, k, a, lda, b, ldb, c, ldc);
      return rows_avx2<DType::kF16>(m, n, k, a, lda, b, ldb, c, ldc);
    case KernelLevel::kScalar:
      break;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = dot_scalar(k, a + i * lda, w, j);
  }
}

}  // namespace numesh::ops
