#include "numesh/runtime/device_mesh.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/huge_page_cost.hpp"
#include "numesh/runtime/huge_page_slabs.hpp"
#include "numesh/runtime/slot_values.hpp"
#include "numesh/runtime/transport.hpp"
#include "test_devices.hpp"
#include "thp_eligible.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using Groups = std::vector<std::vector<std::int64_t>>;

TEST(DeviceSetTest, SyntheticDevicesAreUnpinnedWithANote) {
  auto devices = testing::synthetic_devices("package:2 numa:2 core:1 pu:1");
  ASSERT_EQ(devices->size(), 4u);
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const Device& d = devices->device(i);
    EXPECT_EQ(d.index(), static_cast<int>(i));
    EXPECT_EQ(d.pinning(), Pinning::kUnpinned);
    EXPECT_EQ(d.memory_binding(), MemoryBinding::kUnbound);
    EXPECT_THAT(d.binding_note(), HasSubstr("runs unpinned"));
  }
  EXPECT_EQ(devices->total_threads(), 4);
  EXPECT_THAT([&] { devices->device(4); },
              ThrowsMessage<IndexError>(HasSubstr("device index 4 is out of range: 4 devices")));
}

TEST(DeviceSetTest, AllocateGivesZeroedMemoryOwnedByTheDevice) {
  auto devices = testing::synthetic_devices(testing::nodes(2));
  Device& d = devices->device(1);
  DeviceBuffer b = d.allocate(10000);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.size_bytes(), 10000u);
  EXPECT_EQ(b.device(), &d);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u) << "page-aligned";
  for (std::byte x : b.bytes()) ASSERT_EQ(x, std::byte{0});
  EXPECT_EQ(b.binding(), MemoryBinding::kUnbound);
  EXPECT_FALSE(b.query_node().has_value()) << "no placement query on a synthetic topology";
  DeviceBuffer moved = std::move(b);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(moved.size_bytes(), 10000u);
  EXPECT_THAT([&] { d.allocate(0); },
              ThrowsMessage<ValueError>(HasSubstr("cannot allocate 0 bytes")));
}

// Buffers ask for transparent huge pages (decode streams weights in long runs; first touches of
// fresh 4 KiB pages cost a fault each): small ones too, carved from the device's huge-page
// slabs, unless the slabs are off (sanitizer builds), when only buffers of 2 MiB and more ask.
// Where the kernel has THP off ("never") nothing can be asked.
TEST(DeviceSetTest, LargeBuffersAskForHugePages) {
  const std::string mode = testing::thp_setting();
  if (mode != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' here: madvise changes nothing";
  }
  // Unless the process has found new huge pages dear (huge_page_cost.hpp) and asks no more.
  if (!HugePageCost::process().wanted()) {
    GTEST_SKIP() << "this process found new huge pages dear ("
                 << HugePageCost::process().dear_faults() << " dear faults) and asks for no more";
  }
  // A device of its own: the cached testing::synthetic_devices may have been given shared
  // memory (no huge pages) by a mesh across ranks that an earlier test of the process made.
  PlacementOptions options;
  options.max_threads_per_device = 1;
  auto devices = DeviceSet::create(Topology::from_synthetic(testing::nodes(1)), options);
  DeviceBuffer large = devices->device(0).allocate(std::size_t{8} << 20);
  EXPECT_EQ(testing::thp_eligible(large.data()), 1) << "an 8 MiB buffer under '" << mode << "'";
  // (The large buffer's fault may have been the one that gave up.)
  const bool asking = HugePageCost::process().wanted();
  DeviceBuffer small = devices->device(0).allocate(std::size_t{64} << 10);
  EXPECT_EQ(testing::thp_eligible(small.data()), huge_page_slabs_enabled() && asking ? 1 : 0)
      << "a 64 KiB buffer under '" << mode << "'";
}

