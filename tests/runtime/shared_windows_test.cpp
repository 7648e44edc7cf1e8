// The shared memory between ranks of one host: the arena devices allocate from, its mapping by
// another process's descriptor, the windows a mesh over ranks opens (here ranks as threads of
// one process, whose mappings are second mappings of the same files, as another process's
// would be), their doorbells, and collectives that read another rank's buffers in place or,
// where the bytes are not in shared memory, through the transport.

#include "numesh/runtime/shared_windows.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/shared_arena.hpp"
#include "numesh/runtime/transport.hpp"
#include "scoped_environment.hpp"
#include "test_devices.hpp"
#include "thread_ranks.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

TEST(SharedArenaTest, BlocksComeAndGoInWholePagesFirstFit) {
  const auto arena = SharedArena::create("numesh-test-arena", 8 * kPage);
  EXPECT_EQ(arena->capacity(), 8 * kPage);
  std::byte* a = arena->allocate(1);
  std::byte* b = arena->allocate(kPage + 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a, arena->base());
  EXPECT_EQ(b, arena->base() + kPage) << "first fit, one page for one byte";
  EXPECT_EQ(arena->used_bytes(), 3 * kPage);
  std::memset(b, 7, kPage + 1);
  arena->release(a, 1);
  EXPECT_EQ(arena->allocate(kPage), arena->base()) << "the released page is the first fit";
  EXPECT_EQ(arena->allocate(6 * kPage), nullptr) << "5 pages are left";
  std::byte* c = arena->allocate(5 * kPage);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(arena->allocate(1), nullptr) << "full";
  arena->release(b, kPage + 1);
  arena->release(c, 5 * kPage);
  // b's pages and c's coalesce with each other into 7 free pages.
  std::byte* d = arena->allocate(7 * kPage);
  ASSERT_EQ(d, arena->base() + kPage);
  EXPECT_EQ(static_cast<int>(d[0]), 0) << "a released block's pages come back as zeros";
  EXPECT_EQ(arena->allocate(0), nullptr);
  EXPECT_EQ(arena->allocate(9 * kPage), nullptr);
}

TEST(SharedArenaTest, OffsetsAreKnownOnlyInside) {
  const auto arena = SharedArena::create("numesh-test-arena", 4 * kPage);
  EXPECT_EQ(arena->offset_of(arena->base() + 100, 10), std::optional<std::size_t>(100));
  EXPECT_EQ(arena->offset_of(arena->base() + 4 * kPage - 8, 8),
            std::optional<std::size_t>(4 * kPage - 8));
  EXPECT_EQ(arena->offset_of(arena->base() + 4 * kPage - 8, 9), std::nullopt) << "runs past";
  int outside = 0;
  EXPECT_EQ(arena->offset_of(&outside, sizeof(outside)), std::nullopt);
}

TEST(SharedArenaTest, ZeroCapacityIsRefused) {
  EXPECT_THAT([] { SharedArena::create("empty", 0); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("'empty': a capacity of 0 bytes")));
}

TEST(ArenaMappingTest, ASecondMappingSeesTheSameBytes) {
  const auto arena = SharedArena::create("numesh-test-arena", 2 * kPage);
  std::byte* block = arena->allocate(kPage);
  ASSERT_NE(block, nullptr);
  const ArenaMapping mapping(static_cast<int>(getpid()), arena->fd(), arena->capacity(),
                             arena->identity(), /*writable=*/true);
  ASSERT_NE(mapping.base(), arena->base());
  block[5] = std::byte{42};
  EXPECT_EQ(mapping.base()[5], std::byte{42});
  mapping.base()[6] = std::byte{43};
  EXPECT_EQ(block[6], std::byte{43});
}

TEST(ArenaMappingTest, AMissingDescriptorIsNamed) {
  const int pid = static_cast<int>(getpid());
  EXPECT_THAT([pid] { ArenaMapping(pid, 1 << 20, kPage, FileIdentity{}, false); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  fmt::format("shared memory: cannot open /proc/{}/fd/{}", pid, 1 << 20))));
}

