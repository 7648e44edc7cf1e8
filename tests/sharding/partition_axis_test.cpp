#include "numesh/sharding/partition_axis.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "numesh/core/error.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Each test that touches the process-global registry starts and ends with it empty.
class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { PartitionAxis::clear_registered_axes(); }
  void TearDown() override { PartitionAxis::clear_registered_axes(); }
};

TEST(PartitionAxisTest, DerivesFieldsFromRenamedMeshAxes) {
  PartitionAxis pa({.tensor_parallel_axis = "model", .sequence_parallel_axis = "seq"});
  EXPECT_EQ(pa.fields().head_axis, AxisRule("model"));
  EXPECT_EQ(pa.fields().vocab_axis, AxisRule("model"));
  EXPECT_EQ(pa.fields().query_sequence_axis, AxisRule("seq"));
  EXPECT_EQ(pa.fields().decode_head_axis, AxisRule("model"));
  EXPECT_EQ(pa.fields().batch_axis, AxisRule::tuple({"fsdp", "dp"}));
}

TEST(PartitionAxisTest, ExplicitNoneIsKeptNotDerived) {
  PartitionAxis pa({.head_axis = nullptr});
  EXPECT_TRUE(pa.fields().head_axis.is_none());
  EXPECT_TRUE(pa.fields().decode_head_axis.is_none());
  EXPECT_EQ(pa.resolve_spec({std::string(tokens::kHead)}, Mode::kTrain), PartitionSpec{nullptr});
}

TEST(PartitionAxisTest, NotGivenMeshNameIsReported) {
  EXPECT_THAT(
      [] { PartitionAxis pa({.data_parallel_axis = not_given}); },
      ThrowsMessage<ValueError>("Partitioning rule `data_parallel_axis` was not resolved."));
}

TEST(PartitionAxisTest, UnknownKeywordIsATypeError) {
  EXPECT_THAT(
      [] {
        (void)PartitionAxis::from_kwargs({{"heads_axis", "tp"}});
      },
      ThrowsMessage<TypeError>(HasSubstr("unexpected keyword argument 'heads_axis'")));
}

TEST(PartitionAxisTest, ReplaceDoesNotRederive) {
  PartitionAxis pa = PartitionAxis().replace({{"tensor_parallel_axis", "model"}});
  EXPECT_EQ(pa.fields().tensor_parallel_axis, AxisRule("model"));
  EXPECT_EQ(pa.fields().head_axis, AxisRule("tp"));
}

TEST(PartitionAxisTest, DecodeTwinAppliesOnlyInGenerationModes) {
  PartitionAxis pa({.decode_batch_axis = "dp"});
  const std::vector<AxisRule> axes = {std::string(tokens::kBatch)};
  EXPECT_EQ(pa.resolve_spec(axes, Mode::kTrain), PartitionSpec{AxisRule::tuple({"fsdp", "dp"})});
  EXPECT_EQ(pa.resolve_spec(axes, Mode::kPrefill), PartitionSpec{AxisRule::tuple({"fsdp", "dp"})});
  EXPECT_EQ(pa.resolve_spec(axes, Mode::kDecode), PartitionSpec{"dp"});
  EXPECT_EQ(pa.resolve_spec(axes, Mode::kInsert), PartitionSpec{"dp"});
}

TEST(PartitionAxisTest, UnknownTopLevelTokenNamesIt) {
  EXPECT_THAT([] { (void)PartitionAxis().resolve_axis({"tp"}, Mode::kTrain); },
              ThrowsMessage<ValueError>("Unknown semantic axis name: 'tp'"));
  // Inside a composite the same literal is a mesh axis name.
  EXPECT_EQ(PartitionAxis().resolve_spec({AxisRule::list({"tp", "sp"})}, Mode::kTrain),
            PartitionSpec{AxisRule::tuple({"tp", "sp"})});
}

