#include "numesh/runtime/device_placement.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/topology.hpp"
#include "topology_fixtures.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

using testing::topology_fixture;

Topology two_by_two() { return Topology::from_synthetic("package:2 numa:2 core:8 pu:2"); }

std::vector<std::string> labels(const std::vector<DeviceSpec>& devices) {
  std::vector<std::string> out;
  for (const DeviceSpec& d : devices) out.push_back(d.label);
  return out;
}

// A node whose PUs no Core holds (found by topology_fuzz; tests/data/topologies/README.md)
// still gives a device of one thread per PU: it was once a device of no thread, which no arena
// can be.
TEST(PlacementTest, PusThatNoCoreHoldsAreCoresOfTheirOwn) {
  const Topology t = topology_fixture("fuzzed-numa-node-without-cores.xml");
  for (const PlacementPolicy policy :
       {PlacementPolicy::kNuma, PlacementPolicy::kL3, PlacementPolicy::kCore}) {
    for (const bool smt : {false, true}) {
      const auto devices = place_devices(t, {.policy = policy, .use_smt = smt});
      ASSERT_FALSE(devices.empty());
      for (const DeviceSpec& d : devices) {
        EXPECT_GE(d.threads, 1) << d.label;
        EXPECT_EQ(static_cast<std::size_t>(d.threads), d.cpuset.size()) << d.label;
      }
    }
  }
  const auto numa = place_devices(t, {.policy = PlacementPolicy::kNuma});
  ASSERT_EQ(numa.size(), 1u);  // node 0 of the export lost its PUs to the mutation
  EXPECT_EQ(numa[0].label, "numa1");
  EXPECT_EQ(numa[0].cpuset.to_string(), "2-3");
}

TEST(PlacementTest, PolicyNamesRoundTrip) {
  for (const PlacementPolicy p : {PlacementPolicy::kNuma, PlacementPolicy::kL3,
                                  PlacementPolicy::kCore, PlacementPolicy::kExplicit}) {
    EXPECT_EQ(parse_placement_policy(to_string(p)), p);
  }
  EXPECT_EQ(to_string(PlacementPolicy::kL3), "l3");
}

TEST(PlacementTest, UnknownPolicyNamesTextAndChoices) {
  EXPECT_THAT([] { parse_placement_policy("foo"); },
              ThrowsMessage<ValueError>(
                  HasSubstr("unknown placement policy 'foo' (choose numa, l3, core or explicit)")));
  EXPECT_THAT([] { parse_placement_policy("NUMA"); },
              ThrowsMessage<ValueError>(HasSubstr("'NUMA'")));
}

TEST(PlacementTest, NumaWithoutSmtPinsOneThreadPerCore) {
  std::vector<std::string> notes;
  const auto devices = place_devices(two_by_two(), {}, &notes);
  ASSERT_EQ(devices.size(), 4U);
  EXPECT_THAT(labels(devices), ElementsAre("numa0", "numa1", "numa2", "numa3"));
  const DeviceSpec& d = devices[2];
  EXPECT_EQ(d.index, 2);
  EXPECT_EQ(d.cpuset, CpuSet::parse("32,34,36,38,40,42,44,46"));
  EXPECT_EQ(d.threads, 8);
  EXPECT_EQ(d.numa_node, 2);
  EXPECT_EQ(d.numa_os_index, 2);
  EXPECT_TRUE(d.whole_numa_node);
  EXPECT_THAT(notes, IsEmpty());
}

TEST(PlacementTest, NumaWithSmtUsesEveryPu) {
  const auto devices = place_devices(two_by_two(), {.use_smt = true});
  ASSERT_EQ(devices.size(), 4U);
  EXPECT_EQ(devices[1].cpuset, CpuSet::parse("16-31"));
  EXPECT_EQ(devices[1].threads, 16);
  EXPECT_TRUE(devices[1].whole_numa_node);
}

TEST(PlacementTest, MaxThreadsCapsThreadsButKeepsCpuset) {
  const auto devices = place_devices(two_by_two(), {.use_smt = true, .max_threads_per_device = 2});
  ASSERT_EQ(devices.size(), 4U);
  EXPECT_EQ(devices[0].threads, 2);
  EXPECT_EQ(devices[0].cpuset, CpuSet::parse("0-15"));
}

