#include "numesh/runtime/tensor.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/transport.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using sharding::AxisRule;
using sharding::PartitionSpec;
using ::testing::HasSubstr;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

DeviceMesh mesh_2x4() {
  return DeviceMesh::create(testing::synthetic_devices(testing::nodes(8)), {2, 4}, {"dp", "tp"});
}

HostTensor iota(std::vector<std::int64_t> shape) {
  HostTensor t = HostTensor::zeros(std::move(shape));
  std::iota(t.data.begin(), t.data.end(), 1.0f);
  return t;
}

PartitionSpec P(std::vector<AxisRule> entries) { return PartitionSpec(std::move(entries)); }

std::vector<PartitionSpec> specs_2d() {
  return {P({}),
          P({AxisRule("dp")}),
          P({AxisRule("tp")}),
          P({AxisRule(), AxisRule("tp")}),
          P({AxisRule("dp"), AxisRule("tp")}),
          P({AxisRule("tp"), AxisRule("dp")}),
          P({AxisRule::tuple({"dp", "tp"})}),
          P({AxisRule(), AxisRule::tuple({"tp", "dp"})})};
}

// Slot s's shard of a 2-D tensor scattered from `host` holds exactly its slice.
void expect_holds_its_slice(const ShardedTensor& t, std::int64_t s, const HostTensor& host,
                            const std::string& context) {
  const auto& slices = t.layout().device(s).slices;
  const auto values = t.shard(s).values();
  const std::int64_t columns = host.shape[1];
  std::size_t k = 0;
  for (std::int64_t r = slices[0].offset; r < slices[0].limit(); ++r) {
    for (std::int64_t c = slices[1].offset; c < slices[1].limit(); ++c) {
      ASSERT_EQ(values[k++], host.data[static_cast<std::size_t>(r * columns + c)]) << context;
    }
  }
}

TEST(TensorTest, ShardThenGatherRoundTripsForEverySpec) {
  const DeviceMesh m = mesh_2x4();
  const HostTensor host = iota({8, 16});
  for (const PartitionSpec& spec : specs_2d()) {
    ShardedTensor t(m, host.shape, spec);
    scatter(host, t);
    // Every shard holds exactly its slice.
    for (std::int64_t s = 0; s < m.size(); ++s) {
      expect_holds_its_slice(t, s, host, spec.repr() + " slot " + std::to_string(s));
    }
    EXPECT_EQ(gather(t), host) << spec.repr();
  }
}

