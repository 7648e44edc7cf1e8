#include "numesh/sharding/rule_matching.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using fixtures::leaf;

// The spec of `path` under the rules {pattern: P('x'), '.*': P()}: P('x') when `pattern` is
// found in `path`, P() when not.
PartitionSpec spec_for(std::string pattern, std::string path) {
  return match_partition_rules({{std::move(pattern), PartitionSpec{"x"}}, {".*", PartitionSpec()}},
                               {leaf(std::move(path), {4})})[0];
}

TEST(MatchPartitionRulesTest, FirstSearchMatchWinsAndTrimsToRank) {
  const std::vector<PartitionRule> rules{{"q_proj/kernel", PartitionSpec{"tp", "fsdp", "sp"}},
                                         {"kernel", PartitionSpec{"fsdp"}},
                                         {".*", PartitionSpec()}};
  const auto specs = match_partition_rules(
      rules, {leaf("attn/q_proj/kernel", {8, 8}), leaf("mlp/kernel", {8}), leaf("x", {8})});
  EXPECT_THAT(specs,
              ElementsAre(PartitionSpec{"tp", "fsdp"}, PartitionSpec{"fsdp"}, PartitionSpec()));
}

TEST(MatchPartitionRulesTest, ScalarsAndNonArraysGetReplicatedInStrictMode) {
  const std::vector<PartitionRule> rules{{"w", PartitionSpec{"x"}}};
  const auto specs = match_partition_rules(rules, {leaf("w", {}), NamedLeaf{"w2", std::nullopt}});
  EXPECT_THAT(specs, ElementsAre(PartitionSpec(), PartitionSpec()));
}

TEST(MatchPartitionRulesTest, MinSizeNulloptUsesMinShardingSize) {
  const std::vector<PartitionRule> rules{{"w", PartitionSpec{"x"}}};
  EXPECT_EQ(min_sharding_size(), 16384);  // the test environment does not set the variable
  EXPECT_EQ(match_partition_rules(rules, {leaf("w", {127, 128})}, std::nullopt)[0],
            PartitionSpec());
  EXPECT_EQ(match_partition_rules(rules, {leaf("w", {128, 128})}, std::nullopt)[0],
            PartitionSpec{"x"});
}

TEST(MatchPartitionRulesTest, NonStrictNeedsARuleForEveryLeafAndKeepsLongSpecs) {
  const std::vector<PartitionRule> rules{{"w", PartitionSpec{"a", "b", "c"}}};
  EXPECT_EQ(match_partition_rules(rules, {leaf("w", {4})}, 0, false)[0],
            (PartitionSpec{"a", "b", "c"}));
  EXPECT_THAT(
      [&] {
        (void)match_partition_rules(rules, {NamedLeaf{"step", std::nullopt}}, 0, false);
      },
      ThrowsMessage<ValueError>(HasSubstr("Partition rule not found for param: step")));
}

TEST(MatchPartitionRulesTest, NoRuleNamesTheFirstFailingLeaf) {
  const std::vector<PartitionRule> rules{{"kernel", PartitionSpec{"x"}}};
  EXPECT_THAT(
      [&] {
        (void)match_partition_rules(rules,
                                    {leaf("a/kernel", {4}), leaf("a/bias", {4}), leaf("b", {4})});
      },
      ThrowsMessage<ValueError>(HasSubstr("Partition rule not found for param: a/bias")));
}

// std::regex matches by recursion: a name past the limit is refused by name, never matched
// into a stack overflow (a 50,000-character one crashed the process).
TEST(MatchPartitionRulesTest, ANameTooLongToMatchIsRefused) {
  EXPECT_EQ(spec_for(".*", std::string(4096, 'a')), PartitionSpec{"x"});
  EXPECT_THAT([] { (void)spec_for(".*", std::string(50000, 'a')); },
              ThrowsMessage<ValueError>(
                  HasSubstr("has 50000 characters; rules match names of at most 4096")));
}

TEST(MatchPartitionRulesTest, EasyDeLStyleAnchoredPatterns) {
  const std::vector<PartitionRule> rules{
      {R"(^(?:.*/)?model/layers/\d+/attn/q_proj/kernel$)", PartitionSpec{"tp"}},
      {".*", PartitionSpec()}};
  const auto specs =
      match_partition_rules(rules, {leaf("model/layers/12/attn/q_proj/kernel", {4}),
                                    leaf("mu/model/layers/3/attn/q_proj/kernel", {4}),
                                    leaf("model_extra/layers/0/attn/q_proj/kernel", {4})});
  EXPECT_THAT(specs, ElementsAre(PartitionSpec{"tp"}, PartitionSpec{"tp"}, PartitionSpec()));
}

