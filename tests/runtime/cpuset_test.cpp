#include "numesh/runtime/cpuset.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

TEST(CpuSetTest, ConstructorSortsAndDeduplicates) {
  const CpuSet s({5, 1, 3, 1, 5});
  EXPECT_THAT(s.pus(), ElementsAre(1, 3, 5));
  EXPECT_EQ(s.size(), 3U);
  EXPECT_FALSE(s.empty());
}

TEST(CpuSetTest, DefaultIsEmptyAndPrintsAsEmptyString) {
  const CpuSet s;
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.size(), 0U);
  EXPECT_EQ(s.to_string(), "");
}

TEST(CpuSetTest, ConstructorRejectsNegativeIndex) {
  EXPECT_THAT(
      [] {
        CpuSet({0, -2});
      },
      ThrowsMessage<ValueError>(HasSubstr("cpuset PU index -2 is negative")));
}

TEST(CpuSetTest, ConstructorRejectsHugeIndex) {
  EXPECT_THAT([] { CpuSet({70000}); },
              ThrowsMessage<ValueError>(HasSubstr("PU index 70000 is above the limit 65535")));
}

TEST(CpuSetTest, ParsesRangesAndSingles) {
  EXPECT_THAT(CpuSet::parse("0-3,8,10-11").pus(), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(CpuSet::parse("7").pus(), ElementsAre(7));
  EXPECT_THAT(CpuSet::parse("4-4").pus(), ElementsAre(4));
  EXPECT_THAT(CpuSet::parse(" 2,1 ").pus(), ElementsAre(1, 2));
}

TEST(CpuSetTest, ParsesEmptyAndNoneAsEmptySet) {
  EXPECT_THAT(CpuSet::parse("").pus(), IsEmpty());
  EXPECT_THAT(CpuSet::parse("none").pus(), IsEmpty());
}

TEST(CpuSetTest, ToStringCompressesRuns) {
  EXPECT_EQ(CpuSet({0, 1, 2, 3, 8, 10, 11}).to_string(), "0-3,8,10-11");
  EXPECT_EQ(CpuSet({0, 2, 4}).to_string(), "0,2,4");
  EXPECT_EQ(CpuSet({9}).to_string(), "9");
}

TEST(CpuSetTest, ParseAndToStringRoundTrip) {
  for (const char* text : {"0-3,8,10-11", "1", "0,2,4-6,63"}) {
    EXPECT_EQ(CpuSet::parse(text).to_string(), text);
  }
}

TEST(CpuSetTest, FormatsWithFmt) { EXPECT_EQ(fmt::format("[{}]", CpuSet({0, 1, 5})), "[0-1,5]"); }

TEST(CpuSetTest, ParseRejectsNonNumberNamingTextAndPosition) {
  EXPECT_THAT([] { CpuSet::parse("a-3"); },
              ThrowsMessage<ValueError>(HasSubstr("bad cpuset 'a-3': expected a number at 'a-3'")));
  EXPECT_THAT([] { CpuSet::parse("1,,2"); },
              ThrowsMessage<ValueError>(HasSubstr("bad cpuset '1,,2': expected a number at ',2'")));
  EXPECT_THAT(
      [] { CpuSet::parse("1,"); },
      ThrowsMessage<ValueError>(HasSubstr("bad cpuset '1,': expected a number at the end")));
  EXPECT_THAT(
      [] { CpuSet::parse("3-"); },
      ThrowsMessage<ValueError>(HasSubstr("bad cpuset '3-': expected a number at the end")));
}

TEST(CpuSetTest, ParseRejectsNegativeNumber) {
  EXPECT_THAT([] { CpuSet::parse("-1"); },
              ThrowsMessage<ValueError>(HasSubstr("bad cpuset '-1': negative number at '-1'")));
  EXPECT_THAT([] { CpuSet::parse("2,-1"); },
              ThrowsMessage<ValueError>(HasSubstr("bad cpuset '2,-1': negative number at '-1'")));
}

TEST(CpuSetTest, ParseRejectsReversedRange) {
  EXPECT_THAT([] { CpuSet::parse("0,5-2"); },
              ThrowsMessage<ValueError>(HasSubstr("bad cpuset '0,5-2': range 5-2 is reversed")));
}

TEST(CpuSetTest, ParseRejectsStrayCharacter) {
  EXPECT_THAT(
      [] { CpuSet::parse("0-3x"); },
      ThrowsMessage<ValueError>(HasSubstr("bad cpuset '0-3x': unexpected character 'x' at 'x'")));
  EXPECT_THAT(
      [] { CpuSet::parse("1 2"); },
      ThrowsMessage<ValueError>(HasSubstr("bad cpuset '1 2': unexpected character ' ' at ' 2'")));
}

TEST(CpuSetTest, ParseRejectsNumberAboveLimit) {
  EXPECT_THAT([] { CpuSet::parse("0-4000000000"); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "bad cpuset '0-4000000000': number at '4000000000' is above the limit 65535")));
}

TEST(CpuSetTest, ContainsPuAndSubset) {
  const CpuSet s = CpuSet::parse("0-3,8");
  EXPECT_TRUE(s.contains(8));
  EXPECT_FALSE(s.contains(4));
  EXPECT_TRUE(s.contains(CpuSet({1, 8})));
  EXPECT_FALSE(s.contains(CpuSet({1, 9})));
  EXPECT_TRUE(s.contains(CpuSet()));
  EXPECT_FALSE(CpuSet().contains(s));
}

TEST(CpuSetTest, IntersectUniteAndIntersects) {
  const CpuSet a = CpuSet::parse("0-5");
  const CpuSet b = CpuSet::parse("4-9");
  EXPECT_EQ(a.intersect(b), CpuSet({4, 5}));
  EXPECT_EQ(a.unite(b), CpuSet::parse("0-9"));
  EXPECT_TRUE(a.intersects(b));
  EXPECT_FALSE(a.intersects(CpuSet::parse("6-9")));
  EXPECT_FALSE(a.intersects(CpuSet()));
  EXPECT_TRUE(a.intersect(CpuSet::parse("6-9")).empty());
}

TEST(CpuSetTest, EqualityComparesMembers) {
  EXPECT_EQ(CpuSet({3, 1, 2}), CpuSet::parse("1-3"));
  EXPECT_NE(CpuSet({1, 2}), CpuSet({1, 3}));
}

}  // namespace
}  // namespace numesh::runtime
