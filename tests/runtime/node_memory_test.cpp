// NodeMemory on topologies that cannot bind (synthetic, XML of another machine): refused by
// name, before any allocation. The machine's own nodes: tests/runtime_numa.

#include "numesh/runtime/node_memory.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ThrowsMessage;

TEST(NodeMemoryTest, ATopologyThatCannotBindIsRefusedNamingTheNode) {
  const Topology t = Topology::from_synthetic("numa:2 core:1 pu:1");
  ASSERT_FALSE(t.can_bind());
  EXPECT_THAT([&] { NodeMemory(t, 1, 4096); },
              ThrowsMessage<ValueError>(
                  "node memory: this synthetic topology cannot bind memory to NUMA node 1"));
  EXPECT_THAT([&] { NodeMemory(t, 0, 0); },
              ThrowsMessage<ValueError>("node memory: 0 bytes asked for on NUMA node 0"));
}

}  // namespace
}  // namespace numesh::runtime