TEST(ArenaMappingTest, AnotherFileUnderTheNumberIsRefusedByName) {
  // What a rank in another PID namespace would open under its peer's pid and descriptor.
  const auto arena = SharedArena::create("numesh-test-arena", 2 * kPage);
  const auto other = SharedArena::create("numesh-test-other", 2 * kPage);
  const int pid = static_cast<int>(getpid());
  EXPECT_THAT([&] { ArenaMapping(pid, other->fd(), arena->capacity(), arena->identity(), false); },
              ::testing::ThrowsMessage<Error>(HasSubstr(fmt::format(
                  "shared memory: /proc/{}/fd/{} is not the arena expected", pid, other->fd()))));
  EXPECT_THAT(
      [&] { ArenaMapping(pid, arena->fd(), 4 * kPage, arena->identity(), false); },
      ::testing::ThrowsMessage<Error>(HasSubstr(fmt::format("of {} bytes, expected", 2 * kPage))))
      << "a file smaller than the mapping would fault past its end";
  const ArenaMapping read_only(pid, arena->fd(), arena->capacity(), arena->identity(), false);
  arena->base()[0] = std::byte{9};
  EXPECT_EQ(read_only.base()[0], std::byte{9});
}

// Devices of a rank's own, not the cached sets that the ranks as threads would share.
std::shared_ptr<DeviceSet> own_devices(int nodes) {
  PlacementOptions options;
  options.max_threads_per_device = 1;
  return DeviceSet::create(Topology::from_synthetic(testing::nodes(nodes)), options);
}

TEST(SharedWindowsTest, RanksOfOneHostMapEachOthersDeviceMemory) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    const auto devices = own_devices(2);
    const DeviceMesh mesh = DeviceMesh::create(devices, transport, {4}, {"x"});
    const auto& windows = mesh.shared_windows();
    ASSERT_NE(windows, nullptr);
    const int me = transport->rank(), peer = 1 - me;
    EXPECT_TRUE(windows->reads_in_place(me, peer));
    EXPECT_TRUE(windows->reads_in_place(peer, me));
    EXPECT_FALSE(windows->reads_in_place(me, me));
    EXPECT_NE(devices->device(1).shared_arena(), nullptr);
    // Buffers of the windows' floor or more come from the shared arena; smaller ones, which no
    // transfer reads in place, from private memory.
    DeviceBuffer buffer = devices->device(1).allocate(windows->in_place_min_bytes());
    const DeviceBuffer small = devices->device(1).allocate(windows->in_place_min_bytes() - 1);
    EXPECT_FALSE(windows->locate(small.data(), 1).has_value()) << "below the floor";
    EXPECT_EQ(devices->device(1).shared_arena()->used_bytes(), windows->in_place_min_bytes());
    const auto where = windows->locate(buffer.data() + 10, 100);
    ASSERT_TRUE(where.has_value());
    EXPECT_EQ(where->device, 1);
    for (int i = 0; i < 100; ++i) buffer.data()[10 + i] = static_cast<std::byte>(me * 100 + i);
    std::vector<SharedLocation> all(2);
    transport->all_gather(std::as_bytes(std::span(&*where, 1)),
                          std::as_writable_bytes(std::span(all)));
    const std::byte* theirs = windows->at(peer, all[static_cast<std::size_t>(peer)], 100);
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(theirs[i], static_cast<std::byte>(peer * 100 + i)) << "byte " << i;
    }
    EXPECT_THAT(
        [&] {
          (void)windows->at(peer, {1, all[0].offset}, SIZE_MAX / 2);
        },
        ::testing::ThrowsMessage<ValueError>(
            HasSubstr(fmt::format("bytes at offset {} run past the", all[0].offset))));
    EXPECT_THAT(
        [&] {
          (void)windows->at(peer, {7, 0}, 1);
        },
        ::testing::ThrowsMessage<ValueError>(
            HasSubstr(fmt::format("rank {} device 7 is not mapped on rank {}", peer, me))));
    int host = 0;
    EXPECT_FALSE(windows->locate(&host, sizeof(host)).has_value());
    transport->barrier();  // the peer has read this rank's buffer
  });
}

