#pragma once

// PRIVATE to models/src: where a box of a stored tensor lies in its bytes, when it is one run of
// them: what lets a weight's shard read its checkpoint's bytes in place (Checkpoint::box_in_place)
// instead of a copy.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

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

}  // namespace numesh::models::detail
