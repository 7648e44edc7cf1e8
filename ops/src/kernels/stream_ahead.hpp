#pragma once

// PRIVATE to ops/src/kernels: how the decode kernels ask for the weights ahead of their reads.
// A decode product reads each weight once, output after output, and an output's row follows the
// one before it: one stream through the matrix. The hardware prefetchers alone left the kernels
// waiting on memory on Sapphire Rapids (one thread read 6.4 GB/s of q8_0 where its read kernel
// reads 10.3); a software prefetch a few KiB ahead of the stream took decode of the 109 M Llama
// from 50-55 to 80-95 tokens/s in q8_0, 70-80 to 100-145 in q4_0 (one thread), and with two
// threads bf16 from 73-84 to 94-115, f16 62-66 to 92-115 and f32 44-46 to 52-62
// (docs/benchmarks.md, "Session 33"). 2 KiB to 8 KiB ahead all gained; 4 KiB is the middle.

#include <immintrin.h>

#include <cstdint>

namespace numesh::ops::detail {

/// How far ahead of its reads a decode kernel asks for the weights, in bytes.
inline constexpr std::int64_t kStreamAhead = 4096;

/// Asks for the `bytes` (one or more cache lines) kStreamAhead past `at`: addresses, never read,
/// so past the matrix's end they are only hints.
inline void stream_ahead(const void* at, std::int64_t bytes = 64) noexcept {
  const std::uintptr_t from = reinterpret_cast<std::uintptr_t>(at) + kStreamAhead;
  for (std::int64_t o = 0; o < bytes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(from + static_cast<std::uintptr_t>(o)), _MM_HINT_T0);
  }
}

}  // namespace numesh::ops::detail
