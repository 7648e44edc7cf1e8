#include "numesh/diagnostics/memory_benchmark.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../runtime/test_devices.hpp"
#include "numesh/core/error.hpp"

// Structure and sanity only: the figures come from a shared 2-core machine (and from unpinned
// synthetic devices here), so no test asserts a rate or a latency beyond "positive and finite".

namespace numesh::diagnostics {

using namespace numesh::runtime;
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Small and quick: a Debug build runs these kernels unoptimized.
MemoryBenchmarkOptions tiny() {
  MemoryBenchmarkOptions o;
  o.bytes = kMiB;
  o.warmup = 1;
  o.repeats = 3;
  o.latency_bytes = 256 << 10;
  o.latency_loads = 4096;
  return o;
}

bool positive_finite(double v) { return std::isfinite(v) && v > 0.0; }

// One device with two threads (no cap): the thread sweep needs more than one.
std::shared_ptr<DeviceSet> two_thread_device() {
  static const std::shared_ptr<DeviceSet> set =
      DeviceSet::create(Topology::from_synthetic("numa:1 core:2 pu:1"));
  return set;
}

TEST(MemoryBenchmarkTest, KernelNamesRoundTripAndCountStreamArrays) {
  for (MemoryKernel k : {MemoryKernel::kRead, MemoryKernel::kCopy, MemoryKernel::kTriad}) {
    EXPECT_EQ(parse_memory_kernel(to_string(k)), k);
  }
  EXPECT_EQ(stream_arrays(MemoryKernel::kRead), 1);
  EXPECT_EQ(stream_arrays(MemoryKernel::kCopy), 2);
  EXPECT_EQ(stream_arrays(MemoryKernel::kTriad), 3);
  EXPECT_THAT(
      [] { parse_memory_kernel("scale"); },
      ThrowsMessage<ValueError>(AllOf(HasSubstr("'scale'"), HasSubstr("read, copy or triad"))));
}

TEST(MemoryBenchmarkTest, MeasuresEveryDeviceKernelAndThreadCount) {
  auto devices = testing::synthetic_devices(testing::nodes(2));
  const MemoryBenchmarkOptions o = tiny();
  const DeviceBandwidthResult r = measure_device_bandwidth(*devices, o);

  EXPECT_EQ(r.array_bytes, kMiB);
  ASSERT_EQ(r.devices.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    const DeviceMemoryInfo& info = r.devices[static_cast<std::size_t>(d)];
    EXPECT_EQ(info.device, d);
    EXPECT_EQ(info.label, "numa" + std::to_string(d));
    EXPECT_EQ(info.numa_node, d);
    EXPECT_EQ(info.threads, 1);
    // Synthetic topologies cannot bind: the result says so rather than claiming a node.
    EXPECT_EQ(info.pinning, Pinning::kUnpinned);
    EXPECT_EQ(info.binding, MemoryBinding::kUnbound);
    EXPECT_FALSE(info.pages_on_node.has_value());
  }
  // By device, then kernel, then threads ({0} resolves to the device's one thread).
  ASSERT_EQ(r.measurements.size(), 6u);
  const MemoryKernel order[] = {MemoryKernel::kRead, MemoryKernel::kCopy, MemoryKernel::kTriad};
  for (std::size_t i = 0; i < r.measurements.size(); ++i) {
    const BandwidthMeasurement& m = r.measurements[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(m.device, static_cast<int>(i / 3));
    EXPECT_EQ(m.kernel, order[i % 3]);
    EXPECT_EQ(m.threads, 1);
    EXPECT_EQ(m.observed_threads, 1);
    EXPECT_EQ(m.array_bytes, kMiB);
    EXPECT_EQ(m.counted_bytes, static_cast<std::size_t>(stream_arrays(m.kernel)) * kMiB);
    EXPECT_GE(m.samples, o.repeats);
    EXPECT_TRUE(positive_finite(m.median_seconds));
    EXPECT_LE(m.min_seconds, m.median_seconds);
    EXPECT_LE(m.median_seconds, m.max_seconds);
    EXPECT_TRUE(positive_finite(m.gbps));
    EXPECT_GE(m.best_gbps, m.gbps);
    EXPECT_DOUBLE_EQ(m.gbps, static_cast<double>(m.counted_bytes) / m.median_seconds / 1e9);
  }
  // STREAM's count: copy moves 2x the array, triad 3x, read 1x.
  const BandwidthMeasurement* copy = r.find(1, MemoryKernel::kCopy, 1);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->counted_bytes, 2 * kMiB);
  EXPECT_EQ(r.find(1, MemoryKernel::kTriad, 1)->counted_bytes, 3 * kMiB);
  EXPECT_EQ(r.find(0, MemoryKernel::kRead, 1)->counted_bytes, kMiB);
  EXPECT_EQ(r.find(0, MemoryKernel::kRead, 2), nullptr);
  EXPECT_EQ(r.find(2, MemoryKernel::kRead, 1), nullptr);
}

TEST(MemoryBenchmarkTest, SweepsThreadCountsInOrderAndMeasuresEachResolvedCountOnce) {
  auto devices = two_thread_device();
  ASSERT_EQ(devices->device(0).spec().threads, 2);
  MemoryBenchmarkOptions o = tiny();
  o.kernels = {MemoryKernel::kTriad, MemoryKernel::kRead};
  o.threads = {1, 0, 2};  // 0 is the device's 2 threads: measured once
  const DeviceBandwidthResult r = measure_device_bandwidth(*devices, o);
  ASSERT_EQ(r.measurements.size(), 4u);
  const std::vector<std::pair<MemoryKernel, int>> expected = {{MemoryKernel::kTriad, 1},
                                                              {MemoryKernel::kTriad, 2},
                                                              {MemoryKernel::kRead, 1},
                                                              {MemoryKernel::kRead, 2}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const BandwidthMeasurement& m = r.measurements[i];
    EXPECT_EQ(m.kernel, expected[i].first) << i;
    EXPECT_EQ(m.threads, expected[i].second) << i;
    // Threads can be fewer on a busy machine (chunks then run one after another), never more.
    EXPECT_GE(m.observed_threads, 1) << i;
    EXPECT_LE(m.observed_threads, m.threads) << i;
    EXPECT_TRUE(positive_finite(m.gbps)) << i;
  }
}

TEST(MemoryBenchmarkTest, OneDeviceOfASet) {
  auto devices = testing::synthetic_devices(testing::nodes(2));
  MemoryBenchmarkOptions o = tiny();
  o.kernels = {MemoryKernel::kCopy};
  const DeviceBandwidthResult r = measure_device_bandwidth(*devices, 1, o);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].device, 1);
  ASSERT_EQ(r.measurements.size(), 1u);
  EXPECT_EQ(r.measurements[0].device, 1);
  EXPECT_EQ(r.measurements[0].counted_bytes, 2 * kMiB);
  EXPECT_THAT([&] { measure_device_bandwidth(*devices, 2, o); },
              ThrowsMessage<IndexError>(HasSubstr("device index 2")));
}