TEST(PlacementTest, NegativeMaxThreadsIsRejected) {
  EXPECT_THAT([] { place_devices(two_by_two(), {.max_threads_per_device = -1}); },
              ThrowsMessage<ValueError>(HasSubstr("max_threads_per_device -1 is negative")));
}

TEST(PlacementTest, NumaOnEightSingleCoreNodes) {
  const auto devices = place_devices(Topology::from_synthetic("numa:8 core:1 pu:1"), {});
  ASSERT_EQ(devices.size(), 8U);
  EXPECT_EQ(devices[7].label, "numa7");
  EXPECT_EQ(devices[7].cpuset, CpuSet({7}));
  EXPECT_EQ(devices[7].threads, 1);
}

TEST(PlacementTest, SingleNodeMakesOneDevice) {
  const auto off = place_devices(Topology::from_synthetic("core:4 pu:2"), {});
  ASSERT_EQ(off.size(), 1U);
  EXPECT_EQ(off[0].cpuset, CpuSet({0, 2, 4, 6}));
  EXPECT_EQ(off[0].threads, 4);
  const auto on = place_devices(Topology::from_synthetic("core:4 pu:2"), {.use_smt = true});
  ASSERT_EQ(on.size(), 1U);
  EXPECT_EQ(on[0].cpuset, CpuSet::parse("0-7"));
  EXPECT_EQ(on[0].threads, 8);
}

TEST(PlacementTest, CorePolicyMakesOneDevicePerCore) {
  const auto devices = place_devices(two_by_two(), {.policy = PlacementPolicy::kCore});
  ASSERT_EQ(devices.size(), 32U);
  const DeviceSpec& d = devices[5];
  EXPECT_EQ(d.label, "core5");
  EXPECT_EQ(d.cpuset, CpuSet({10}));
  EXPECT_EQ(d.threads, 1);
  EXPECT_EQ(d.numa_node, 0);
  EXPECT_EQ(d.numa_os_index, 0);
  EXPECT_FALSE(d.whole_numa_node);
  EXPECT_EQ(devices[31].numa_node, 3);
}

TEST(PlacementTest, CorePolicyWithSmtTakesSiblings) {
  const auto devices =
      place_devices(two_by_two(), {.policy = PlacementPolicy::kCore, .use_smt = true});
  ASSERT_EQ(devices.size(), 32U);
  EXPECT_EQ(devices[5].cpuset, CpuSet({10, 11}));
  EXPECT_EQ(devices[5].threads, 2);
}

TEST(PlacementTest, CoreThatIsAWholeNodeIsMarkedSo) {
  const auto devices = place_devices(Topology::from_synthetic("numa:8 core:1 pu:1"),
                                     {.policy = PlacementPolicy::kCore});
  ASSERT_EQ(devices.size(), 8U);
  EXPECT_TRUE(devices[3].whole_numa_node);
  EXPECT_EQ(devices[3].numa_os_index, 3);
}

TEST(PlacementTest, L3PolicySplitsNodesIntoCacheGroups) {
  const Topology t = Topology::from_synthetic("package:2 numa:1 l3:2 core:4 pu:2");
  const auto devices = place_devices(t, {.policy = PlacementPolicy::kL3});
  ASSERT_EQ(devices.size(), 4U);
  EXPECT_THAT(labels(devices), ElementsAre("l3-0", "l3-1", "l3-2", "l3-3"));
  EXPECT_EQ(devices[3].cpuset, CpuSet({24, 26, 28, 30}));
  EXPECT_EQ(devices[3].threads, 4);
  EXPECT_EQ(devices[3].numa_node, 1);
  EXPECT_FALSE(devices[3].whole_numa_node);  // half of node 1
}

TEST(PlacementTest, L3GroupEqualToItsNodeIsWholeNodeInBothSmtModes) {
  const Topology t = Topology::from_synthetic("package:2 numa:2 l3:1 core:2 pu:2");
  for (const bool smt : {false, true}) {
    const auto devices = place_devices(t, {.policy = PlacementPolicy::kL3, .use_smt = smt});
    ASSERT_EQ(devices.size(), 4U);
    EXPECT_TRUE(devices[2].whole_numa_node) << "smt " << smt;
    EXPECT_EQ(devices[2].threads, smt ? 4 : 2);
  }
}

