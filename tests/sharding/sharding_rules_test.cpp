#include "numesh/sharding/sharding_rules.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using fixtures::kDpTp;
using fixtures::leaf;

const NamedLeaf kNoArray{"n", std::nullopt};

// ---- AutoShardingRule ----------------------------------------------------------------------

TEST(AutoShardingRuleTest, TriesAxesInTheGivenOrder) {
  AutoShardingRule rule(kDpTp, std::vector<std::string>{"tp", "dp", "tp"}, 1);
  EXPECT_THAT(
      rule.apply({leaf("w", {4096, 4096}), leaf("s", {3, 5}), leaf("b", {6})}),
      ElementsAre(PartitionSpec{"tp", "dp"}, PartitionSpec{nullptr, nullptr}, PartitionSpec{"dp"}));
  EXPECT_EQ(
      AutoShardingRule(kDpTp, std::vector<std::string>{"tp"}, 1, /*reverse=*/true).spec_for({8, 4}),
      (PartitionSpec{nullptr, "tp"}));
}

TEST(AutoShardingRuleTest, DefaultsAreMeshAxesAndDeviceCount) {
  AutoShardingRule rule(kDpTp);
  EXPECT_EQ(rule.spec_for({7}), PartitionSpec());  // 7 < 8 devices
  EXPECT_EQ(rule.spec_for({8, 8}), (PartitionSpec{"dp", "tp"}));
  MeshScope scope(kDpTp);
  EXPECT_EQ(AutoShardingRule().spec_for({8, 8}), (PartitionSpec{"dp", "tp"}));
}

