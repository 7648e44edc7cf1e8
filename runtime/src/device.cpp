// Devices: a oneTBB arena pinned to the device's cpuset and an allocator bound to its node.
// This file and topology.cpp are the only places that call tbb::info or create NUMA-constrained
// arenas: under ASan, Debian's oneTBB aborts when it loads tbbbind (STYLE.md 2.11), so tests
// that reach these calls carry the `numa` label.

#include "numesh/runtime/device.hpp"

#include <hwloc.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <thread>

#include "hwloc_handle.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/log.hpp"
#include "numesh/runtime/huge_page_cost.hpp"
#include "numesh/runtime/huge_page_slabs.hpp"
#include "numesh/runtime/shared_arena.hpp"
#include "size_text.hpp"

namespace numesh::runtime {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kCacheLine = 64;
// Zero-filling above this size is split over the device's threads.
constexpr std::size_t kParallelFillBytes = std::size_t{4} << 20;
// Buffers of their own (without the slabs: NUMESH_HUGE_PAGES=off, sanitizer builds) ask for
// transparent huge pages from this size up (madvise; the kernel's THP setting decides, and
// "never" ignores it). Decode streams each weight matrix in long runs, and with 4 KiB pages the
// hardware prefetchers stop at every page: bench decode's bf16 step took 4.71 ms with them
// against 4.05 ms with huge pages (medians of five alternated runs, Zen 4, docs/benchmarks.md).
constexpr std::size_t kHugePageBytes = HugePageSlabs::kHugePage;

using detail::make_bitmap;
using detail::to_bitmap;
using BitmapPtr = detail::UniqueBitmap;

// The nodeset of the device's node, or nullptr when it has none.
hwloc_const_nodeset_t node_set(const Topology& topology, const DeviceSpec& spec) {
  if (spec.numa_node < 0) return nullptr;
  hwloc_obj_t node = topology.hwloc()->numa_obj(spec.numa_node);
  return node != nullptr ? node->nodeset : nullptr;
}

// Binds `bytes` at `p` (not yet touched) to the device's node, as hwloc_alloc_membind binds;
// false when the device has no node or the OS refuses.
bool bind_to_node(const Topology& topology, const DeviceSpec& spec, void* p, std::size_t bytes) {
  hwloc_const_nodeset_t nodes = node_set(topology, spec);
  return nodes != nullptr &&
         hwloc_set_area_membind(
             topology.hwloc()->get(), p, bytes, nodes, HWLOC_MEMBIND_BIND,
             HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT | HWLOC_MEMBIND_NOCPUBIND) == 0;
}

void* membind_alloc(const Topology& topology, const DeviceSpec& spec, std::size_t bytes) {
  hwloc_const_nodeset_t nodes = node_set(topology, spec);
  if (nodes == nullptr) return nullptr;
  return hwloc_alloc_membind(
      topology.hwloc()->get(), bytes, nodes, HWLOC_MEMBIND_BIND,
      HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT | HWLOC_MEMBIND_NOCPUBIND);
}

// One tbb::global_control for every live DeviceSet, at the largest limit any of them needs.
// oneTBB applies the minimum over all live controls, so each set holding its own control
// would cap a big set by a small one alive at the same time.
class WorkerLimit {
 public:
  // Never destroyed: DeviceSets held by other static objects release their claim during
  // static destruction, possibly after a function-local static would have been destroyed.
  static WorkerLimit& instance() {
    static auto* limit = new WorkerLimit();
    return *limit;
  }
  void acquire(std::size_t wanted) {
    const std::lock_guard lock(mutex_);
    wanted_.insert(wanted);
    update();
  }
  void release(std::size_t wanted) {
    const std::lock_guard lock(mutex_);
    if (auto it = wanted_.find(wanted); it != wanted_.end()) wanted_.erase(it);
    update();
  }

 private:
  void update() {
    const std::size_t target = wanted_.empty() ? 0 : *wanted_.rbegin();
    if (target == current_) return;
    control_.reset();  // first, or the old (smaller) value would still win
    if (target > 0) {
      control_ = std::make_unique<oneapi::tbb::global_control>(
          oneapi::tbb::global_control::max_allowed_parallelism, target);
    }
    current_ = target;
  }
  std::mutex mutex_;
  std::multiset<std::size_t> wanted_;
  std::size_t current_ = 0;
  std::unique_ptr<oneapi::tbb::global_control> control_;
};

}  // namespace

