#include "numesh/sharding/mesh_creation.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "numesh/core/error.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Shape = std::vector<std::int64_t>;

CreateMeshOptions opts(std::int64_t devices, std::int64_t processes = 1, std::int64_t slices = 1,
                       std::optional<Shape> dcn = std::nullopt) {
  CreateMeshOptions o;
  o.device_count = devices;
  o.process_count = processes;
  o.num_slices = slices;
  o.dcn_mesh_dims = std::move(dcn);
  return o;
}

TEST(NormalizeAxisTypesTest, TypedInputBroadcastsOrChecksLength) {
  EXPECT_THAT(normalize_axis_types({"x", "y"}, std::vector<AxisType>{AxisType::kManual}),
              ElementsAre(AxisType::kManual, AxisType::kManual));
  EXPECT_THAT(
      [] {
        (void)normalize_axis_types({"x"}, std::vector<AxisType>{AxisType::kAuto, AxisType::kAuto});
      },
      ThrowsMessage<ValueError>(HasSubstr("Got 2 types for 1 axis names.")));
  EXPECT_EQ(to_string(AxisType::kExplicit), "Explicit");
}

TEST(NormalizeAxisTypesTest, DynamicInput) {
  using nlohmann::json;
  EXPECT_FALSE(normalize_axis_types({"x"}, json(nullptr)).has_value());
  EXPECT_THAT(*normalize_axis_types({"x", "y"}, json(" MANUAL\t")),
              ElementsAre(AxisType::kManual, AxisType::kManual));
  EXPECT_THAT(*normalize_axis_types({"x", "y"}, json::array({"auto", "explicit"})),
              ElementsAre(AxisType::kAuto, AxisType::kExplicit));
  EXPECT_THAT(
      [] { (void)normalize_axis_types({"x"}, json("bogus")); },
      ThrowsMessage<ValueError>(HasSubstr(
          "axis_types must be one of {'auto', 'explicit', 'manual'} or AxisType, got 'bogus'.")));
  EXPECT_THAT(
      [] {
        (void)normalize_axis_types({"x", "y"}, json::array({1, 2}));
      },
      ThrowsMessage<TypeError>(
          HasSubstr("axis_types entries must be strings or AxisType values, got <class 'int'>.")));
  EXPECT_THAT([] { (void)normalize_axis_types({"x"}, json(3)); },
              ThrowsMessage<TypeError>(HasSubstr("'int' object is not iterable")));
  EXPECT_THAT(
      [] {
        (void)normalize_axis_types({"x", "y"}, json::array({"auto", "auto", "auto"}));
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "axis_types length must match axis_names length. Got 3 types for 2 axis names.")));
}

TEST(CalculateHostMeshShapeTest, SplitsProcessesLeftToRight) {
  EXPECT_THAT(calculate_host_mesh_shape({2, 2, 1, 2, 1}, 2, 4), ElementsAre(1, 1, 1, 2, 1));
  EXPECT_THAT(calculate_host_mesh_shape({6, 1}, 2, 3), ElementsAre(2, 1));
  EXPECT_THAT(
      [] {
        (void)calculate_host_mesh_shape({2, 4}, 4, 4);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("Mesh size 8 doesn't match available devices 16 (local x processes)")));
  EXPECT_THAT(
      [] {
        (void)calculate_host_mesh_shape({2, 3}, 2, 3);
      },
      ThrowsMessage<ValueError>(HasSubstr("Host mesh shape (1, 3) uses 3 devices instead of 2.")));
  EXPECT_THAT(calculate_host_mesh_shape({1, 3}, 1, 3), ElementsAre(1, 1));
  EXPECT_THAT(
      [] {
        (void)calculate_host_mesh_shape({0, 2}, 0, 2);
      },
      ThrowsMessage<ValueError>(HasSubstr("integer division or modulo by zero")));
}

TEST(FillMinusOneToTargetTest, AllErrors) {
  EXPECT_THAT(fill_minus_one_to_target({2, -1}, 8), ElementsAre(2, 4));
  EXPECT_THAT(
      [] {
        (void)fill_minus_one_to_target({-1, -1}, 4);
      },
      ThrowsMessage<ValueError>(HasSubstr("Only one -1 is supported in dcn_mesh_dims.")));
  EXPECT_THAT(
      [] {
        (void)fill_minus_one_to_target({0, -1}, 4);
      },
      ThrowsMessage<ValueError>(HasSubstr("dcn_mesh_dims entries must be > 0 or -1, got 0")));
  EXPECT_THAT(
      [] {
        (void)fill_minus_one_to_target({3, -1}, 4);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("dcn_mesh_dims product (3) does not divide target (4).")));
  EXPECT_THAT(
      [] { (void)fill_minus_one_to_target({2}, 4); },
      ThrowsMessage<ValueError>(HasSubstr("dcn_mesh_dims product 2 must equal 4; got (2,)")));
}

TEST(CreateMeshTest, SingleProcess) {
  const Mesh m = create_mesh(kDefaultMeshDims, kDefaultMeshNames, opts(8));
  EXPECT_THAT(m.sizes(), ElementsAre(1, 8, 1, 1, 1));
  EXPECT_THAT(
      [] {
        (void)create_mesh({3, -1}, {"dp", "tp"}, opts(8));
      },
      ThrowsMessage<ValueError>(
          HasSubstr("cannot reshape array of size 8 into shape (3,newaxis)")));
  EXPECT_THAT(
      [] {
        (void)create_mesh({2, -1}, {"dp"}, opts(8));
      },
      ThrowsMessage<ValueError>(HasSubstr("dp")));
}

