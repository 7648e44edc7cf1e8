#include "numesh/sharding/semantic_axis.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/sharding/presets.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ThrowsMessage;

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

TEST(SemanticAxisTest, InferModeReadsTheDimsExtent) {
  const std::vector<std::int64_t> step{4, 1, 64}, prompt{4, 9, 64};
  EXPECT_EQ(infer_mode(ModeArg::from_dim(1), step), Mode::kDecode);
  EXPECT_EQ(infer_mode(ModeArg::from_dim(-2), step), Mode::kDecode)
      << "negative dims count from the end";
  EXPECT_EQ(infer_mode(ModeArg::from_dim(1), prompt), Mode::kTrain) << "never prefill";
  EXPECT_EQ(infer_mode(Mode::kInsert, step), Mode::kInsert) << "a named mode stays";
  EXPECT_THAT([&] { (void)infer_mode(ModeArg::from_dim(3), step); },
              ThrowsMessage<IndexError>("tuple index out of range"));
  EXPECT_THAT([&] { (void)infer_mode(ModeArg::from_dim(-4), step); },
              ThrowsMessage<IndexError>("tuple index out of range"));
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
