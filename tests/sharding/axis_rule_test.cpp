#include "numesh/sharding/axis_rule.hpp"

#include <gtest/gtest.h>

namespace numesh::sharding {
namespace {

TEST(AxisRuleTest, DefaultIsNone) {
  AxisRule r;
  EXPECT_TRUE(r.is_none());
  EXPECT_FALSE(r.truthy());
  EXPECT_EQ(r.repr(), "None");
}

TEST(AxisRuleTest, TruthinessFollowsPython) {
  EXPECT_FALSE(AxisRule("").truthy());
  EXPECT_FALSE(AxisRule::tuple({}).truthy());
  EXPECT_FALSE(AxisRule::list({}).truthy());
  EXPECT_FALSE(AxisRule::integer(0).truthy());
  EXPECT_TRUE(AxisRule::integer(5).truthy());
  EXPECT_TRUE(AxisRule(not_given).truthy());
  EXPECT_TRUE(AxisRule::unconstrained().truthy());
  EXPECT_TRUE(AxisRule("tp").truthy());
}

TEST(AxisRuleTest, TupleAndListAreDifferentValues) {
  EXPECT_NE(AxisRule::tuple({"a", "b"}), AxisRule::list({"a", "b"}));
  EXPECT_EQ(AxisRule::tuple({"a", nullptr}), AxisRule::tuple({"a", nullptr}));
  EXPECT_NE(std::hash<AxisRule>{}(AxisRule("a")), std::hash<AxisRule>{}(AxisRule("b")));
}

TEST(AxisRuleTest, ReprMatchesPython) {
  EXPECT_EQ(AxisRule::tuple({"fsdp", "dp"}).repr(), "('fsdp', 'dp')");
  EXPECT_EQ(AxisRule::tuple({"fsdp"}).repr(), "('fsdp',)");
  EXPECT_EQ(AxisRule::list({"a", nullptr, AxisRule::integer(3)}).repr(), "['a', None, 3]");
  EXPECT_EQ(AxisRule("it's").repr(), "\"it's\"");
  EXPECT_EQ(python_repr("a'b\"c"), "'a\\'b\"c'");
}

}  // namespace
}  // namespace numesh::sharding