TEST(PartitionAxisTest, JsonRoundTripKeepsEveryField) {
  PartitionAxis pa({.tensor_parallel_axis = "model",
                    .head_axis = AxisRule::tuple({"model", "ep"}),
                    .decode_query_sequence_axis = ""});
  const nlohmann::json j = pa.to_json();
  EXPECT_EQ(j["head_axis"], nlohmann::json::array({"model", "ep"}));
  EXPECT_EQ(j["expert_gate_axis"], nullptr);
  EXPECT_EQ(PartitionAxis::from_json(j), pa);
  EXPECT_EQ(PartitionAxis::from_json(nlohmann::json::parse(j.dump())), pa);
}

TEST(PartitionAxisTest, FromJsonRejectsBadValuesByName) {
  EXPECT_THAT(
      [] {
        (void)PartitionAxis::from_json({{"head_axis", {{"x", 1}}}});
      },
      ThrowsMessage<TypeError>(HasSubstr("field 'head_axis' must be null")));
  EXPECT_THAT([] { (void)PartitionAxis::from_json(nlohmann::json::array()); },
              ThrowsMessage<TypeError>(HasSubstr("must be a JSON object")));
}

TEST_F(RegistryTest, RegisterResolvesAndInfersGenerationRule) {
  PartitionAxis::register_axis("  __ROWS__ ", "head_axis");
  const auto reg = PartitionAxis::get_registered_axes();
  ASSERT_EQ(reg.count("__ROWS__"), 1u);
  EXPECT_EQ(reg.at("__ROWS__").generation_axis_rule, AxisRule("decode_head_axis"));
  PartitionAxis pa({.decode_head_axis = "dp"});
  EXPECT_EQ(pa.resolve_spec({"__ROWS__"}, Mode::kTrain), PartitionSpec{"tp"});
  EXPECT_EQ(pa.resolve_spec({"__ROWS__"}, Mode::kDecode), PartitionSpec{"dp"});
}

TEST_F(RegistryTest, ErrorsNameTheToken) {
  EXPECT_THAT([] { PartitionAxis::register_axis("  ", "tp"); },
              ThrowsMessage<ValueError>("`semantic_axis` must be a non-empty string."));
  EXPECT_THAT([] { PartitionAxis::register_axis(tokens::kBatch, "tp"); },
              ThrowsMessage<ValueError>(
                  "Semantic axis '__BATCH__' already exists. Use override=True to replace it."));
  try {
    PartitionAxis::unregister_axis("__NOPE__", /*missing_ok=*/false);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_STREQ(e.what(), "Semantic axis '__NOPE__' is not registered.");
  }
}

TEST_F(RegistryTest, CycleIsReportedAtTheRepeatedToken) {
  PartitionAxis::register_axis("__A__", "__B__");
  PartitionAxis::register_axis("__B__", "__A__");
  EXPECT_THAT([] { (void)PartitionAxis().resolve_axis({"__A__"}, Mode::kTrain); },
              ThrowsMessage<ValueError>("Cyclic semantic axis registration detected at '__B__'."));
}

TEST_F(RegistryTest, ConcurrentRegistrationAndResolutionAreSafe) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::atomic<int> resolved{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &resolved] {
      const PartitionAxis pa;
      for (int i = 0; i < kPerThread; ++i) {
        const std::string name = "__T" + std::to_string(t) + "_" + std::to_string(i) + "__";
        PartitionAxis::register_axis(name, i % 2 ? "head_axis" : "tp");
        if (pa.resolve_spec({name, std::string(tokens::kBatch)}, Mode::kDecode) ==
            PartitionSpec{"tp", AxisRule::tuple({"fsdp", "dp"})}) {
          ++resolved;
        }
        if (i % 5 == 0) PartitionAxis::unregister_axis(name);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(resolved.load(), kThreads * kPerThread);
  EXPECT_EQ(PartitionAxis::get_registered_axes().size(),
            static_cast<std::size_t>(kThreads * (kPerThread - kPerThread / 5)));
}

}  // namespace
}  // namespace numesh::sharding