TEST(SharedWindowsTest, TheKthAwaitOfADoorbellMatchesItsKthRing) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    const DeviceMesh mesh = DeviceMesh::create(own_devices(1), transport, {2}, {"x"});
    SharedWindows& windows = *mesh.shared_windows();
    const int me = transport->rank(), peer = 1 - me;
    if (me == 0) {
      for (int k = 0; k < 3; ++k) windows.ring(Doorbell::kPublished, peer, 5);
      windows.ring(Doorbell::kConsumed, peer, 5);
      transport->barrier();
      transport->barrier();  // the peer awaited 3 of the published rings
      windows.ring(Doorbell::kPublished, peer, 5);
      windows.ring(Doorbell::kPublished, peer, 6);
      transport->barrier();
      return;
    }
    transport->barrier();  // rank 0 rang 3 published and 1 consumed under tag 5
    for (int k = 0; k < 3; ++k) {
      std::promise<std::exception_ptr> rung;
      windows.await(Doorbell::kPublished, peer, 5,
                    [&](std::exception_ptr e) { rung.set_value(e); });
      EXPECT_EQ(rung.get_future().get(), nullptr) << "await " << k;
    }
    // The 4th await of tag 5 waits for the 4th ring; consumed is its own doorbell.
    std::promise<std::exception_ptr> fourth;
    auto fourth_done = fourth.get_future();
    windows.await(Doorbell::kPublished, peer, 5,
                  [&](std::exception_ptr e) { fourth.set_value(e); });
    EXPECT_EQ(fourth_done.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
    std::promise<std::exception_ptr> consumed;
    windows.await(Doorbell::kConsumed, peer, 5,
                  [&](std::exception_ptr e) { consumed.set_value(e); });
    EXPECT_EQ(consumed.get_future().get(), nullptr);
    std::promise<std::exception_ptr> both;
    windows.await_all(Doorbell::kPublished, {{peer, 6}},
                      [&](std::exception_ptr e) { both.set_value(e); });
    transport->barrier();  // let rank 0 ring again
    EXPECT_EQ(fourth_done.get(), nullptr);
    EXPECT_EQ(both.get_future().get(), nullptr);
    transport->barrier();
  });
}

// A ring from a stopping run fails the await it matches, naming the rank, and only that one:
// whether the ring came before the await (read on the caller's thread) or after it (the
// poller's).
TEST(SharedWindowsTest, ARingOfAStoppedRunFailsTheAwaitItMatches) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    const DeviceMesh mesh = DeviceMesh::create(own_devices(1), transport, {2}, {"x"});
    SharedWindows& windows = *mesh.shared_windows();
    const int me = transport->rank(), peer = 1 - me;
    const std::vector<bool> stopped{false, true, false, true, false};
    if (me == 0) {
      for (std::size_t k = 0; k < 3; ++k) windows.ring(Doorbell::kPublished, peer, 4, stopped[k]);
      transport->barrier();  // rings before the awaits
      transport->barrier();  // the peer awaits the next two before they ring
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (std::size_t k = 3; k < 5; ++k) windows.ring(Doorbell::kPublished, peer, 4, stopped[k]);
      transport->barrier();
      return;
    }
    transport->barrier();
    std::vector<std::promise<std::exception_ptr>> rung(stopped.size());
    for (std::size_t k = 0; k < stopped.size(); ++k) {
      if (k == 3) transport->barrier();
      windows.await(Doorbell::kPublished, peer, 4,
                    [&rung, k](std::exception_ptr e) { rung[k].set_value(e); });
    }
    for (std::size_t k = 0; k < stopped.size(); ++k) {
      const std::exception_ptr error = rung[k].get_future().get();
      if (!stopped[k]) {
        EXPECT_EQ(error, nullptr) << "await " << k;
        continue;
      }
      EXPECT_THAT(
          [&] { std::rethrow_exception(error); },
          ::testing::ThrowsMessage<PeerStoppedError>(
              "wait for rank 0's published doorbell, tag 4: rank 0's run stopped before "
              "its bytes were ready (a node failed there or on a rank it waited for, or its run "
              "was cancelled)"))
          << "await " << k;
    }
    transport->barrier();
  });
}

TEST(SharedWindowsTest, AnAwaitWithoutRingEndsAfterThePatienceNamingTheRank) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    const DeviceMesh mesh = DeviceMesh::create(own_devices(1), transport, {2}, {"x"});
    transport->set_patience(std::chrono::milliseconds(100));
    const int me = transport->rank(), peer = 1 - me;
    std::promise<std::exception_ptr> ended;
    mesh.shared_windows()->await(Doorbell::kConsumed, peer, 9,
                                 [&](std::exception_ptr e) { ended.set_value(e); });
    const std::exception_ptr error = ended.get_future().get();
    ASSERT_NE(error, nullptr);
    EXPECT_THAT([&] { std::rethrow_exception(error); },
                ::testing::ThrowsMessage<TimeoutError>(HasSubstr(fmt::format(
                    "wait for rank {}'s consumed doorbell, tag 9: nothing from rank {} for 0.1 s; "
                    "it has most likely hung",
                    peer, peer))));
    transport->barrier();
  });
}

