#include "numesh/runtime/free_ranges.hpp"

#include <gtest/gtest.h>

namespace numesh::runtime {
namespace {

TEST(FreeRangesTest, TakesFirstFitAndCoalescesWhatIsGivenBack) {
  FreeRanges r(1000);
  EXPECT_EQ(r.take(100, 1), 0u);
  EXPECT_EQ(r.take(200, 1), 100u);
  EXPECT_EQ(r.take(300, 1), 300u);
  EXPECT_EQ(r.used(), 600u);
  r.give(100, 200);                 // a hole of 200 at 100
  EXPECT_EQ(r.take(250, 1), 600u);  // does not fit the hole: after the last block
  EXPECT_EQ(r.take(150, 1), 100u);  // fits it: the lowest offset
  r.give(0, 100);
  r.give(100, 150);  // joins [0, 100): a hole of 300 at 0
  EXPECT_EQ(r.take(300, 1), 0u) << "the two given ranges and the hole were one range";
  EXPECT_FALSE(r.take(151, 1).has_value()) << "150 bytes are left: [850, 1000)";
  EXPECT_EQ(r.take(150, 1), 850u);
  EXPECT_EQ(r.used(), 1000u);
}

TEST(FreeRangesTest, AlignsOffsetsAndKeepsTheSkippedBytesFree) {
  FreeRanges r(8192);
  EXPECT_EQ(r.take(10, 1), 0u);
  EXPECT_EQ(r.take(100, 4096), 4096u);
  EXPECT_EQ(r.take(4086, 1), 10u) << "the bytes skipped to align stay free";
  EXPECT_FALSE(r.take(8, 4096).has_value()) << "no aligned range is left";
  EXPECT_EQ(r.take(8, 64), 4224u);
  r.give(0, 10);
  r.give(10, 4086);
  r.give(4096, 100);
  r.give(4224, 8);
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.take(8192, 4096), 0u) << "every range given back joined into the whole region";
}

TEST(FreeRangesTest, AnEmptyRegionHoldsNothing) {
  FreeRanges r(0);
  EXPECT_FALSE(r.take(1, 1).has_value());
  EXPECT_EQ(r.capacity(), 0u);
  EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace numesh::runtime