std::string_view to_string(Pinning pinning) noexcept {
  switch (pinning) {
    case Pinning::kNumaConstraints:
      return "numa-constraints";
    case Pinning::kObserver:
      return "observer";
    case Pinning::kUnpinned:
      return "unpinned";
  }
  return "?";
}

std::string_view to_string(MemoryBinding binding) noexcept {
  switch (binding) {
    case MemoryBinding::kBound:
      return "bound";
    case MemoryBinding::kFirstTouch:
      return "first-touch";
    case MemoryBinding::kUnbound:
      return "unbound";
    case MemoryBinding::kMapped:
      return "mapped";
  }
  return "?";
}

// Binds every thread entering the arena to the device's cpuset and restores the thread's
// previous binding when it leaves. A thread can be inside several arenas at once (execute()
// nests), so the previous bindings form a per-thread stack.
class Device::PinningObserver : public oneapi::tbb::task_scheduler_observer {
 public:
  PinningObserver(oneapi::tbb::task_arena& arena, std::shared_ptr<const Topology> topology,
                  const CpuSet& cpus)
      : task_scheduler_observer(arena), topology_(std::move(topology)), cpus_(to_bitmap(cpus)) {
    observe(true);
  }
  ~PinningObserver() override { observe(false); }
  PinningObserver(const PinningObserver&) = delete;
  PinningObserver& operator=(const PinningObserver&) = delete;

  void on_scheduler_entry(bool /*is_worker*/) override {
    hwloc_topology_t topo = topology_->hwloc()->get();
    BitmapPtr previous = make_bitmap();
    if (hwloc_get_cpubind(topo, previous.get(), HWLOC_CPUBIND_THREAD) != 0) {
      hwloc_bitmap_zero(previous.get());  // unknown: leave the thread bound to the device
    }
    saved().push_back(std::move(previous));
    if (hwloc_set_cpubind(topo, cpus_.get(), HWLOC_CPUBIND_THREAD) != 0) {
      const int error = errno;
      char cpus[256];
      hwloc_bitmap_list_snprintf(cpus, sizeof cpus, cpus_.get());
      log::warn_once(std::string("pin-failed-") + cpus,
                     fmt::format("cannot pin a device thread to CPUs {} ({}); it runs unpinned",
                                 cpus, std::strerror(error)));
    }
  }

  void on_scheduler_exit(bool /*is_worker*/) override {
    auto& stack = saved();
    if (stack.empty()) return;
    BitmapPtr previous = std::move(stack.back());
    stack.pop_back();
    if (!hwloc_bitmap_iszero(previous.get())) {
      hwloc_set_cpubind(topology_->hwloc()->get(), previous.get(), HWLOC_CPUBIND_THREAD);
    }
  }

 private:
  static std::vector<BitmapPtr>& saved() {
    thread_local std::vector<BitmapPtr> stack;
    return stack;
  }
  std::shared_ptr<const Topology> topology_;
  BitmapPtr cpus_;
};

using detail::size_text;