TEST(MemoryBenchmarkTest, MinSecondsAddsPassesBeyondRepeats) {
  auto devices = testing::synthetic_devices(testing::nodes(1));
  MemoryBenchmarkOptions o = tiny();
  o.bytes = 64 << 10;
  o.kernels = {MemoryKernel::kRead};
  o.repeats = 1;
  o.min_seconds = 0.02;
  const DeviceBandwidthResult r = measure_device_bandwidth(*devices, o);
  ASSERT_EQ(r.measurements.size(), 1u);
  const BandwidthMeasurement& m = r.measurements[0];
  // Timing goes on until the passes add up to min_seconds: one pass is enough only if it alone
  // took that long (a 64 KiB pass takes microseconds, so there are many).
  EXPECT_TRUE(m.samples > 1 || m.median_seconds >= o.min_seconds) << m.samples;
}

TEST(MemoryBenchmarkTest, ProgressNamesEachMeasurement) {
  auto devices = testing::synthetic_devices(testing::nodes(1));
  MemoryBenchmarkOptions o = tiny();
  o.kernels = {MemoryKernel::kRead, MemoryKernel::kTriad};
  std::vector<std::string> lines;
  o.progress = [&](const std::string& line) { lines.push_back(line); };
  (void)measure_device_bandwidth(*devices, o);
  EXPECT_THAT(lines, ::testing::ElementsAre("device 0 (numa0) read 1 thread",
                                            "device 0 (numa0) triad 1 thread"));
}

