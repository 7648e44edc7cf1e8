#include "numesh/runtime/node_memory.hpp"

#include <hwloc.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "hwloc_handle.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime {

struct NodeMemory::Block {
  std::shared_ptr<const detail::HwlocTopology> hwloc;
  const Topology* topology = nullptr;  // for query_node(); the caller keeps it alive
  void* data = nullptr;
  std::size_t bytes = 0;
  ~Block() {
    if (data != nullptr) hwloc_free(hwloc->get(), data, bytes);
  }
};

NodeMemory::NodeMemory(const Topology& topology, int node, std::size_t bytes)
    : block_(std::make_unique<Block>()) {
  NUMESH_CHECK(bytes > 0, ValueError, "node memory: 0 bytes asked for on NUMA node {}", node);
  NUMESH_CHECK(topology.can_bind(), ValueError,
               "node memory: this {} topology cannot bind memory to NUMA node {}",
               to_string(topology.source()), node);
  hwloc_obj_t obj = topology.hwloc()->numa_obj(node);
  NUMESH_CHECK(obj != nullptr, TopologyError, "hwloc has no such node");
  void* p =
      hwloc_alloc_membind(topology.hwloc()->get(), bytes, obj->nodeset, HWLOC_MEMBIND_BIND,
                          HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT | HWLOC_MEMBIND_NOCPUBIND);
  if (p == nullptr) throw TopologyError(std::error_code(errno, std::generic_category()).message());
  std::memset(p, 0, bytes);  // bound: whoever touches the pages, they land on the node
  block_->hwloc = topology.hwloc();
  block_->topology = &topology;
  block_->data = p;
  block_->bytes = bytes;
}

NodeMemory::NodeMemory(NodeMemory&& other) noexcept = default;
NodeMemory& NodeMemory::operator=(NodeMemory&& other) noexcept = default;
NodeMemory::~NodeMemory() = default;

std::byte* NodeMemory::data() noexcept { return static_cast<std::byte*>(block_->data); }

std::size_t NodeMemory::size_bytes() const noexcept { return block_->bytes; }

std::optional<int> NodeMemory::query_node() const {
  return detail::pages_node(*block_->topology, block_->data, block_->bytes);
}

}  // namespace numesh::runtime
