#pragma once

// PRIVATE to ops/src/kernels: every block format's kernels, in one table. A format's file
// (q8_0_gemm.cpp, q4_k_gemm.cpp, ...) writes its codes class (q8_dot_common.hpp's interface) and
// defines its entry from it with block_kernels_of; dot_gemm_blocks and packed_gemm_q8
// (block_gemm.hpp) and the kernel table behind device_gemm (weight_kernels.cpp) find a format's
// kernels here (packed_gemm_q8 names Q8_0 and Q4_0 only for their stored panels, a layout of
// their own). So adding a block format's kernels is its file and its line in kBlockKernels.

#include <array>
#include <cstddef>
#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

namespace numesh::ops::detail {

/// dot_gemm_blocks' contract (block_gemm.hpp) for one format's weights.
using BlockDot = void (*)(std::int64_t m, const std::int8_t* codes, const float* scales,
                          const WeightMatrix& b, float* c, std::int64_t ldc,
                          runtime::KernelLevel level);

/// One block format's kernels.
struct BlockKernels {
  DType dtype;
  /// The decode kernel: dot_gemm_blocks on this format's weights.
  BlockDot dot;
  /// The prefill tile's packer (packed_panels.hpp).
  PanelPacker pack_panel;
  /// How packed_gemm_q8 multiplies the packed blocks: with two scales a block (Q3_K, Q6_K:
  /// inputs 0-15 and 16-31) or one, and with minimums (Q4_K, Q5_K: the activations' scaled block
  /// sums times -dmin m) or without.
  bool two_scales;
  bool minimums;
};

/// The kernels of the format whose codes class is F: q8_dot_common.hpp's decode kernel and
/// packed_panels.hpp's packer, both written once for every format of its kind (pair formats,
/// blocks of 32; super-block formats, 256).
template <class F>
constexpr BlockKernels block_kernels_of() {
  if constexpr (kSuperBlocks<F>) {
    static_assert(F::kScalesPerBlock * traits(F::kDType).scale_elements == kQ8DotBlock,
                  "the format's scales per activation block are its sub-blocks in core's table");
    static_assert(F::kScalesPerBlock == 1 || !F::kMinimums,
                  "no tile form takes two scales and two minimums an activation block yet");
    return {F::kDType, q8dot_gemm<F>, pack_kquant_panel<F>, F::kScalesPerBlock == 2, F::kMinimums};
  } else {
    return {F::kDType, q8dot_gemm<F>, pack_pair_panel<F>, false, false};
  }
}

// Each defined in its format's file.
extern const BlockKernels kQ8_0BlockKernels;
extern const BlockKernels kQ4_0BlockKernels;
extern const BlockKernels kQ5_0BlockKernels;
extern const BlockKernels kIQ4_NLBlockKernels;
extern const BlockKernels kQ3_KBlockKernels;
extern const BlockKernels kQ4_KBlockKernels;
extern const BlockKernels kQ5_KBlockKernels;
extern const BlockKernels kQ6_KBlockKernels;
extern const BlockKernels kIQ4_XSBlockKernels;

/// Every block format's kernels (tests/ops/block_gemm_test.cpp runs every block format of core's
/// table through dot_gemm_blocks and packed_gemm_q8 at every level, bitwise against its own
/// reference: a format without its entry, or with another's, fails there).
inline constexpr std::array<const BlockKernels*, 9> kBlockKernels = {
    &kQ8_0BlockKernels,   &kQ4_0BlockKernels, &kQ5_0BlockKernels,
    &kIQ4_NLBlockKernels, &kQ3_KBlockKernels, &kQ4_KBlockKernels,
    &kQ5_KBlockKernels,   &kQ6_KBlockKernels, &kIQ4_XSBlockKernels,
};

// One line above for each block format of core's table.
constexpr std::size_t block_format_count() {
  std::size_t n = 0;
  for (const DTypeTraits& f : kDTypes) n += f.block_elements > 1 ? 1 : 0;
  return n;
}
static_assert(kBlockKernels.size() == block_format_count(),
              "every block format of core's table has its line in kBlockKernels");

/// The kernels of weights stored as `dtype`; nullptr for an element type (or a block format
/// without an entry, which the assertion and the test above rule out).
inline const BlockKernels* block_kernels(DType dtype) noexcept {
  for (const BlockKernels* k : kBlockKernels) {
    if (k->dtype == dtype) return k;
  }
  return nullptr;
}

}  // namespace numesh::ops::detail
