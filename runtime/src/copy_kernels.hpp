#pragma once

// PRIVATE: the copy kernel behind every data movement of the runtime (collectives, shard and
// gather, box copies).
//
// Why not plain memcpy: on the machine kind numesh is measured on (Zen 4 under KVM, glibc
// 2.36), memcpy of 4 KiB - 1 MiB runs at ~2 GB/s instead of ~40 GB/s when the *destination*
// is not 64-byte aligned (glibc picks `rep movsb`, which is slow there for unaligned
// destinations; source alignment does not matter). Collective chunks and box rows start at
// arbitrary element offsets, so copy_bytes first copies up to 63 bytes to align the
// destination, then hands the rest to memcpy. Copies of kNonTemporalBytes and more use
// streaming stores instead: the destination is not read again soon, and bypassing the cache
// saves the read-for-ownership traffic (docs/benchmarks.md, "Streaming stores from 8 MiB":
// from 16 MiB per copy they beat cached copies; below the L3's size they lose).

#include <algorithm>
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

/// True when a copy of `bytes` in total should stream.
constexpr bool streams_bytes(std::size_t bytes) noexcept { return bytes >= kNonTemporalBytes; }
/// True when a copy of `n` floats in total should stream.
constexpr bool streams(std::size_t n) noexcept { return streams_bytes(n * sizeof(float)); }

/// dst[0, bytes) = src[0, bytes), with streaming stores when `non_temporal` (callers that split
/// one big copy into pieces decide on the whole size). Elements of any size: the head up to the
/// destination's next cache line is copied first (a short memcpy), then the aligned rest.
/// REQUIRES: the ranges do not overlap.
inline void copy_bytes(void* dst_ptr, const void* src_ptr, std::size_t bytes, bool non_temporal) {
  auto* dst = static_cast<std::byte*>(dst_ptr);
  const auto* src = static_cast<const std::byte*>(src_ptr);
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(dst) & 63u;
  const std::size_t head = misalign == 0 ? 0 : std::min(bytes, 64 - misalign);
  if (head > 0) std::memcpy(dst, src, head);
  std::size_t i = head;
#if defined(__SSE2__)
  if (non_temporal) {
    for (; i + 64 <= bytes; i += 64) {
      const auto* s = reinterpret_cast<const __m128i*>(src + i);
      auto* d = reinterpret_cast<__m128i*>(dst + i);
      _mm_stream_si128(d, _mm_loadu_si128(s));
      _mm_stream_si128(d + 1, _mm_loadu_si128(s + 1));
      _mm_stream_si128(d + 2, _mm_loadu_si128(s + 2));
      _mm_stream_si128(d + 3, _mm_loadu_si128(s + 3));
    }
    if (i < bytes) std::memcpy(dst + i, src + i, bytes - i);
    _mm_sfence();  // order the streamed stores before whatever signals completion
    return;
  }
#else
  (void)non_temporal;
#endif
  if (i < bytes) std::memcpy(dst + i, src + i, bytes - i);
}

/// dst[0, n) = src[0, n) for floats (copy_bytes). REQUIRES: the ranges do not overlap.
inline void copy_floats(float* dst, const float* src, std::size_t n, bool non_temporal) {
  copy_bytes(dst, src, n * sizeof(float), non_temporal);
}

}  // namespace numesh::runtime::detail
