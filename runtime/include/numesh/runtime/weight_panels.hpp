#pragma once

// Weight panels: an out-in matrix of Q8_0 or Q4_0 blocks ([n outputs, k inputs], each output's
// row a run of GGML blocks) stored with 16 outputs interleaved, so that a decode kernel holds 16
// outputs in one 512-bit register: no sum across lanes per output, and one broadcast of the
// activations serves 16 outputs (the decode GEMV ran 2.8-3.7x as fast as over rows, in L2, in a
// throwaway A/B program on [3072, 768] Q4_0). The bytes are GGML's, reordered; nothing is
// converted, so a panel holds exactly the values of its rows.
//
// The first n - n mod 16 outputs are panels, the rest stay rows, so a matrix takes the bytes of
// its rows (n row_bytes(dtype, k)). Panel p (outputs 16p .. 16p + 15) holds its k / 32 blocks in
// order; block t of a panel is 16 blocks' bytes:
//   bytes [0, 32)           the 16 outputs' f16 scales d, output o's at 2o (little-endian);
//   bytes [32, 32 + 64 u)   the codes in 4-byte units: unit u of output o at 32 + 64u + 4o, unit
//                           u being bytes 2 + 4u .. 2 + 4u + 3 of output o's block (Q8_0: 8 units,
//                           codes 4u .. 4u + 3; Q4_0: 4 units, whose low nibbles are codes 4u ..
//                           4u + 3 and high nibbles codes 16 + 4u .. 16 + 4u + 3).
// So each 64-byte line of codes is one group of 4 inputs (two for Q4_0) across the 16 outputs:
// the operand of one vpdpbusd.

#include <cstddef>
#include <cstdint>
#include <span>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::runtime {

/// Outputs a panel interleaves.
inline constexpr std::int64_t kPanelWidth = 16;

/// True for the formats that can be stored in panels (Q8_0, Q4_0).
constexpr bool has_panels(DType dtype) noexcept {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0;
}

/// Outputs of an n-output matrix that its panels hold: n rounded down to 16.
constexpr std::int64_t panel_outputs(std::int64_t n) noexcept { return n - n % kPanelWidth; }

/// Writes the n x k matrix `rows` (n rows of row_bytes(dtype, k), one after the other) into
/// `panels` in the panel layout (this header's top comment), with the kernels of `level` (AVX-512
/// from KernelLevel::kAvx512, else portable C++; every level writes the same bytes). The spans
/// must not overlap. REQUIRES: `level` runs on this CPU.
/// Throws: TypeError when `dtype` has no panels; ShapeError when k is not whole blocks, n or k is
/// negative, or a span's size is not n row_bytes(dtype, k) (naming both).
void rows_to_panels(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> rows,
                    std::span<std::byte> panels, KernelLevel level = kernel_level());

/// The inverse of rows_to_panels: the n rows of the matrix `panels` holds.
/// Throws: as rows_to_panels.
void panels_to_rows(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> panels,
                    std::span<std::byte> rows);

/// rows_to_panels in place: `matrix` holds rows and then holds panels (through a buffer of one
/// panel's bytes at a time). REQUIRES: `level` runs on this CPU. Throws: as rows_to_panels.
void rows_to_panels_in_place(DType dtype, std::int64_t n, std::int64_t k,
                             std::span<std::byte> matrix, KernelLevel level = kernel_level());

}  // namespace numesh::runtime
