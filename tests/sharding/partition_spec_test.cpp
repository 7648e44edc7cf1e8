#include "numesh/sharding/partition_spec.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "numesh/core/error.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(PartitionSpecTest, CanonicalisesFalsyEntriesToNone) {
  PartitionSpec p{"", AxisRule::tuple({}), AxisRule::list({}), AxisRule::integer(0), nullptr};
  EXPECT_EQ(p, PartitionSpec::replicated(5));
  EXPECT_TRUE(p.is_fully_replicated());
}

TEST(PartitionSpecTest, OneMemberSequenceBecomesItsMember) {
  PartitionSpec p{AxisRule::list({"fsdp"}), AxisRule::tuple({nullptr}),
                  AxisRule::list({"fsdp", "sp"})};
  EXPECT_EQ(p[0], AxisRule("fsdp"));
  EXPECT_TRUE(p[1].is_none());
  EXPECT_EQ(p[2], AxisRule::tuple({"fsdp", "sp"}));
  EXPECT_EQ(p.repr(), "P('fsdp', None, ('fsdp', 'sp'))");
}

TEST(PartitionSpecTest, NestedTupleThrowsValueError) {
  EXPECT_THAT([] { PartitionSpec p{AxisRule::list({AxisRule::tuple({"fsdp", "dp"}), "tp"})}; },
              ThrowsMessage<ValueError>(HasSubstr(
                  "cannot contain a nested tuple. Got partition: [('fsdp', 'dp'), 'tp'] and the "
                  "nested tuple: ('fsdp', 'dp')")));
}

TEST(PartitionSpecTest, EmptySpecDiffersFromSingleNone) {
  EXPECT_NE(PartitionSpec{}, PartitionSpec{nullptr});
  EXPECT_EQ(PartitionSpec{}.repr(), "P()");
  EXPECT_EQ(PartitionSpec{nullptr}.repr(), "P(None,)");
}

TEST(PartitionSpecTest, EntryNamesListsNamesOnly) {
  PartitionSpec p{AxisRule::tuple({"fsdp", nullptr, "sp"}), "tp", nullptr};
  EXPECT_EQ(p.entry_names(0), (std::vector<std::string>{"fsdp", "sp"}));
  EXPECT_EQ(p.entry_names(1), (std::vector<std::string>{"tp"}));
  EXPECT_TRUE(p.entry_names(2).empty());
}

TEST(PartitionSpecTest, ParsesReprAndShortForms) {
  PartitionSpec expected{AxisRule::tuple({"fsdp", "dp"}), "sp", nullptr};
  EXPECT_EQ(PartitionSpec::parse("P(('fsdp', 'dp'), 'sp', None)"), expected);
  EXPECT_EQ(PartitionSpec::parse("(fsdp,dp),sp,None"), expected);
  EXPECT_EQ(PartitionSpec::parse("[fsdp, dp], sp, null"), expected);
  EXPECT_EQ(PartitionSpec::parse("P()"), PartitionSpec{});
  EXPECT_EQ(PartitionSpec::parse(""), PartitionSpec{});
  EXPECT_EQ(PartitionSpec::parse("P('dp',)"), PartitionSpec{"dp"});
  EXPECT_EQ(PartitionSpec::parse(expected.repr()), expected);
}

TEST(PartitionSpecTest, ParseErrorNamesTheText) {
  EXPECT_THAT([] { (void)PartitionSpec::parse("P(dp, (tp"); },
              ThrowsMessage<ValueError>(HasSubstr("cannot parse partition spec 'P(dp, (tp'")));
  EXPECT_THAT([] { (void)PartitionSpec::parse("dp; tp"); },
              ThrowsMessage<ValueError>(HasSubstr("unexpected text at offset 2")));
}

TEST(PartitionSpecTest, FormatsWithFmt) {
  EXPECT_EQ(fmt::format("{}", PartitionSpec{"dp", nullptr}), "P('dp', None)");
}

}  // namespace
}  // namespace numesh::sharding
