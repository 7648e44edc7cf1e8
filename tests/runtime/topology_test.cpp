#include "numesh/runtime/topology.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "scoped_environment.hpp"
#include "topology_fixtures.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

using testing::topology_fixture;
constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;

std::vector<int> os_indexes(const std::vector<NumaNode>& nodes) {
  std::vector<int> out;
  for (const NumaNode& n : nodes) out.push_back(n.os_index);
  return out;
}

TEST(TopologyTest, SourceNames) {
  EXPECT_EQ(to_string(TopologySource::kMachine), "machine");
  EXPECT_EQ(to_string(TopologySource::kSynthetic), "synthetic");
  EXPECT_EQ(to_string(TopologySource::kXml), "xml");
}

TEST(TopologyTest, SyntheticTwoPackagesTwoNodesEachHasFourNodes) {
  const Topology t = Topology::from_synthetic("package:2 numa:2 core:8 pu:2");
  EXPECT_EQ(t.source(), TopologySource::kSynthetic);
  EXPECT_EQ(t.origin(), "package:2 numa:2 core:8 pu:2");
  ASSERT_EQ(t.numa_nodes().size(), 4U);
  EXPECT_EQ(t.packages().size(), 2U);
  EXPECT_EQ(t.cores().size(), 32U);
  EXPECT_EQ(t.cpuset(), CpuSet::parse("0-63"));
  EXPECT_TRUE(t.l3_groups().empty());
  EXPECT_THAT(os_indexes(t.numa_nodes()), ElementsAre(0, 1, 2, 3));
  for (int i = 0; i < 4; ++i) {
    const NumaNode& n = t.numa_nodes()[static_cast<std::size_t>(i)];
    EXPECT_EQ(n.index, i);
    EXPECT_EQ(n.cpuset, CpuSet::parse(fmt::format("{}-{}", 16 * i, 16 * i + 15)));
    EXPECT_EQ(n.package, i / 2);
    EXPECT_EQ(n.memory_bytes, 1 * kGiB);  // hwloc's synthetic default
  }
  EXPECT_EQ(t.packages()[1].cpuset, CpuSet::parse("32-63"));
  EXPECT_EQ(t.packages()[1].os_index, 1);
}

TEST(TopologyTest, SyntheticCoresKnowTheirPusNodeAndPackage) {
  const Topology t = Topology::from_synthetic("package:2 numa:2 core:8 pu:2");
  const Core& first = t.cores().front();
  EXPECT_EQ(first.index, 0);
  EXPECT_EQ(first.pus, CpuSet({0, 1}));
  EXPECT_EQ(first.numa_node, 0);
  EXPECT_EQ(first.package, 0);
  EXPECT_EQ(first.l3_group, -1);
  const Core& c20 = t.cores()[20];
  EXPECT_EQ(c20.index, 20);
  EXPECT_EQ(c20.pus, CpuSet({40, 41}));
  EXPECT_EQ(c20.numa_node, 2);
  EXPECT_EQ(c20.package, 1);
}

TEST(TopologyTest, SyntheticWithoutDistancesUsesTheLabelledDefault) {
  const Topology t = Topology::from_synthetic("package:2 numa:2 core:8 pu:2");
  const DistanceMatrix& d = t.distances();
  EXPECT_EQ(d.origin, "default");
  ASSERT_EQ(d.size, 4);
  ASSERT_EQ(d.values.size(), 16U);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(d.at(i, j), i == j ? 10U : 20U) << i << "," << j;
  }
  EXPECT_THAT(t.notes(), ElementsAre(HasSubstr("binding is not possible on a synthetic topology"),
                                     HasSubstr("distances are a guess (10 local, 20 remote)")));
}

TEST(TopologyTest, SyntheticCannotBindAndSaysSo) {
  const Topology t = Topology::from_synthetic("numa:2 core:2 pu:1");
  EXPECT_FALSE(t.can_bind());
  ASSERT_FALSE(t.notes().empty());
  EXPECT_THAT(t.notes().front(), HasSubstr("devices run unpinned"));
}

TEST(TopologyTest, SyntheticWithThisSystemCanBind) {
  const testing::ScopedEnvironment env("HWLOC_THISSYSTEM", "1");
  const Topology t = Topology::from_synthetic("numa:2 core:1 pu:1");
  EXPECT_TRUE(t.can_bind());
  EXPECT_EQ(t.cpuset(), CpuSet({0, 1}));
  for (const std::string& note : t.notes()) EXPECT_THAT(note, ::testing::Not(HasSubstr("binding")));
}

