// Tests that load the real machine (Topology::discover()). They live in runtime_numa_test,
// labelled `numa`, so that sanitizer runs can leave them out (STYLE.md §2.11).

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/cpuset.hpp"
#include "numesh/runtime/node_memory.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime {
namespace {

using ::testing::Contains;

CpuSet thread_affinity() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  std::vector<int> pus;
  for (int pu = 0; pu < CPU_SETSIZE; ++pu) {
    if (CPU_ISSET(pu, &mask)) pus.push_back(pu);
  }
  return CpuSet(std::move(pus));
}

void set_thread_affinity(const CpuSet& cpus) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (const int pu : cpus.pus()) CPU_SET(pu, &mask);
  ASSERT_EQ(sched_setaffinity(0, sizeof(mask), &mask), 0);
}

// One smoke test of discovery: the machine as loaded matches what the kernel says this
// (single-threaded) process may run on, and a narrower binding restricts it with a note.
TEST(TopologyNumaTest, DiscoverMatchesTheAffinityAndHonoursANarrowerBinding) {
  const CpuSet affinity = thread_affinity();
  ASSERT_FALSE(affinity.empty());
  {
    const Topology t = Topology::discover();
    EXPECT_EQ(t.source(), TopologySource::kMachine);
    EXPECT_EQ(t.origin(), "");
    EXPECT_TRUE(t.can_bind());
    ASSERT_FALSE(t.numa_nodes().empty());
    EXPECT_FALSE(t.cores().empty());
    EXPECT_EQ(t.cpuset(), affinity);
    EXPECT_EQ(t.distances().size, static_cast<int>(t.numa_nodes().size()));
    EXPECT_THAT(t.distances().origin, ::testing::AnyOf("os", "default"));
    for (const Core& c : t.cores()) EXPECT_TRUE(t.cpuset().contains(c.pus));
  }
  if (affinity.size() < 2) GTEST_SKIP() << "one allowed PU: no narrower binding to test";

  const CpuSet narrow({affinity.pus().back()});
  set_thread_affinity(narrow);
  const Topology t = Topology::discover();
  set_thread_affinity(affinity);
  EXPECT_EQ(t.cpuset(), narrow);
  ASSERT_EQ(t.cores().size(), 1U);
  EXPECT_THAT(t.notes(), Contains(fmt::format("restricted to the process binding {}", narrow)));
  // Nodes stay listed (with their memory) even when none of their PUs are left.
  std::size_t nodes_with_pus = 0;
  for (const NumaNode& n : t.numa_nodes()) nodes_with_pus += n.cpuset.empty() ? 0 : 1;
  EXPECT_EQ(nodes_with_pus, 1U);
}

// Memory bound to the machine's first node holds zeros, reports that node where the OS can
// tell, and a node the machine lacks is refused with hwloc's reason.
TEST(NodeMemoryNumaTest, BindsToANodeOfTheMachineAndRefusesOneItLacks) {
  const Topology t = Topology::discover();
  if (!t.can_bind()) GTEST_SKIP() << "this machine's topology cannot bind memory";
  NodeMemory m(t, 0, 1 << 20);
  ASSERT_EQ(m.size_bytes(), std::size_t{1} << 20);
  const std::byte* p = m.data();
  EXPECT_EQ(std::count(p, p + m.size_bytes(), std::byte{0}),
            static_cast<std::ptrdiff_t>(m.size_bytes()));
  const std::optional<int> node = m.query_node();
  if (node.has_value()) {
    EXPECT_EQ(*node, 0);
  }
  const int missing = static_cast<int>(t.numa_nodes().size());
  EXPECT_THAT([&] { NodeMemory(t, missing, 4096); },
              ::testing::ThrowsMessage<TopologyError>("hwloc has no such node"));
}

}  // namespace
}  // namespace numesh::runtime