TEST(CreateMeshTest, MultiProcessSplitsHostAndDcn) {
  const auto layout = create_mesh_layout({2, -1, 1, 1, 1}, kDefaultMeshNames, opts(8, 2));
  EXPECT_THAT(layout.mesh.sizes(), ElementsAre(2, 4, 1, 1, 1));
  EXPECT_THAT(layout.local_shape, ElementsAre(1, 4, 1, 1, 1));
  EXPECT_THAT(layout.dcn_shape, ElementsAre(2, 1, 1, 1, 1));
  const auto given = create_mesh_layout({2, 4}, {"a", "b"}, opts(8, 2, 1, Shape{-1, 1}));
  EXPECT_THAT(given.dcn_shape, ElementsAre(2, 1));
  EXPECT_THAT(
      [] { (void)create_mesh({-1}, {"a"}, opts(7, 2)); },
      ThrowsMessage<ValueError>(HasSubstr("7 devices cannot be split evenly over 2 processes")));
  EXPECT_THAT(
      [] {
        (void)create_mesh({2, 4}, {"a", "b"}, opts(8, 2, 1, Shape{-1}));
      },
      ThrowsMessage<ValueError>(HasSubstr("must have one entry per mesh axis")));
}

TEST(CreateMeshTest, MultiSlice) {
  const auto layout = create_mesh_layout({3, 4}, {"a", "b"}, opts(12, 1, 2));
  EXPECT_THAT(layout.local_shape, ElementsAre(3, 2));
  EXPECT_THAT(layout.dcn_shape, ElementsAre(1, 2));
  EXPECT_THAT(layout.mesh.sizes(), ElementsAre(3, 4));
  EXPECT_THAT(
      [] {
        (void)create_mesh({3, 3}, {"a", "b"}, opts(9, 1, 2));
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "Multi-slice detected (num_slices=2) but no mesh axis in (3, 3) is divisible")));
}

TEST(ParseMeshFromStringTest, NamedAndPositional) {
  const auto named = parse_mesh_from_string("tp:4,dp: 2", {"dp", "tp"});
  EXPECT_THAT(named.axis_dims, ElementsAre(4, 2));
  EXPECT_THAT(named.axis_names, ElementsAre("tp", "dp"));
  EXPECT_THAT(parse_mesh_from_string("1,-1, +2,1_0", {"a", "b", "c", "d"}).axis_dims,
              ElementsAre(1, -1, 2, 10));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("dp:2,xx:4", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(
          HasSubstr("Axis name 'xx' not found in provided names: ['dp', 'tp']")));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("dp:2,dp:4", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("Not all axis names were used in 'axis_dims'")));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("2,4,1", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("Number of dimensions and names must match")));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("2,x", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("invalid literal for int() with base 10: 'x'")));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("2,99999999999999999999", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "mesh dimension '99999999999999999999' is too large (at most 9223372036854775807)")));
  EXPECT_THAT(parse_mesh_from_string("9223372036854775807", {"dp"}).axis_dims,
              ElementsAre(std::numeric_limits<std::int64_t>::max()));
  EXPECT_THAT(
      [] {
        (void)parse_mesh_from_string("dp:2,4", {"dp", "tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("not enough values to unpack (expected 2, got 1)")));
  EXPECT_THAT([] { (void)parse_mesh_from_string("dp:2:3", {"dp"}); },
              ThrowsMessage<ValueError>(HasSubstr("too many values to unpack (expected 2)")));
}

TEST(MeshPartitionHelperTest, FallbackQuirkAndErrors) {
  const MeshPartitionHelper helper(Mesh({"dp", "fsdp", "tp", "sp"}, {2, 2, 2, 1}));
  // eformer quirk: ('fsdp', 'sp') is assigned without a divisibility check.
  EXPECT_EQ(helper.auto_partition_spec({1, 8}, 1024), (PartitionSpec{"fsdp", "sp"}));
  EXPECT_EQ(helper.auto_partition_spec({}), PartitionSpec());
  EXPECT_THAT([&] { (void)helper.create_partition_spec({4096}, {{"model"}}); },
              ThrowsMessage<KeyError>(HasSubstr("model")));
  EXPECT_THAT(
      [&] {
        (void)helper.create_partition_spec({3}, {{"fsdp", "sp"}});
      },
      ThrowsMessage<IndexError>(HasSubstr("list index out of range")));
  const MeshPartitionHelper zero(Mesh({"dp"}, {0}));
  EXPECT_THAT([&] { (void)zero.create_partition_spec({4096}, {{"dp"}}); },
              ThrowsMessage<ValueError>(HasSubstr("integer division or modulo by zero")));
  // Methods of 0 or 3 axes are ignored.
  EXPECT_EQ(helper.create_partition_spec({4096}, {{}, {"dp", "tp", "sp"}}), PartitionSpec{nullptr});
}

}  // namespace
}  // namespace numesh::sharding
