#pragma once

#include <cstddef>
#include <memory>
#include <optional>

namespace numesh::runtime {

class Topology;

/// Memory bound to one NUMA node of a topology and owned by no device: for a node no device can
/// allocate from (a memory-only node, or one whose cores lie outside the process's binding),
/// as the memory benchmark's device x node matrix needs. hwloc binds the pages strictly, so
/// they land on the node whoever touches them first; they are zero-filled on construction.
/// Move-only; keeps the topology's hwloc handle alive, and query_node() needs the Topology
/// itself alive. A moved-from object may only be destroyed or assigned to.
/// Thread-safety: distinct objects are independent.
class NodeMemory {
 public:
  /// `bytes` (at least 1) bound to NUMA node `node` (NumaNode::index) of `topology`.
  /// Throws: ValueError when `topology` cannot bind memory (an XML or synthetic topology of
  /// another machine) or `bytes` is 0; TopologyError whose message is the reason alone ("hwloc
  /// has no such node", or the OS's error text) when the node cannot hold the memory.
  NodeMemory(const Topology& topology, int node, std::size_t bytes);
  NodeMemory(NodeMemory&& other) noexcept;
  NodeMemory& operator=(NodeMemory&& other) noexcept;
  NodeMemory(const NodeMemory&) = delete;
  NodeMemory& operator=(const NodeMemory&) = delete;
  ~NodeMemory();

  /// The first byte (page-aligned).
  [[nodiscard]] std::byte* data() noexcept;
  /// Size in bytes.
  [[nodiscard]] std::size_t size_bytes() const noexcept;
  /// Where the pages are, as DeviceBuffer::query_node() says it: the NumaNode::index holding
  /// every page, -1 when they are spread over several nodes, nullopt when the OS cannot tell.
  [[nodiscard]] std::optional<int> query_node() const;

 private:
  struct Block;
  std::unique_ptr<Block> block_;
};

}  // namespace numesh::runtime