// The names of the graph's nodes on this rank that contain `part`.
int nodes_named(const CompiledGraph& graph, const std::string& part) {
  int n = 0;
  for (NodeId id = 0; id < graph.size(); ++id)
    n += graph.node(id).name.find(part) != std::string::npos;
  return n;
}

// An all-reduce over two ranks of two devices each, its inputs in device buffers (in shared
// memory) or, with `host_inputs`, in host memory: in place, or through the transport.
// With `fault`, the first run fails on rank 1 in the collective's node that its first published
// doorbell waits for: rank 1 throws the fault, rank 0's run stops with CancelledError naming
// rank 1 (its wait for the published doorbell), and the runs after it are exact.
void all_reduce_two_ranks(const std::shared_ptr<Transport>& transport, bool host_inputs,
                          bool expect_in_place, bool fault = false) {
  const auto devices = own_devices(2);
  const DeviceMesh mesh = DeviceMesh::create(devices, transport, {4}, {"x"});
  const std::size_t count = 20000;  // 80 KB: reduce-scatter, then all-gather
  std::vector<DeviceBuffer> device_in, device_out;
  std::vector<std::vector<float>> host_in(4);
  std::vector<BufferView> in(4, BufferView{nullptr, count, DType::kF32});
  std::vector<BufferView> out = in;
  for (const std::int64_t slot : mesh.local_slots()) {
    Device& device = mesh.device(slot);
    const auto s = static_cast<std::size_t>(slot);
    device_out.push_back(device.allocate(count * sizeof(float)));
    out[s].data = device_out.back().data();
    float* values = nullptr;
    if (host_inputs) {
      host_in[s].resize(count);
      values = host_in[s].data();
    } else {
      device_in.push_back(device.allocate(count * sizeof(float)));
      values = reinterpret_cast<float*>(device_in.back().data());
    }
    for (std::size_t i = 0; i < count; ++i)
      values[i] = static_cast<float>(slot + 1) * 0.5f + static_cast<float>(i);
    in[s].data = values;
  }
  GraphBuilder builder(mesh.device_set());
  all_reduce(builder, mesh, in, out, count, ReduceOp::kSum, {{"x"}, {}, "sum"});
  CompiledGraph graph = builder.compile();
  if (fault && transport->rank() == 1) {
    NodeId victim = 0;
    for (NodeId id = 0; id < graph.size() && victim == 0; ++id) {
      if (graph.node(id).name.find(".publish[") == std::string::npos) continue;
      for (const NodeId dep : graph.node(id).deps) {
        if (graph.node(dep).kind == NodeKind::kCollective) victim = dep;
      }
    }
    ASSERT_NE(victim, 0u) << "no published doorbell waits for a collective's node";
    graph.inject_fault(victim);
    EXPECT_THROW(graph.run(), InjectedFault);
  } else if (fault) {
    // Run once and match after: EXPECT_THAT would run a failing run again to explain it.
    std::string error = "(no error)";
    try {
      graph.run();
    } catch (const PeerStoppedError& e) {
      error = e.what();
    }
    EXPECT_THAT(error, HasSubstr("wait for rank 1's published doorbell, tag "));
    EXPECT_THAT(graph.failed_node(), HasSubstr(".published["));
  }
  for (int run = 0; run < 3; ++run) {
    graph.run();
    for (const std::int64_t slot : mesh.local_slots()) {
      const auto* got = static_cast<const float*>(out[static_cast<std::size_t>(slot)].data);
      for (std::size_t i = 0; i < count; i += 499) {
        // 0.5 + 1 + 1.5 + 2 from the four slots, exact in f32.
        EXPECT_EQ(got[i], 5.0f + 4.0f * static_cast<float>(i)) << "slot " << slot << ", i " << i;
      }
    }
  }
  if (expect_in_place) {
    EXPECT_GT(nodes_named(graph, ".publish["), 0);
    EXPECT_GT(nodes_named(graph, ".free["), 0);
    if (host_inputs) {
      EXPECT_GT(nodes_named(graph, ".send["), 0) << "the host inputs cross by the transport";
    } else {
      EXPECT_EQ(nodes_named(graph, ".send["), 0);
    }
  } else {
    EXPECT_EQ(nodes_named(graph, ".publish["), 0);
    EXPECT_GT(nodes_named(graph, ".send["), 0);
  }
}