TEST(TopologyTest, SyntheticEightSingleCoreNodes) {
  const Topology t = Topology::from_synthetic("numa:8 core:1 pu:1");
  ASSERT_EQ(t.numa_nodes().size(), 8U);
  EXPECT_TRUE(t.packages().empty());
  EXPECT_EQ(t.cores().size(), 8U);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(t.numa_nodes()[i].cpuset, CpuSet({static_cast<int>(i)}));
    EXPECT_EQ(t.numa_nodes()[i].package, -1);
    EXPECT_EQ(t.cores()[i].numa_node, static_cast<int>(i));
    EXPECT_EQ(t.cores()[i].package, -1);
  }
  EXPECT_EQ(t.distances().size, 8);
}

TEST(TopologyTest, SyntheticSingleNodeHasNoDistanceGuessNote) {
  const Topology t = Topology::from_synthetic("core:4 pu:2");
  ASSERT_EQ(t.numa_nodes().size(), 1U);
  EXPECT_EQ(t.numa_nodes()[0].cpuset, CpuSet::parse("0-7"));
  EXPECT_EQ(t.cores().size(), 4U);
  EXPECT_EQ(t.cores()[3].pus, CpuSet({6, 7}));
  EXPECT_EQ(t.distances().size, 1);
  EXPECT_THAT(t.distances().values, ElementsAre(10U));
  EXPECT_EQ(t.distances().origin, "default");
  EXPECT_EQ(t.notes().size(), 1U);  // only "binding is not possible"
}

TEST(TopologyTest, SyntheticWithoutCoreLevelTreatsEachPuAsCore) {
  const Topology t = Topology::from_synthetic("numa:2 pu:3");
  ASSERT_EQ(t.cores().size(), 6U);
  EXPECT_EQ(t.cores()[4].pus, CpuSet({4}));
  EXPECT_EQ(t.cores()[4].numa_node, 1);
}

TEST(TopologyTest, SyntheticL3GroupsMapToTheirNode) {
  const Topology t = Topology::from_synthetic("package:2 numa:1 l3:2 core:4 pu:2");
  ASSERT_EQ(t.l3_groups().size(), 4U);
  const CacheGroup& g = t.l3_groups()[2];
  EXPECT_EQ(g.index, 2);
  EXPECT_EQ(g.cpuset, CpuSet::parse("16-23"));
  EXPECT_EQ(g.numa_node, 1);
  EXPECT_GT(g.size_bytes, 0U);
  EXPECT_EQ(t.cores()[5].l3_group, 1);
  EXPECT_EQ(t.cores()[5].numa_node, 0);
}

TEST(TopologyTest, CopiesShareTheLoadedHwlocTopology) {
  const Topology a = Topology::from_synthetic("numa:2 core:1 pu:1");
  const Topology b = a;  // NOLINT(performance-unnecessary-copy-initialization)
  ASSERT_NE(a.hwloc(), nullptr);
  EXPECT_EQ(a.hwloc().get(), b.hwloc().get());
  EXPECT_EQ(b.numa_nodes().size(), 2U);
}