TEST(MatchPartitionRulesTest, PythonSyntaxIsTranslatedOrRejected) {
  EXPECT_EQ(spec_for(R"(\Akernel\Z)", "kernel"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for(R"(\Akernel\Z)", "my_kernel"), PartitionSpec());
  EXPECT_EQ(spec_for(R"((?P<layer>\d+)/w)", "3/w"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for("(?i)KERNEL", "kernel"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for("[]a]", "]"), PartitionSpec{"x"});
  EXPECT_THAT([&] { (void)spec_for("(?<=a)b", "ab"); },
              ThrowsMessage<ValueError>(HasSubstr("lookbehind")));
  EXPECT_THAT([&] { (void)spec_for("(?P=x)", "a"); },
              ThrowsMessage<ValueError>(HasSubstr("(?P=name)")));
  EXPECT_THAT([&] { (void)spec_for("(?s).", "a"); },
              ThrowsMessage<ValueError>(HasSubstr("inline flag")));
  EXPECT_THAT([&] { (void)spec_for("(a", "a"); },
              ThrowsMessage<ValueError>(HasSubstr("cannot compile partition rule pattern '(a'")));
}

// A repeat of a repeat is refused as Python's re refuses it (std::regex would accept `.+*+` and
// backtrack exponentially: found by rule_regex_fuzz); lazy quantifiers and repeated groups stay.
TEST(MatchPartitionRulesTest, MultipleRepeatsAreRefusedAsPythonRefusesThem) {
  EXPECT_THAT([&] { (void)spec_for(".+*+", "abc"); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "cannot compile partition rule pattern '.+*+': multiple repeat at position 2")));
  EXPECT_THAT([&] { (void)spec_for("a{2}*", "aa"); },
              ThrowsMessage<ValueError>(HasSubstr("multiple repeat at position 4")));
  EXPECT_THAT([&] { (void)spec_for("a+?*", "aa"); },
              ThrowsMessage<ValueError>(HasSubstr("multiple repeat at position 3")));
  EXPECT_THAT([&] { (void)spec_for("a*+", "aa"); },
              ThrowsMessage<ValueError>(HasSubstr("possessive quantifier")));
  EXPECT_EQ(spec_for("^a+?b*?c??$", "aac"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for(R"((ab)+[+*]\d*x{1,2})", "abab+1x"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for("(?:a|b)*(?=c)", "abc"), PartitionSpec{"x"});
  // Braces as Python reads them: `{,n}` is {0,n}; braces that are not a quantifier are literals.
  EXPECT_EQ(spec_for("^ba{,2}c$", "bc"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for("^ba{,2}c$", "baaac"), PartitionSpec());
  EXPECT_EQ(spec_for("a{,x}", "a{,x}"), PartitionSpec{"x"});
  EXPECT_EQ(spec_for("^a{}}$", "a{}}"), PartitionSpec{"x"});
  EXPECT_THAT([&] { (void)spec_for("a{70000}", "a"); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "the repetition number at position 1 is larger than numesh's limit of 65535")));
}

// Backslash-digit escapes as Python's sre_parse reads them (std::regex read a run of digits as
// one back-reference and overflowed on a long one: found by rule_regex_fuzz).
TEST(MatchPartitionRulesTest, NumericEscapesAreReadAsPythonReadsThem) {
  EXPECT_EQ(spec_for(R"(^(a)\1$)", "aa"), PartitionSpec{"x"});  // a group reference
  EXPECT_EQ(spec_for(R"(^\101\0$)", std::string("A\0", 2)), PartitionSpec{"x"});  // octal escapes
  EXPECT_EQ(spec_for(R"(^[\101-\103]$)", "B"), PartitionSpec{"x"});  // octal in a class
  EXPECT_EQ(spec_for(R"(^(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\108$)", "abcdefghijj8"),
            PartitionSpec{"x"});  // \10 then '8'
  EXPECT_THAT([&] { (void)spec_for(R"(\400)", "a"); },
              ThrowsMessage<ValueError>(
                  HasSubstr(R"(octal escape value \400 outside of range 0-0o377 at position 0)")));
  EXPECT_THAT([&] { (void)spec_for(R"([\9])", "9"); },
              ThrowsMessage<ValueError>(HasSubstr(R"(bad escape \9 at position 1)")));
  // A long run of digits: three octal digits and literals, or a two-digit group reference (here
  // to a group that does not exist) and literals; never one huge reference.
  EXPECT_EQ(spec_for(R"(^(a)\3332222$)", "a\3332222"), PartitionSpec{"x"});
  EXPECT_THAT([&] { (void)spec_for(R"((a)\99999999999999999999)", "a"); },
              ThrowsMessage<ValueError>(HasSubstr("cannot compile partition rule pattern")));
}

TEST(PatternPartitionSpecTest, ParsesEformerGrammar) {
  MeshScope scope(Mesh({"dp"}, {1}));
  const auto fn = create_pattern_based_partition_spec("attention|mlp->dp.tp,bias->,x..y,q->a..b");
  ASSERT_EQ(fn.rules().size(), 4U);
  EXPECT_EQ(fn("model/attention/q"), (PartitionSpec{"dp", "tp"}));
  EXPECT_EQ(fn("mlp"), (PartitionSpec{"dp", "tp"}));
  EXPECT_EQ(fn("layer/bias"), PartitionSpec{nullptr});
  EXPECT_EQ(fn("q"), (PartitionSpec{"a", nullptr, "b"}));
  EXPECT_EQ(fn("other"), PartitionSpec());
  const auto with_default =
      create_pattern_based_partition_spec("a->x", nullptr, PartitionSpec{"d"});
  EXPECT_EQ(with_default("zzz"), PartitionSpec{"d"});
}

TEST(PatternPartitionSpecTest, Errors) {
  EXPECT_THAT([] { (void)create_pattern_based_partition_spec("a->b"); },
              ThrowsMessage<NoMeshError>(HasSubstr("No mesh found under this context manager.")));
  const Mesh explicit_mesh;  // an explicit mesh is never checked, as in eformer
  EXPECT_NO_THROW((void)create_pattern_based_partition_spec("a->b", &explicit_mesh));
  EXPECT_THAT([&] { (void)create_pattern_based_partition_spec("a->b->c", &explicit_mesh); },
              ThrowsMessage<ValueError>(HasSubstr("too many values to unpack (expected 2)")));
  EXPECT_THAT([&] { (void)create_pattern_based_partition_spec("(->b", &explicit_mesh); },
              ThrowsMessage<ValueError>(HasSubstr("cannot compile partition rule pattern")));
}

}  // namespace
}  // namespace numesh::sharding
