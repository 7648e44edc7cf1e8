#include "numesh/sharding/easydel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace numesh::sharding {
namespace {

namespace ed = easydel;

const Mesh kDp2Fsdp2Tp2({"dp", "fsdp", "ep", "tp", "sp"}, {2, 2, 1, 2, 1});

std::vector<AxisRule> query_axes() {
  return {AxisRule(std::string(tokens::kBatch)), AxisRule(std::string(tokens::kQueryLength)),
          AxisRule(std::string(tokens::kHead)), AxisRule(std::string(tokens::kHeadDim))};
}

PartitionManager decode_overrides() {
  return PartitionManager(PartitionAxis({.decode_batch_axis = "dp",
                                         .decode_query_sequence_axis = "dp",
                                         .decode_head_axis = nullptr,
                                         .decode_attention_dim_axis = "sp"}));
}

// EasyDeL's resolve_safe_sharding given a list of axes resolves them in the mode it is given
// (its first attempt passes mode and shape), then drops entries that do not divide their dim.
TEST(EasydelResolveSafeShardingTest, ListOfAxesInDecodeUsesTheDecodeTwins) {
  const PartitionManager pm = decode_overrides();
  const std::vector<std::int64_t> shape{4, 1, 8, 64};
  // Decode: batch dp, query sequence dp (1 % 2 != 0 -> None), head falls back to tp, head dim sp.
  EXPECT_EQ(ed::resolve_safe_sharding(query_axes(), shape, &pm, kDp2Fsdp2Tp2, Mode::kDecode),
            (PartitionSpec{"dp", nullptr, "tp", "sp"}));
  // Train ignores the twins.
  EXPECT_EQ(ed::resolve_safe_sharding(query_axes(), shape, &pm, kDp2Fsdp2Tp2, Mode::kTrain),
            (PartitionSpec{AxisRule::tuple({"fsdp", "dp"}), "sp", "tp", nullptr}));
  // A dimension mode reads the shape: shape[1] == 1 is decode.
  EXPECT_EQ(ed::resolve_safe_sharding(query_axes(), shape, &pm, kDp2Fsdp2Tp2, ModeArg::from_dim(1)),
            (PartitionSpec{"dp", nullptr, "tp", "sp"}));
}

TEST(EasydelResolveSafeShardingTest, ListOfAxesWithoutAMeshIsNotSanitised) {
  const PartitionManager pm = decode_overrides();
  EXPECT_EQ(
      ed::resolve_safe_sharding(query_axes(), {4, 1, 8, 64}, &pm, std::nullopt, Mode::kDecode),
      (PartitionSpec{"dp", "dp", "tp", "sp"}));
}

TEST(EasydelResolveSafeShardingTest, UnresolvableListIsReturnedUnchanged) {
  // Every attempt fails (an unknown token), so EasyDeL returns the axes object: nullopt here.
  const PartitionManager pm;
  EXPECT_EQ(ed::resolve_safe_sharding(std::vector<AxisRule>{AxisRule("__NOT_A_TOKEN__")}, {8}, &pm,
                                      kDp2Fsdp2Tp2, Mode::kDecode),
            std::nullopt);
  EXPECT_EQ(
      ed::resolve_safe_sharding(query_axes(), {4, 1, 8, 64}, nullptr, kDp2Fsdp2Tp2, Mode::kDecode),
      std::nullopt);
}

}  // namespace
}  // namespace numesh::sharding