// A mesh (dp=2, tp=4) over 2 ranks of 4 devices each, ranks as threads: each rank holds the
// shards of its own slots (dp row 0 on rank 0, row 1 on rank 1), scatter fills exactly them,
// another rank's shard is refused by name, and gather gives every rank the whole tensor.
TEST(TensorTest, AProcessHoldsTheShardsOfItsOwnSlots) {
  auto transports = make_thread_transports(2);
  const HostTensor host = iota({8, 16});
  std::vector<std::string> remote_error(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const DeviceMesh m =
          DeviceMesh::create(testing::synthetic_devices(testing::nodes(4)),
                             transports[static_cast<std::size_t>(r)], {2, 4}, {"dp", "tp"});
      for (const PartitionSpec& spec : specs_2d()) {
        ShardedTensor t(m, host.shape, spec);
        scatter(host, t);
        for (std::int64_t s = 0; s < m.size(); ++s) {
          EXPECT_EQ(t.has_shard(s), s / 4 == r) << "rank " << r << " slot " << s;
          if (!t.has_shard(s)) continue;
          EXPECT_EQ(t.shard(s).device(), &m.device(s));
          expect_holds_its_slice(
              t, s, host,
              spec.repr() + " rank " + std::to_string(r) + " slot " + std::to_string(s));
        }
        EXPECT_EQ(gather(t), host) << spec.repr() << " rank " << r;
      }
      ShardedTensor t(m, host.shape, P({AxisRule("tp")}));
      try {
        t.shard(r == 0 ? 5 : 2);
      } catch (const ValueError& e) {
        remote_error[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(remote_error[0], "shard 5 is held by rank 1: this process (rank 0) holds shards 0-3");
  EXPECT_EQ(remote_error[1], "shard 2 is held by rank 0: this process (rank 1) holds shards 4-7");
}

TEST(TensorTest, ShardAndGatherFnsApplyEformersCorrection) {
  const DeviceMesh m = mesh_2x4();
  // Dim 0 (6) is not divisible by tp=4, so eformer's correction drops it; dim 1 keeps dp.
  const auto fns = make_shard_and_gather_fns(m, {6, 4}, P({AxisRule("tp"), AxisRule("dp")}));
  EXPECT_EQ(fns.spec.repr(), "P(None, 'dp')");
  const HostTensor host = iota({6, 4});
  const ShardedTensor t = fns.shard(host);
  EXPECT_EQ(t.layout().shard_shape(), (std::vector<std::int64_t>{6, 2}));
  EXPECT_EQ(fns.gather(t), host);
  // An axis the mesh lacks is dropped as well.
  EXPECT_EQ(make_shard_and_gather_fns(m, {8}, P({AxisRule("sp")})).spec.repr(), "P()");
}

TEST(TensorTest, ReplicatedShardsAreRealCopiesOnEachDevice) {
  const DeviceMesh m = mesh_2x4();
  ShardedTensor t(m, {4, 4}, P({}));
  scatter(iota({4, 4}), t);
  for (std::int64_t s = 1; s < m.size(); ++s) {
    EXPECT_NE(t.shard(s).values().data(), t.shard(0).values().data());
    EXPECT_EQ(t.shard(s).device(), &m.device(s));
    EXPECT_TRUE(std::equal(t.shard(s).values().begin(), t.shard(s).values().end(),
                           t.shard(0).values().begin()));
  }
}

TEST(TensorTest, BadShapesAreRejected) {
  const DeviceMesh m = mesh_2x4();
  ShardedTensor t(m, {8, 16}, P({AxisRule("dp")}));
  EXPECT_THAT(
      [&] {
        scatter(iota({8, 15}), t);
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("host tensor has shape (8, 15) but the sharded tensor has shape (8, 16)")));
  EXPECT_THAT(
      [&] {
        ShardedTensor(m, {7, 16}, P({AxisRule("dp")}));
      },
      ThrowsMessage<ShapeError>(HasSubstr("7")));
  EXPECT_THAT([&] { ShardedTensor(m, {8}, P({AxisRule("xp")})); }, ::testing::Throws<Error>());
  EXPECT_THAT(
      [&] {
        HostTensor::zeros({2, -1});
      },
      ThrowsMessage<ShapeError>(HasSubstr("shape (2, -1) has a negative extent")));
  // Larger than the machine's memory: refused, named, before the allocator sees it (4.4 TB).
  EXPECT_THAT(
      [&] {
        HostTensor::zeros({1 << 20, 1 << 20});
      },
      ThrowsMessage<ValueError>(
          ::testing::ContainsRegex("host memory: cannot allocate a \\[1048576, 1048576\\] tensor "
                                   "of 4398\\.0 GB, more than the "
                                   "[0-9.]+ GB this machine has")));
  EXPECT_THAT(
      [&] { (void)t.shard(8); },
      ThrowsMessage<IndexError>(HasSubstr("shard 8 does not exist: the mesh has 8 devices")));
}

// scatter() of many pairs at once: every tensor gets its own host's values, in any spec and
// dtype; the pairs are checked before anything is written, naming the one that does not fit.
TEST(TensorTest, ScatterOfManyPairsWritesEachItsHostAndChecksThemAllFirst) {
  const DeviceMesh m = mesh_2x4();
  const HostTensor a = iota({8, 16}), b = iota({1, 12}), c = iota({4, 8}), d = iota({32, 64});
  ShardedTensor ta(m, {8, 16}, P({AxisRule("dp"), AxisRule("tp")}));
  ShardedTensor tb(m, {1, 12}, P({}), DType::kBF16);
  ShardedTensor tc(m, {4, 8}, P({AxisRule(), AxisRule("tp")}));
  // Q8_0 in panels: its rows written and then arranged, as scatter() of one does.
  ShardedTensor td(m, {32, 64}, P({}), DType::kQ8_0, BufferContents::kUnspecified,
                   StoredOrder::kPanels);
  ShardedTensor td_alone(m, {32, 64}, P({}), DType::kQ8_0, BufferContents::kUnspecified,
                         StoredOrder::kPanels);
  const HostTensor* const hosts[] = {&a, &b, &c, &d};
  ShardedTensor* const tensors[] = {&ta, &tb, &tc, &td};
  scatter(hosts, tensors);
  scatter(d, td_alone);
  EXPECT_EQ(gather(ta).data, a.data);
  EXPECT_EQ(gather(tb).data, b.data);  // 1 .. 12 are bf16 values
  EXPECT_EQ(gather(tc).data, c.data);
  for (std::int64_t slot = 0; slot < m.size(); ++slot) {
    const Tensor& got = td.shard(slot);
    ASSERT_EQ(std::memcmp(got.data(), td_alone.shard(slot).data(), got.size_bytes()), 0) << slot;
  }

  ShardedTensor untouched(m, {4, 8}, P({}));
  const HostTensor wrong = iota({4, 9});
  const HostTensor* const bad_hosts[] = {&c, &wrong};
  ShardedTensor* const bad_tensors[] = {&untouched, &tc};
  EXPECT_THAT([&] { scatter(bad_hosts, bad_tensors); },
              ThrowsMessage<ShapeError>(
                  StrEq("host tensor has shape (4, 9) but the sharded tensor has shape (4, 8)")));
  EXPECT_EQ(gather(untouched).data, std::vector<float>(32, 0.0f)) << "written before the check";
  EXPECT_THAT([&] { scatter(std::span(hosts).first(2), tensors); },
              ThrowsMessage<ShapeError>(StrEq("scatter: 2 host tensors for 4 sharded tensors")));
  // The same mesh shape on other devices (mesh_2x4's devices are shared).
  PlacementOptions one_thread;
  one_thread.max_threads_per_device = 1;
  const DeviceMesh other =
      DeviceMesh::create(DeviceSet::create(Topology::from_synthetic(testing::nodes(8)), one_thread),
                         {2, 4}, {"dp", "tp"});
  ShardedTensor elsewhere(other, {4, 8}, P({}));
  const HostTensor* const two_hosts[] = {&c, &c};
  ShardedTensor* const two_meshes[] = {&tc, &elsewhere};
  EXPECT_THAT([&] { scatter(two_hosts, two_meshes); },
              ThrowsMessage<ValueError>(StrEq(
                  "fill_shards: tensor 1 [4, 8] is on mesh Mesh('dp': 2, 'tp': 4), tensor 0 on "
                  "mesh Mesh('dp': 2, 'tp': 4): their slots must be the same devices")));
}

// A tensor with a shape and no values is laid out unfilled only when it says so (shape_only):
// one that merely lacks its data is refused where its values are needed, never read as garbage.
TEST(TensorTest, OnlyAShapeOnlyTensorGoesWithoutValues) {
  const HostTensor deferred = HostTensor::shape_only({8, 16});
  EXPECT_TRUE(deferred.is_shape_only());
  EXPECT_TRUE(deferred.values_elsewhere);
  const HostTensor forgotten{.shape = {8, 16}, .data = {}};
  EXPECT_FALSE(forgotten.is_shape_only());
  EXPECT_NE(forgotten, deferred);
  ShardedTensor t(mesh_2x4(), {8, 16}, P({AxisRule("dp")}));
  EXPECT_THAT([&] { scatter(forgotten, t); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("host tensor of shape (8, 16) holds 0 values, expected 128")));
  EXPECT_THAT(
      [&] {
        (void)HostTensor::shape_only({0, 4});
      },
      ThrowsMessage<ShapeError>(HasSubstr("needs elements, not shape [0, 4]")));
}

// fill_shards over many tensors: each device goes through the list in order, writing its own
// shard of each; the tensors must be on the same devices; after a fill throws, the devices
// stop at their next tensor and the first error comes back.
TEST(TensorTest, FillShardsOverManyTensorsWritesEveryShardInOrder) {
  const DeviceMesh m = mesh_2x4();
  std::vector<ShardedTensor> owned;
  owned.emplace_back(m, std::vector<std::int64_t>{8, 16}, P({AxisRule("dp"), AxisRule("tp")}),
                     DType::kF32, BufferContents::kUnspecified);
  owned.emplace_back(m, std::vector<std::int64_t>{4, 4}, P({}), DType::kF32,
                     BufferContents::kUnspecified);
  owned.emplace_back(m, std::vector<std::int64_t>{16}, P({AxisRule("tp")}), DType::kF32,
                     BufferContents::kUnspecified);
  std::vector<ShardedTensor*> tensors;
  for (ShardedTensor& t : owned) tensors.push_back(&t);
  std::vector<std::vector<std::size_t>> order(8);  // per slot, the tensors it filled
  fill_shards(tensors, [&](std::size_t i, std::int64_t slot, Tensor& shard) {
    order[static_cast<std::size_t>(slot)].push_back(i);
    const auto& box = tensors[i]->layout().device(slot).slices;
    // Each element its global row-major index plus 1000 * the tensor's.
    std::vector<std::int64_t> at(box.size(), 0);
    std::span<float> v = shard.values();
    for (std::size_t e = 0; e < v.size(); ++e) {
      std::int64_t flat = 0, rest = static_cast<std::int64_t>(e);
      for (std::size_t d = box.size(); d-- > 0;) {
        at[d] = box[d].offset + rest % box[d].extent;
        rest /= box[d].extent;
      }
      for (std::size_t d = 0; d < box.size(); ++d) flat = flat * tensors[i]->shape()[d] + at[d];
      v[e] = static_cast<float>(1000 * i + static_cast<std::size_t>(flat));
    }
  });
  for (const auto& slots : order) EXPECT_THAT(slots, ::testing::ElementsAre(0, 1, 2));
  for (std::size_t i = 0; i < owned.size(); ++i) {
    const HostTensor all = gather(owned[i]);
    for (std::size_t e = 0; e < all.data.size(); ++e)
      ASSERT_EQ(all.data[e], static_cast<float>(1000 * i + e)) << "tensor " << i << " at " << e;
  }
  // Slots on other devices: refused, naming the tensor.
  PlacementOptions one_thread;
  one_thread.max_threads_per_device = 1;
  const DeviceMesh other =
      DeviceMesh::create(DeviceSet::create(Topology::from_synthetic(testing::nodes(8)), one_thread),
                         {2, 4}, {"dp", "tp"});
  ShardedTensor elsewhere(other, {4}, P({}));
  std::vector<ShardedTensor*> mixed{tensors[0], &elsewhere};
  EXPECT_THAT([&] { fill_shards(mixed, [](std::size_t, std::int64_t, Tensor&) {}); },
              ThrowsMessage<ValueError>(HasSubstr("fill_shards: tensor 1 [4] is on mesh")));
  // A fill that throws on tensor 0 of slot 3: that device goes no further, and the first error
  // comes back once every device has stopped.
  std::vector<std::vector<std::size_t>> calls(8);
  EXPECT_THAT(
      [&] {
        fill_shards(tensors, [&](std::size_t i, std::int64_t slot, Tensor&) {
          calls[static_cast<std::size_t>(slot)].push_back(i);
          if (i == 0 && slot == 3) throw ValueError("slot 3 cannot read");
        });
      },
      ThrowsMessage<ValueError>(HasSubstr("slot 3 cannot read")));
  EXPECT_THAT(calls[3], ::testing::ElementsAre(0));
}

// Storage is counted by rows (what a block format needs), which for element types is the
// element count times the element's bytes; shard_bytes() is a shard's storage.
TEST(TensorTest, StorageIsCountedByRows) {
  const std::vector<std::int64_t> rank0, empty_rows{3, 0}, matrix{3, 5}, stacked{2, 3, 4};
  EXPECT_EQ(storage_bytes(DType::kF32, rank0), 4);
  EXPECT_EQ(storage_bytes(DType::kBF16, empty_rows), 0);
  EXPECT_EQ(storage_bytes(DType::kF16, matrix), 30);
  EXPECT_EQ(storage_bytes(DType::kF32, stacked), 96);
  const std::vector<std::int64_t> negative{2, -1};
  EXPECT_THAT([&] { (void)storage_bytes(DType::kF32, negative); },
              ThrowsMessage<ShapeError>(HasSubstr("shape (2, -1) has a negative extent")));
  const ShardedTensor t(mesh_2x4(), {8, 16}, P({AxisRule("dp"), AxisRule("tp")}), DType::kBF16);
  EXPECT_EQ(t.shard_bytes(), 4 * 4 * 2);
  EXPECT_EQ(t.shard(0).size_bytes(), 32U);
}

// A tensor reading mapped bytes in place (a weight's shard over its file's mapping): its
// elements are the owner's bytes, its buffer says so, and it keeps the owner alive exactly as
// long as it holds them.
TEST(TensorTest, AMappedTensorReadsItsOwnersBytesAndKeepsThemAlive) {
  const auto devices = testing::synthetic_devices(testing::nodes(1));
  Device& device = devices->device(0);
  auto owner = std::make_shared<std::vector<float>>(12);
  std::iota(owner->begin(), owner->end(), 1.0f);
  const std::weak_ptr<std::vector<float>> watch = owner;
  std::shared_ptr<const std::byte> bytes(owner, reinterpret_cast<const std::byte*>(owner->data()));
  owner.reset();
  Tensor t(device, {3, 4}, DType::kF32, BufferContents::kUnspecified);
  ASSERT_FALSE(t.buffer().is_mapped());
  t.use_mapped(std::move(bytes));
  EXPECT_TRUE(t.buffer().is_mapped());
  EXPECT_EQ(t.buffer().binding(), MemoryBinding::kMapped);
  EXPECT_EQ(to_string(t.buffer().binding()), "mapped");
  EXPECT_EQ(t.device(), &device);
  EXPECT_EQ(t.size_bytes(), 48U);
  EXPECT_FALSE(watch.expired()) << "the tensor holds the owner";
  EXPECT_EQ(t.data(), static_cast<const void*>(watch.lock()->data()));
  EXPECT_EQ(std::vector<float>(t.values().begin(), t.values().end()),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  Tensor moved = std::move(t);
  EXPECT_TRUE(moved.buffer().is_mapped());
  EXPECT_FALSE(t.buffer().is_mapped()) << "the moved-from buffer is empty";  // NOLINT
  EXPECT_FALSE(watch.expired());
  moved = Tensor();
  EXPECT_TRUE(watch.expired()) << "released with the tensor, never freed by the device";

  auto panels_owner = std::make_shared<std::vector<std::byte>>(16 * 34);
  Tensor panels(device, {16, 32}, DType::kQ8_0, BufferContents::kUnspecified, StoredOrder::kPanels);
  EXPECT_THAT(
      [&] {
        panels.use_mapped(std::shared_ptr<const std::byte>(panels_owner, panels_owner->data()));
      },
      ThrowsMessage<TypeError>(HasSubstr("tensor of shape (16, 32) of q8_0 is stored in panels: "
                                         "it cannot read a file's rows in place")));
  EXPECT_FALSE(panels.buffer().is_mapped()) << "refused: the tensor keeps its storage";
  Tensor rows(device, {2, 2});
  EXPECT_THAT([&] { rows.use_mapped(nullptr); },
              ThrowsMessage<ValueError>(HasSubstr("tensor of shape (2, 2): no bytes")));
  Tensor none;
  EXPECT_THAT([&] { none.use_mapped(std::shared_ptr<const std::byte>(panels_owner, nullptr)); },
              ThrowsMessage<ValueError>(HasSubstr("has no elements to read in place")));
  EXPECT_THAT([&] { (void)device.use_mapped(nullptr, 8); },
              ThrowsMessage<ValueError>(HasSubstr("a mapped buffer needs bytes (given 8 bytes")));
}

TEST(TensorTest, CopyBoxCopiesAStridedBlock) {
  // A 2x3 box at (1, 2) of a 4x6 source into a 3x4 destination holding rows [1, 4), cols [2, 6).
  std::vector<float> src(24);
  std::iota(src.begin(), src.end(), 0.0f);
  std::vector<float> dst(12, -1.0f);
  const std::vector<sharding::DimSlice> box{{1, 2}, {2, 3}};
  const std::vector<sharding::DimSlice> src_slices{{0, 4}, {0, 6}};
  const std::vector<sharding::DimSlice> dst_slices{{1, 3}, {2, 4}};
  copy_box(box, src.data(), src_slices, dst.data(), dst_slices);
  EXPECT_EQ(dst, (std::vector<float>{8, 9, 10, -1, 14, 15, 16, -1, -1, -1, -1, -1}));
  EXPECT_FALSE(intersect_boxes(std::vector<sharding::DimSlice>{{0, 2}},
                               std::vector<sharding::DimSlice>{{2, 2}}));
}

// ---- Collectives on sharded tensors -----------------------------------------------------------

TEST(ShardedCollectivesTest, RedistributeAllGathersAndAllToAllsAnySpecPair) {
  const DeviceMesh m = mesh_2x4();
  const HostTensor host = iota({8, 16});
  const std::vector<std::string> all_axes{"dp", "tp"};
  for (const PartitionSpec& from : specs_2d()) {
    for (const PartitionSpec& to : specs_2d()) {
      ShardedTensor in(m, host.shape, from), out(m, host.shape, to);
      scatter(host, in);
      GraphBuilder b(m.device_set());
      redistribute(b, in, out, {.axes = all_axes, .after = {}, .name = {}});
      b.compile().run();
      ASSERT_EQ(gather(out), host) << from.repr() << " -> " << to.repr();
      for (std::int64_t s = 0; s < m.size(); ++s) {
        // Every shard, not just the first replica, holds its slice.
        ShardedTensor check(m, host.shape, to);
        scatter(host, check);
        ASSERT_TRUE(std::equal(out.shard(s).values().begin(), out.shard(s).values().end(),
                               check.shard(s).values().begin()))
            << from.repr() << " -> " << to.repr() << " slot " << s;
      }
    }
  }
}

TEST(ShardedCollectivesTest, AllGatherOverTpOnlyKeepsDp) {
  const DeviceMesh m = mesh_2x4();
  const HostTensor host = iota({8, 16});
  ShardedTensor in(m, host.shape, P({AxisRule("dp"), AxisRule("tp")}));
  ShardedTensor out(m, host.shape, P({AxisRule("dp")}));
  scatter(host, in);
  GraphBuilder b(m.device_set());
  redistribute(b, in, out, {.axes = {"tp"}, .after = {}, .name = "ag"});
  EXPECT_EQ(b.size(), 8u);
  b.compile().run();
  EXPECT_EQ(gather(out), host);
  // Gathering over dp alone cannot produce a tp-free layout: the tp parts live outside the
  // dp group.
  ShardedTensor replicated(m, host.shape, P({}));
  GraphBuilder b2(m.device_set());
  EXPECT_THAT([&] { redistribute(b2, in, replicated, {.axes = {"dp"}, .after = {}, .name = {}}); },
              ThrowsMessage<ShapeError>(HasSubstr("is held by no device of its group")));
}

// Specs that read differently but lay data out alike (a trailing None) are one layout to the
// sharded all-reduce: each slot's two summands over tp add up.
TEST(ShardedCollectivesTest, AllReduceAcceptsSpecsThatDifferOnlyInTrailingNones) {
  const DeviceMesh m = mesh_2x4();
  ShardedTensor in(m, {8, 16}, P({AxisRule("dp")})),
      out(m, {8, 16}, P({AxisRule("dp"), AxisRule()}));
  for (std::int64_t s = 0; s < m.size(); ++s) {
    for (float& v : in.shard(s).values()) v = 1.0f;
  }
  GraphBuilder b(m.device_set());
  all_reduce(b, in, out, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
  b.compile().run();
  for (float v : out.shard(5).values()) ASSERT_EQ(v, 4.0f) << "four tp summands of 1";
}

// Weights in a block format hold blocks, not elements: collectives refuse them by name before any
// node is added (a reduction would re-quantize; a copy would cut blocks).
TEST(ShardedCollectivesTest, BlockFormatsAreRefusedBeforeAnyNodeIsAdded) {
  const DeviceMesh m = mesh_2x4();
  ShardedTensor a(m, {8, 64}, P({AxisRule("dp")}), DType::kQ8_0),
      b(m, {8, 64}, P({}), DType::kQ8_0);
  GraphBuilder builder(m.device_set());
  EXPECT_THAT([&] { redistribute(builder, a, b, {.axes = {"dp"}, .after = {}, .name = {}}); },
              ThrowsMessage<TypeError>(HasSubstr(
                  "redistribute: q8_0 to q8_0: collectives move element types (f32, bf16, f16)")));
  ShardedTensor f(m, {8, 64}, P({}));
  EXPECT_THAT(
      [&] {
        reduce_scatter(builder, b, f, ReduceOp::kSum, {.axes = {"dp"}, .after = {}, .name = {}});
      },
      ThrowsMessage<TypeError>(HasSubstr("q8_0 to f32: collectives move element types")));
  // Stored and gathered back: each row's blocks, dequantized.
  HostTensor host = HostTensor::zeros({8, 64});
  for (std::size_t i = 0; i < host.data.size(); ++i)
    host.data[i] = static_cast<float>(i % 7) - 3.0f;
  EXPECT_THAT(
      [&] {
        ShardedTensor(m, {8, 64}, P({AxisRule("dp"), AxisRule("tp")}), DType::kQ4_0);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("q4_0: a row of 16 elements is not a whole number of 32-element blocks")))
      << "a shard's rows of 16 elements";
  ShardedTensor r(m, {8, 64}, P({AxisRule("dp")}), DType::kQ4_0);
  scatter(host, r);
  EXPECT_EQ(gather(r), rounded_to(host, DType::kQ4_0));
}

TEST(ShardedCollectivesTest, BadArgumentsAreRejectedBeforeAnyNodeIsAdded) {
  const DeviceMesh m = mesh_2x4();
  ShardedTensor a(m, {8, 16}, P({AxisRule("dp")})), b(m, {8, 16}, P({})), c(m, {8, 8}, P({}));
  GraphBuilder builder(m.device_set());
  const CollectiveArgs all{.axes = {"dp", "tp"}, .after = {}, .name = {}};
  EXPECT_THAT(
      [&] { redistribute(builder, a, a, all); },
      ThrowsMessage<ValueError>(HasSubstr("redistribute: input and output are the same tensor")));
  EXPECT_THAT(
      [&] {
        redistribute(builder, a, b, {.axes = {"dp"}, .after = {0, 1}, .name = {}});
      },
      ThrowsMessage<ValueError>(
          HasSubstr("redistribute: the frontier has 2 entries, the mesh has 8 slots")));
  EXPECT_THAT([&] { reduce_scatter(builder, b, c, ReduceOp::kSum, all); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "reduce_scatter: input shape (8, 16) differs from output shape (8, 8)")));
  EXPECT_THAT([&] { all_reduce(builder, a, b, ReduceOp::kSum, all); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("all_reduce: input spec P('dp',) differs from output spec P()")));
  EXPECT_THAT([&] { redistribute(builder, a, b, {.axes = {"xp"}, .after = {}, .name = {}}); },
              ThrowsMessage<KeyError>(HasSubstr("mesh axis 'xp' is not in the mesh")));
  EXPECT_EQ(builder.size(), 0u);
}

TEST(ShardedCollectivesTest, ReduceScatterAndAllReduceSumPartialShards) {
  const DeviceMesh m = mesh_2x4();
  // Partial sums: every slot holds a full (4, 8) tensor whose values depend on the slot.
  ShardedTensor partial(m, {4, 8}, P({}));
  for (std::int64_t s = 0; s < m.size(); ++s) {
    auto v = partial.shard(s).values();
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(s * 100 + static_cast<std::int64_t>(i));
  }
  // Reduce over tp into a layout that splits dim 1 over tp.
  ShardedTensor scattered(m, {4, 8}, P({AxisRule(), AxisRule("tp")}));
  ShardedTensor summed(m, {4, 8}, P({}));
  GraphBuilder b(m.device_set());
  reduce_scatter(b, partial, scattered, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
  all_reduce(b, partial, summed, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
  b.compile().run();
  for (std::int64_t s = 0; s < m.size(); ++s) {
    const auto group = m.groups(std::vector<std::string>{"tp"})[static_cast<std::size_t>(s / 4)];
    const auto& slices = scattered.layout().device(s).slices;
    const auto got = scattered.shard(s).values();
    std::size_t k = 0;
    for (std::int64_t r = 0; r < 4; ++r) {
      for (std::int64_t c = slices[1].offset; c < slices[1].limit(); ++c) {
        float expected = 0;
        for (std::int64_t t : group) expected += static_cast<float>(t * 100 + r * 8 + c);
        ASSERT_EQ(got[k++], expected) << "slot " << s;
      }
    }
    const auto all = summed.shard(s).values();
    for (std::int64_t i = 0; i < 32; ++i) {
      float expected = 0;
      for (std::int64_t t : group) expected += static_cast<float>(t * 100 + i);
      ASSERT_EQ(all[static_cast<std::size_t>(i)], expected);
    }
  }
}

}  // namespace
}  // namespace numesh::runtime