TEST(MemoryBenchmarkTest, BadOptionsAreValueErrorsNamingTheValue) {
  auto devices = testing::synthetic_devices(testing::nodes(2));
  auto expect_value_error = [&](const MemoryBenchmarkOptions& o, const std::string& text) {
    EXPECT_THAT([&] { measure_device_bandwidth(*devices, o); },
                ThrowsMessage<ValueError>(HasSubstr(text)))
        << text;
  };
  MemoryBenchmarkOptions o = tiny();
  o.bytes = 0;
  expect_value_error(o, "bytes = 0 (0 B) must be a multiple of 64 bytes from 4.0 KiB to 1.0 TiB");
  o.bytes = 4100;
  expect_value_error(o, "bytes = 4100");
  o.bytes = 1024;
  expect_value_error(o, "bytes = 1024");
  o.bytes = std::size_t{2} << 40;
  expect_value_error(o, "bytes = 2199023255552 (2.0 TiB)");

  o = tiny();
  o.kernels = {};
  expect_value_error(o, "kernels is empty");
  o.kernels = {MemoryKernel::kCopy, MemoryKernel::kRead, MemoryKernel::kCopy};
  expect_value_error(o, "kernel 'copy' is listed twice");

  o = tiny();
  o.threads = {};
  expect_value_error(o, "threads is empty");
  o.threads = {-1};
  expect_value_error(o, "thread count -1 is negative");
  o.threads = {1, 1};
  expect_value_error(o, "thread count 1 is listed twice");
  o.threads = {2};
  expect_value_error(o, "thread count 2 is above the 1 thread of device 0 (numa0)");

  o = tiny();
  o.repeats = 0;
  expect_value_error(o, "repeats = 0 must be in [1, 100000]");
  o = tiny();
  o.warmup = -1;
  expect_value_error(o, "warmup = -1 must be in [0, 1000]");
  o = tiny();
  o.min_seconds = std::numeric_limits<double>::quiet_NaN();
  expect_value_error(o, "min_seconds = nan");
  o.min_seconds = -1.0;
  expect_value_error(o, "min_seconds = -1");

  // The matrix checks the latency options too (and not the bandwidth-only ones).
  o = tiny();
  o.threads = {};
  o.latency_bytes = 100;
  EXPECT_THAT([&] { measure_node_matrix(*devices, o); },
              ThrowsMessage<ValueError>(HasSubstr("latency_bytes = 100 (100 B)")));
  o.latency_bytes = 1 << 20;
  o.latency_loads = 0;
  EXPECT_THAT([&] { measure_node_matrix(*devices, o); },
              ThrowsMessage<ValueError>(HasSubstr("latency_loads = 0")));
}

TEST(MemoryBenchmarkTest, SizesBeyondTheNodesMemoryAreRefusedBeforeAllocating) {
  // hwloc's synthetic node of 16 MB (16,000,000 bytes).
  auto devices = testing::synthetic_devices("numa:1(memory=16MB) core:1 pu:1");
  ASSERT_EQ(devices->topology().numa_nodes()[0].memory_bytes, 16000000u);
  MemoryBenchmarkOptions o = tiny();
  o.bytes = 8 * kMiB;  // triad needs 3 arrays: 24 MiB
  EXPECT_THAT([&] { measure_device_bandwidth(*devices, o); },
              ThrowsMessage<ValueError>(
                  AllOf(HasSubstr("device 0 (numa0) needs 24.0 MiB (25165824 bytes: 3 arrays "
                                  "of 8.0 MiB for triad) on NUMA node 0"),
                        HasSubstr("which has 15.3 MiB (16000000 bytes"))));
  // Read alone needs one array, which fits.
  o.kernels = {MemoryKernel::kRead};
  o.repeats = 1;
  o.warmup = 0;
  EXPECT_EQ(measure_device_bandwidth(*devices, o).measurements.size(), 1u);
  // The matrix checks the read buffer and the latency list against every node.
  o.bytes = kMiB;
  o.latency_bytes = 32 * kMiB;
  EXPECT_THAT(
      [&] { measure_node_matrix(*devices, o); },
      ThrowsMessage<ValueError>(AllOf(
          HasSubstr(
              "the latency list (latency_bytes) needs 32.0 MiB (33554432 bytes) on NUMA node 0"),
          HasSubstr("on NUMA node 0, which has 15.3 MiB"))));
}

void expect_matrix_shape(const NodeMatrixResult& m, std::size_t rows, std::size_t cols) {
  ASSERT_EQ(m.rows(), rows);
  ASSERT_EQ(m.cols(), cols);
  ASSERT_EQ(m.read_gbps.size(), rows * cols);
  ASSERT_EQ(m.latency_ns.size(), rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    EXPECT_EQ(m.devices[i].device, static_cast<int>(i));
    for (std::size_t j = 0; j < cols; ++j) {
      ASSERT_TRUE(m.read_gbps_at(i, j).has_value()) << i << "," << j;
      ASSERT_TRUE(m.latency_ns_at(i, j).has_value()) << i << "," << j;
      EXPECT_TRUE(positive_finite(*m.read_gbps_at(i, j))) << i << "," << j;
      EXPECT_TRUE(positive_finite(*m.latency_ns_at(i, j))) << i << "," << j;
    }
  }
  for (std::size_t j = 0; j < cols; ++j) {
    EXPECT_EQ(m.nodes[j].node, static_cast<int>(j));
    EXPECT_TRUE(m.nodes[j].measured);
  }
}