Device::Device(std::shared_ptr<const Topology> topology, DeviceSpec spec)
    : topology_(std::move(topology)), spec_(std::move(spec)) {
  const int threads = std::max(1, spec_.threads);
  bool numa_constraints = false;
  // oneTBB's NUMA constraints pin to every PU of the node; use them only when that is the
  // device's cpuset (with SMT off the cpuset holds one PU per core, which only the observer
  // can keep).
  const bool whole_node_cpuset =
      spec_.whole_numa_node && spec_.numa_node >= 0 &&
      topology_->numa_nodes()[static_cast<std::size_t>(spec_.numa_node)].cpuset == spec_.cpuset;
  if (topology_->can_bind() && whole_node_cpuset && spec_.numa_os_index >= 0) {
    const auto ids = oneapi::tbb::info::numa_nodes();
    numa_constraints = std::find(ids.begin(), ids.end(), spec_.numa_os_index) != ids.end();
  }
  if (numa_constraints) {
    arena_.initialize(oneapi::tbb::task_arena::constraints{}
                          .set_numa_id(spec_.numa_os_index)
                          .set_max_concurrency(threads),
                      /*reserved_for_masters=*/0);
    pinning_ = Pinning::kNumaConstraints;
  } else {
    arena_.initialize(threads, /*reserved_for_masters=*/0);
    if (topology_->can_bind()) {
      observer_ = std::make_unique<PinningObserver>(arena_, topology_, spec_.cpuset);
      pinning_ = Pinning::kObserver;
    } else {
      pinning_ = Pinning::kUnpinned;
      binding_note_ = fmt::format(
          "device {} ({}) runs unpinned: {}", spec_.index, spec_.label,
          topology_->source() == TopologySource::kMachine
              ? "hwloc does not treat this topology as the running system (HWLOC_SYNTHETIC or "
                "HWLOC_XMLFILE is set without HWLOC_THISSYSTEM=1)"
              : fmt::format("binding is not possible on a {} topology",
                            to_string(topology_->source())));
    }
  }

  if (pinning_ == Pinning::kUnpinned) {
    memory_binding_ = MemoryBinding::kUnbound;
  } else if (spec_.numa_node < 0) {
    memory_binding_ = MemoryBinding::kFirstTouch;
    binding_note_ = fmt::format(
        "device {} ({}): its CPUs belong to no NUMA node, so its memory is placed by first touch "
        "from its pinned threads",
        spec_.index, spec_.label);
  } else if (void* probe = membind_alloc(*topology_, spec_, kPage); probe != nullptr) {
    hwloc_free(topology_->hwloc()->get(), probe, kPage);
    memory_binding_ = MemoryBinding::kBound;
  } else {
    memory_binding_ = MemoryBinding::kFirstTouch;
    binding_note_ = fmt::format(
        "device {} ({}): memory cannot be bound to NUMA node {}; placing it by first touch "
        "from the device's pinned threads",
        spec_.index, spec_.label, spec_.numa_node);
  }
  if (huge_page_slabs_enabled()) {
    // A bound device binds each region to its node before its first touch, as
    // hwloc_alloc_membind binds, and refuses a region it cannot bind (allocate() then takes
    // hwloc's bound allocation); the others place pages by first touch.
    // The process's watch on what new huge pages cost faults in each region's first pages from
    // the allocating thread: only where that thread's touch cannot misplace them (a device
    // placing by first touch leaves the touch to its own threads, and asks for huge pages
    // regardless).
    HugePageCost* cost =
        memory_binding_ == MemoryBinding::kFirstTouch ? nullptr : &HugePageCost::process();
    slabs_ = std::make_unique<HugePageSlabs>(
        [this](std::byte* region, std::size_t bytes) {
          return memory_binding_ != MemoryBinding::kBound ||
                 bind_to_node(*topology_, spec_, region, bytes);
        },
        /*huge_pages=*/true, HugePageSlabs::kDefaultSlabBytes, cost);
  }
}

Device::~Device() = default;

std::atomic<std::uint64_t>* Device::node_bytes_in_use() const noexcept {
  if (node_usage_ == nullptr || spec_.numa_node < 0 ||
      static_cast<std::size_t>(spec_.numa_node) >= node_usage_->bytes.size() ||
      topology_->numa_nodes()[static_cast<std::size_t>(spec_.numa_node)].memory_bytes == 0) {
    return nullptr;
  }
  return &node_usage_->bytes[static_cast<std::size_t>(spec_.numa_node)];
}

