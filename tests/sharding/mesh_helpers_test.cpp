#include "numesh/sharding/mesh_helpers.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const Mesh kFiveAxes({"dp", "fsdp", "ep", "tp", "sp"}, {1, 4, 2, 2, 2});

TEST(GetInContextMeshTest, RaisesOrReturnsEmpty) {
  EXPECT_THAT([] { (void)get_incontext_mesh(); },
              ThrowsMessage<NoMeshError>(HasSubstr("No mesh found under this context manager.")));
  EXPECT_TRUE(get_incontext_mesh(false).empty());
  MeshScope scope(kFiveAxes);
  EXPECT_EQ(get_incontext_mesh(), kFiveAxes);
}

TEST(GetAxesSizeInMeshTest, NamesSequencesAndErrors) {
  EXPECT_EQ(get_axes_size_in_mesh("fsdp", &kFiveAxes), 4);
  EXPECT_EQ(get_axes_size_in_mesh(std::vector<std::string>{"fsdp", "tp"}, &kFiveAxes), 8);
  EXPECT_EQ(get_axes_size_in_mesh(std::vector<std::string>{}, &kFiveAxes), 1);
  EXPECT_EQ(get_axes_size_in_mesh(AxisRule::list({"ep", "sp"}), &kFiveAxes), 4);
  EXPECT_THAT([] { (void)get_axes_size_in_mesh("missing", &kFiveAxes); },
              ThrowsMessage<KeyError>(HasSubstr("missing")));
  try {
    (void)get_axes_size_in_mesh(AxisRule::tuple({"fsdp", nullptr}), &kFiveAxes);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "None");
  }
  EXPECT_THAT([] { (void)get_axes_size_in_mesh(AxisRule::integer(5), &kFiveAxes); },
              ThrowsMessage<TypeError>(
                  HasSubstr("axis_names must be str or Sequence[str], got <class 'int'>")));
  EXPECT_THAT([] { (void)get_axes_size_in_mesh(AxisRule(), &kFiveAxes); },
              ThrowsMessage<TypeError>(HasSubstr("got <class 'NoneType'>")));
  EXPECT_THAT([] { (void)get_axes_size_in_mesh("dp"); },
              ThrowsMessage<NoMeshError>(HasSubstr("No mesh found")));
  MeshScope scope(kFiveAxes);
  EXPECT_EQ(get_axes_size_in_mesh("sp"), 2);
  EXPECT_THAT(get_mesh_axis_names(), ElementsAre("dp", "fsdp", "ep", "tp", "sp"));
}

TEST(SubmeshTest, RowMajorOverGivenAxes) {
  const std::vector<std::int64_t> coords{0, 2, 0, 1, 1};
  EXPECT_EQ(get_submesh_device_index(kFiveAxes, coords, {"tp", "fsdp"}), 6);
  EXPECT_EQ(get_submesh_device_index(kFiveAxes, coords, {"fsdp", "tp"}), 5);
  EXPECT_EQ(get_submesh_device_index(kFiveAxes, coords, {}), 0);
  EXPECT_EQ(get_mesh_axis_size(kFiveAxes, {"fsdp", "ep", "tp", "sp"}), 32);
  EXPECT_EQ(get_mesh_axis_size(kFiveAxes, {}), 1);
}

TEST(SubmeshTest, Errors) {
  EXPECT_THAT(
      [] {
        (void)get_submesh_device_index(kFiveAxes, {0, 1}, {"tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("need one entry per axis")));
  EXPECT_THAT(
      [] {
        (void)get_submesh_device_index(kFiveAxes, {0, 4, 0, 0, 0}, {"tp"});
      },
      ThrowsMessage<ValueError>(HasSubstr("outside axis 'fsdp' of size 4")));
  EXPECT_THAT(
      [] {
        (void)get_submesh_device_index(kFiveAxes, {0, 0, 0, 0, 0}, {"zz"});
      },
      ThrowsMessage<KeyError>(HasSubstr("unbound axis name: zz")));
  EXPECT_THAT([] { (void)get_mesh_axis_size(kFiveAxes, {"zz"}); },
              ThrowsMessage<KeyError>(HasSubstr("unbound axis name: zz")));
}

TEST(GetSafeHashIntTest, MatchesHashlib) {
  EXPECT_EQ(get_safe_hash_int("hello world"), "125893641179230474042701625388361764291");
  EXPECT_EQ(get_safe_hash_int("abc", "sha1"), "968236873715988614170569073515315707566766479517");
  // Python: int.from_bytes(hashlib.sha256(b"").digest(), "big")
  EXPECT_EQ(get_safe_hash_int("", "sha256"),
            "102987336249554097029535212322581322789799900648198034993379397001115665086549");
  EXPECT_EQ(get_safe_hash_int("x", "blake2s"),
            "106831607379052878869266862741693208909680252247511063010881597210989545954060");
  EXPECT_EQ(get_safe_hash_int("abc", "sha3_256"),
            "26503352344809812503781852260497330104742418796726218580378611674310760404274");
}

TEST(GetSafeHashIntTest, UnknownAlgorithm) {
  EXPECT_THAT([] { (void)get_safe_hash_int("x", "not_a_real_hash"); },
              ThrowsMessage<ValueError>(HasSubstr("Unsupported hash algorithm: not_a_real_hash")));
  EXPECT_THAT([] { (void)get_safe_hash_int("x", "MD5"); },  // case-sensitive, as getattr
              ThrowsMessage<ValueError>(HasSubstr("Unsupported hash algorithm: MD5")));
  EXPECT_THAT([] { (void)get_safe_hash_int("x", "shake_128"); },
              ThrowsMessage<ValueError>(HasSubstr("Unsupported hash algorithm: shake_128")));
}

TEST(NamesInCurrentMeshTest, SubsetOfCurrentAxes) {
  EXPECT_TRUE(names_in_current_mesh({}));
  EXPECT_FALSE(names_in_current_mesh({"dp"}));
  MeshScope scope(Mesh({"dp", "tp"}, {2, 4}));
  EXPECT_TRUE(names_in_current_mesh({"dp", "tp"}));
  EXPECT_FALSE(names_in_current_mesh({"dp", "zz"}));
}

TEST(GetNamesFromPartitionSpecTest, CollectsSortedUniqueNames) {
  EXPECT_THAT(get_names_from_partition_spec(std::vector<PartitionSpec>{
                  PartitionSpec{"x", AxisRule::tuple({"z", "y"})}, PartitionSpec{nullptr, "x"}}),
              ElementsAre("x", "y", "z"));
  EXPECT_THAT(get_names_from_partition_spec(std::map<std::string, PartitionSpec>{
                  {"a", PartitionSpec{"dp"}}, {"b", PartitionSpec()}}),
              ElementsAre("dp"));
  EXPECT_THAT([] { (void)get_names_from_partition_spec({PartitionSpec{AxisRule::integer(5)}}); },
              ThrowsMessage<TypeError>(HasSubstr("'int' object is not iterable")));
  EXPECT_THAT(
      [] { (void)get_names_from_partition_spec({PartitionSpec{AxisRule::unconstrained()}}); },
      ThrowsMessage<TypeError>(HasSubstr("'UnconstrainedSingleton' object is not iterable")));
}

}  // namespace
}  // namespace numesh::sharding