TEST(DeviceSetTest, AllocationsLargerThanTheNodeAreRefusedBeforeTheyAreMade) {
  // Node 0 of this topology has 19316633600 bytes (19.3 GB); the XML says so, the machine
  // running the test need not have them (nothing that large is allocated).
  PlacementOptions one_thread;
  one_thread.max_threads_per_device = 1;
  auto devices = DeviceSet::create(
      Topology::from_xml(std::string(NUMESH_TOPOLOGY_DIR) + "/24em64t-2n6c2t-pci.xml"), one_thread);
  Device& d = devices->device(0);
  EXPECT_THAT([&] { d.allocate(std::size_t{20} << 30); },
              ThrowsMessage<ValueError>(
                  HasSubstr("cannot allocate 21.5 GB, more than the 19.3 GB of its NUMA node 0 "
                            "leaves (numesh's buffers there already take 0 bytes)")));
  EXPECT_FALSE(d.allocate(4096).empty()) << "smaller sizes still allocate";
}

TEST(DeviceSetTest, LiveBuffersOfTheDevicesOnANodeCountTogether) {
  // The same topology with 1 MB of memory per node: two devices (one thread each) on node 0.
  std::ifstream in(std::string(NUMESH_TOPOLOGY_DIR) + "/24em64t-2n6c2t-pci.xml");
  std::stringstream text;
  text << in.rdbuf();
  const std::string small = std::regex_replace(text.str(), std::regex("local_memory=\"[0-9]+\""),
                                               "local_memory=\"1000000\"");
  const std::filesystem::path xml = std::filesystem::temp_directory_path() /
                                    ("numesh-small-memory-" + std::to_string(::getpid()) + ".xml");
  std::ofstream(xml) << small;
  PlacementOptions cores;
  cores.policy = PlacementPolicy::kCore;
  cores.max_threads_per_device = 1;
  auto devices = DeviceSet::create(Topology::from_xml(xml.string()), cores);
  std::filesystem::remove(xml);
  Device& a = devices->device(0);
  Device& b = devices->device(1);
  ASSERT_EQ(a.spec().numa_node, b.spec().numa_node);
  {
    DeviceBuffer first = a.allocate(600000);
    EXPECT_THAT([&] { b.allocate(600000); },
                ThrowsMessage<ValueError>(
                    HasSubstr("cannot allocate 600000 bytes, more than the 1.0 MB of its NUMA "
                              "node 0 leaves (numesh's buffers there already take 600000 bytes)")));
  }
  EXPECT_FALSE(b.allocate(600000).empty())
      << "the first buffer's bytes came back when it was freed";
}

TEST(DeviceSetTest, TheWorkerLimitServesTheLargestLiveSet) {
  using oneapi::tbb::global_control;
  PlacementOptions one_thread;
  one_thread.max_threads_per_device = 1;
  {
    // A small set first, then a large one: the limit must grow to the large set's need (a
    // control per set would leave the small one's value in force, oneTBB taking the minimum).
    auto small = DeviceSet::create(Topology::from_synthetic("numa:3 core:1 pu:1"), one_thread);
    auto large = DeviceSet::create(Topology::from_synthetic("numa:6 core:1 pu:1"), one_thread);
    EXPECT_GE(global_control::active_value(global_control::max_allowed_parallelism), 7u);
    large.reset();
    EXPECT_GE(global_control::active_value(global_control::max_allowed_parallelism), 4u);
  }
}