TEST(AutoShardingRuleTest, Errors) {
  EXPECT_THAT([] { AutoShardingRule rule; },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  AutoShardingRule rule(kDpTp, std::vector<std::string>{"ep"}, 1);
  EXPECT_THAT([&] { (void)rule.apply({leaf("w", {8})}); },
              ThrowsMessage<KeyError>(HasSubstr("mesh axis 'ep' is not in the mesh ('dp', 'tp')")));
  EXPECT_THAT([&] { (void)rule.apply({kNoArray}); },
              ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
}

// ---- MemoryConstrainedShardingRule ---------------------------------------------------------

TEST(MemoryConstrainedShardingRuleTest, ShardsOnlyUntilTheLeafFits) {
  const std::vector<NamedLeaf> leaves{leaf("w", {4096, 4096}), leaf("b", {4096}),
                                      leaf("s", {3, 5})};
  // 64 MiB over a 32 MiB budget: 'tp' (the largest axis) quarters it, and then it fits.
  EXPECT_THAT(MemoryConstrainedShardingRule(32 << 20, kDpTp).apply(leaves),
              ElementsAre(PartitionSpec{"tp", nullptr}, PartitionSpec(), PartitionSpec()));
  // A 1-byte budget uses every axis that divides; (3, 5) fits none.
  EXPECT_THAT(
      MemoryConstrainedShardingRule(1, kDpTp).apply(leaves),
      ElementsAre(PartitionSpec{"tp", "dp"}, PartitionSpec{"tp"}, PartitionSpec{nullptr, nullptr}));
  // At exactly the budget a leaf is left alone.
  EXPECT_THAT(MemoryConstrainedShardingRule(16384, kDpTp).apply({leaf("b", {4096})}),
              ElementsAre(PartitionSpec()));
}

TEST(MemoryConstrainedShardingRuleTest, Errors) {
  EXPECT_THAT([] { MemoryConstrainedShardingRule rule(1); },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  MemoryConstrainedShardingRule rule(1, kDpTp, std::vector<std::string>{"fsdp"});
  EXPECT_THAT([&] { (void)rule.apply({leaf("w", {8})}); },
              ThrowsMessage<KeyError>(HasSubstr("mesh axis 'fsdp' is not in the mesh")));
  EXPECT_THAT([&] { (void)rule.apply({kNoArray}); },
              ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  EXPECT_THAT([&] { (void)rule.apply({leaf("w", {8}, "float7")}); },
              ThrowsMessage<ValueError>("unknown dtype 'float7'"));
}

// ---- ShapeBasedShardingRule and CompositeShardingRule --------------------------------------

TEST(ShapeBasedShardingRuleTest, FirstPatternOfTheSameRankWins) {
  ShapeBasedShardingRule rule({{{4096, std::nullopt}, PartitionSpec{"tp", nullptr}},
                               {{std::nullopt}, PartitionSpec{"dp"}},
                               {{std::nullopt, std::nullopt}, PartitionSpec{nullptr, "tp"}}});
  EXPECT_THAT(
      rule.apply({leaf("w", {4096, 8}), leaf("b", {3}), leaf("e", {5, 4096}), leaf("s", {})}),
      ElementsAre(PartitionSpec{"tp", nullptr}, PartitionSpec{"dp"}, PartitionSpec{nullptr, "tp"},
                  PartitionSpec()));
  EXPECT_THAT([&] { (void)rule.apply({kNoArray}); },
              ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
}

TEST(CompositeShardingRuleTest, FirstSpecOtherThanEmptyWins) {
  auto shape =
      std::make_shared<ShapeBasedShardingRule>(std::vector<std::pair<ShapePattern, PartitionSpec>>{
          {{std::nullopt}, PartitionSpec{"dp"}}, {{3, 5}, PartitionSpec{nullptr, nullptr}}});
  auto memory = std::make_shared<MemoryConstrainedShardingRule>(1 << 20, kDpTp);
  CompositeShardingRule rule({shape, memory});
  EXPECT_THAT(rule.apply({leaf("b", {4096}), leaf("w", {4096, 4096}), leaf("s", {3, 5})}),
              ElementsAre(PartitionSpec{"dp"}, PartitionSpec{"tp", "dp"},
                          PartitionSpec{nullptr, nullptr}));  // P(None, None) counts as a choice
  // Every rule runs, so a later rule's error surfaces even when an earlier rule decided.
  CompositeShardingRule failing({shape, std::make_shared<MemoryConstrainedShardingRule>(
                                            1, kDpTp, std::vector<std::string>{"x"})});
  EXPECT_THAT([&] { (void)failing.apply({leaf("b", {4096})}); },
              ThrowsMessage<KeyError>(HasSubstr("mesh axis 'x' is not in the mesh")));
}

// ---- ShardingAnalyzer ----------------------------------------------------------------------

TEST(ShardingAnalyzerTest, ValidateChecksEveryEntryIncludingTuples) {
  ShardingAnalyzer analyzer(kDpTp);
  EXPECT_THAT(analyzer.validate_partition_specs(
                  {leaf("e", {32000, 4096}), leaf("s", {3, 5}), leaf("t", {6})},
                  {PartitionSpec{AxisRule::tuple({"dp", "tp"})}, PartitionSpec{"dp"},
                   PartitionSpec{AxisRule::tuple({"dp", "tp"})}}),
              ElementsAre("Array shape (3, 5) not divisible by mesh axis dp size 2",
                          "Array shape (6,) not divisible by mesh axis ('dp', 'tp') size 8"));
}

TEST(ShardingAnalyzerTest, ValidSpecsGiveNoIssues) {
  // eformer ShardingAnalyzer.validate_partition_specs on specs that all divide their dims.
  ShardingAnalyzer analyzer(kDpTp);
  EXPECT_THAT(
      analyzer.validate_partition_specs({leaf("b", {4096}), leaf("e", {32000, 4096}, "float16"),
                                         leaf("s", {3, 5}), leaf("w", {4096, 4096})},
                                        {PartitionSpec{"tp"}, PartitionSpec{nullptr, "tp"},
                                         PartitionSpec(), PartitionSpec{"dp", "tp"}}),
      ::testing::IsEmpty());
}

TEST(ShardingAnalyzerTest, ValidateNeverReadsAReplicatedLeaf) {
  // eformer returns before reading the leaf when its spec is P(): a scalar leaf is fine there,
  // and only a sharded one fails (AttributeError in eformer, TypeError here).
  ShardingAnalyzer analyzer(kDpTp);
  const NamedLeaf scalar{"n", std::nullopt};
  EXPECT_THAT(analyzer.validate_partition_specs({scalar, leaf("s", {3, 5})},
                                                {PartitionSpec(), PartitionSpec{"dp"}}),
              ElementsAre("Array shape (3, 5) not divisible by mesh axis dp size 2"));
  EXPECT_THAT([&] { (void)analyzer.validate_partition_specs({scalar}, {PartitionSpec{"dp"}}); },
              ThrowsMessage<TypeError>(HasSubstr("'n'")));
}

TEST(ShardingAnalyzerTest, EstimateDividesByShardsThenByDeviceCount) {
  ShardingAnalyzer analyzer(kDpTp);
  // w: 64 MiB / 2 / 4 = 8 MiB; b: 16 KiB / 4 = 4 KiB; s: 60 bytes.
  const auto usage = analyzer.estimate_memory_usage(
      {leaf("w", {4096, 4096}), leaf("b", {4096}), leaf("s", {3, 5})},
      {PartitionSpec{"dp", "tp"}, PartitionSpec{"tp"}, PartitionSpec()});
  EXPECT_EQ(usage.total_size, 8388608 + 4096 + 60);
  EXPECT_EQ(usage.size_per_device, (8388608 + 4096 + 60) / 8);
  const auto tuple = analyzer.estimate_memory_usage({leaf("w", {64})},
                                                    {PartitionSpec{AxisRule::tuple({"dp", "tp"})}});
  EXPECT_EQ(tuple.total_size, 32);
}

TEST(ShardingAnalyzerTest, Errors) {
  EXPECT_THAT([] { ShardingAnalyzer analyzer; },
              ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  ShardingAnalyzer analyzer(kDpTp);
  EXPECT_THAT([&] { (void)analyzer.validate_partition_specs({leaf("x", {4})}, {}); },
              ThrowsMessage<ValueError>(HasSubstr("validate_partition_specs: 1 leaves but 0")));
  EXPECT_THAT([&] { (void)analyzer.estimate_memory_usage({leaf("x", {4})}, {}); },
              ThrowsMessage<ValueError>(HasSubstr("estimate_memory_usage: 1 leaves but 0")));
  EXPECT_THAT(
      [&] {
        (void)analyzer.validate_partition_specs({leaf("x", {4})}, {PartitionSpec{nullptr, "dp"}});
      },
      ThrowsMessage<IndexError>("tuple index out of range"));
  EXPECT_THAT(
      [&] { (void)analyzer.validate_partition_specs({leaf("x", {4})}, {PartitionSpec{"sp"}}); },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'sp' is not in the mesh")));
  EXPECT_THAT(
      [&] { (void)analyzer.estimate_memory_usage({leaf("x", {4})}, {PartitionSpec{"sp"}}); },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'sp' is not in the mesh")));
  // A leaf whose spec is P() is never read (see ValidateNeverReadsAReplicatedLeaf).
  EXPECT_THAT([&] { (void)analyzer.validate_partition_specs({kNoArray}, {PartitionSpec{"dp"}}); },
              ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  EXPECT_THAT([&] { (void)analyzer.estimate_memory_usage({kNoArray}, {PartitionSpec()}); },
              ThrowsMessage<TypeError>("leaf 'n' is not an array: it has no shape"));
  ShardingAnalyzer empty(Mesh({"dp"}, {0}));
  EXPECT_THAT([&] { (void)empty.estimate_memory_usage({leaf("x", {4})}, {PartitionSpec()}); },
              ThrowsMessage<ValueError>(HasSubstr("has no devices")));
}

}  // namespace
}  // namespace numesh::sharding