TEST(TopologyTest, BadSyntheticDescriptionThrowsTopologyErrorNamingIt) {
  EXPECT_THAT([] { Topology::from_synthetic("numa:2 pu:x"); },
              ThrowsMessage<TopologyError>(
                  HasSubstr("hwloc rejected the synthetic topology description 'numa:2 pu:x'")));
  EXPECT_THAT([] { Topology::from_synthetic("bogus:2 pu:1"); },
              ThrowsMessage<TopologyError>(HasSubstr("'bogus:2 pu:1'")));
  // A last level that is not PUs is named (hwloc itself says why only on stderr).
  EXPECT_THAT([] { Topology::from_synthetic("package:2 numa:1 core:1"); },
              ThrowsMessage<TopologyError>(StrEq(
                  "hwloc rejected the synthetic topology description 'package:2 numa:1 core:1': "
                  "its last level is 'core:1', and hwloc's must be PUs (e.g. 'package:2 numa:2 "
                  "core:8 pu:2')")));
  EXPECT_THAT([] { Topology::from_synthetic("numa:2 PU:x"); },
              ThrowsMessage<TopologyError>(
                  StrEq("hwloc rejected the synthetic topology description 'numa:2 PU:x'")));
  // The last level is the walk's: after attributes holding blanks (the description's last word
  // is "memory=2MB)"), and with no blank before it. A level the walk cannot read to its count
  // gets no hint: hwloc refuses it for that.
  EXPECT_THAT([] { Topology::from_synthetic("numa:2(memory=1GB) core:1(memory=1MB memory=2MB)"); },
              ThrowsMessage<TopologyError>(HasSubstr("its last level is 'core:1', and hwloc's")));
  EXPECT_THAT([] { Topology::from_synthetic("numa:2 pu:2core:1"); },
              ThrowsMessage<TopologyError>(HasSubstr("its last level is 'core:1', and hwloc's")));
  EXPECT_THAT([] { Topology::from_synthetic("numa:2 core:2pu:x"); },
              ThrowsMessage<TopologyError>(
                  StrEq("hwloc rejected the synthetic topology description 'numa:2 core:2pu:x'")));
  EXPECT_THAT([] { Topology::from_synthetic("numa:2 core:2 pu :x"); },
              ThrowsMessage<TopologyError>(StrEq(
                  "hwloc rejected the synthetic topology description 'numa:2 core:2 pu :x'")));
}

// A NUL byte is refused: hwloc reads up to it, so numesh's PU count would be of other text
// ("11100008" then a NUL passed the count, and hwloc spent minutes on 11 million objects; found
// by topology_fuzz, fuzz/corpus/topology_fuzz/regression-nul-byte).
TEST(TopologyTest, ASyntheticDescriptionWithANulByteIsRefused) {
  using namespace std::string_view_literals;
  EXPECT_THAT([] { (void)Topology::from_synthetic("11100008\0 core:0"sv); },
              ThrowsMessage<TopologyError>(
                  "the synthetic topology description has a NUL byte at offset 8: a description "
                  "is text"));
}

// A memory-side cache level is refused before hwloc sees it: hwloc 2.9 asserts (aborting the
// process) while loading "MemCache3:1 core:4 pu:2" (found by topology_fuzz).
TEST(TopologyTest, SyntheticMemorySideCachesAreRefusedBeforeHwlocLoadsThem) {
  EXPECT_THAT([] { (void)Topology::from_synthetic("MemCache3:1 core:4 pu:2"); },
              ThrowsMessage<TopologyError>(HasSubstr(
                  "the synthetic topology 'MemCache3:1 core:4 pu:2' has a memory-side cache level "
                  "('MemCache3:1')")));
  EXPECT_THROW((void)Topology::from_synthetic("numa:2 mcache:1 core:2 pu:1"), TopologyError);
  // hwloc takes any prefix of the type's name (5 letters at least), in any case, ending at the
  // first character that is not a letter or a dash (topology_fuzz found "MemCach<bytes>3:1").
  EXPECT_THAT([] { (void)Topology::from_synthetic("numa:2 MEMCA:1 core:2 pu:1"); },
              ThrowsMessage<TopologyError>(HasSubstr("has a memory-side cache level ('MEMCA:1')")));
  EXPECT_THAT(
      [] {
        (void)Topology::from_synthetic(
            "numa:2 MemCach\xfa"
            "3:1 core:2 pu:1");
      },
      ThrowsMessage<TopologyError>(HasSubstr("has a memory-side cache level")));
  EXPECT_THAT([] { (void)Topology::from_synthetic("numa:2 memory-side:1 core:2 pu:1"); },
              ThrowsMessage<TopologyError>(HasSubstr("has a memory-side cache level")));
  EXPECT_EQ(Topology::from_synthetic("numa:2 l3:1 core:2 pu:1").cores().size(), 4U);
}

