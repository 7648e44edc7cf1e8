#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

namespace numesh::runtime {

class Device;
class SharedArena;  // shared_arena.hpp

/// How a DeviceBuffer's pages were placed on its device's NUMA node.
enum class MemoryBinding {
  kBound,       ///< hwloc bound the pages to the node (strict membind)
  kFirstTouch,  ///< binding failed or does not apply; a thread pinned to the device wrote
                ///< every page first, so Linux's first-touch policy placed them locally
  kUnbound,     ///< the device is unpinned: the pages lie wherever the OS put them
  kMapped,      ///< not the device's memory: a file's pages, mapped in place (the page cache's,
                ///< wherever the kernel put them; read-only), Device::use_mapped
};

/// "bound", "first-touch", "unbound" or "mapped".
std::string_view to_string(MemoryBinding binding) noexcept;

/// A block of memory owned by one device: allocated for its NUMA node, zero-filled by the
/// device's own (pinned) threads, freed with the right call. Move-only. Or, made by
/// Device::use_mapped, a view of memory mapped elsewhere (a model file's bytes used in place),
/// which the buffer keeps alive and never writes: binding() kMapped, nothing allocated or freed.
///
/// The buffer keeps its Device alive (shared ownership), so it may outlive the DeviceSet
/// handle it came from. A writable buffer is never shared across devices except through a
/// collective. Thread-safety: distinct buffers are independent; concurrent writes to one
/// buffer are the caller's business.
class DeviceBuffer {
 public:
  /// An empty buffer (no memory, no device).
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  /// The first byte (64-byte aligned; page-aligned from 4 KiB up; a mapped buffer's where its
  /// owner has it), or nullptr when empty. A mapped buffer's bytes are read-only: writing them
  /// faults.
  std::byte* data() noexcept { return data_; }
  /// The first byte, or nullptr when empty.
  const std::byte* data() const noexcept { return data_; }
  /// Size in bytes.
  std::size_t size_bytes() const noexcept { return bytes_; }
  /// True when the buffer holds no memory.
  bool empty() const noexcept { return data_ == nullptr; }
  /// The bytes as a span.
  std::span<std::byte> bytes() noexcept { return {data_, bytes_}; }
  /// The owning device, or nullptr when empty.
  Device* device() const noexcept { return device_.get(); }
  /// How the pages were placed.
  MemoryBinding binding() const noexcept { return binding_; }
  /// True for a view of mapped memory (Device::use_mapped): read-only, not the device's.
  bool is_mapped() const noexcept { return binding_ == MemoryBinding::kMapped; }

  /// Where the pages actually are, when the OS can tell (hwloc_get_area_memlocation): the
  /// NumaNode::index holding every page, -1 when they are spread over several nodes, or
  /// nullopt when the query is not possible (unbindable topology, no pages).
  /// Costs a system call; meant for reports and tests.
  std::optional<int> query_node() const;

 private:
  friend class Device;
  std::shared_ptr<Device> device_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryBinding binding_ = MemoryBinding::kUnbound;
  bool hwloc_allocated_ = false;             // freed with hwloc_free, else with std::free
  bool slab_allocated_ = false;              // a block of the device's HugePageSlabs
  std::shared_ptr<const std::byte> mapped_;  // a mapped buffer's owner: released, not freed
  std::shared_ptr<SharedArena> arena_;       // a block of a shared arena: given back to it
  void release() noexcept;
};

}  // namespace numesh::runtime
