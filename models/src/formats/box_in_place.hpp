#pragma once

// PRIVATE to models/src: where a box of a stored tensor lies in its bytes, when it is one run of
// them: what lets a weight's shard read its checkpoint's bytes in place (Checkpoint::box_in_place)
// instead of a copy, and a copy of it be one read of the file.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "file_mapping.hpp"
#include "numesh/core/dtype.hpp"

namespace numesh::models::detail {

/// The offset in bytes, from the tensor's first byte, of the box [offsets[d], offsets[d] +
/// sizes[d]) of a dense row-major tensor of `shape` stored as `format`, when the box's bytes are
/// one run laid out as a dense tensor of `sizes` would be: its dims before some dim j have size
/// 1, dim j any range and every dim after j is whole (a block format's rows whole too). nullopt
/// when they are not (a box of columns), when the box holds no elements, or when the box, the
/// shape or the offsets do not fit each other (the copying read reports those).
std::optional<std::uint64_t> contiguous_box_offset(std::span<const std::int64_t> shape,
                                                   std::span<const std::int64_t> offsets,
                                                   std::span<const std::int64_t> sizes,
                                                   DType format) noexcept;

/// The box's first byte inside `mapping`, sharing its ownership, when the box of a tensor whose
/// bytes start at `tensor` (inside the mapping) is stored in `target` as one run
/// (contiguous_box_offset) and that byte is aligned for `target`'s values (4 bytes for f32, 2
/// for the others, whose blocks start with a half); nullptr otherwise.
std::shared_ptr<const std::byte> box_in_place(const std::shared_ptr<const std::byte>& mapping,
                                              const std::byte* tensor, std::optional<DType> stored,
                                              std::span<const std::int64_t> shape,
                                              std::span<const std::int64_t> offsets,
                                              std::span<const std::int64_t> sizes,
                                              DType target) noexcept;

/// Reads the box into `out` with one pread() (ReadableFile::read_at) and returns true when the
/// tensor, whose bytes start at byte `tensor_offset` of `file`, is stored as `target` and the
/// box is one run of its bytes (contiguous_box_offset); false, reading nothing, otherwise (the
/// caller copies it out of the mapping). REQUIRES: out.size() is the box's bytes as `target`.
/// Throws: IoError as ReadableFile::read_at, starting with `where`.
bool read_one_run(const ReadableFile& file, std::uint64_t tensor_offset,
                  std::optional<DType> stored, std::span<const std::int64_t> shape,
                  std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
                  DType target, std::span<std::byte> out, std::string_view where);

}  // namespace numesh::models::detail
