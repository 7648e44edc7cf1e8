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
  EXPECT_THAT(
      [] {
        PartitionSpec p{AxisRule::list({AxisRule::tuple({"fsdp", "dp"}), "tp"})};
      },
      ThrowsMessage<ValueError>(
          HasSubstr("cannot contain a nested tuple. Got partition: [('fsdp', 'dp'), 'tp'] and the "
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

// Quoted names are read as Python string literals, so that repr() parses back to the same spec
// for any name, control characters and quotes included (found by partition_spec_fuzz: a raw
// \x02 in a quoted name came back as the four characters of its escape).
TEST(PartitionSpecTest, QuotedNamesDecodeTheEscapesReprWrites) {
  for (const std::string& name :
       {std::string("a\x02b"), std::string("it's"), std::string("say \"hi\" 'x'"),
        std::string("back\\slash"), std::string("tab\tnew\nline\r")}) {
    const PartitionSpec spec{AxisRule::tuple({AxisRule(name), "dp"})};
    EXPECT_EQ(PartitionSpec::parse(spec.repr()), spec) << spec.repr();
  }
  EXPECT_EQ(PartitionSpec::parse(R"(P('a\x41\'b', "c\"d"))"), (PartitionSpec{"aA'b", "c\"d"}));
  // An escape Python does not know keeps its backslash, as Python keeps it.
  EXPECT_EQ(PartitionSpec::parse(R"('a\db')"), PartitionSpec{"a\\db"});
  EXPECT_THAT([] { (void)PartitionSpec::parse(R"('a\x4')"); },
              ThrowsMessage<ValueError>(HasSubstr("truncated \\xHH escape")));
  EXPECT_THAT([] { (void)PartitionSpec::parse(R"('a\')"); },
              ThrowsMessage<ValueError>(HasSubstr("unterminated quote")));
}

TEST(PartitionSpecTest, FormatsWithFmt) {
  EXPECT_EQ(fmt::format("{}", PartitionSpec{"dp", nullptr}), "P('dp', None)");
}

}  // namespace
}  // namespace numesh::sharding
