// Two really pinned devices on any machine with two CPUs: main() sets HWLOC_THISSYSTEM=1 and
// HWLOC_SYNTHETIC='numa:2 core:1 pu:1' before hwloc or oneTBB start. HWLOC_THISSYSTEM=1 makes
// hwloc take the synthetic topology for this machine, and oneTBB's tbbbind follows it, so they
// see two NUMA nodes whose arenas are pinned to CPU 0 and CPU 1 (docs/runtime.md, section 10).
// Binding memory to the fake node 1 fails, which exercises the first-touch fallback. Labelled
// `numa`: it loads tbbbind, which aborts under ASan.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../common/matches_reference.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/transformer.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;

constexpr const char* kEmulation = "numa:2 core:1 pu:1";

bool emulated() {
  const char* s = std::getenv("HWLOC_SYNTHETIC");
  const char* t = std::getenv("HWLOC_THISSYSTEM");
  return s != nullptr && std::string(s) == kEmulation && t != nullptr && std::string(t) == "1";
}

std::shared_ptr<DeviceSet> devices() {
  static auto set = DeviceSet::create(Topology::discover());
  return set;
}

class EmulatedDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!emulated()) GTEST_SKIP() << "HWLOC_SYNTHETIC was set to another topology by the caller";
    if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs to pin to";
  }
};

TEST_F(EmulatedDevicesTest, TheMachineShowsTwoBindableNodes) {
  const Topology& t = devices()->topology();
  EXPECT_TRUE(t.can_bind());
  ASSERT_EQ(t.numa_nodes().size(), 2u);
  EXPECT_EQ(t.numa_nodes()[0].cpuset.to_string(), "0");
  EXPECT_EQ(t.numa_nodes()[1].cpuset.to_string(), "1");
  ASSERT_EQ(devices()->size(), 2u);
}

TEST_F(EmulatedDevicesTest, DevicesArePinnedAndNode1FallsBackToFirstTouch) {
  for (std::size_t d = 0; d < 2; ++d) {
    EXPECT_NE(devices()->device(d).pinning(), Pinning::kUnpinned) << "device " << d;
  }
  EXPECT_EQ(devices()->device(0).memory_binding(), MemoryBinding::kBound);
  EXPECT_EQ(devices()->device(1).memory_binding(), MemoryBinding::kFirstTouch);
  EXPECT_THAT(devices()->device(1).binding_note(), HasSubstr("first touch"));
  DeviceBuffer b0 = devices()->device(0).allocate(1 << 20);
  EXPECT_EQ(b0.binding(), MemoryBinding::kBound);
  EXPECT_EQ(b0.query_node(), std::optional<int>(0));
  DeviceBuffer b1 = devices()->device(1).allocate(1 << 20);
  EXPECT_EQ(b1.binding(), MemoryBinding::kFirstTouch);
}

TEST_F(EmulatedDevicesTest, NodesRunOnTheirDevicesCpu) {
  GraphBuilder b(devices());
  std::vector<int> cpu(8, -1);
  NodeId prev = 0;
  for (int i = 0; i < 8; ++i) {
    std::vector<NodeId> deps;
    if (i > 0) deps.push_back(prev);
    prev = b.add(
        i % 2, "n", [&cpu, i] { cpu[static_cast<std::size_t>(i)] = sched_getcpu(); }, deps);
  }
  CompiledGraph g = b.compile();
  for (int run = 0; run < 3; ++run) {
    g.run();
    for (int i = 0; i < 8; ++i) EXPECT_EQ(cpu[static_cast<std::size_t>(i)], i % 2) << "node " << i;
  }
}

