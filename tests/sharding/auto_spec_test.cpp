#include "numesh/sharding/auto_spec.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using fixtures::kDpTp;
const Mesh kFsdp8({"dp", "fsdp", "ep", "tp", "sp"}, {1, 8, 1, 1, 1});

ArrayInfo array(std::vector<std::int64_t> shape) { return ArrayInfo{std::move(shape), "float32"}; }

TEST(AutoSpecTest, LargestDimTakesLargestAxisAndSizeOneAxesAreAssignedToo) {
  EXPECT_EQ(auto_partition_spec(array({64, 64}), kDpTp), (PartitionSpec{"tp", "dp"}));
  // SPEC 0.26: size-1 axes divide everything, so the second dim gets 'dp' (size 1).
  EXPECT_EQ(auto_partition_spec(array({4096, 4096}), kFsdp8), (PartitionSpec{"fsdp", "dp"}));
}

TEST(AutoSpecTest, TiesKeepIndexOrderAndReverseVisitsSmallDimsFirst) {
  EXPECT_EQ(auto_partition_spec(array({8, 16}), kDpTp), (PartitionSpec{"dp", "tp"}));
  EXPECT_EQ(auto_partition_spec(array({8, 16}), kDpTp, std::nullopt, std::nullopt, true),
            (PartitionSpec{"tp", "dp"}));
}

TEST(AutoSpecTest, MinShardingSizeDefaultsToDeviceCountAndZeroMeansDefault) {
  EXPECT_EQ(auto_partition_spec(array({7}), kDpTp), PartitionSpec());  // 7 < 8 devices
  EXPECT_EQ(auto_partition_spec(array({7}), kDpTp, std::nullopt, 0), PartitionSpec());
  EXPECT_EQ(auto_partition_spec(array({8}), kDpTp, std::nullopt, 0), PartitionSpec{"tp"});
  EXPECT_EQ(auto_partition_spec(array({2, 3}), kDpTp, std::nullopt, 1),
            (PartitionSpec{"dp", nullptr}));
  EXPECT_EQ(auto_partition_spec(array({}), kDpTp, std::nullopt, 1), PartitionSpec());
}

TEST(AutoSpecTest, TupleNamesShardOverTheProduct) {
  const std::vector<AxisRule> names{AxisRule::tuple({"dp", "tp"})};
  EXPECT_EQ(auto_partition_spec(array({16, 4}), kDpTp, names, 1),
            (PartitionSpec{AxisRule::tuple({"dp", "tp"}), nullptr}));
  EXPECT_EQ(entry_mesh_size(kDpTp, AxisRule::tuple({})), 1);
}

TEST(AutoSpecTest, VrnKeepsDuplicatesAutoDoesNot) {
  const std::vector<AxisRule> names{"dp", "dp"};
  EXPECT_EQ(auto_partition_spec(array({8, 8}), kDpTp, names, 1), (PartitionSpec{"dp", nullptr}));
  EXPECT_EQ(vrn_auto_partition_spec(array({8, 8}), kDpTp, names, 1), (PartitionSpec{"dp", "dp"}));
}

TEST(AutoSpecTest, EmptyTupleCandidateIsSkippedByAutoButAssignedByVrn) {
  const std::vector<AxisRule> names{AxisRule::tuple({}), "tp"};
  // auto: () divides dim 0 but is falsy, so dim 0 stays None and () is not used up; dim 1
  // again finds () first.
  EXPECT_EQ(auto_partition_spec(array({8, 8}), kDpTp, names, 1), (PartitionSpec{nullptr, nullptr}));
  // vrn: () is assigned (and canonicalised to None), then 'tp' takes dim 1.
  EXPECT_EQ(vrn_auto_partition_spec(array({8, 8}), kDpTp, names, 1),
            (PartitionSpec{nullptr, "tp"}));
}

TEST(AutoSpecTest, FallsBackToTheCurrentMesh) {
  MeshScope scope(kDpTp);
  EXPECT_EQ(auto_partition_spec(array({64, 64})), (PartitionSpec{"tp", "dp"}));
  EXPECT_EQ(vrn_auto_partition_spec(array({64, 64})), (PartitionSpec{"tp", "dp"}));
}

TEST(AutoSpecTest, ReasoningExplainsEachDecision) {
  AutoSpecOptions options;
  options.min_sharding_size = 1;
  const AutoSpec a = auto_spec(array({4096, 3}), kDpTp, options);
  EXPECT_EQ(a.spec, (PartitionSpec{"tp", nullptr}));
  EXPECT_THAT(a.reasoning,
              Contains(HasSubstr("candidates in order: 'tp' (size 4), 'dp' (size 2)")));
  EXPECT_THAT(a.reasoning, Contains(HasSubstr("dim 0 (size 4096) takes 'tp' (size 4)")));
  EXPECT_THAT(a.reasoning, Contains(HasSubstr("dim 1 (size 3): no remaining candidate divides 3")));
  EXPECT_THAT(a.reasoning, Contains("result: P('tp', None)"));

  const AutoSpec small = auto_spec(array({2}), kDpTp);
  EXPECT_EQ(small.spec, PartitionSpec());
  EXPECT_THAT(small.reasoning, Contains(HasSubstr("fewer than min_sharding_size 8")));
}

TEST(AutoSpecTest, NoMeshIsAnError) {
  for (auto algo : {AutoSpecAlgorithm::kAuto, AutoSpecAlgorithm::kVrn}) {
    AutoSpecOptions options;
    options.algorithm = algo;
    EXPECT_THAT([&] { (void)auto_spec(array({8}), std::nullopt, options); },
                ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  }
  EXPECT_THAT([] { (void)auto_partition_spec(array({8})); },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
}

TEST(AutoSpecTest, UnknownNameIsKeyErrorEvenIfAnEarlierNameWouldDo) {
  const std::vector<AxisRule> names{"tp", "fsdp"};
  EXPECT_THAT(
      [&] { (void)auto_partition_spec(array({16}), kDpTp, names, 1); },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'fsdp' is not in the mesh ('dp', 'tp')")));
  try {
    (void)vrn_auto_partition_spec(array({16}), kDpTp,
                                  std::vector<AxisRule>{AxisRule::tuple({"dp", "x"})}, 1);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "x");
  }
}

TEST(AutoSpecTest, CandidatesThatAreNotNamesAreTypeErrors) {
  EXPECT_THAT(
      [] { (void)auto_partition_spec(array({16}), kDpTp, std::vector<AxisRule>{nullptr}, 1); },
      ThrowsMessage<TypeError>(
          "expected a mesh axis name or a tuple of mesh axis names, got None"));
  const std::vector<AxisRule> nested{AxisRule::tuple({"dp", AxisRule::tuple({"tp"})})};
  EXPECT_THAT(
      [&] { (void)auto_partition_spec(array({16}), kDpTp, nested, 1); },
      ThrowsMessage<TypeError>(HasSubstr("a tuple of mesh axis names may only hold names")));
  EXPECT_THAT([] { (void)entry_mesh_size(kDpTp, AxisRule::integer(3)); },
              ThrowsMessage<TypeError>(HasSubstr("got 3")));
}

}  // namespace
}  // namespace numesh::sharding
