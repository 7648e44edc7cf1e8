#include "numesh/sharding/semantic_axis.hpp"

#include <gtest/gtest.h>

#include "numesh/sharding/presets.hpp"

namespace numesh::sharding {
namespace {

TEST(SemanticAxisTest, NormalizeAcceptsTokensConstantsAndShortNames) {
  EXPECT_EQ(normalize_token("__BATCH__"), "__BATCH__");
  EXPECT_EQ(normalize_token("BATCH"), "__BATCH__");
  EXPECT_EQ(normalize_token("query_length"), "__QUERY_LENGTH__");
  EXPECT_EQ(normalize_token("tp"), "__TENSOR_PARALLEL__");
  EXPECT_EQ(normalize_token("fully_sharded_data_parallel"), "__FULLY_SHARDED_DATA_PARALLEL__");
  EXPECT_EQ(normalize_token("_"), "_");
  EXPECT_EQ(normalize_token("__CUSTOM__"), "__CUSTOM__");
}

TEST(SemanticAxisTest, ParseModeAcceptsEformerAndShortNames) {
  EXPECT_EQ(parse_mode("__autoregressive__"), Mode::kDecode);
  EXPECT_EQ(parse_mode("decode"), Mode::kDecode);
  EXPECT_EQ(parse_mode("prefill"), Mode::kPrefill);
  EXPECT_EQ(parse_mode("insert"), Mode::kInsert);
  EXPECT_FALSE(parse_mode("Decode").has_value());
  EXPECT_EQ(mode_string(Mode::kInsert), "__insert__");
  EXPECT_TRUE(is_generation_mode(Mode::kInsert));
  EXPECT_FALSE(is_generation_mode(Mode::kPrefill));
}

TEST(SemanticAxisTest, EformerDefaults) {
  EXPECT_EQ(kMinShardingSize, 16384);
  EXPECT_DOUBLE_EQ(kDefaultMaskValue, -2.381976426469702e+38);
}

TEST(PresetsTest, FindByEformerName) {
  ASSERT_NE(find_preset("ColumnWise"), nullptr);
  EXPECT_EQ(find_preset("ColumnWise"), &presets::kColumnWise);
  EXPECT_EQ(find_preset("columnwise"), nullptr);
  EXPECT_EQ(all_presets().size(), 17u);
  EXPECT_TRUE(presets::kAttnQSharding.mode.is_dim());
}

}  // namespace
}  // namespace numesh::sharding