TEST(PlacementTest, L3OnIntelXmlMatchesTheNodes) {
  const Topology t = topology_fixture("24em64t-2n6c2t-pci.xml");
  const auto devices = place_devices(t, {.policy = PlacementPolicy::kL3});
  ASSERT_EQ(devices.size(), 2U);
  EXPECT_EQ(devices[1].label, "l3-1");
  EXPECT_EQ(devices[1].cpuset, CpuSet::parse("1,3,5,7,9,11"));
  EXPECT_EQ(devices[1].threads, 6);
  EXPECT_EQ(devices[1].numa_os_index, 1);
  EXPECT_TRUE(devices[1].whole_numa_node);
}

TEST(PlacementTest, NumaOnIntelXmlWithSmt) {
  const Topology t = topology_fixture("24em64t-2n6c2t-pci.xml");
  const auto devices = place_devices(t, {.use_smt = true});
  ASSERT_EQ(devices.size(), 2U);
  EXPECT_EQ(devices[0].cpuset, CpuSet::parse("0,2,4,6,8,10,12,14,16,18,20,22"));
  EXPECT_EQ(devices[0].threads, 12);
}

TEST(PlacementTest, L3WithoutL3FallsBackToNumaWithNote) {
  const Topology t = topology_fixture("16amd64-4distances.xml");
  std::vector<std::string> notes;
  const auto devices = place_devices(t, {.policy = PlacementPolicy::kL3}, &notes);
  ASSERT_EQ(devices.size(), 8U);
  // Labels carry the OS node number, devices follow hwloc's logical order.
  EXPECT_THAT(labels(devices),
              ElementsAre("numa1", "numa0", "numa2", "numa5", "numa4", "numa3", "numa6", "numa7"));
  EXPECT_EQ(devices[1].numa_node, 1);
  EXPECT_EQ(devices[1].numa_os_index, 0);
  EXPECT_THAT(notes,
              ElementsAre("the topology reports no L3 cache: l3 placement falls back to numa"));
}

TEST(PlacementTest, NumaSkipsMemoryOnlyNodesAndNodelessPusWithNotes) {
  const Topology t = topology_fixture("16amd64-8n2c-cpusets.xml");
  std::vector<std::string> notes;
  const auto devices = place_devices(t, {}, &notes);
  ASSERT_EQ(devices.size(), 3U);
  EXPECT_THAT(labels(devices), ElementsAre("numa1", "numa2", "numa3"));
  EXPECT_EQ(devices[0].cpuset, CpuSet({2, 3}));
  EXPECT_EQ(devices[0].threads, 2);
  EXPECT_EQ(devices[2].cpuset, CpuSet({6}));
  EXPECT_EQ(devices[2].numa_node, 2);
  EXPECT_THAT(notes, ElementsAre("NUMA nodes without PUs get no device (memory only): numa5, numa4",
                                 "PUs 0-1,12-15 belong to no NUMA node and get no device"));
}

TEST(PlacementTest, CorePolicyGivesNodelessCoresNoNode) {
  const Topology t = topology_fixture("16amd64-8n2c-cpusets.xml");
  const auto devices = place_devices(t, {.policy = PlacementPolicy::kCore});
  ASSERT_EQ(devices.size(), 10U);
  EXPECT_EQ(devices[0].numa_node, -1);
  EXPECT_EQ(devices[0].numa_os_index, -1);
  EXPECT_FALSE(devices[0].whole_numa_node);
  EXPECT_EQ(devices[4].cpuset, CpuSet({5}));
  EXPECT_TRUE(devices[4].whole_numa_node);  // node P#2 is PU 5 alone
}

