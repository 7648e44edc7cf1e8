#include "box_in_place.hpp"

#include <cstddef>

namespace numesh::models::detail {

std::optional<std::uint64_t> contiguous_box_offset(std::span<const std::int64_t> shape,
                                                   std::span<const std::int64_t> offsets,
                                                   std::span<const std::int64_t> sizes,
                                                   DType format) noexcept {
  const std::size_t rank = shape.size();
  if (rank == 0 || offsets.size() != rank || sizes.size() != rank) return std::nullopt;
  for (std::size_t d = 0; d < rank; ++d) {
    if (offsets[d] < 0 || sizes[d] <= 0 || offsets[d] > shape[d] - sizes[d]) return std::nullopt;
  }
  // j: the outermost dim not of size 1; every dim after it whole.
  std::size_t j = 0;
  while (j + 1 < rank && sizes[j] == 1) ++j;
  for (std::size_t d = j + 1; d < rank; ++d) {
    if (sizes[d] != shape[d]) return std::nullopt;
  }
  const DTypeTraits& f = traits(format);
  // A block format's box: whole rows (a box within one row only if it is that whole row).
  if (f.block_elements > 1 && sizes[rank - 1] != shape[rank - 1]) return std::nullopt;
  if (shape[rank - 1] % f.block_elements != 0) return std::nullopt;
  // Bytes a step of each dim moves: a row's blocks for the dim before last, one element (of an
  // element type) in the last.
  const auto row = static_cast<std::uint64_t>(shape[rank - 1] / f.block_elements) *
                   static_cast<std::uint64_t>(f.block_bytes);
  std::uint64_t offset = f.block_elements == 1 ? static_cast<std::uint64_t>(offsets[rank - 1]) *
                                                     static_cast<std::uint64_t>(f.block_bytes)
                                               : 0;
  std::uint64_t stride = row;
  for (std::size_t d = rank - 1; d-- > 0;) {
    offset += static_cast<std::uint64_t>(offsets[d]) * stride;
    stride *= static_cast<std::uint64_t>(shape[d]);
  }
  return offset;
}

namespace {

// The box's offset in the tensor's bytes when the tensor is stored as `target` and the box is
// one run of them (contiguous_box_offset): what box_in_place maps and read_one_run reads.
std::optional<std::uint64_t> run_offset(std::optional<DType> stored,
                                        std::span<const std::int64_t> shape,
                                        std::span<const std::int64_t> offsets,
                                        std::span<const std::int64_t> sizes,
                                        DType target) noexcept {
  if (stored != target) return std::nullopt;
  return contiguous_box_offset(shape, offsets, sizes, target);
}

}  // namespace

std::shared_ptr<const std::byte> box_in_place(const std::shared_ptr<const std::byte>& mapping,
                                              const std::byte* tensor, std::optional<DType> stored,
                                              std::span<const std::int64_t> shape,
                                              std::span<const std::int64_t> offsets,
                                              std::span<const std::int64_t> sizes,
                                              DType target) noexcept {
  const std::optional<std::uint64_t> offset = run_offset(stored, shape, offsets, sizes, target);
  if (!offset) return nullptr;
  const std::byte* first = tensor + *offset;
  const std::uintptr_t alignment = target == DType::kF32 ? 4 : 2;
  if (reinterpret_cast<std::uintptr_t>(first) % alignment != 0) return nullptr;
  return {mapping, first};  // aliasing: owns the mapping, points at the box
}

bool read_one_run(const ReadableFile& file, std::uint64_t tensor_offset,
                  std::optional<DType> stored, std::span<const std::int64_t> shape,
                  std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
                  DType target, std::span<std::byte> out, std::string_view where) {
  const std::optional<std::uint64_t> offset = run_offset(stored, shape, offsets, sizes, target);
  if (!offset) return false;
  file.read_at(tensor_offset + *offset, out, where);
  return true;
}

}  // namespace numesh::models::detail
