#pragma once
// What a new transparent huge page costs to fault in, watched, so that numesh stops asking for
// huge pages where they are dear. On most machines a fresh 2 MiB page faults in faster than 512
// small ones (7.3 GB/s against 2.5 on a 2-vCPU Zen 4 VM, 14 against 0.4 on a Zen 5 VM), and
// decode streams weights faster from huge pages. But a VM whose host takes back the guest's free
// memory (free page reporting, as Firecracker's balloon does) reports free blocks of 2 MiB and
// more, exactly the blocks a huge page needs: faulting one in then costs the host's faults too,
// 12-18 ms a page on that Zen 4 VM (0.12-0.17 GB/s, 15-20x slower than small pages), while small
// pages still come from blocks the host keeps. There a q8_0 model's load took 0.35-0.9 s instead
// of 0.05 and its first prefill ran at 0.4x its speed (docs/runtime.md, "Huge pages").
// Which blocks a process gets changes from second to second (memory another process just freed
// is cheap until it is reported), so the cost is measured as memory is mapped, not once.
#include <atomic>
#include <chrono>
#include <cstddef>

namespace numesh::runtime {

/// How numesh asks for transparent huge pages, from NUMESH_HUGE_PAGES (read once per process).
enum class HugePageMode {
  kAuto,  ///< unset or "auto": asked for, until new ones prove dear (HugePageCost)
  kOn,    ///< "on": always asked for
  kOff,   ///< "off": never asked for, and no huge-page slabs (huge_page_slabs.hpp)
};

/// The process's mode. A value other than auto, on or off reads as auto.
HugePageMode huge_page_mode() noexcept;

/// Watches the faults of new huge pages and gives up asking for them after kDearFaultsToGiveUp
/// dear ones (two: one fault slowed by the scheduler alone does not decide). Memory another
/// process just freed comes first and is cheap, the host's reported memory after it: so a new
/// region's first pages are faulted in and timed, up to kProbedPages, not only its first; but
/// only pages its first block will touch anyway (a new slab of 32 MiB for a block of a few KiB
/// faults in one page, not 16 MiB that may never be used: 10 ms of a 109 M model's 19 ms load in
/// place on a VM whose new memory is dear; docs/benchmarks.md, "Session 69"; on giving up, the
/// slabs mark their other pages small: HugePageSlabs). Thread-safety: all methods are safe to
/// call concurrently.
class HugePageCost {
 public:
  /// A huge page that takes longer than this to fault in is dear: 2 MiB at 0.35 GB/s, a
  /// seventh of what small pages fault at on the VMs measured and 20x a fault on a machine
  /// that keeps its memory (about 0.3 ms).
  static constexpr std::chrono::microseconds kDearFault{6000};
  /// Dear faults after which no more huge pages are asked for.
  static constexpr int kDearFaultsToGiveUp = 2;
  /// Huge pages of a new region faulted in and timed (16 MiB: a slab's first half).
  static constexpr std::size_t kProbedPages = 8;

  /// `adaptive`: time faults and give up after dear ones (false: neither, as
  /// NUMESH_HUGE_PAGES=on, or a kernel whose THP setting is "never"); `dear`: the fault time from
  /// which a fault counts as dear.
  explicit HugePageCost(bool adaptive = true, std::chrono::nanoseconds dear = kDearFault) noexcept;

  /// Whether a new mapping should ask for huge pages (madvise MADV_HUGEPAGE).
  [[nodiscard]] bool wanted() const noexcept;

  /// When adaptive: faults in the huge pages of `region` that its first `used` bytes cover, up
  /// to the first kProbedPages, one by one, writing a zero to the first byte of each (its
  /// contents stay zeros), timed, and counts each dear one; on giving up, stops and marks the
  /// pages of `region` not yet touched MADV_NOHUGEPAGE. `used`: the bytes at the region's start
  /// that its first owner is about to take (the whole of a large block; a new slab's first
  /// block), so that the probe faults in no page the process would not touch anyway.
  /// REQUIRES: `region` is a fresh mapping of `bytes`, 2 MiB-aligned, that asked for huge pages
  /// and whose NUMA binding is set (the calling thread's touch places the pages as it says).
  void probe(std::byte* region, std::size_t bytes, std::size_t used) noexcept;

  /// Dear faults counted so far.
  [[nodiscard]] int dear_faults() const noexcept;

  /// The process's: adaptive unless NUMESH_HUGE_PAGES=on.
  static HugePageCost& process() noexcept;

 private:
  bool adaptive_;
  std::chrono::nanoseconds dear_;
  std::atomic<int> dear_faults_{0};
};

}  // namespace numesh::runtime
