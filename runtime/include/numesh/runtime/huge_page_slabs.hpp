#pragma once

// A device's private memory in regions of whole 2 MiB pages. A buffer of its own per allocation
// (the C library's, or hwloc's) starts on fresh 4 KiB pages unless it is 2 MiB or more and
// happens to hold an aligned 2 MiB span: every first touch of a page is a fault (on a 2-vCPU
// Zen 5 VM, 2.6 us a page: zero-filling a program's intermediates ran at 0.4 GB/s, 14 GB/s in a
// huge-page region; docs/benchmarks.md, "Session 42"). So a device carves its buffers from slabs:
// 2 MiB-aligned mappings of whole huge pages (transparent huge pages asked for with madvise,
// until new ones prove dear: huge_page_cost.hpp),
// bound to the device's node before anything touches them where the device binds its memory;
// blocks of half a slab and more get a mapping of their own, 2 MiB-aligned and rounded up to
// whole huge pages. Blocks under 64 KiB (norms, biases, one token's activations) are carved
// from slabs of their own: among a model's matrices each would sit on a huge page of its own,
// and its first touch would zero 2 MiB (a layer's two norms cost 0.8 ms of a 109 M model's
// load that way, 24 huge pages of memory for 72 KiB; docs/benchmarks.md, "Session 51").

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>

#include "numesh/runtime/free_ranges.hpp"
#include "numesh/runtime/huge_page_cost.hpp"

namespace numesh::runtime {

/// Whether numesh asks for transparent huge pages at all: false when NUMESH_HUGE_PAGES=off
/// (read once per process; huge_page_cost.hpp's HugePageMode).
bool huge_pages_wanted() noexcept;

/// Whether devices carve their buffers from HugePageSlabs: true unless NUMESH_HUGE_PAGES=off,
/// or the build runs under AddressSanitizer or ThreadSanitizer (which check a buffer's bounds
/// and accesses only as a block of its own: carved from a slab, a kernel's overrun would land in
/// its neighbour unseen, and a reused block would carry its previous owner's accesses).
bool huge_page_slabs_enabled() noexcept;

/// Blocks carved from slabs of whole 2 MiB pages (this header's top comment). A released block's
/// memory stays mapped and is reused by later blocks (so it is no longer zero); a slab left
/// empty is unmapped unless it is the only empty one of its class (blocks under
/// kSmallBlockBytes, or the others). Thread-safety: all methods are safe to call concurrently.
class HugePageSlabs {
 public:
  /// A huge page of x86-64: slabs and large blocks are whole ones, aligned to one.
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  /// The default slab: 32 MiB (16 huge pages; the pages a slab never touches take no memory).
  static constexpr std::size_t kDefaultSlabBytes = std::size_t{32} << 20;
  /// Blocks under this many bytes share slabs that hold only such blocks.
  static constexpr std::size_t kSmallBlockBytes = std::size_t{64} << 10;

  /// What a region is given before anything touches it: `prepare(region, bytes)` returns
  /// whether the region may be used (a device bound to its node binds it and refuses a region
  /// it cannot bind, so that its allocate() falls back to hwloc's bound allocation).
  using Prepare = std::function<bool(std::byte* region, std::size_t bytes)>;

  /// Slabs of `slab_bytes` (rounded up to whole huge pages); `huge_pages` asks for transparent
  /// huge pages on every region (madvise; the kernel's setting decides) while `cost` (when not
  /// null) still wants them, and then has `cost` probe each new region, after `prepare` (so
  /// only where `prepare` places the pages: the allocating thread touches them).
  /// `cost` must outlive the slabs.
  explicit HugePageSlabs(Prepare prepare, bool huge_pages = true,
                         std::size_t slab_bytes = kDefaultSlabBytes, HugePageCost* cost = nullptr);
  /// Unmaps every region. REQUIRES: no block is live.
  ~HugePageSlabs();
  HugePageSlabs(const HugePageSlabs&) = delete;
  HugePageSlabs& operator=(const HugePageSlabs&) = delete;

  /// A block of `bytes` (> 0), 64-byte aligned, and page-aligned from 4096 bytes up. Its bytes
  /// are zeros when its memory was never used before, else unspecified. nullptr when bytes is 0
  /// or too large to round up, when the OS refuses the mapping, or when prepare refuses it.
  /// Throws: std::bad_alloc when the bookkeeping cannot grow (the new region is unmapped).
  std::byte* allocate(std::size_t bytes);

  /// Gives back a block that allocate() returned, with the size asked for (a pointer inside no
  /// slab is ignored). A freed small block's pages stay resident for the next blocks; a large
  /// block's mapping is unmapped.
  void release(std::byte* block, std::size_t bytes) noexcept;

  /// Bytes mapped: slabs and large blocks' mappings.
  [[nodiscard]] std::size_t mapped_bytes() const noexcept;
  /// Slabs mapped.
  [[nodiscard]] std::size_t slab_count() const noexcept;

 private:
  struct Slab {
    std::size_t bytes;
    bool small;  // holds blocks under kSmallBlockBytes only, or none of them
    FreeRanges ranges;
  };
  // A mapping of `bytes` (whole huge pages) at a 2 MiB boundary, madvised, prepared and probed
  // over the `used` bytes at its start that the caller's block takes, or nullptr (the OS or
  // prepare refused it).
  std::byte* map_region(std::size_t bytes, std::size_t used) noexcept;
  bool large(std::size_t bytes) const noexcept { return bytes >= slab_bytes_ / 2; }
  // Once cost_ has given up on huge pages (here or in another device's slabs), marks every slab
  // MADV_NOHUGEPAGE, once: a slab's probe covers only its first block's pages (huge_page_cost.hpp),
  // so the pages its later blocks take would otherwise still be faulted in huge, and dear.
  void follow_giving_up() noexcept;

  Prepare prepare_;
  bool huge_pages_;
  HugePageCost* cost_;
  std::size_t slab_bytes_;
  mutable std::mutex mutex_;
  std::map<std::byte*, Slab> slabs_;  // by base address
  std::size_t large_bytes_ = 0;
  std::atomic<bool> marked_small_{false};  // follow_giving_up() has marked the slabs
};

}  // namespace numesh::runtime
