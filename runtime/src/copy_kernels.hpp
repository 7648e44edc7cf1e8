#pragma once

// PRIVATE: the copy kernel behind every data movement of the runtime (collectives, shard and
// gather, box copies).
//
// Why not plain memcpy: on the machine kind numesh is measured on (Zen 4 under KVM, glibc
// 2.36), memcpy of 4 KiB - 1 MiB runs at ~2 GB/s instead of ~40 GB/s when the *destination*
// is not 64-byte aligned (glibc picks `rep movsb`, which is slow there for unaligned
// destinations; source alignment does not matter). Collective chunks and box rows start at
// arbitrary element offsets, so copy_floats first copies up to 15 floats to align the
// destination, then hands the rest to memcpy. Copies of kNonTemporalBytes and more use
// streaming stores instead: the destination is not read again soon, and bypassing the cache
// saves the read-for-ownership traffic (docs/benchmarks.md, "Streaming stores from 8 MiB":
// from 16 MiB per copy they beat cached copies; below the L3's size they lose).

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace numesh::runtime::detail {

/// Copies at or above this many bytes (in total) use non-temporal stores (where the CPU has
/// SSE2).
inline constexpr std::size_t kNonTemporalBytes = std::size_t{8} << 20;

/// True when a copy of `n` floats in total should stream.
constexpr bool streams(std::size_t n) noexcept { return n * sizeof(float) >= kNonTemporalBytes; }

/// dst[0, n) = src[0, n), with streaming stores when `non_temporal` (callers that split one
/// big copy into pieces decide on the whole size). REQUIRES: the ranges do not overlap.
inline void copy_floats(float* dst, const float* src, std::size_t n, bool non_temporal) {
  std::size_t i = 0;
  // Align the destination to a cache line.
  while (i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 63u) != 0) {
    dst[i] = src[i];
    ++i;
  }
#if defined(__SSE2__)
  if (non_temporal) {
    for (; i + 16 <= n; i += 16) {
      _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
      _mm_stream_ps(dst + i + 4, _mm_loadu_ps(src + i + 4));
      _mm_stream_ps(dst + i + 8, _mm_loadu_ps(src + i + 8));
      _mm_stream_ps(dst + i + 12, _mm_loadu_ps(src + i + 12));
    }
    for (; i < n; ++i) dst[i] = src[i];
    _mm_sfence();  // order the streamed stores before whatever signals completion
    return;
  }
#else
  (void)non_temporal;
#endif
  if (i < n) std::memcpy(dst + i, src + i, (n - i) * sizeof(float));
}

}  // namespace numesh::runtime::detail
