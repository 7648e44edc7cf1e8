#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

// The decode kernel for weights stored out-in ([n, k] row-major, nn.Linear's layout): each
// output's k weights lie together, so a task that owns a range of outputs reads one contiguous
// run of memory, as a plain read does (the in-out skinny_gemm must stream several rows at once
// to amortize its updates of c, and ran at 0.79-0.86x this kernel's bytes per second on the
// same weights; docs/benchmarks.md, "Weights stored out-in").
//
// Every element c[i][j] is one dot product of row i of a and row j of b, summed in a fixed
// order at every kernel level, so the scalar, AVX2 and AVX-512 versions give the same bits on
// normal values: 32 partial sums s[0..31] start at zero, k is padded with zeros to a whole
// block, and the sums are then folded as t[l] = s[l] + s[l + 16], t[l] += t[l + 8], += t[l + 4],
// += t[l + 2], c = t[0] + t[1].
// - fp32 and f16 weights (f16 widened exactly): blocks of 32, element e goes to s[e mod 32]
//   with one fma each, in e order.
// - bf16 weights: a is rounded to bf16 first (nearest even; a no-op for activations device_gemm
//   has already rounded). Blocks of 64, the pair (e, e + 1) with e even goes to s[(e mod 64) / 2],
//   the odd element's product added first, then the even's, each with one rounding: the products
//   of two bf16 values are exact in fp32, and this is the order vdpbf16ps adds them in (Intel's
//   definition, checked on Zen 4 by gemm_16bit_test). kAvx512Bf16 runs vdpbf16ps; the levels
//   below it take the same steps with fma. vdpbf16ps reads subnormal inputs as zero and flushes
//   subnormal results, fma does not: with subnormal values the levels may differ in those bits.
// - bf16 weights at kAmx: AMX tile products (dot_gemm_amx.hpp), each a chunk of 32 values of k
//   summed by the tile unit in its own way and added to the fp32 sum of the chunks before it,
//   in k order. Its bits are not the other levels' (the unit rounds a pair's products and the
//   sum otherwise than vdpbf16ps's two steps; docs/benchmarks.md, "bf16 rows by tile
//   products"), and one row reads its weights as fast as the vdpbf16ps kernel while 16 rows
//   take a tile product where fma took 16 times the work.
// At each level a row has the same bits in a product of any number of rows, and an output in a
// call given any range of outputs.

namespace numesh::ops {

/// c[m, n] = a[m, k] b on the calling thread: a fp32 with rows `lda` floats apart, b [k, n]
/// stored out-in ([n, k]) in fp32, bf16 or f16, its rows (one per output) b.stride() elements
/// apart, c fp32 with rows `ldc` apart (overwritten; k = 0 writes zeros). Keeps a buffer of the
/// calling thread for a's bf16 bits (m * k of them) between calls.
/// REQUIRES: m >= 0; b.layout is kOutIn and b.dtype an element type; `level` runs on this CPU;
/// lda >= k, ldc >= n.
void dot_gemm(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b, float* c,
              std::int64_t ldc, runtime::KernelLevel level = runtime::kernel_level());

/// dot_gemm for bf16 weights whose activations are bf16 already: `a` holds their bits (rows
/// `lda` elements apart), as device_gemm has them, so that no task converts them again.
/// REQUIRES: as dot_gemm, with b.dtype kBF16.
void dot_gemm_bf16(std::int64_t m, const std::uint16_t* a, std::int64_t lda, const WeightMatrix& b,
                   float* c, std::int64_t ldc,
                   runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