TEST(PlacementTest, ExplicitCpusetsBecomeDevicesInListOrder) {
  const PlacementOptions options{.policy = PlacementPolicy::kExplicit,
                                 .explicit_cpusets = {CpuSet::parse("32-47"), CpuSet::parse("0-3"),
                                                      CpuSet::parse("16-17,48-63")}};
  const auto devices = place_devices(two_by_two(), options);
  ASSERT_EQ(devices.size(), 3U);
  EXPECT_THAT(labels(devices), ElementsAre("cpus32-47", "cpus0-3", "cpus16-17,48-63"));
  EXPECT_EQ(devices[0].numa_node, 2);
  EXPECT_TRUE(devices[0].whole_numa_node);
  EXPECT_EQ(devices[0].threads, 8);  // 8 cores
  EXPECT_EQ(devices[1].cpuset, CpuSet::parse("0-3"));
  EXPECT_EQ(devices[1].threads, 2);  // PUs 0-3 are 2 cores
  EXPECT_EQ(devices[1].numa_node, 0);
  EXPECT_FALSE(devices[1].whole_numa_node);
  EXPECT_EQ(devices[2].numa_node, 3);  // 16 of its PUs are on node 3, 2 on node 1
  EXPECT_EQ(devices[2].numa_os_index, 3);
}

TEST(PlacementTest, ExplicitWithSmtCountsPus) {
  const PlacementOptions options{.policy = PlacementPolicy::kExplicit,
                                 .use_smt = true,
                                 .explicit_cpusets = {CpuSet::parse("0-3"), CpuSet({5})}};
  const auto devices = place_devices(two_by_two(), options);
  ASSERT_EQ(devices.size(), 2U);
  EXPECT_EQ(devices[0].threads, 4);
  EXPECT_EQ(devices[1].threads, 1);
  EXPECT_EQ(devices[1].index, 1);
}

TEST(PlacementTest, ExplicitNeedsAtLeastOneCpuset) {
  EXPECT_THAT([] { place_devices(two_by_two(), {.policy = PlacementPolicy::kExplicit}); },
              ThrowsMessage<ValueError>(HasSubstr("explicit placement needs at least one cpuset")));
}

TEST(PlacementTest, ExplicitRejectsEmptyCpuset) {
  const PlacementOptions options{.policy = PlacementPolicy::kExplicit,
                                 .explicit_cpusets = {CpuSet({0}), CpuSet()}};
  EXPECT_THAT([&] { place_devices(two_by_two(), options); },
              ThrowsMessage<ValueError>(HasSubstr("explicit cpuset 1 is empty")));
}

TEST(PlacementTest, ExplicitRejectsCpusetOutsideTopology) {
  const PlacementOptions options{.policy = PlacementPolicy::kExplicit,
                                 .explicit_cpusets = {CpuSet::parse("60-70")}};
  EXPECT_THAT([&] { place_devices(two_by_two(), options); },
              ThrowsMessage<ValueError>(
                  HasSubstr("explicit cpuset 0 '60-70' is outside the topology's PUs '0-63'")));
}

TEST(PlacementTest, ExplicitRejectsOverlapNamingBothCpusets) {
  const PlacementOptions options{
      .policy = PlacementPolicy::kExplicit,
      .explicit_cpusets = {CpuSet::parse("0-7"), CpuSet::parse("8-9"), CpuSet::parse("6-8")}};
  EXPECT_THAT([&] { place_devices(two_by_two(), options); },
              ThrowsMessage<ValueError>(
                  HasSubstr("explicit cpusets 0 '0-7' and 2 '6-8' overlap (PUs 6-7)")));
}

TEST(PlacementTest, ExplicitOnXmlRejectsDisallowedPu) {
  const Topology t = topology_fixture("16amd64-8n2c-cpusets.xml");
  const PlacementOptions options{.policy = PlacementPolicy::kExplicit,
                                 .explicit_cpusets = {CpuSet({4})}};
  EXPECT_THAT([&] { place_devices(t, options); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "explicit cpuset 0 '4' is outside the topology's PUs '0-3,5-6,12-15'")));
}

TEST(PlacementTest, PolicyOtherThanExplicitIgnoresExplicitCpusets) {
  const auto devices =
      place_devices(two_by_two(), {.explicit_cpusets = {CpuSet::parse("100-200")}});
  EXPECT_EQ(devices.size(), 4U);
}

}  // namespace
}  // namespace numesh::runtime
