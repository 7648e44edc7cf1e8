// Long and concurrent use of one set of devices: ten thousand runs of a compiled graph leave
// the process's resident memory and thread count as they were (measured from /proc), and two
// graphs run at once from two threads on the same devices give correct results every time.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

// Resident bytes of this process (/proc/self/statm's second field, in pages).
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

// Threads of this process (/proc/self/status's "Threads:" line).
int thread_count() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// A compiled all-reduce (sum over every axis) of a [4, n] tensor split over dp, tp, whose
// input holds `seed`-dependent values, and the host sum every output shard must equal.
struct SumGraph {
  ShardedTensor in, out;
  CompiledGraph graph;
  std::vector<float> want;  // every slot's [n] output

  SumGraph(const DeviceMesh& mesh, std::int64_t n, float seed)
      : in(mesh, {mesh.size(), n},
           sharding::PartitionSpec({sharding::AxisRule::tuple({"dp", "tp"}), {}})),
        out(mesh, {mesh.size(), n}, in.spec()),
        graph(build(mesh)) {
    HostTensor host = HostTensor::zeros({mesh.size(), n});
    want.assign(static_cast<std::size_t>(n), 0.0f);
    for (std::int64_t s = 0; s < mesh.size(); ++s) {
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = seed + static_cast<float>(s * 3 + i % 7);
        host.data[static_cast<std::size_t>(s * n + i)] = v;
        want[static_cast<std::size_t>(i)] += v;
      }
    }
    scatter(host, in);
  }
  CompiledGraph build(const DeviceMesh& mesh) {
    GraphBuilder b(mesh.device_set());
    all_reduce(b, in, out, ReduceOp::kSum, {.axes = {"dp", "tp"}, .after = {}, .name = {}});
    return b.compile();
  }
  // Runs once; true when every slot holds the sum.
  bool run_and_check() {
    graph.run();
    const HostTensor got = gather(out);
    const auto n = static_cast<std::size_t>(want.size());
    for (std::size_t s = 0; s < got.data.size() / n; ++s) {
      for (std::size_t i = 0; i < n; ++i) {
        if (got.data[s * n + i] != want[i]) return false;
      }
    }
    return true;
  }
};

TEST(SoakTest, TenThousandRunsLeaveResidentMemoryAndThreadsAsTheyWere) {
  const DeviceMesh mesh = testing::mesh_2x2();
  SumGraph g(mesh, 1024, 0.5f);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(g.run_and_check()) << "warm-up run " << i;
  const std::int64_t rss_before = resident_bytes();
  const int threads_before = thread_count();
  int wrong = 0;
  for (int i = 0; i < 10000; ++i) {
    g.graph.run();
    if (i % 1000 == 999 && !g.run_and_check()) ++wrong;
  }
  const std::int64_t rss_after = resident_bytes();
  const int threads_after = thread_count();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(threads_after, threads_before) << "runs must not start threads";
  // The allocator may keep a few pages more; a leak of even 100 bytes a run would be 1 MB.
  EXPECT_LT(rss_after - rss_before, std::int64_t{1} << 20)
      << "resident memory grew from " << rss_before << " to " << rss_after << " bytes";
}

TEST(SoakTest, TwoGraphsRunAtOnceFromTwoThreadsOnTheSameDevices) {
  const DeviceMesh mesh = testing::mesh_2x2();
  SumGraph a(mesh, 4096, 1.0f), b(mesh, 333, -2.0f);
  int wrong_a = 0, wrong_b = 0;
  std::thread ta([&] {
    for (int i = 0; i < 300; ++i) wrong_a += a.run_and_check() ? 0 : 1;
  });
  std::thread tb([&] {
    for (int i = 0; i < 300; ++i) wrong_b += b.run_and_check() ? 0 : 1;
  });
  ta.join();
  tb.join();
  EXPECT_EQ(wrong_a, 0);
  EXPECT_EQ(wrong_b, 0);
}

}  // namespace
}  // namespace numesh::runtime
