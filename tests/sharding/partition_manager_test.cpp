#include "numesh/sharding/partition_manager.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

PartitionManager manager_with_tp(const char* tp) {
  return PartitionManager(PartitionAxis({.tensor_parallel_axis = tp}));
}

TEST(PartitionManagerTest, DimModeInfersDecodeFromASizeOneDim) {
  PartitionManager pm(PartitionAxis({.decode_batch_axis = "dp"}));
  EXPECT_EQ(pm.resolve(presets::kHiddenStateSharding, {{8, 1, 64}}),
            (PartitionSpec{"dp", "sp", "tp"}));
  EXPECT_EQ(pm.resolve(presets::kHiddenStateSharding, {{8, 9, 64}}),
            (PartitionSpec{AxisRule::tuple({"fsdp", "dp"}), "sp", "tp"}));
  // Negative dims count from the end.
  EXPECT_EQ(pm.resolve({std::string(tokens::kBatch)}, ModeArg::from_dim(-1), {{4, 1}}),
            PartitionSpec{"dp"});
}

TEST(PartitionManagerTest, DimModeErrors) {
  PartitionManager pm;
  EXPECT_THAT(
      [&] { (void)pm.resolve(presets::kHiddenStateSharding); },
      ThrowsMessage<ValueError>("when using dynamic mode detection shape should be provided"));
  EXPECT_THAT([&] { (void)pm.resolve(presets::kHiddenStateSharding, {{8}}); },
              ThrowsMessage<IndexError>("tuple index out of range"));
  EXPECT_THAT(
      [&] { (void)pm.resolve(ResolveArgs{.axes = {{"_"}}}); },
      ThrowsMessage<ValueError>("if axes or mode is empty you should provide dynamic axes"));
}

TEST(PartitionManagerTest, ScopesNestAndRestore) {
  const PartitionManager a = manager_with_tp("a");
  const PartitionManager b = manager_with_tp("b");
  EXPECT_EQ(PartitionManager::current(), nullptr);
  {
    PartitionManager::Scope sa(a);
    {
      PartitionManager::Scope sa_again(a);
      PartitionManager::Scope sb(b);
      EXPECT_EQ(PartitionManager::current(), &b);
    }
    EXPECT_EQ(PartitionManager::current(), &a);
  }
  EXPECT_EQ(PartitionManager::current(), nullptr);
}

TEST(PartitionManagerTest, CurrentIsPerThreadLastCreatedIsGlobal) {
  const PartitionManager a = manager_with_tp("a");
  PartitionManager::Scope scope(a);
  const PartitionManager* seen = &a;
  std::optional<PartitionManager> last;
  std::thread([&] {
    seen = PartitionManager::current();
    last = PartitionManager::last_created();
  }).join();
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(last, a);
}

TEST(PartitionManagerTest, ApplyLogicalShardingPrefersExplicitThenCurrentThenLast) {
  Mesh mesh({"dp", "fsdp", "ep", "tp", "sp", "a", "b", "c"}, {1, 2, 1, 2, 2, 2, 2, 2});
  MeshScope mesh_scope(mesh);
  const ResolveArgs args{.axes = {{"_", std::string(tokens::kEmbed)}}, .mode = Mode::kTrain};
  const PartitionManager last = manager_with_tp("a");
  EXPECT_EQ(apply_logical_sharding({4, 8}, args)->spec(), (PartitionSpec{nullptr, "a"}));
  const PartitionManager current = manager_with_tp("b");
  PartitionManager::Scope scope(current);
  const PartitionManager later = manager_with_tp("a");  // last created, but not current
  EXPECT_EQ(apply_logical_sharding({4, 8}, args)->spec(), (PartitionSpec{nullptr, "b"}));
  const PartitionManager explicit_pm = manager_with_tp("c");
  EXPECT_EQ(apply_logical_sharding({4, 8}, args, &explicit_pm)->spec(),
            (PartitionSpec{nullptr, "c"}));
}

TEST(PartitionManagerTest, ApplyLogicalShardingWithoutAnyManager) {
  PartitionManager::reset_last_created();
  EXPECT_THAT([] { (void)apply_logical_sharding({4}, {}); },
              ThrowsMessage<ValueError>(HasSubstr("No PartitionManager is available.")));
}

TEST(PartitionManagerTest, ShardCorrectsAgainstTheCurrentMesh) {
  const PartitionManager pm;
  const ResolveArgs args{.dynamic_axes = presets::kColumnWise};
  EXPECT_THAT(
      [&] {
        (void)pm.shard({64, 30}, args);
      },
      ThrowsMessage<NoMeshError>("No mesh found under this context manager."));
  MeshScope scope(Mesh({"dp", "fsdp", "ep", "tp", "sp"}, {1, 4, 1, 2, 1}));
  // 64 % (fsdp*sp = 4) == 0 and 30 % (tp = 2) == 0: both dims stay sharded.
  EXPECT_EQ(pm.shard({64, 30}, args)->spec(),
            (PartitionSpec{AxisRule::tuple({"fsdp", "sp"}), "tp"}));
  // 62 % 4 != 0: the fsdp*sp entry is dropped by correction.
  EXPECT_EQ(pm.shard({62, 30}, args)->spec(), (PartitionSpec{nullptr, "tp"}));
  // Fully corrected away: no constraint with auto_correct, a replicate one (P()) without,
  // because with_sharding_constraint corrects again (eformer quirk, SPEC 14.9).
  EXPECT_FALSE(pm.shard({3, 3}, args).has_value());
  EXPECT_EQ(pm.shard({3, 3}, args, /*auto_correct=*/false)->spec(), PartitionSpec{});
}

TEST(PartitionManagerTest, JsonRoundTrip) {
  const PartitionManager pm(PartitionAxis({.expert_parallel_axis = "experts"}));
  EXPECT_EQ(PartitionManager::from_json(pm.to_json()), pm);
  EXPECT_THAT(
      [] {
        (void)PartitionManager::from_json({{"paxis", "x"}});
      },
      ThrowsMessage<TypeError>("Expected PartitionAxis, got <class 'str'>"));
}

}  // namespace
}  // namespace numesh::sharding