TEST(MemoryBenchmarkTest, NodeMatrixIsDevicesByNodes) {
  const MemoryBenchmarkOptions o = tiny();
  {
    const NodeMatrixResult m =
        measure_node_matrix(*testing::synthetic_devices(testing::nodes(1)), o);
    expect_matrix_shape(m, 1, 1);
  }
  const NodeMatrixResult m = measure_node_matrix(*testing::synthetic_devices(testing::nodes(2)), o);
  expect_matrix_shape(m, 2, 2);
  EXPECT_EQ(m.bytes, kMiB);
  EXPECT_EQ(m.latency_bytes, std::size_t{256} << 10);
  EXPECT_EQ(m.latency_loads, 4096u);
  for (std::size_t j = 0; j < 2; ++j) {
    // Each node's memory comes from the allocator of the device on it; nothing can be bound on
    // a synthetic topology, and the column says so.
    EXPECT_EQ(m.nodes[j].allocated_by_device, static_cast<int>(j));
    EXPECT_EQ(m.nodes[j].binding, MemoryBinding::kUnbound);
    EXPECT_FALSE(m.nodes[j].pages_on_node.has_value());
    EXPECT_THAT(m.nodes[j].note, HasSubstr("not necessarily on NUMA node " + std::to_string(j)));
  }
  EXPECT_THAT([&] { (void)m.read_gbps_at(2, 0); },
              ThrowsMessage<IndexError>(HasSubstr("(2, 0) is out of range: 2 devices x 2 nodes")));
  EXPECT_THAT([&] { (void)m.latency_ns_at(0, 2); }, ThrowsMessage<IndexError>(HasSubstr("(0, 2)")));
}

TEST(MemoryBenchmarkTest, NodeMatrixHasAColumnForMemoryOnlyNodes) {
  // 3 devices (nodes 0-2) and 5 nodes, 3 and 4 without PUs.
  PlacementOptions placement;
  placement.max_threads_per_device = 1;
  auto devices = DeviceSet::create(
      Topology::from_xml(std::string(NUMESH_TOPOLOGY_DIR) + "/16amd64-8n2c-cpusets.xml"),
      placement);
  ASSERT_EQ(devices->size(), 3u);
  MemoryBenchmarkOptions o = tiny();
  o.bytes = 64 << 10;
  o.latency_bytes = 64 << 10;
  const NodeMatrixResult m = measure_node_matrix(*devices, o);
  expect_matrix_shape(m, 3, 5);
  EXPECT_EQ(m.nodes[0].allocated_by_device, 0);
  EXPECT_EQ(m.nodes[3].allocated_by_device, -1);  // memory only: no device's allocator
  EXPECT_EQ(m.nodes[4].allocated_by_device, -1);
  EXPECT_EQ(m.nodes[3].os_index, 5);
  EXPECT_THAT(m.nodes[3].note, HasSubstr("binding is not possible on this xml topology"));
}

TEST(MemoryBenchmarkTest, JsonHoldsEveryFieldAndNullForWhatWasNotMeasured) {
  auto devices = testing::synthetic_devices(testing::nodes(1));
  MemoryBenchmarkOptions o = tiny();
  o.kernels = {MemoryKernel::kCopy};
  const nlohmann::json j = measure_device_bandwidth(*devices, o).to_json();
  EXPECT_EQ(j.at("array_bytes"), kMiB);
  ASSERT_EQ(j.at("devices").size(), 1u);
  EXPECT_EQ(j.at("devices")[0].at("label"), "numa0");
  EXPECT_EQ(j.at("devices")[0].at("memory_binding"), "unbound");
  EXPECT_TRUE(j.at("devices")[0].at("pages_on_node").is_null());
  ASSERT_EQ(j.at("measurements").size(), 1u);
  const nlohmann::json& m = j.at("measurements")[0];
  EXPECT_EQ(m.at("kernel"), "copy");
  EXPECT_EQ(m.at("counted_bytes"), 2 * kMiB);
  EXPECT_GT(m.at("gbps").get<double>(), 0.0);
  for (const char* key : {"device", "threads", "observed_threads", "samples", "median_seconds",
                          "min_seconds", "max_seconds", "best_gbps"}) {
    EXPECT_TRUE(m.contains(key)) << key;
  }
  EXPECT_THAT(j.at("units").at("counted_bytes").get<std::string>(), HasSubstr("copy 2x"));

  // A matrix with a column that could not be placed: nulls, not numbers.
  NodeMatrixResult r;
  r.devices.push_back(DeviceMemoryInfo{});
  r.nodes.resize(2);
  r.nodes[1].note = "not measured";
  r.read_gbps = {12.5, std::nullopt};
  r.latency_ns = {90.0, std::nullopt};
  const nlohmann::json mj = r.to_json();
  EXPECT_EQ(mj.at("read_gbps"), nlohmann::json::parse("[[12.5, null]]"));
  EXPECT_EQ(mj.at("latency_ns"), nlohmann::json::parse("[[90.0, null]]"));
  EXPECT_EQ(mj.at("nodes")[1].at("measured"), false);
  EXPECT_EQ(mj.at("nodes")[1].at("note"), "not measured");
}

}  // namespace
}  // namespace numesh::diagnostics
