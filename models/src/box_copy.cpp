#include "box_copy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::models::detail {

std::uint64_t check_box(std::string_view where, std::span<const std::int64_t> shape,
                        std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
                        DType target, std::size_t out_bytes) {
  const auto text = [](std::span<const std::int64_t> dims) {
    return fmt::format("[{}]", fmt::join(dims, ", "));
  };
  const std::size_t rank = shape.size();
  NUMESH_CHECK(offsets.size() == rank && sizes.size() == rank, ShapeError,
               "{}: the box has {} offsets and {} sizes but the tensor (shape {}) has rank {}",
               where, offsets.size(), sizes.size(), text(shape), rank);
  std::uint64_t elements = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const bool inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] <= shape[d] &&
                        sizes[d] <= shape[d] - offsets[d];
    NUMESH_CHECK(inside, ShapeError,
                 "{}: the box at offsets {} of sizes {} is outside shape {} in dim {} (offset {}, "
                 "size {}, extent {})",
                 where, text(offsets), text(sizes), text(shape), d, offsets[d], sizes[d], shape[d]);
  }
  for (std::size_t d = 0; d < rank; ++d) {
    // Saturates: the count is only reported, and a box past 2^64 elements is refused below.
    if (__builtin_mul_overflow(elements, static_cast<std::uint64_t>(sizes[d]), &elements)) {
      elements = UINT64_MAX;
    }
  }
  // Bytes of the box stored as `target`: whole rows of it (a block format's blocks along them).
  const std::int64_t row = rank == 0 ? 1 : sizes[rank - 1];
  const DTypeTraits& format = traits(target);
  NUMESH_CHECK(row % format.block_elements == 0, ValueError,
               "{} as {}: the box's rows of {} elements are not whole blocks of {}", where,
               format.name, row, format.block_elements);
  std::uint64_t needed = 0;
  try {
    needed = static_cast<std::uint64_t>(runtime::storage_bytes(target, sizes));
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("{}: {}", where, e.what()));
  }
  NUMESH_CHECK(out_bytes == needed, ShapeError,
               "{}: the output has {} bytes but {} elements of {} take {}", where, out_bytes,
               elements, to_string(target), needed);
  return elements;
}

void copy_box(const std::byte* src, DType from, std::span<const std::int64_t> shape,
              std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
              std::byte* dst, DType to) {
  const std::size_t rank = shape.size();
  NUMESH_DCHECK(offsets.size() == rank && sizes.size() == rank);
  if (std::any_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s == 0; })) return;

  // The run: dims [split, rank) read as one stretch of consecutive elements. Going inwards to
  // outwards, every dim the box covers fully extends it; the first one it does not still joins
  // the run (its elements are consecutive) but ends it.
  std::size_t split = rank;
  std::size_t run = 1;
  while (split > 0) {
    --split;
    run *= static_cast<std::size_t>(sizes[split]);
    if (sizes[split] != shape[split]) break;
  }

  // Element strides of the source, and the first element of the box.
  std::vector<std::size_t> stride(rank, 1);
  for (std::size_t d = rank; d-- > 1;)
    stride[d - 1] = stride[d] * static_cast<std::size_t>(shape[d]);
  std::size_t first = 0;
  for (std::size_t d = 0; d < rank; ++d) first += static_cast<std::size_t>(offsets[d]) * stride[d];

  // An odometer over the dims outside the run, [0, split), last dim fastest.
  std::vector<std::int64_t> index(split, 0);
  std::size_t source = first;
  for (std::size_t written = 0;;) {
    // Offsets in bytes of each format: a block format's runs are whole blocks (convert_elements
    // refuses others, naming the format).
    runtime::convert_elements(src + row_bytes(from, static_cast<std::int64_t>(source)), from,
                              dst + row_bytes(to, static_cast<std::int64_t>(written)), to, run);
    written += run;
    std::size_t d = split;
    while (d > 0) {
      --d;
      if (++index[d] < sizes[d]) {
        source += stride[d];
        break;
      }
      source -= static_cast<std::size_t>(index[d] - 1) * stride[d];
      index[d] = 0;
      if (d == 0) return;
    }
    if (split == 0) return;
  }
}

}  // namespace numesh::models::detail