TEST_F(EmulatedDevicesTest, AllReduceAndShardGatherWorkOnPinnedDevices) {
  const DeviceMesh mesh = DeviceMesh::create(devices(), {-1}, {"tp"});
  for (std::size_t count : {std::size_t{1000}, std::size_t{1} << 20}) {
    std::vector<Tensor> in, out;
    std::vector<BufferView> iv, ov;
    for (std::int64_t s = 0; s < 2; ++s) {
      in.emplace_back(mesh.device(s), std::vector<std::int64_t>{static_cast<std::int64_t>(count)});
      out.emplace_back(mesh.device(s), std::vector<std::int64_t>{static_cast<std::int64_t>(count)});
      auto v = in.back().values();
      for (std::size_t i = 0; i < count; ++i)
        v[i] = static_cast<float>(s + 1) * static_cast<float>(i % 100);
    }
    for (auto& t : in) iv.push_back(view(t));
    for (auto& t : out) ov.push_back(view(t));
    GraphBuilder b(devices());
    all_reduce(b, mesh, iv, ov, count, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
    b.compile().run();
    for (std::size_t s = 0; s < 2; ++s) {
      auto v = out[s].values();
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(v[i], 3.0f * static_cast<float>(i % 100)) << "slot " << s << " element " << i;
      }
    }
  }
  HostTensor host = HostTensor::zeros({4, 6});
  for (std::size_t i = 0; i < host.data.size(); ++i) host.data[i] = static_cast<float>(i);
  const auto fns = make_shard_and_gather_fns(mesh, host.shape, sharding::PartitionSpec{"tp"});
  EXPECT_EQ(fns.gather(fns.shard(host)), host);
}

TEST_F(EmulatedDevicesTest, ShardedSwigluMlpOnPinnedDevicesEqualsTheReference) {
  const DeviceMesh mesh = DeviceMesh::create(devices(), {-1}, {"tp"});
  auto random = [](std::vector<std::int64_t> shape, unsigned seed) {
    HostTensor t = HostTensor::zeros(std::move(shape));
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      t.data[i] = 0.3f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
    }
    return t;
  };
  ops::MlpWeights w;
  w.gate = random({64, 256}, 1);
  w.up = random({64, 256}, 2);
  w.down = random({256, 64}, 3);
  const HostTensor x = random({32, 64}, 4);
  ops::ShardedMlp mlp(mesh, ops::MlpKind::kSwiGLU, w, 32);
  const HostTensor y = mlp.forward(x);
  auto m = [](const HostTensor& t) {
    return ops::RowMatrix(Eigen::Map<const ops::RowMatrix>(t.data.data(), t.shape[0], t.shape[1]));
  };
  const ops::RowMatrix want = ops::mlp_swiglu_reference(m(x), m(w.gate), m(w.up), m(w.down));
  // fp32 sums of 256 products in another order (split over tp): bound 2 * F * epsilon.
  EXPECT_TRUE(numesh::testing::matches_reference(
      y,
      HostTensor{.shape = y.shape,
                 .data = std::vector<float>(want.data(), want.data() + want.size())},
      2.0 * 256 * std::numeric_limits<float>::epsilon()));
}

// The whole stack on the two pinned devices, over tp and then over ep: prefill and decode
// steps equal the dense model (attention heads, MLP F and the MoE's experts split across
// really pinned arenas with node-bound memory).
TEST_F(EmulatedDevicesTest, ShardedTransformerOnPinnedDevicesEqualsTheDenseModel) {
  ops::TransformerConfig c;
  c.hidden = 32;
  c.layers = 2;
  c.attention = ops::AttentionConfig{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  c.ffn = 64;
  c.moe = ops::MoeConfig{.num_experts = 4, .top_k = 2};
  c.moe_ffn = 16;
  const ops::TransformerWeights w = ops::TransformerWeights::random(c, 11);
  for (const char* axis : {"tp", "ep"}) {
    const DeviceMesh mesh = DeviceMesh::create(devices(), {-1}, {axis});
    ops::ShardedTransformer model(mesh, c, w, 2, 8);
    ops::TransformerReference reference(c, w, 2, 8);
    std::int64_t position = 0;
    for (std::int64_t n : {5, 1, 1}) {
      HostTensor x = HostTensor::zeros({2, n, 32});
      for (std::size_t i = 0; i < x.data.size(); ++i) {
        x.data[i] = std::sin(0.7f * static_cast<float>(i) + static_cast<float>(position));
      }
      const HostTensor y = model.forward(x, position);
      const HostTensor want = reference.forward(x, position);
      EXPECT_TRUE(numesh::testing::matches_reference(y, want, 2e-5))
          << axis << " tokens [" << position << ", " << position + n << ")";
      position += n;
    }
  }
}

}  // namespace
}  // namespace numesh::runtime

int main(int argc, char** argv) {
  // Before anything loads hwloc or oneTBB's tbbbind (both read these once). A caller's own
  // setting wins (overwrite = 0); the tests then skip.
  setenv("HWLOC_THISSYSTEM", "1", 0);
  setenv("HWLOC_SYNTHETIC", numesh::runtime::kEmulation, 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
