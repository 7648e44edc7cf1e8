#pragma once

// PRIVATE to ops/src/kernels: MXCSR's DAZ and FTZ for a scope, for kernels that compute
// vdpbf16ps's steps with fmas (vdpbf16ps reads subnormal inputs as zero and flushes subnormal
// results whatever MXCSR says; an fma does so only under DAZ and FTZ). The scope's work must
// be a call the compiler cannot see into (gemm_16bit.cpp calls its micro-kernels through a
// table of function pointers), so that no arithmetic moves across the writes of MXCSR.

#include <immintrin.h>

namespace numesh::ops::detail {

/// DAZ and FTZ on the calling thread from construction to destruction, then MXCSR as it was
/// (its exception flags included).
class FlushDenormals {
 public:
  FlushDenormals() noexcept : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDazFtz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kDazFtz = 0x8040;  // flush to zero (bit 15), denormals are zero (6)
  unsigned saved_;
};

}  // namespace numesh::ops::detail
