#include "numesh/runtime/huge_page_slabs.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <iterator>
#include <utility>

namespace numesh::runtime {

// (Names of their own: the sanitizer preset builds runtime/src as a unity build.)
namespace {

constexpr std::size_t kSmallPage = 4096;
constexpr std::size_t kBlockAlign = 64;

std::size_t round_up_to(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

// The sanitizers check the bounds and the accesses of the blocks the C library's allocator
// hands out; blocks carved from a region of ours would hide a kernel's overrun into its
// neighbour, and a block reused by another thread would carry the previous owner's accesses.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif
#else
constexpr bool kUnderSanitizer = false;
#endif

}  // namespace

bool huge_pages_wanted() noexcept { return huge_page_mode() != HugePageMode::kOff; }

bool huge_page_slabs_enabled() noexcept { return !kUnderSanitizer && huge_pages_wanted(); }

HugePageSlabs::HugePageSlabs(Prepare prepare, bool huge_pages, std::size_t slab_bytes,
                             HugePageCost* cost)
    : prepare_(std::move(prepare)),
      huge_pages_(huge_pages),
      cost_(cost),
      slab_bytes_(round_up_to(slab_bytes == 0 ? kDefaultSlabBytes : slab_bytes, kHugePage)) {}

HugePageSlabs::~HugePageSlabs() {
  for (auto& [base, slab] : slabs_) munmap(base, slab.bytes);
}

std::byte* HugePageSlabs::map_region(std::size_t bytes, std::size_t used) noexcept {
  // Over-reserve by a huge page, then keep the aligned part: mmap aligns to 4 KiB only.
  const std::size_t reserved = bytes + kHugePage;
  // (Without MAP_NORESERVE: a block larger than the memory the OS will commit is refused here,
  // as the C library's allocator refuses it, not killed at a later touch.)
  void* raw = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* start = static_cast<std::byte*>(raw);
  auto* base =
      reinterpret_cast<std::byte*>(round_up_to(reinterpret_cast<std::uintptr_t>(start), kHugePage));
  const auto head = static_cast<std::size_t>(base - start);
  if (head > 0) munmap(start, head);
  if (reserved - head > bytes) munmap(base + bytes, reserved - head - bytes);
  // Before the first touch, which places the pages (a kernel without THP refuses: small pages).
  const bool huge = huge_pages_ && (cost_ == nullptr || cost_->wanted());
  if (huge) (void)madvise(base, bytes, MADV_HUGEPAGE);
  if (prepare_ && !prepare_(base, bytes)) {
    munmap(base, bytes);
    return nullptr;
  }
  if (huge && cost_ != nullptr) {
    cost_->probe(base, bytes, used);
    follow_giving_up();
  }
  return base;
}

void HugePageSlabs::follow_giving_up() noexcept {
  if (cost_ == nullptr || cost_->wanted() || marked_small_.exchange(true)) return;
  // Pages already huge stay so; the slabs' others are faulted in small from now on.
  const std::lock_guard lock(mutex_);
  for (const auto& [base, slab] : slabs_) (void)madvise(base, slab.bytes, MADV_NOHUGEPAGE);
}

std::byte* HugePageSlabs::allocate(std::size_t bytes) {
  // (Past this, rounding up to whole huge pages would wrap around.)
  if (bytes == 0 || bytes > SIZE_MAX - 2 * kHugePage) return nullptr;
  follow_giving_up();  // the cost may have given up on another device's slabs
  if (large(bytes)) {
    const std::size_t size = round_up_to(bytes, kHugePage);
    std::byte* p = map_region(size, bytes);
    if (p == nullptr) return nullptr;
    const std::lock_guard lock(mutex_);
    large_bytes_ += size;
    return p;
  }
  const std::size_t size = round_up_to(bytes, kBlockAlign);
  const std::size_t align = bytes >= kSmallPage ? kSmallPage : kBlockAlign;
  const bool small = bytes < kSmallBlockBytes;
  {
    const std::lock_guard lock(mutex_);
    for (auto& [base, slab] : slabs_) {
      if (slab.small != small) continue;
      if (const auto offset = slab.ranges.take(size, align)) return base + *offset;
    }
  }
  // A new slab, mapped and prepared outside the lock (a bind is a system call; the other
  // threads' blocks need not wait for it). Another thread may add one meanwhile: both stay.
  // (A fresh slab's free ranges give its first block the slab's start: the pages probed.)
  std::byte* base = map_region(slab_bytes_, size);
  if (base == nullptr) return nullptr;
  try {
    const std::lock_guard lock(mutex_);
    Slab& slab =
        slabs_.emplace(base, Slab{slab_bytes_, small, FreeRanges(slab_bytes_)}).first->second;
    return base + *slab.ranges.take(size, align);
  } catch (...) {
    munmap(base, slab_bytes_);
    throw;
  }
}

void HugePageSlabs::release(std::byte* block, std::size_t bytes) noexcept {
  if (block == nullptr || bytes == 0) return;
  if (large(bytes)) {
    const std::size_t size = round_up_to(bytes, kHugePage);
    munmap(block, size);
    const std::lock_guard lock(mutex_);
    large_bytes_ -= size;
    return;
  }
  std::byte* unmap = nullptr;
  std::size_t unmap_bytes = 0;
  {
    const std::lock_guard lock(mutex_);
    auto it = slabs_.upper_bound(block);
    if (it == slabs_.begin()) return;  // not a block of these slabs: nothing to give back
    it = std::prev(it);
    Slab& slab = it->second;
    const auto offset = static_cast<std::size_t>(block - it->first);
    if (offset >= slab.bytes) return;
    slab.ranges.give(offset, round_up_to(bytes, kBlockAlign));
    if (!slab.ranges.empty()) return;
    // An empty slab stays for the next blocks of its class unless another empty one already
    // does.
    for (const auto& [base, other] : slabs_) {
      if (base != it->first && other.small == slab.small && other.ranges.empty()) {
        unmap = it->first;
        unmap_bytes = slab.bytes;
        slabs_.erase(it);
        break;
      }
    }
  }
  if (unmap != nullptr) munmap(unmap, unmap_bytes);  // outside the lock: a TLB shootdown
}

std::size_t HugePageSlabs::mapped_bytes() const noexcept {
  const std::lock_guard lock(mutex_);
  std::size_t total = large_bytes_;
  for (const auto& [base, slab] : slabs_) total += slab.bytes;
  return total;
}

std::size_t HugePageSlabs::slab_count() const noexcept {
  const std::lock_guard lock(mutex_);
  return slabs_.size();
}

}  // namespace numesh::runtime
