#include "numesh/core/option_text.hpp"

#include <gtest/gtest.h>

namespace numesh {
namespace {

TEST(OptionTextTest, FlagsAndKeywordsNameTheSameOption) {
  EXPECT_EQ(option_name(OptionStyle::kFlag, "kv_cache_tokens"), "--kv-cache-tokens");
  EXPECT_EQ(option_name(OptionStyle::kKeyword, "kv_cache_tokens"), "kv_cache_tokens");
  EXPECT_EQ(option_text(OptionStyle::kFlag, "parallel", 0), "--parallel 0");
  EXPECT_EQ(option_text(OptionStyle::kKeyword, "parallel", 0), "parallel=0");
  EXPECT_EQ(option_text(OptionStyle::kFlag, "mode", "'x'"), "--mode 'x'");
}

}  // namespace
}  // namespace numesh
