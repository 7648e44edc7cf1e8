#include "numesh/sharding/sharding_strategy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::ThrowsMessage;

using fixtures::kDpTp;  // device = dp * 4 + tp
using fixtures::leaf;

// ---- analyze_sharding_strategy: the filled-in fields, worked by hand ------------------------

TEST(AnalyzeShardingStrategyTest, HandComputedExample) {
  // w (8, 6) f32 over (dp, tp): 8 rows / 2 = 4; 6 cols split 4 ways are 2, 2, 2, 0 (ceil chunks)
  //   -> 4*2*4 = 32 bytes on tp = 0..2, 0 bytes on tp = 3.
  // b (10,) f16 replicated -> 20 bytes everywhere.
  // x (30, 7) f32 over tp: 30 rows split 4 ways are 8, 8, 8, 6 -> 224, 224, 224, 168 bytes.
  // s () f32 replicated -> 4 bytes everywhere.
  // Per device: tp 0..2 hold 32 + 20 + 224 + 4 = 280; tp 3 holds 0 + 20 + 168 + 4 = 192.
  const std::vector<NamedLeaf> leaves{leaf("w", {8, 6}), leaf("b", {10}, "float16"),
                                      leaf("x", {30, 7}), leaf("s", {})};
  const std::vector<PartitionSpec> specs{PartitionSpec{"dp", "tp"}, PartitionSpec(),
                                         PartitionSpec{"tp"}, PartitionSpec()};
  const ShardingAnalysis a = analyze_sharding_strategy(leaves, specs, kDpTp);
  EXPECT_EQ(a.total_parameters, 48 + 10 + 210 + 1);
  EXPECT_EQ(a.sharded_parameters, 48 + 210);
  EXPECT_THAT(a.memory_per_device, ElementsAre(280, 280, 280, 192, 280, 280, 280, 192));
  EXPECT_DOUBLE_EQ(a.balance_score, 192.0 / 280.0);
  EXPECT_EQ(a.partition_stats.leaves, 4);
  EXPECT_EQ(a.partition_stats.sharded_leaves, 2);
  EXPECT_EQ(a.partition_stats.replicated_leaves, 2);
  EXPECT_THAT(a.partition_stats.axis_usage, ElementsAre(Pair("dp", 1), Pair("tp", 2)));
}

TEST(AnalyzeShardingStrategyTest, TupleEntriesSplitOverTheProductDpMajor) {
  // (16,) f32 over ('dp', 'tp'): 8 shards of 2 elements = 8 bytes each; even -> balance 1.
  const auto a = analyze_sharding_strategy({leaf("w", {16})},
                                           {PartitionSpec{AxisRule::tuple({"dp", "tp"})}}, kDpTp);
  EXPECT_THAT(a.memory_per_device, ElementsAre(8, 8, 8, 8, 8, 8, 8, 8));
  EXPECT_DOUBLE_EQ(a.balance_score, 1.0);
  // (12,) over ('tp', 'dp'): chunk 2, shard index = tp * 2 + dp; index 6 and 7 hold nothing,
  // i.e. tp = 3 on both dp rows.
  const auto b = analyze_sharding_strategy({leaf("w", {12})},
                                           {PartitionSpec{AxisRule::tuple({"tp", "dp"})}}, kDpTp);
  EXPECT_THAT(b.memory_per_device, ElementsAre(8, 8, 8, 0, 8, 8, 8, 0));
  EXPECT_DOUBLE_EQ(b.balance_score, 0.0);
}

TEST(AnalyzeShardingStrategyTest, NoneSpecCountsAsShardedParametersButReplicatedLeaf) {
  const auto a = analyze_sharding_strategy({leaf("x", {4, 4})}, {PartitionSpec{nullptr}}, kDpTp);
  EXPECT_EQ(a.sharded_parameters, 16);  // eformer: P(None) != P()
  EXPECT_EQ(a.partition_stats.replicated_leaves, 1);
  EXPECT_DOUBLE_EQ(a.balance_score, 1.0);
}

