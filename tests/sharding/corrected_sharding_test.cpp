#include "numesh/sharding/corrected_sharding.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

const Mesh kMesh({"dp", "fsdp", "tp"}, {2, 4, 1});

TEST(CorrectSpecTest, KeepsFittingEntriesAndPadsToRank) {
  const auto r = correct_spec({8, 6, 5}, PartitionSpec{"fsdp"}, kMesh);
  EXPECT_EQ(r.spec, (PartitionSpec{"fsdp", nullptr, nullptr}));
  EXPECT_THAT(r.corrections, IsEmpty());
}

TEST(CorrectSpecTest, ReportsMissingAxisWithItsName) {
  const auto r =
      correct_spec({8, 8}, PartitionSpec{AxisRule::tuple({"dp", "model"}), "fsdp"}, kMesh);
  EXPECT_EQ(r.spec, (PartitionSpec{nullptr, "fsdp"}));
  ASSERT_EQ(r.corrections.size(), 1U);
  EXPECT_EQ(r.corrections[0].dim, 0U);
  EXPECT_EQ(r.corrections[0].reason, CorrectionReason::kAxisNotInMesh);
  EXPECT_EQ(r.corrections[0].missing_axis, "model");
  EXPECT_THAT(r.corrections[0].message(), HasSubstr("axis model is not in the mesh"));
}

TEST(CorrectSpecTest, ReportsNonDivisibleDimWithSizes) {
  const auto r = correct_spec({12, 32}, PartitionSpec{AxisRule::tuple({"dp", "fsdp"})}, kMesh);
  EXPECT_EQ(r.spec, PartitionSpec());  // all None collapses to P()
  ASSERT_EQ(r.corrections.size(), 1U);
  EXPECT_EQ(r.corrections[0].reason, CorrectionReason::kNotDivisible);
  EXPECT_EQ(r.corrections[0].dim_size, 12);
  EXPECT_EQ(r.corrections[0].mesh_size, 8);
  EXPECT_THAT(r.corrections[0].message(), HasSubstr("extent 12 is not divisible by mesh size 8"));
}

TEST(CorrectSpecTest, ReportsTruncatedAndUnsupportedEntries) {
  const auto r = correct_spec({4}, PartitionSpec{AxisRule::unconstrained(), "dp", nullptr}, kMesh);
  EXPECT_EQ(r.spec, PartitionSpec());
  ASSERT_EQ(r.corrections.size(), 2U);  // the trailing None is not a correction
  EXPECT_EQ(r.corrections[0].reason, CorrectionReason::kUnsupportedEntry);
  EXPECT_EQ(r.corrections[1].reason, CorrectionReason::kBeyondRank);
  EXPECT_EQ(r.corrections[1].dim, 1U);
  EXPECT_THAT(r.corrections[1].message(), HasSubstr("the array has rank 1"));
}

TEST(CorrectSpecTest, NoneInsideTupleDropsTheDim) {
  const auto r = correct_spec({8}, PartitionSpec{AxisRule::tuple({"dp", nullptr})}, kMesh);
  EXPECT_EQ(r.spec, PartitionSpec());
  ASSERT_EQ(r.corrections.size(), 1U);
  EXPECT_EQ(r.corrections[0].missing_axis, "None");
}

TEST(CorrectSpecTest, SizeOneAxesAndZeroExtentsAreKept) {
  EXPECT_EQ(correct_spec({3, 0}, PartitionSpec{"tp", "fsdp"}, kMesh).spec,
            (PartitionSpec{"tp", "fsdp"}));
}

TEST(GetCorrectedNamedShardingTest, NoMeshRaisesOrWarns) {
  EXPECT_THAT([] { (void)get_corrected_named_sharding({16}, PartitionSpec{"dp"}); },
              ThrowsMessage<NoMeshError>(HasSubstr("No mesh found under this context manager.")));
  std::vector<std::string> warnings;
  const auto ns = get_corrected_named_sharding({16}, PartitionSpec{"dp"}, false, &warnings);
  EXPECT_TRUE(ns.mesh().empty());
  EXPECT_EQ(ns.spec(), PartitionSpec());
  EXPECT_THAT(warnings, ElementsAre(kEmptyMeshWarning));
  // A null warnings list is allowed.
  EXPECT_EQ(get_corrected_named_sharding({16}, PartitionSpec{"dp"}, false).spec(), PartitionSpec());
}