DeviceBuffer Device::allocate(std::size_t bytes, BufferContents contents) {
  NUMESH_CHECK(bytes > 0, ValueError, "device {} ({}): cannot allocate 0 bytes", spec_.index,
               spec_.label);
  // A size that follows from a user's options (a prompt of 10^8 tokens, a cache that does not
  // fit beside the weights) is refused here, named, rather than left to the allocator (an abort,
  // or the OOM killer after minutes of paging).
  std::atomic<std::uint64_t>* in_use = node_bytes_in_use();
  if (in_use != nullptr) {
    const std::uint64_t node_bytes =
        topology_->numa_nodes()[static_cast<std::size_t>(spec_.numa_node)].memory_bytes;
    const std::uint64_t before = in_use->fetch_add(bytes);
    if (before + bytes > node_bytes || before + bytes < before) {
      in_use->fetch_sub(bytes);
      throw ValueError(
          fmt::format("device {} ({}): cannot allocate {}, more than the {} of its NUMA node {} "
                      "leaves (numesh's buffers there "
                      "already take {})",
                      spec_.index, spec_.label, size_text(bytes), size_text(node_bytes),
                      spec_.numa_node, size_text(before)));
    }
  }
  // From here the bytes are counted: a failed allocation gives them back.
  struct Uncount {
    std::atomic<std::uint64_t>* in_use;
    std::size_t bytes;
    bool keep = false;
    ~Uncount() {
      if (in_use != nullptr && !keep) in_use->fetch_sub(bytes);
    }
  } uncount{in_use, bytes};
  DeviceBuffer buffer;
  buffer.device_ = shared_from_this();
  buffer.bytes_ = bytes;
  // How a block of the shared arena or of the slabs is placed, bound or not.
  const auto placed = [this](bool bound) {
    return bound                            ? MemoryBinding::kBound
           : pinning_ == Pinning::kUnpinned ? MemoryBinding::kUnbound
                                            : MemoryBinding::kFirstTouch;
  };
  std::shared_ptr<SharedArena> arena;
  {
    const std::lock_guard lock(shared_arena_mutex_);
    if (bytes >= shared_min_bytes_) arena = shared_arena_;
  }
  if (arena != nullptr) {
    if (std::byte* p = arena->allocate(bytes); p != nullptr) {
      buffer.data_ = p;
      buffer.arena_ = std::move(arena);
      // Bound before the first touch below; the shared file's pages take the policy of the
      // range (Linux's shared memory policy).
      buffer.binding_ = placed(memory_binding_ == MemoryBinding::kBound &&
                               bind_to_node(*topology_, spec_, p, bytes));
    }
  }
  if (buffer.data_ == nullptr && slabs_ != nullptr) {
    if (std::byte* block = slabs_->allocate(bytes); block != nullptr) {
      buffer.data_ = block;
      buffer.slab_allocated_ = true;
      // (A bound device's slabs are all bound: it refuses the regions it cannot bind.)
      buffer.binding_ = placed(memory_binding_ == MemoryBinding::kBound);
    }
  }
  if (buffer.data_ == nullptr && memory_binding_ == MemoryBinding::kBound) {
    if (void* p = membind_alloc(*topology_, spec_, bytes); p != nullptr) {
      buffer.data_ = static_cast<std::byte*>(p);
      buffer.hwloc_allocated_ = true;
      buffer.binding_ = MemoryBinding::kBound;
    }
  }
  if (buffer.data_ == nullptr) {
    // First-touch placement needs whole pages of our own, so page-align anything page-sized.
    const std::size_t align = bytes >= kPage ? kPage : kCacheLine;
    const std::size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (p == nullptr) throw std::bad_alloc();
    buffer.data_ = static_cast<std::byte*>(p);
    buffer.binding_ =
        pinning_ == Pinning::kUnpinned ? MemoryBinding::kUnbound : MemoryBinding::kFirstTouch;
  }
  uncount.keep = true;  // the buffer's release() gives the bytes back
  std::byte* data = buffer.data_;
  // Before the first touch below, which places the pages. Best effort: a kernel without THP
  // refuses, and the buffer keeps its small pages.
  // (A slab's region asked when it was mapped.)
  if (!buffer.slab_allocated_ && bytes >= kHugePageBytes && huge_pages_wanted() &&
      HugePageCost::process().wanted())
    (void)madvise(data, bytes, MADV_HUGEPAGE);
  if (contents == BufferContents::kUnspecified) return buffer;
  arena_.execute([data, bytes] {
    if (bytes < kParallelFillBytes) {
      std::memset(data, 0, bytes);
      return;
    }
    oneapi::tbb::parallel_for(
        oneapi::tbb::blocked_range<std::size_t>(0, bytes, kParallelFillBytes / 4),
        [data](const oneapi::tbb::blocked_range<std::size_t>& r) {
          std::memset(data + r.begin(), 0, r.size());
        });
  });
  return buffer;
}

void Device::share_memory(std::shared_ptr<SharedArena> arena, std::size_t min_bytes) {
  const std::lock_guard lock(shared_arena_mutex_);
  if (shared_arena_ != nullptr) return;
  shared_arena_ = std::move(arena);
  shared_min_bytes_ = min_bytes;
}

std::shared_ptr<SharedArena> Device::shared_arena() const {
  const std::lock_guard lock(shared_arena_mutex_);
  return shared_arena_;
}

