#include "numesh/sharding/shard_layout.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "numesh/core/error.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using I64 = std::vector<std::int64_t>;

// Every global index of every dim is held by exactly one device of each replica group, and
// the groups partition the devices.
void expect_exact_cover(const ShardLayout& layout) {
  std::int64_t total = 1;
  for (std::int64_t e : layout.shape()) total *= e;
  std::set<std::int64_t> seen_devices;
  for (const auto& group : layout.replica_groups()) {
    // Within a group, all hold the same slice.
    for (std::int64_t d : group) {
      EXPECT_EQ(layout.device(d).slices, layout.device(group.front()).slices);
      EXPECT_TRUE(seen_devices.insert(d).second) << "device " << d << " in two groups";
    }
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen_devices.size()), layout.num_devices());
  EXPECT_EQ(static_cast<std::int64_t>(layout.replica_groups().size()), layout.num_shards());
  // One representative per group: the slices tile the array exactly once.
  std::vector<int> hits(static_cast<std::size_t>(total), 0);
  for (std::int64_t lin = 0; lin < total; ++lin) {
    // Row-major multi-index of element `lin`.
    std::vector<std::int64_t> idx(layout.rank());
    std::int64_t rest = lin;
    for (std::size_t d = layout.rank(); d-- > 0;) {
      idx[d] = rest % layout.shape()[d];
      rest /= layout.shape()[d];
    }
    for (const auto& group : layout.replica_groups()) {
      const DeviceShard& s = layout.device(group.front());
      bool inside = true;
      for (std::size_t d = 0; d < layout.rank(); ++d) {
        inside = inside && s.slices[d].offset <= idx[d] && idx[d] < s.slices[d].limit();
      }
      if (inside) ++hits[static_cast<std::size_t>(lin)];
    }
  }
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  EXPECT_EQ(layout.num_shards() * layout.replication(), layout.num_devices());
}

TEST(ShardLayoutTest, TwoDimsOnTwoAxes) {
  ShardLayout l({8, 16}, PartitionSpec{"dp", "tp"}, Mesh({"dp", "tp"}, {2, 4}));
  EXPECT_EQ(l.blocks_per_dim(), (I64{2, 4}));
  EXPECT_EQ(l.shard_shape(), (I64{4, 4}));
  EXPECT_EQ(l.num_shards(), 8);
  EXPECT_EQ(l.replication(), 1);
  // Device 6 sits at (dp=1, tp=2).
  EXPECT_EQ(l.device(6).coords, (I64{1, 2}));
  EXPECT_EQ(l.device(6).block, (I64{1, 2}));
  EXPECT_EQ(l.tile_offset(6), (I64{4, 8}));
  EXPECT_EQ(l.tile_limit(6), (I64{8, 12}));
  EXPECT_EQ(l.to_string(),
            "shape=[8,16] spec=P('dp', 'tp') mesh=[dp=2,tp=4] blocks=[2,4] shard=[4,4] "
            "shards=8 replication=1");
  expect_exact_cover(l);
}

