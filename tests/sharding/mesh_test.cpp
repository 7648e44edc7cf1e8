#include "numesh/sharding/mesh.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"
#include "numesh/sharding/named_sharding.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(MeshTest, DevicesAreRowMajorOverAxes) {
  Mesh m({"dp", "tp"}, {2, 4});
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.coords_of(5), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(m.device_at({1, 3}), 7);
  for (std::int64_t d = 0; d < m.size(); ++d) EXPECT_EQ(m.device_at(m.coords_of(d)), d);
}

TEST(MeshTest, EmptyWhenNoAxesOrAZeroAxis) {
  EXPECT_TRUE(Mesh().empty());
  EXPECT_TRUE(Mesh({"dp"}, {0}).empty());
  EXPECT_FALSE(Mesh({"dp"}, {1}).empty());
}

TEST(MeshTest, BadConstructionNamesTheValues) {
  EXPECT_THAT(
      [] {
        Mesh({"dp", "tp"}, {2});
      },
      ThrowsMessage<ValueError>(HasSubstr("2 axis names (dp, tp) but 1 sizes (2)")));
  EXPECT_THAT(
      [] {
        Mesh({"dp", "dp"}, {2, 2});
      },
      ThrowsMessage<ValueError>(HasSubstr("'dp' appears twice")));
  EXPECT_THAT([] { Mesh({"dp"}, {-2}); },
              ThrowsMessage<ValueError>(HasSubstr("'dp' has negative size -2")));
}

TEST(MeshTest, AxisSizeOfUnknownAxisThrowsKeyError) {
  Mesh m({"dp", "tp"}, {2, 4});
  EXPECT_EQ(m.axis_size("tp"), 4);
  try {
    (void)m.axis_size("sp");
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "sp");
    EXPECT_THAT(e.what(), HasSubstr("'sp' is not in the mesh ('dp', 'tp')"));
  }
}

TEST(MeshTest, ResolveDimsFollowsNumpyReshape) {
  EXPECT_EQ(resolve_mesh_dims({2, -1, 1, 2, 1}, 8), (std::vector<std::int64_t>{2, 2, 1, 2, 1}));
  EXPECT_EQ(resolve_mesh_dims({1, -1}, 0), (std::vector<std::int64_t>{1, 0}));
  EXPECT_THAT(
      [] {
        (void)resolve_mesh_dims({-1, -1}, 4);
      },
      ThrowsMessage<ValueError>(HasSubstr("can only specify one unknown dimension")));
  EXPECT_THAT(
      [] {
        (void)resolve_mesh_dims({3, -1}, 8);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("cannot reshape array of size 8 into shape (3,newaxis)")));
}

TEST(NamedShardingTest, RejectsDuplicateAxes) {
  Mesh m({"dp", "tp"}, {2, 4});
  EXPECT_THAT(
      [&] {
        NamedSharding(m, PartitionSpec{"dp", "dp"});
      },
      ThrowsMessage<DuplicateSpecError>(
          HasSubstr("but P('dp', 'dp') has duplicate entries for `dp`")));
}

TEST(NamedShardingTest, RejectsAxesMissingFromTheMesh) {
  Mesh m({"dp", "tp"}, {2, 4});
  EXPECT_THAT(
      [&] {
        NamedSharding(m, PartitionSpec{"fsdp", "tp"});
      },
      ThrowsMessage<ValueError>(
          HasSubstr("Resource axis: fsdp of P('fsdp', 'tp') is not found in mesh: ('dp', 'tp').")));
  NamedSharding ok(m, PartitionSpec{AxisRule::tuple({"dp", "tp"})});
  EXPECT_EQ(ok.spec().size(), 1u);
}

}  // namespace
}  // namespace numesh::sharding