TEST(AnalyzeShardingStrategyTest, Errors) {
  EXPECT_THAT([] { (void)analyze_sharding_strategy({leaf("x", {4})}, {}, kDpTp); },
              ThrowsMessage<ValueError>(HasSubstr("1 leaves but 0 partition specs")));
  EXPECT_THAT(
      [] {
        (void)analyze_sharding_strategy({leaf("x", {4})}, {PartitionSpec{nullptr, "tp"}}, kDpTp);
      },
      ThrowsMessage<ValueError>(
          "spec P(None, 'tp') of leaf 'x' shards dim 1, but the array has rank 1"));
  EXPECT_THAT(
      [] { (void)analyze_sharding_strategy({leaf("x", {4})}, {PartitionSpec{"fsdp"}}, kDpTp); },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'fsdp' is not in the mesh")));
  EXPECT_THAT(
      [] {
        (void)analyze_sharding_strategy({NamedLeaf{"n", std::nullopt}}, {PartitionSpec()}, kDpTp);
      },
      ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  EXPECT_THAT([] { (void)analyze_sharding_strategy({leaf("x", {4})}, {PartitionSpec()}); },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
}

// ---- validate_sharding_config ----------------------------------------------------------------

TEST(ValidateShardingConfigTest, MessagesMatchEformer) {
  const auto issues =
      validate_sharding_config({leaf("w", {4096, 4096}), leaf("x", {30, 7})},
                               {PartitionSpec{"tp", "dp"}, PartitionSpec{"tp"}}, kDpTp);
  EXPECT_THAT(issues,
              ElementsAre("Array at (DictKey(key='x'),) with shape (30, 7) not divisible by mesh "
                          "axis tp size 4",
                          "Small array at (DictKey(key='x'),) might not benefit from sharding"));
}

TEST(ValidateShardingConfigTest, TupleEntriesUseTheProduct) {
  const auto issues = validate_sharding_config(
      {leaf("params/w", {6})}, {PartitionSpec{AxisRule::tuple({"dp", "tp"})}}, kDpTp);
  EXPECT_THAT(issues, ElementsAre("Array at (DictKey(key='params'), DictKey(key='w')) with shape "
                                  "(6,) not divisible by mesh axis ('dp', 'tp') size 8",
                                  "Small array at (DictKey(key='params'), DictKey(key='w')) might "
                                  "not benefit from sharding"));
  EXPECT_THAT(validate_sharding_config({leaf("w", {4096})},
                                       {PartitionSpec{AxisRule::tuple({"dp", "tp"})}}, kDpTp),
              IsEmpty());
}

TEST(ValidateShardingConfigTest, UsesTheCurrentMesh) {
  MeshScope scope(kDpTp);
  EXPECT_THAT(validate_sharding_config({leaf("b", {10})}, {PartitionSpec{nullptr}}),
              ElementsAre("Small array at (DictKey(key='b'),) might not benefit from sharding"));
}

TEST(ValidateShardingConfigTest, Errors) {
  EXPECT_THAT([] { (void)validate_sharding_config({leaf("x", {4})}, {}, kDpTp); },
              ThrowsMessage<ValueError>(HasSubstr("validate_sharding_config: 1 leaves but 0")));
  EXPECT_THAT(
      [] {
        (void)validate_sharding_config({leaf("x", {4})}, {PartitionSpec{nullptr, "tp"}}, kDpTp);
      },
      ThrowsMessage<IndexError>("tuple index out of range"));
  // A None entry past the rank is never indexed (eformer).
  EXPECT_THAT(validate_sharding_config({leaf("x", {4096})}, {PartitionSpec{"tp", nullptr}}, kDpTp),
              IsEmpty());
  EXPECT_THAT(
      [] { (void)validate_sharding_config({leaf("x", {4})}, {PartitionSpec{"missing"}}, kDpTp); },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'missing' is not in the mesh")));
  EXPECT_THAT(
      [] {
        (void)validate_sharding_config({NamedLeaf{"n", std::nullopt}}, {PartitionSpec()}, kDpTp);
      },
      ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  EXPECT_THAT([] { (void)validate_sharding_config({leaf("x", {4})}, {PartitionSpec()}); },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
}

TEST(ReprTest, KeyPathsAndShapes) {
  EXPECT_EQ(jax_keypath_repr("x"), "(DictKey(key='x'),)");
  EXPECT_EQ(jax_keypath_repr("layers/0/w"),
            "(DictKey(key='layers'), SequenceKey(idx=0), DictKey(key='w'))");
  EXPECT_EQ(jax_keypath_repr(""), "()");
  EXPECT_EQ(jax_keypath_repr("it's"), "(DictKey(key=\"it's\"),)");
  EXPECT_EQ(python_shape_repr({}), "()");
  EXPECT_EQ(python_shape_repr({10}), "(10,)");
  EXPECT_EQ(python_shape_repr({30, 7}), "(30, 7)");
}

// ---- optimize_sharding_for_memory --------------------------------------------------------------

TEST(OptimizeShardingForMemoryTest, OnlyLeavesOverTheBudgetAreSharded) {
  const std::vector<NamedLeaf> leaves{leaf("big", {4096, 4096}), leaf("small", {4})};
  // Default names are the mesh axes in mesh order: 'dp' is tried before 'tp'.
  EXPECT_THAT(optimize_sharding_for_memory(leaves, kDpTp, 1 << 20),
              ElementsAre(PartitionSpec{"dp", "tp"}, PartitionSpec()));
  // No budget: everything replicated.
  EXPECT_THAT(optimize_sharding_for_memory(leaves, kDpTp),
              ElementsAre(PartitionSpec(), PartitionSpec()));
  // An empty names list falls through to auto_partition_spec's size-sorted default.
  EXPECT_THAT(optimize_sharding_for_memory(leaves, kDpTp, 1 << 20, std::vector<AxisRule>{}),
              ElementsAre(PartitionSpec{"tp", "dp"}, PartitionSpec()));
  // The comparison is strict: a leaf of exactly the budget is sharded.
  EXPECT_THAT(optimize_sharding_for_memory({leaf("e", {16})}, kDpTp, 64),
              ElementsAre(PartitionSpec{"dp"}));
}

TEST(OptimizeShardingForMemoryTest, Errors) {
  EXPECT_THAT([] { (void)optimize_sharding_for_memory({leaf("x", {4})}); },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  EXPECT_THAT(
      [] {
        (void)optimize_sharding_for_memory({NamedLeaf{"n", std::nullopt}}, kDpTp);
      },
      ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  EXPECT_THAT(
      [] {
        (void)optimize_sharding_for_memory({leaf("x", {64})}, kDpTp, 1,
                                           std::vector<AxisRule>{"ep"});
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'ep' is not in the mesh")));
  EXPECT_THAT([] { (void)optimize_sharding_for_memory({leaf("x", {64}, "float7")}, kDpTp, 1); },
              ThrowsMessage<ValueError>("unknown dtype 'float7'"));
}

// ---- convert_sharding_strategy -----------------------------------------------------------------

TEST(ConvertShardingStrategyTest, PreserveBalanceUsesTheOldParallelFactor) {
  const Mesh new_mesh({"x"}, {16});
  const NamedSpecs old{{"w", PartitionSpec{AxisRule::tuple({"dp", "tp"})}}, {"b", PartitionSpec()}};
  // factor 8 for w (the tuple's product), 1 for b; a (64, 64) array clears both.
  const auto out = convert_sharding_strategy(ArrayInfo{{64, 64}, "float32"}, old, kDpTp, new_mesh);
  EXPECT_THAT(out, ElementsAre(Pair("w", PartitionSpec{"x", nullptr}),
                               Pair("b", PartitionSpec{"x", nullptr})));
  // A factor above the array size leaves the array replicated (w); b's factor 1 lets the
  // walk run, and no axis divides 2.
  const auto small = convert_sharding_strategy(ArrayInfo{{2}, "float32"}, old, kDpTp, new_mesh);
  EXPECT_THAT(small, ElementsAre(Pair("w", PartitionSpec()), Pair("b", PartitionSpec{nullptr})));
}

TEST(ConvertShardingStrategyTest, UnknownStrategyYieldsNothingAndUnknownAxisIsKeyError) {
  const NamedSpecs old{{"w", PartitionSpec{"dp"}}};
  EXPECT_THAT(
      convert_sharding_strategy(ArrayInfo{{64}, "float32"}, old, kDpTp, kDpTp, "something_else"),
      IsEmpty());
  EXPECT_THAT(
      [] {
        (void)convert_sharding_strategy(ArrayInfo{{64}, "float32"},
                                        {{"w", PartitionSpec{"nonexistent"}}}, kDpTp, kDpTp);
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'nonexistent' is not in the mesh")));
}

}  // namespace
}  // namespace numesh::sharding