// hwloc builds every object a description names, so a huge one is refused before it is built
// (topology_fuzz found "... core:622 pu:2" taking 32 s); the largest accepted still loads.
TEST(TopologyTest, SyntheticDescriptionsOfMoreThan4096PusAreRefusedBeforeHwlocBuildsThem) {
  EXPECT_THAT([] { Topology::from_synthetic("pack:64 core:64 pu:2"); },
              ThrowsMessage<TopologyError>(
                  "the synthetic topology 'pack:64 core:64 pu:2' describes more than 4096 PUs, "
                  "the most numesh accepts"));
  EXPECT_THAT([] { Topology::from_synthetic("pu:99999999999999999999999"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_EQ(Topology::from_synthetic("pack:2 numa:2 core:512 pu:2").cpuset().size(), 4096u);
  // Bare counts are levels too (topology_fuzz found "11111" taking 25 s), and attributes in
  // parentheses or of the whole description are not counts.
  EXPECT_THAT([] { Topology::from_synthetic("11111"); },
              ThrowsMessage<TopologyError>(
                  "the synthetic topology '11111' describes more than 4096 PUs, the most numesh "
                  "accepts"));
  EXPECT_THAT([] { Topology::from_synthetic("64 64 2"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_EQ(Topology::from_synthetic("2 3").cpuset().size(), 6u);
  EXPECT_EQ(Topology::from_synthetic("numa:2(memory=1GB) pu:2").cpuset().size(), 4u);
  // Counts as hwloc reads them: after the next ':' whatever stands before it (topology_fuzz
  // found "l3<bytes>=<bytes>:516", which hwloc takes as 516 L3 caches), in strtoul's bases,
  // after a sign; attached NUMA nodes hold no count.
  EXPECT_THAT([] { Topology::from_synthetic("pack:4 l3=x:516 pu:2"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_THAT([] { Topology::from_synthetic("pack:2 core:0x800 pu:2"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_THAT([] { Topology::from_synthetic("pack:2 core:04000 pu:2"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_THAT([] { Topology::from_synthetic("core:-1 pu:1"); },
              ThrowsMessage<TopologyError>(HasSubstr("more than 4096 PUs")));
  EXPECT_EQ(Topology::from_synthetic("pack:3 l3=x:516 pu:2").cpuset().size(), 3096u);
  EXPECT_EQ(Topology::from_synthetic("numa:2 core:010 pu:1").cpuset().size(), 16u);
  EXPECT_EQ(Topology::from_synthetic("numa:2 core: +4 pu:1").cpuset().size(), 8u);
  EXPECT_EQ(Topology::from_synthetic("pack:2 [numa(memory=1GB)] core:0x3 pu:1").cpuset().size(),
            6u);
}

TEST(TopologyTest, IntelTwoNodeXmlReadsDistancesFromTheFile) {
  const Topology t = topology_fixture("24em64t-2n6c2t-pci.xml");
  EXPECT_EQ(t.source(), TopologySource::kXml);
  EXPECT_THAT(t.origin(), HasSubstr("24em64t-2n6c2t-pci.xml"));
  const DistanceMatrix& d = t.distances();
  EXPECT_EQ(d.origin, "xml");
  ASSERT_EQ(d.size, 2);
  EXPECT_THAT(d.values, ElementsAre(10U, 20U, 20U, 10U));
}

TEST(TopologyTest, IntelTwoNodeXmlLayout) {
  const Topology t = topology_fixture("24em64t-2n6c2t-pci.xml");
  ASSERT_EQ(t.numa_nodes().size(), 2U);
  EXPECT_EQ(t.packages().size(), 2U);
  EXPECT_EQ(t.cores().size(), 12U);
  EXPECT_EQ(t.cpuset(), CpuSet::parse("0-23"));
  // Node 0 holds the even PUs: core k of package 0 is PUs 2k and 2k+12.
  EXPECT_EQ(t.numa_nodes()[0].cpuset, CpuSet::parse("0,2,4,6,8,10,12,14,16,18,20,22"));
  EXPECT_EQ(t.numa_nodes()[1].package, 1);
  EXPECT_EQ(t.numa_nodes()[0].memory_bytes, 18863900ULL * 1024);
  EXPECT_EQ(t.cores()[1].pus, CpuSet({2, 14}));
  EXPECT_EQ(t.cores()[7].pus, CpuSet({3, 15}));
  EXPECT_EQ(t.cores()[7].numa_node, 1);
  EXPECT_EQ(t.cores()[7].l3_group, 1);
  ASSERT_EQ(t.l3_groups().size(), 2U);
  EXPECT_EQ(t.l3_groups()[0].size_bytes, 12U * 1024 * 1024);
  EXPECT_EQ(t.l3_groups()[0].cpuset, t.numa_nodes()[0].cpuset);
  EXPECT_EQ(t.l3_groups()[1].numa_node, 1);
}

TEST(TopologyTest, XmlCannotBindAndSaysSo) {
  const Topology t = topology_fixture("24em64t-2n6c2t-pci.xml");
  EXPECT_FALSE(t.can_bind());
  EXPECT_THAT(t.notes(),
              ElementsAre("binding is not possible on an XML topology: devices run unpinned"));
}

TEST(TopologyTest, AmdEightNodeXmlKeepsHwlocLogicalOrderAndItsMatrix) {
  const Topology t = topology_fixture("16amd64-4distances.xml");
  ASSERT_EQ(t.numa_nodes().size(), 8U);
  // Logical order follows the tree, not the OS numbering.
  EXPECT_THAT(os_indexes(t.numa_nodes()), ElementsAre(1, 0, 2, 5, 4, 3, 6, 7));
  EXPECT_EQ(t.packages().size(), 8U);
  EXPECT_EQ(t.cores().size(), 16U);
  EXPECT_TRUE(t.l3_groups().empty());
  EXPECT_EQ(t.numa_nodes()[3].cpuset, CpuSet({6, 7}));
  EXPECT_EQ(t.numa_nodes()[3].package, 3);
  const DistanceMatrix& d = t.distances();
  EXPECT_EQ(d.origin, "xml");
  ASSERT_EQ(d.size, 8);
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(d.at(i, j), i == j ? 10U : 20U) << i << "," << j;
  }
}

TEST(TopologyTest, CpusetsXmlKeepsMemoryOnlyNodesAndDropsDisallowedPus) {
  const Topology t = topology_fixture("16amd64-8n2c-cpusets.xml");
  EXPECT_EQ(t.cpuset(), CpuSet::parse("0-3,5-6,12-15"));
  EXPECT_EQ(t.cores().size(), 10U);
  ASSERT_EQ(t.numa_nodes().size(), 5U);
  EXPECT_THAT(os_indexes(t.numa_nodes()), ElementsAre(1, 2, 3, 5, 4));
  EXPECT_EQ(t.numa_nodes()[0].cpuset, CpuSet({2, 3}));
  EXPECT_EQ(t.numa_nodes()[1].cpuset, CpuSet({5}));
  EXPECT_TRUE(t.numa_nodes()[3].cpuset.empty());
  EXPECT_TRUE(t.numa_nodes()[4].cpuset.empty());
  EXPECT_EQ(t.numa_nodes()[4].memory_bytes, 8 * kGiB);
  // The nodes hang off Groups above the packages: the package is found by its PUs.
  EXPECT_EQ(t.numa_nodes()[0].package, 1);
  EXPECT_EQ(t.numa_nodes()[2].package, 3);
  EXPECT_EQ(t.numa_nodes()[3].package, -1);
  // PUs 0-1 lost their node (P#0, disallowed) when the file was exported.
  EXPECT_EQ(t.cores()[0].numa_node, -1);
  EXPECT_EQ(t.cores()[0].package, 0);
  EXPECT_EQ(t.cores()[2].numa_node, 0);
  EXPECT_EQ(t.distances().origin, "xml");
  EXPECT_EQ(t.distances().size, 5);
  EXPECT_EQ(t.distances().at(3, 3), 10U);
  EXPECT_EQ(t.distances().at(3, 4), 20U);
}

TEST(TopologyTest, MissingXmlFileThrowsTopologyErrorNamingIt) {
  EXPECT_THAT([] { Topology::from_xml("/nonexistent/machine.xml"); },
              ThrowsMessage<TopologyError>(
                  HasSubstr("topology file '/nonexistent/machine.xml' does not exist")));
}

TEST(TopologyTest, XmlDirectoryThrowsTopologyError) {
  EXPECT_THAT([] { Topology::from_xml(NUMESH_TOPOLOGY_DIR); },
              ThrowsMessage<TopologyError>(HasSubstr("is a directory")));
}

TEST(TopologyTest, UnparsableXmlThrowsTopologyErrorNamingIt) {
  const std::filesystem::path file =
      std::filesystem::path(::testing::TempDir()) / "numesh_not_a_topology.xml";
  {
    std::ofstream out(file);
    out << "this is not hwloc XML\n";
  }
  EXPECT_THAT([&] { Topology::from_xml(file); },
              ThrowsMessage<TopologyError>(HasSubstr(fmt::format("'{}'", file.string()))));
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace numesh::runtime
