#pragma once

// The free ranges of a region that blocks are carved from, first fit and coalesced on release:
// the bookkeeping of the shared arena's blocks and of the huge-page slabs' blocks.

#include <cstddef>
#include <iterator>
#include <map>
#include <optional>

namespace numesh::runtime {

/// Free byte ranges [offset, offset + size) of a region of `capacity` bytes, all free at first.
/// Not thread-safe: the owner locks.
class FreeRanges {
 public:
  explicit FreeRanges(std::size_t capacity) : capacity_(capacity) {
    if (capacity > 0) free_.emplace(0, capacity);
  }

  /// The offset of a range of `size` bytes starting at a multiple of `align` (a power of two),
  /// taken first fit (the lowest such offset: blocks of one program come and go together, so
  /// the low end stays dense), or nullopt when no free range holds it. The bytes skipped to
  /// align stay free.
  std::optional<std::size_t> take(std::size_t size, std::size_t align) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const std::size_t begin = it->first, end = it->first + it->second;
      const std::size_t at = (begin + align - 1) & ~(align - 1);
      if (at > end || end - at < size) continue;
      free_.erase(it);
      if (at > begin) free_.emplace(begin, at - begin);
      if (end > at + size) free_.emplace(at + size, end - at - size);
      used_ += size;
      return at;
    }
    return std::nullopt;
  }

  /// Gives back [offset, offset + size), a range take() returned, joining its free neighbours.
  void give(std::size_t offset, std::size_t size) {
    used_ -= size;
    std::size_t begin = offset;
    auto next = free_.lower_bound(offset);
    if (next != free_.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {
        begin = before->first;
        size += before->second;
        free_.erase(before);
      }
    }
    if (next != free_.end() && begin + size == next->first) {
      size += next->second;
      free_.erase(next);
    }
    free_.emplace(begin, size);
  }

  /// Bytes in ranges taken and not given back.
  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  /// The region's size.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// True when nothing is taken.
  [[nodiscard]] bool empty() const noexcept { return used_ == 0; }

 private:
  std::size_t capacity_;
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, coalesced
  std::size_t used_ = 0;
};

}  // namespace numesh::runtime
