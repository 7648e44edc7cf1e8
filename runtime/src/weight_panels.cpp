#include "numesh/runtime/weight_panels.hpp"

#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

// Bytes of a block's f16 scale, which leads it in both formats.
constexpr std::int64_t kScaleBytes = 2;
// Bytes of a unit of codes.
constexpr std::int64_t kUnitBytes = 4;

// The checks both directions share; returns the bytes of a row.
std::int64_t checked_row_bytes(const char* name, DType dtype, std::int64_t n, std::int64_t k,
                               std::size_t from_bytes, std::size_t to_bytes) {
  NUMESH_CHECK(has_panels(dtype), TypeError, "{}: {} weights have no panel layout (q8_0, q4_0 do)",
               name, to_string(dtype));
  const std::int64_t block = traits(dtype).block_elements;
  NUMESH_CHECK(n >= 0 && k >= 0 && k % block == 0, ShapeError,
               "{}: a [{}, {}] {} matrix: sizes must be >= 0 and each row whole blocks of {}", name,
               n, k, to_string(dtype), block);
  const std::int64_t row = row_bytes(dtype, k);
  const auto want = static_cast<std::size_t>(n * row);
  NUMESH_CHECK(from_bytes == want && to_bytes == want, ShapeError,
               "{}: a [{}, {}] {} matrix takes {} bytes; given {} and {}", name, n, k,
               to_string(dtype), want, from_bytes, to_bytes);
  return row;
}

// One panel: its 16 rows (`blocks` blocks each, one after the other) at `from` into the panel
// layout at `to`, or (kToPanels false) a panel at `from` back into its rows at `to`.
template <bool kToPanels>
void convert_panel(DType dtype, std::int64_t blocks, const std::byte* from, std::byte* to) {
  const std::int64_t block_bytes = traits(dtype).block_bytes;
  const std::int64_t units = (block_bytes - kScaleBytes) / kUnitBytes;
  const std::int64_t row = blocks * block_bytes;
  for (std::int64_t t = 0; t < blocks; ++t) {
    // Block t of the panel, and block t of output o's row.
    const std::int64_t panel_block = t * kPanelWidth * block_bytes;
    for (std::int64_t o = 0; o < kPanelWidth; ++o) {
      const std::int64_t row_block = o * row + t * block_bytes;
      const auto copy = [&](std::int64_t in_panel, std::int64_t in_row, std::int64_t bytes) {
        if constexpr (kToPanels) {
          std::memcpy(to + panel_block + in_panel, from + row_block + in_row, bytes);
        } else {
          std::memcpy(to + row_block + in_row, from + panel_block + in_panel, bytes);
        }
      };
      copy(kScaleBytes * o, 0, kScaleBytes);
      for (std::int64_t u = 0; u < units; ++u) {
        copy(kPanelWidth * kScaleBytes + kPanelWidth * kUnitBytes * u + kUnitBytes * o,
             kScaleBytes + kUnitBytes * u, kUnitBytes);
      }
    }
  }
}

template <bool kToPanels>
void convert(const char* name, DType dtype, std::int64_t n, std::int64_t k,
             std::span<const std::byte> from, std::span<std::byte> to) {
  const std::int64_t row = checked_row_bytes(name, dtype, n, k, from.size(), to.size());
  const std::int64_t blocks = k / traits(dtype).block_elements;
  const std::int64_t panelled = panel_outputs(n);
  for (std::int64_t j = 0; j < panelled; j += kPanelWidth) {
    convert_panel<kToPanels>(dtype, blocks, from.data() + j * row, to.data() + j * row);
  }
  // The last n mod 16 outputs are rows in both layouts.
  if (panelled < n) {
    std::memcpy(to.data() + panelled * row, from.data() + panelled * row,
                static_cast<std::size_t>((n - panelled) * row));
  }
}

}  // namespace

void rows_to_panels(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> rows,
                    std::span<std::byte> panels) {
  convert<true>("rows_to_panels", dtype, n, k, rows, panels);
}

void panels_to_rows(DType dtype, std::int64_t n, std::int64_t k, std::span<const std::byte> panels,
                    std::span<std::byte> rows) {
  convert<false>("panels_to_rows", dtype, n, k, panels, rows);
}

void rows_to_panels_in_place(DType dtype, std::int64_t n, std::int64_t k,
                             std::span<std::byte> matrix) {
  const std::int64_t row =
      checked_row_bytes("rows_to_panels_in_place", dtype, n, k, matrix.size(), matrix.size());
  // A panel's bytes lie where its 16 rows lay: each panel is converted through a copy of them.
  std::vector<std::byte> staged(static_cast<std::size_t>(kPanelWidth * row));
  const std::int64_t blocks = k / traits(dtype).block_elements;
  for (std::int64_t j = 0; j < panel_outputs(n); j += kPanelWidth) {
    std::byte* at = matrix.data() + j * row;
    std::memcpy(staged.data(), at, staged.size());
    convert_panel<true>(dtype, blocks, staged.data(), at);
  }
}

}  // namespace numesh::runtime