DeviceBuffer Device::use_mapped(std::shared_ptr<const std::byte> bytes, std::size_t size) {
  NUMESH_CHECK(bytes != nullptr && size > 0, ValueError,
               "device {} ({}): a mapped buffer needs bytes (given {} bytes at {})", spec_.index,
               spec_.label, size, static_cast<const void*>(bytes.get()));
  DeviceBuffer buffer;
  buffer.device_ = shared_from_this();
  // Never written through: the kernels take weights as const; data() is non-const for the
  // device's own buffers.
  buffer.data_ = const_cast<std::byte*>(bytes.get());
  buffer.bytes_ = size;
  buffer.binding_ = MemoryBinding::kMapped;
  buffer.mapped_ = std::move(bytes);
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::move(other.device_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      binding_(std::exchange(other.binding_, MemoryBinding::kUnbound)),
      hwloc_allocated_(std::exchange(other.hwloc_allocated_, false)),
      slab_allocated_(std::exchange(other.slab_allocated_, false)),
      mapped_(std::move(other.mapped_)),
      arena_(std::move(other.arena_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = std::move(other.device_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    binding_ = std::exchange(other.binding_, MemoryBinding::kUnbound);
    hwloc_allocated_ = std::exchange(other.hwloc_allocated_, false);
    slab_allocated_ = std::exchange(other.slab_allocated_, false);
    mapped_ = std::move(other.mapped_);
    arena_ = std::move(other.arena_);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() noexcept {
  if (mapped_ != nullptr) {
    mapped_.reset();  // the owner's bytes: nothing of the device's to give back
  } else if (data_ != nullptr) {
    if (std::atomic<std::uint64_t>* in_use = device_->node_bytes_in_use(); in_use != nullptr)
      in_use->fetch_sub(bytes_);
    if (arena_ != nullptr) {
      arena_->release(data_, bytes_);
      arena_.reset();
    } else if (slab_allocated_) {
      device_->slabs_->release(data_, bytes_);
    } else if (hwloc_allocated_) {
      hwloc_free(device_->topology_->hwloc()->get(), data_, bytes_);
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  bytes_ = 0;
  binding_ = MemoryBinding::kUnbound;
  hwloc_allocated_ = false;
  slab_allocated_ = false;
  device_.reset();
}

std::optional<int> DeviceBuffer::query_node() const {
  if (data_ == nullptr) return std::nullopt;
  return detail::pages_node(*device_->topology_, data_, bytes_);
}

std::shared_ptr<DeviceSet> DeviceSet::create(Topology topology, const PlacementOptions& options) {
  std::shared_ptr<DeviceSet> set(new DeviceSet());
  set->topology_ = std::make_shared<const Topology>(std::move(topology));
  set->options_ = options;
  std::vector<DeviceSpec> specs = place_devices(*set->topology_, options, &set->notes_);
  int threads = 0;
  for (const DeviceSpec& spec : specs) threads += std::max(1, spec.threads);
  // Every device arena must be able to hold its threads at once; oneTBB's default worker
  // limit is its default concurrency minus one, which would leave arenas starving for
  // workers when the devices together have more threads than that (synthetic topologies;
  // one device per core plus the caller). oneTBB counts the PUs of the process affinity mask
  // (taskset, a Slurm or container cpuset), not the machine's: under `taskset -c 0` its
  // default is 1, no worker at all, and a one-device run would wait forever for one.
  const auto wanted = static_cast<std::size_t>(threads) + 1;
  if (wanted > static_cast<std::size_t>(oneapi::tbb::info::default_concurrency())) {
    set->worker_limit_ = wanted;
    WorkerLimit::instance().acquire(wanted);
  }
  // One count of live buffer bytes per node, shared by the devices on it.
  const auto usage = std::make_shared<Device::NodeUsage>(set->topology_->numa_nodes().size());
  for (DeviceSpec& spec : specs) {
    std::shared_ptr<Device> device(new Device(set->topology_, std::move(spec)));
    device->node_usage_ = usage;
    if (!device->binding_note().empty()) {
      set->notes_.push_back(device->binding_note());
    }
    set->devices_.push_back(std::move(device));
  }
  for (const auto& device : set->devices_) {
    if (device->pinning() == Pinning::kUnpinned) {
      // One warning per process: the notes (and `numesh topology`) list every device.
      log::warn_once("numesh-unpinned", device->binding_note());
      break;
    }
  }
  for (const auto& device : set->devices_) {
    if (device->memory_binding() == MemoryBinding::kFirstTouch) {
      log::warn_once("first-touch-" + device->spec().label, device->binding_note());
    }
  }
  return set;
}

DeviceSet::~DeviceSet() {
  devices_.clear();  // arenas go before the limit that staffed them
  if (worker_limit_ > 0) WorkerLimit::instance().release(worker_limit_);
}

Device& DeviceSet::device(std::size_t index) const { return *device_ptr(index); }

std::shared_ptr<Device> DeviceSet::device_ptr(std::size_t index) const {
  NUMESH_CHECK(index < devices_.size(), IndexError, "device index {} is out of range: {} devices",
               index, devices_.size());
  return devices_[index];
}

int DeviceSet::total_threads() const noexcept {
  int n = 0;
  for (const auto& d : devices_) n += std::max(1, d->spec().threads);
  return n;
}

}  // namespace numesh::runtime
