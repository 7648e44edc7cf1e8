#include "numesh/runtime/huge_page_cost.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "numesh/runtime/huge_page_slabs.hpp"

namespace numesh::runtime {

namespace {

constexpr std::size_t kHugePageBytes = HugePageSlabs::kHugePage;

// Whether the kernel's transparent huge page setting gives any ("never" gives none: nothing to
// time). An unreadable setting reads as giving them.
bool kernel_gives_huge_pages() noexcept {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == nullptr) return true;
  char line[128] = {};
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  return !read || std::strstr(line, "[never]") == nullptr;
}

}  // namespace

HugePageMode huge_page_mode() noexcept {
  static const HugePageMode mode = [] {
    const char* v = std::getenv("NUMESH_HUGE_PAGES");
    if (v != nullptr && std::strcmp(v, "off") == 0) return HugePageMode::kOff;
    if (v != nullptr && std::strcmp(v, "on") == 0) return HugePageMode::kOn;
    return HugePageMode::kAuto;
  }();
  return mode;
}

HugePageCost::HugePageCost(bool adaptive, std::chrono::nanoseconds dear) noexcept
    : adaptive_(adaptive), dear_(dear) {}

bool HugePageCost::wanted() const noexcept {
  return !adaptive_ || dear_faults_.load(std::memory_order_relaxed) < kDearFaultsToGiveUp;
}

void HugePageCost::probe(std::byte* region, std::size_t bytes, std::size_t used) noexcept {
  if (!adaptive_) return;
  const std::size_t probed = std::min({bytes, used, kProbedPages * kHugePageBytes});
  for (std::size_t at = 0; at < probed; at += kHugePageBytes) {
    if (!wanted()) {
      // Given up (here or by another thread): the pages not touched yet stay small.
      (void)madvise(region + at, bytes - at, MADV_NOHUGEPAGE);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    // volatile: the store must happen here, inside the timing, not merge with a later one.
    *static_cast<volatile std::byte*>(region + at) = std::byte{0};
    if (std::chrono::steady_clock::now() - start >= dear_)
      dear_faults_.fetch_add(1, std::memory_order_relaxed);
  }
}

int HugePageCost::dear_faults() const noexcept {
  return dear_faults_.load(std::memory_order_relaxed);
}

HugePageCost& HugePageCost::process() noexcept {
  static HugePageCost cost(huge_page_mode() == HugePageMode::kAuto && kernel_gives_huge_pages());
  return cost;
}

}  // namespace numesh::runtime