// all_reduce_two_ranks moves pieces of 20000 bytes (80 KB over four slots), below the default
// floor of transfers read in place (1 MiB): these tests lower it.
TEST(SharedWindowsTest, AnAllReduceReadsTheOtherRanksBuffersInPlace) {
  const testing::ScopedEnvironment every("NUMESH_IN_PLACE_MIN_BYTES", "0");
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/true);
  });
}

// A rank whose run fails before it publishes what another rank reads in place stops that
// rank's run too, naming it, instead of letting it read what was never computed.
TEST(SharedWindowsTest, AFailedRunStopsTheRankThatReadsItInPlace) {
  const testing::ScopedEnvironment every("NUMESH_IN_PLACE_MIN_BYTES", "0");
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/true,
                         /*fault=*/true);
  });
}

TEST(SharedWindowsTest, BytesOutsideSharedMemoryCrossThroughTheTransport) {
  const testing::ScopedEnvironment every("NUMESH_IN_PLACE_MIN_BYTES", "0");
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    all_reduce_two_ranks(transport, /*host_inputs=*/true, /*expect_in_place=*/true);
  });
}

// Transfers below the floor cross by the transport between ranks that read each other in
// place; at the floor they are read in place.
TEST(SharedWindowsTest, TransfersBelowTheFloorCrossThroughTheTransport) {
  {
    testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
      const DeviceMesh mesh = DeviceMesh::create(own_devices(1), transport, {2}, {"x"});
      ASSERT_NE(mesh.shared_windows(), nullptr);
      EXPECT_EQ(mesh.shared_windows()->in_place_min_bytes(), kDefaultInPlaceMinBytes);
      all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/false);
    });
  }
  {
    const testing::ScopedEnvironment above("NUMESH_IN_PLACE_MIN_BYTES", "20001");
    testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
      all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/false);
    });
  }
  const testing::ScopedEnvironment at("NUMESH_IN_PLACE_MIN_BYTES", "20000");
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    const DeviceMesh mesh = DeviceMesh::create(own_devices(1), transport, {2}, {"x"});
    ASSERT_NE(mesh.shared_windows(), nullptr);
    EXPECT_EQ(mesh.shared_windows()->in_place_min_bytes(), 20000u);
    all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/true);
  });
}

// NUMESH_IN_PLACE_MIN_BYTES: a whole number of bytes, the default when unset or empty; anything
// else is refused by name.
TEST(SharedWindowsTest, TheFloorComesFromTheEnvironmentAndBadValuesAreRefused) {
  unsetenv("NUMESH_IN_PLACE_MIN_BYTES");
  EXPECT_EQ(in_place_min_bytes_from_environment(), kDefaultInPlaceMinBytes);
  {
    const testing::ScopedEnvironment empty("NUMESH_IN_PLACE_MIN_BYTES", "");
    EXPECT_EQ(in_place_min_bytes_from_environment(), kDefaultInPlaceMinBytes);
  }
  {
    const testing::ScopedEnvironment zero("NUMESH_IN_PLACE_MIN_BYTES", "0");
    EXPECT_EQ(in_place_min_bytes_from_environment(), 0u);
  }
  for (const char* bad : {"1M", "-1", "abc", "1.5", "99999999999999999999999"}) {
    const testing::ScopedEnvironment value("NUMESH_IN_PLACE_MIN_BYTES", bad);
    EXPECT_THAT([] { (void)in_place_min_bytes_from_environment(); },
                ::testing::ThrowsMessage<ValueError>(HasSubstr(fmt::format(
                    "NUMESH_IN_PLACE_MIN_BYTES='{}' is not a whole number of bytes", bad))))
        << bad;
  }
}

TEST(SharedWindowsTest, NumeshSharedMemoryOffKeepsEveryTransferOnTheTransport) {
  ASSERT_EQ(setenv("NUMESH_SHARED_MEMORY", "off", 1), 0);
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    EXPECT_EQ(DeviceMesh::create(own_devices(1), transport, {2}, {"x"}).shared_windows(), nullptr);
    all_reduce_two_ranks(transport, /*host_inputs=*/false, /*expect_in_place=*/false);
  });
  unsetenv("NUMESH_SHARED_MEMORY");
}

}  // namespace
}  // namespace numesh::runtime