TEST(ShardLayoutTest, ReplicatedDimMakesReplicaGroups) {
  ShardLayout l({8, 16}, PartitionSpec{nullptr, "tp"}, Mesh({"dp", "tp"}, {2, 4}));
  EXPECT_EQ(l.shard_shape(), (I64{8, 4}));
  EXPECT_EQ(l.num_shards(), 4);
  EXPECT_EQ(l.replication(), 2);
  EXPECT_EQ(l.replica_groups(), (std::vector<I64>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.device(5).replica_group, 1u);
  EXPECT_EQ(l.device(5).replica_id, 1u);
  EXPECT_EQ(l.device(1).replica_id, 0u);
  expect_exact_cover(l);
}

TEST(ShardLayoutTest, TupleIsMajorToMinorInTupleOrder) {
  Mesh mesh({"dp", "tp"}, {2, 4});
  ShardLayout a({16}, PartitionSpec{AxisRule::tuple({"dp", "tp"})}, mesh);
  // (dp, tp): block = dp * 4 + tp, which is the device id.
  for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(a.tile_offset(d), (I64{2 * d})) << d;
  expect_exact_cover(a);

  ShardLayout b({16}, PartitionSpec{AxisRule::tuple({"tp", "dp"})}, mesh);
  // (tp, dp): block = tp * 2 + dp. Device 1 is (dp=0, tp=1) -> block 2; device 4 is
  // (dp=1, tp=0) -> block 1.
  EXPECT_EQ(b.device(1).block, (I64{2}));
  EXPECT_EQ(b.device(4).block, (I64{1}));
  EXPECT_EQ(b.tile_offset(4), (I64{2}));
  expect_exact_cover(b);
}

TEST(ShardLayoutTest, EformerBatchTupleOnFiveAxisMesh) {
  // P(('fsdp', 'dp'), 'sp', 'tp', None), the default attention spec, on dp=2 fsdp=2 tp=2.
  Mesh mesh({"dp", "fsdp", "ep", "tp", "sp"}, {2, 2, 1, 2, 1});
  ShardLayout l({8, 128, 32, 64},
                PartitionSpec{AxisRule::tuple({"fsdp", "dp"}), "sp", "tp", nullptr}, mesh);
  EXPECT_EQ(l.shard_shape(), (I64{2, 128, 16, 64}));
  EXPECT_EQ(l.num_shards(), 8);
  EXPECT_EQ(l.replication(), 1);
  // Device 2 = (dp=0, fsdp=1, ep=0, tp=0, sp=0): batch block fsdp*2 + dp = 2.
  EXPECT_EQ(l.device(2).block, (I64{2, 0, 0, 0}));
  EXPECT_EQ(l.bytes_per_device(2), 2 * 128 * 16 * 64 * 2);
  // The same spec on a small shape, checked element by element.
  expect_exact_cover(ShardLayout(
      {8, 2, 4, 2}, PartitionSpec{AxisRule::tuple({"fsdp", "dp"}), "sp", "tp", nullptr}, mesh));
}

TEST(ShardLayoutTest, FullyReplicatedAndShortSpec) {
  Mesh mesh({"dp", "tp"}, {2, 2});
  ShardLayout p({4, 6}, PartitionSpec{}, mesh);
  EXPECT_EQ(p.num_shards(), 1);
  EXPECT_EQ(p.replication(), 4);
  EXPECT_EQ(p.replica_groups(), (std::vector<I64>{{0, 1, 2, 3}}));
  EXPECT_EQ(p.shard_shape(), (I64{4, 6}));
  expect_exact_cover(p);

  // P('tp') on a rank-3 array pads with None.
  ShardLayout s({4, 6, 2}, PartitionSpec{"tp"}, mesh);
  EXPECT_EQ(s.shard_shape(), (I64{2, 6, 2}));
  EXPECT_EQ(s.replica_groups(), (std::vector<I64>{{0, 2}, {1, 3}}));
  expect_exact_cover(s);
}

TEST(ShardLayoutTest, SizeOneAxesAndZeroExtentsAndScalars) {
  Mesh mesh({"dp", "tp"}, {1, 2});
  ShardLayout one({3, 4}, PartitionSpec{"dp", "tp"}, mesh);
  EXPECT_EQ(one.shard_shape(), (I64{3, 2}));
  expect_exact_cover(one);

  ShardLayout zero({0, 4}, PartitionSpec{"tp"}, mesh);
  EXPECT_EQ(zero.shard_shape(), (I64{0, 4}));
  EXPECT_EQ(zero.bytes_per_device(4), 0);

  ShardLayout scalar({}, PartitionSpec{}, mesh);
  EXPECT_EQ(scalar.elements_per_device(), 1);
  EXPECT_EQ(scalar.replica_groups(), (std::vector<I64>{{0, 1}}));
}

TEST(ShardLayoutTest, NotDivisibleNamesDimSizeAxesAndProduct) {
  Mesh mesh({"dp", "tp"}, {2, 4});
  EXPECT_THAT(
      [&] {
        ShardLayout({8, 30}, PartitionSpec{nullptr, "tp"}, mesh);
      },
      ThrowsMessage<ShapeError>(
          "sharding: dim 1 (size 30) is not divisible by mesh axis 'tp' (size 4) in "
          "P(None, 'tp'); use correct_spec() or pad to 32"));
  EXPECT_THAT(
      [&] {
        ShardLayout({12}, PartitionSpec{AxisRule::tuple({"dp", "tp"})}, mesh);
      },
      ThrowsMessage<ShapeError>(
          "sharding: dim 0 (size 12) is not divisible by mesh axes ('dp', 'tp') "
          "(product 8) in P(('dp', 'tp'),); use correct_spec() or pad to 16"));
}

TEST(ShardLayoutTest, InvalidSpecsAndShapes) {
  Mesh mesh({"dp", "tp"}, {2, 4});
  EXPECT_THAT(
      [&] {
        ShardLayout({8}, PartitionSpec{"dp", "tp"}, mesh);
      },
      ThrowsMessage<ShapeError>(HasSubstr("has 2 entries but the array has rank 1")));
  EXPECT_THROW(ShardLayout({8, 8}, PartitionSpec{"dp", "dp"}, mesh), DuplicateSpecError);
  EXPECT_THAT([&] { ShardLayout({8}, PartitionSpec{"model"}, mesh); },
              ThrowsMessage<ValueError>(HasSubstr("Resource axis: model")));
  EXPECT_THROW(ShardLayout({8}, PartitionSpec{AxisRule::unconstrained()}, mesh), ValueError);
  EXPECT_THAT(
      [&] {
        ShardLayout({8, -1}, PartitionSpec{}, mesh);
      },
      ThrowsMessage<ShapeError>(HasSubstr("dim 1 has negative size -1")));
  EXPECT_THROW(ShardLayout({8}, PartitionSpec{}, Mesh()), NoMeshError);
  ShardLayout ok({8}, PartitionSpec{}, mesh);
  EXPECT_THROW((void)ok.bytes_per_device(0), ValueError);
}

TEST(ShardLayoutTest, ExhaustiveCoverOnThreeAxisMesh) {
  Mesh mesh({"a", "b", "c"}, {2, 3, 2});
  const std::vector<PartitionSpec> specs = {
      PartitionSpec{"a", "b", "c"},
      PartitionSpec{AxisRule::tuple({"c", "a"}), "b"},
      PartitionSpec{nullptr, AxisRule::tuple({"b", "c", "a"})},
      PartitionSpec{"b"},
      PartitionSpec{nullptr, nullptr, "c"},
  };
  for (const auto& spec : specs) {
    ShardLayout l({12, 12, 6}, spec, mesh);
    SCOPED_TRACE(l.to_string());
    expect_exact_cover(l);
  }
}

}  // namespace
}  // namespace numesh::sharding