TEST(GetCorrectedNamedShardingTest, UsesCurrentOrExplicitMesh) {
  {
    MeshScope scope(kMesh);
    EXPECT_EQ(get_corrected_named_sharding({6, 8}, PartitionSpec{"dp", "fsdp"}).spec(),
              (PartitionSpec{"dp", "fsdp"}));
  }
  const Mesh other({"x"}, {3});
  const auto ns = get_corrected_named_sharding({6}, PartitionSpec{"x"}, other);
  EXPECT_EQ(ns.mesh(), other);
  EXPECT_EQ(ns.spec(), PartitionSpec{"x"});
  EXPECT_THAT([] { (void)get_corrected_named_sharding({6}, PartitionSpec{"x"}, Mesh({"x"}, {0})); },
              ThrowsMessage<NoMeshError>(HasSubstr("No mesh found")));
}

TEST(GetCorrectedNamedShardingTest, DuplicatesSurviveCorrectionAndThrow) {
  MeshScope scope(kMesh);
  EXPECT_THAT(
      [] {
        (void)get_corrected_named_sharding({4, 4}, PartitionSpec{"dp", "dp"});
      },
      ThrowsMessage<DuplicateSpecError>(HasSubstr("has duplicate entries for `dp`")));
}

TEST(WithShardingConstraintTest, NoMeshOrEmptySpecAppliesNothing) {
  EXPECT_FALSE(with_sharding_constraint({8}, PartitionSpec{"dp"}).has_value());
  MeshScope scope(kMesh);
  EXPECT_FALSE(with_sharding_constraint({8}, PartitionSpec()).has_value());
  const auto applied = with_sharding_constraint({3}, PartitionSpec{"dp"});
  ASSERT_TRUE(applied.has_value());
  EXPECT_EQ(applied->spec(), PartitionSpec());  // corrected to all-None: replicate constraint
}

TEST(WithShardingConstraintTest, NamedShardingFormIgnoresCurrentMesh) {
  const NamedSharding ns(Mesh({"x"}, {2}), PartitionSpec{"x"});
  const auto applied = with_sharding_constraint({4, 4}, ns);
  ASSERT_TRUE(applied.has_value());
  EXPECT_EQ(applied->spec(), (PartitionSpec{"x", nullptr}));
  EXPECT_EQ(applied->mesh(), ns.mesh());
}

TEST(WithShardingConstraintTest, DuplicateAfterCorrectionThrows) {
  MeshScope scope(kMesh);
  EXPECT_THAT(
      [] {
        (void)with_sharding_constraint({4, 4}, PartitionSpec{"dp", "dp"});
      },
      ThrowsMessage<DuplicateSpecError>(HasSubstr("P('dp', 'dp')")));
}

TEST(WithShardingConstraintTest, LeavesWithoutArraysAreUntouched) {
  MeshScope scope(kMesh);
  const std::vector<NamedLeaf> leaves{
      {"a", ArrayInfo{{16, 32}}}, {"b/0", ArrayInfo{{6}}}, {"b/1", std::nullopt}};
  const auto r = with_sharding_constraint_tree(leaves, PartitionSpec{"fsdp"});
  ASSERT_EQ(r.size(), 3U);
  EXPECT_EQ(r[0]->spec(), (PartitionSpec{"fsdp", nullptr}));
  EXPECT_EQ(r[1]->spec(), PartitionSpec());
  EXPECT_FALSE(r[2].has_value());
  const auto named =
      with_sharding_constraint_tree(leaves, NamedSharding(kMesh, PartitionSpec{"dp"}));
  EXPECT_EQ(named[1]->spec(), PartitionSpec{"dp"});
  EXPECT_FALSE(named[2].has_value());
}

}  // namespace
}  // namespace numesh::sharding