TEST(DeviceMeshTest, CreateResolvesMinusOneAndNamesAxes) {
  auto devices = testing::synthetic_devices(testing::nodes(8));
  const DeviceMesh m = DeviceMesh::create(devices, {2, -1}, {"dp", "tp"});
  EXPECT_EQ(m.mesh().sizes(), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.coords(6), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(&m.device(6), &devices->device(6));
  EXPECT_EQ(m.to_string(), "DeviceMesh('dp': 2, 'tp': 4) over 8 devices (numa policy)");
}

TEST(DeviceMeshTest, GroupsFollowEveryAxisSubset) {
  const DeviceMesh m = DeviceMesh::create(testing::synthetic_devices(testing::nodes(8)), {2, 2, 2},
                                          {"dp", "fsdp", "tp"});
  const std::vector<std::string> none, tp{"tp"}, dp{"dp"}, dp_tp{"dp", "tp"},
      all{"dp", "fsdp", "tp"};
  EXPECT_EQ(m.groups(none), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(m.groups(tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups(dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups(dp_tp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.groups(all), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // The order of the axes given does not change the rank order (mesh order).
  const std::vector<std::string> tp_dp{"tp", "dp"};
  EXPECT_EQ(m.groups(tp_dp), m.groups(dp_tp));
}

TEST(DeviceMeshTest, BadMeshesAreRejectedNamingTheValues) {
  auto devices = testing::synthetic_devices(testing::nodes(2));
  EXPECT_THAT(
      [&] {
        DeviceMesh::create(devices, {2, 4}, {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "mesh dims (2,4) do not fit the 2 devices the numa placement made (numa0, numa1)")));
  EXPECT_THAT(
      [&] {
        DeviceMesh::create(devices, {-1, -1}, {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("can only specify one unknown dimension")));
  EXPECT_THAT(
      [&] {
        DeviceMesh::create(devices, {2}, {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh dims (2) and names (dp,tp) differ in length")));
  EXPECT_THAT(
      [&] {
        DeviceMesh::create(devices, {1, 2}, {"tp", "tp"});
      },
      ::testing::Throws<ValueError>());
  const DeviceMesh m = DeviceMesh::create(devices, {2}, {"tp"});
  const std::vector<std::string> bad{"sp"};
  EXPECT_THAT([&] { m.groups(bad); },
              ThrowsMessage<KeyError>(HasSubstr("mesh axis 'sp' is not in the mesh (axes: tp)")));
  EXPECT_THAT(
      [&] { m.device(2); },
      ThrowsMessage<IndexError>(HasSubstr("mesh slot 2 is out of range: the mesh has 2 devices")));
}

TEST(DeviceMeshTest, AMeshOfOneProcessIsAllLocal) {
  auto devices = testing::synthetic_devices(testing::nodes(4));
  const DeviceMesh m = DeviceMesh::create(devices, {2, 2}, {"dp", "tp"});
  EXPECT_EQ(m.this_rank(), 0);
  EXPECT_EQ(m.ranks(), 1);
  EXPECT_EQ(m.local_slots(), (std::vector<std::int64_t>{0, 1, 2, 3}));
  for (std::int64_t slot = 0; slot < 4; ++slot) {
    EXPECT_EQ(m.rank_of(slot), 0);
    EXPECT_TRUE(m.is_local(slot));
  }
  EXPECT_THAT(
      [&] { m.rank_of(4); },
      ThrowsMessage<IndexError>(HasSubstr("mesh slot 4 is out of range: the mesh has 4 devices")));
  // Through the transport of one process: the same mesh.
  const DeviceMesh t =
      DeviceMesh::create(devices, std::make_shared<SingleProcessTransport>(), {2, 2}, {"dp", "tp"});
  EXPECT_EQ(m.transport()->name(), "single process");
  EXPECT_EQ(t.to_string(), m.to_string());
  EXPECT_EQ(t.local_slots(), m.local_slots());
  EXPECT_EQ(&t.device(3), &devices->device(3));
}

// Ranks as threads, each with devices of its own (2, 1 and 3 of them): every rank sees the
// same slots in rank order, its own as local devices and the others by their rank.
TEST(DeviceMeshTest, AMeshOverRanksHoldsEveryRanksDevicesInRankOrder) {
  auto transports = make_thread_transports(3);
  const std::vector<int> counts{2, 1, 3};
  std::vector<std::shared_ptr<DeviceSet>> sets;
  for (int c : counts) sets.push_back(testing::synthetic_devices(testing::nodes(c)));
  std::vector<std::optional<DeviceMesh>> meshes(3);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      meshes[r] = DeviceMesh::create(sets[r], transports[r], {2, -1}, {"dp", "tp"});
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<std::vector<std::int64_t>> local{{0, 1}, {2}, {3, 4, 5}};
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(meshes[r].has_value());
    const DeviceMesh& m = *meshes[r];
    EXPECT_EQ(m.size(), 6);
    EXPECT_EQ(m.mesh().sizes(), (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(m.this_rank(), static_cast<int>(r));
    EXPECT_EQ(m.ranks(), 3);
    EXPECT_EQ(m.transport(), transports[r]) << "the mesh keeps its transport";
    EXPECT_EQ(m.local_slots(), local[r]);
    const std::vector<int> rank_of_slot{0, 0, 1, 2, 2, 2};
    for (std::int64_t slot = 0; slot < 6; ++slot) {
      EXPECT_EQ(m.rank_of(slot), rank_of_slot[static_cast<std::size_t>(slot)]) << slot;
      EXPECT_EQ(m.is_local(slot),
                rank_of_slot[static_cast<std::size_t>(slot)] == static_cast<int>(r));
    }
    for (std::size_t i = 0; i < local[r].size(); ++i) {
      EXPECT_EQ(&m.device(local[r][i]), &sets[r]->device(i)) << "rank " << r;
    }
    // The groups are the logical mesh's, whichever rank asks.
    const std::vector<std::string> tp{"tp"};
    EXPECT_EQ(m.groups(tp), (Groups{{0, 1, 2}, {3, 4, 5}}));
  }
  EXPECT_THAT([&] { meshes[0]->device(2); },
              ThrowsMessage<ValueError>(
                  "mesh slot 2 is a device of rank 1: this process (rank 0) holds slots 0-1"));
  EXPECT_THAT([&] { meshes[2]->device(0); },
              ThrowsMessage<ValueError>(
                  "mesh slot 0 is a device of rank 0: this process (rank 2) holds slots 3-5"));
  EXPECT_EQ(meshes[1]->to_string(),
            "DeviceMesh('dp': 2, 'tp': 3) over 6 devices on 3 ranks (numa policy; this is rank "
            "1, slots 2-2)");
}

TEST(DeviceMeshTest, EverySlotsValueComesFromItsRank) {
  auto transports = make_thread_transports(3);
  const std::vector<int> counts{2, 1, 3};
  std::vector<std::vector<double>> got(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const DeviceMesh mesh =
          DeviceMesh::create(testing::synthetic_devices(testing::nodes(counts[r])), transports[r],
                             {2, 3}, {"dp", "tp"});
      // A rank's own slots hold slot + 0.5; the others hold what a rank must not send: -rank.
      std::vector<double> mine(6, -static_cast<double>(r));
      for (const std::int64_t s : mesh.local_slots())
        mine[static_cast<std::size_t>(s)] = static_cast<double>(s) + 0.5;
      got[r] = values_of_every_slot(mesh, mine);
      try {
        values_of_every_slot(mesh, std::vector<double>(5));
      } catch (const ValueError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], (std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5})) << "rank " << r;
    EXPECT_EQ(errors[r], "values_of_every_slot: 5 values for a mesh of 6 slots") << "rank " << r;
  }
}

TEST(DeviceMeshTest, DimsThatDoNotFitTheRanksNameEveryRanksDevices) {
  auto transports = make_thread_transports(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        DeviceMesh::create(testing::synthetic_devices(testing::nodes(r == 0 ? 2 : 1)),
                           transports[r], {2, 2}, {"dp", "tp"});
      } catch (const ValueError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(errors[0], HasSubstr("mesh dims (2,2) do not fit the 3 devices of 2 ranks (rank 0: "
                                   "2, rank 1: 1; this rank's numa placement made numa0, numa1)"));
  EXPECT_THAT(errors[1], HasSubstr("mesh dims (2,2) do not fit the 3 devices of 2 ranks (rank 0: "
                                   "2, rank 1: 1; this rank's numa placement made numa0)"));
}

}  // namespace
}  // namespace numesh::runtime
