// The LM head (lowering/lm_head.hpp): logits against the float64 reference and greedy picks
// against argmax over the whole row, on meshes that split the vocabulary, the rows, both or
// neither (a vocabulary tp does not divide is replicated), fp32 and 16-bit weights; ties, NaN
// and the errors.

#include "numesh/ops/lowering/lm_head.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/argmax.hpp"
#include "numesh/ops/reference/lm_head.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using testing::MeshCase;
using ::testing::ThrowsMessage;

class LmHeadTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(LmHeadTest, LogitsMatchTheReferenceAndGreedyPicksTheirArgmax) {
  const MeshCase& c = GetParam();
  const runtime::DeviceMesh mesh = testing::make_mesh(c);
  // V 1000 divides tp 1, 2 and 4; 1002 does not divide 4 (replicated there); rows 1 and 6.
  for (std::int64_t vocab : {std::int64_t{1000}, std::int64_t{1002}}) {
    for (std::int64_t rows : {std::int64_t{1}, std::int64_t{6}}) {
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        const std::string label = testing::mesh_label(c) + " V=" + std::to_string(vocab) +
                                  " rows=" + std::to_string(rows) + " " + std::string(to_string(t));
        const LmHeadWeights w{.weight = testing::random_host({64, vocab}, 5, 0.125f),
                              .stored_as = t};
        const runtime::HostTensor x = testing::random_host({rows, 64}, 6, 1.0f);
        ShardedLmHead head(mesh, w, rows);
        const runtime::HostTensor logits = head.logits(x);
        const runtime::HostTensor want = lm_head_reference(x, w);
        // fp32 sums of 64 products: the sharded operators' bound (bf16: the rare activation
        // rounding to the other neighbour, as in WeightDtypeTest).
        EXPECT_TRUE(testing::matches_reference(logits, want, t == DType::kBF16 ? 1e-4 : 1e-5))
            << label;
        // Greedy is the argmax of the logits the devices computed, exactly.
        EXPECT_EQ(head.greedy(x), argmax_rows(logits)) << label;
      }
    }
  }
}

TEST_P(LmHeadTest, ScoredCandidatesGiveEachRowsLogSumExp) {
  const MeshCase& c = GetParam();
  const runtime::DeviceMesh mesh = testing::make_mesh(c);
  for (std::int64_t vocab : {std::int64_t{1000}, std::int64_t{1002}}) {
    const std::int64_t rows = 6;
    const std::string label = testing::mesh_label(c) + " V=" + std::to_string(vocab);
    const LmHeadWeights w{.weight = testing::random_host({64, vocab}, 7, 0.5f)};
    const runtime::HostTensor x = testing::random_host({rows, 64}, 8, 1.0f);
    ShardedLmHead head(mesh, w, rows);
    const runtime::HostTensor logits = head.logits(x);
    const ShardedLmHead::ScoredCandidates scored = head.scored_candidates(x, 5);
    // The candidates are those of candidates(), and each row's normaliser is the log-sum-exp of
    // the logits the devices computed, in double.
    EXPECT_EQ(scored.candidates.data, head.candidates(x, 5).data) << label;
    ASSERT_EQ(scored.log_normalizers.size(), static_cast<std::size_t>(rows)) << label;
    for (std::int64_t r = 0; r < rows; ++r) {
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (std::int64_t v = 0; v < vocab; ++v) m = std::max<double>(m, logits.data[r * vocab + v]);
      for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(logits.data[r * vocab + v] - m);
      EXPECT_NEAR(scored.log_normalizers[r], m + std::log(sum), 1e-5) << label << " row " << r;
    }
  }
}

TEST(LmHeadTest, LogSumExpOfRowsThatRuleOutEveryTokenOrHoldNan) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> rows = {-inf, -inf, 1.0f, std::nanf(""), 0.0f, 0.0f};
  std::vector<float> out(3);
  row_log_sum_exp(ConstMatrixMap(rows.data(), 3, 2), out.data());
  EXPECT_EQ(out[0], -inf);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_FLOAT_EQ(out[2], std::log(2.0f));
  EXPECT_THAT([] { (void)log_normalizers(runtime::HostTensor::zeros({2})); },
              ThrowsMessage<ShapeError>(HasSubstr("must be [rows, n]")));
}

INSTANTIATE_TEST_SUITE_P(Meshes, LmHeadTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2}, {"dp"}},
                                           MeshCase{{2, 2}, {"dp", "tp"}}),
                         testing::mesh_case_name);

TEST(LmHeadTest, TheVocabularyIsSplitWhenItDividesAndReplicatedOtherwise) {
  const runtime::DeviceMesh tp4 = testing::make_mesh({{4}, {"tp"}});
  const LmHeadWeights even{.weight = testing::random_host({8, 1000}, 1, 1.0f)};
  const LmHeadWeights odd{.weight = testing::random_host({8, 1002}, 1, 1.0f)};
  EXPECT_EQ(ShardedLmHead(tp4, even, 2).weight_spec().repr(), "P(None, 'tp')");
  EXPECT_EQ(ShardedLmHead(tp4, odd, 2).weight_spec().repr(), "P()");
}

TEST(LmHeadTest, TiesGoToTheLowestIndexAcrossShards) {
  // Columns 100, 600 and 900 equal and largest: on tp4 they sit on shards 0, 2 and 3.
  runtime::HostTensor w = runtime::HostTensor::zeros({4, 1000});
  for (std::int64_t col : {std::int64_t{100}, std::int64_t{600}, std::int64_t{900}}) {
    for (std::int64_t h = 0; h < 4; ++h) w.data[static_cast<std::size_t>(h * 1000 + col)] = 1.0f;
  }
  runtime::HostTensor x = runtime::HostTensor::zeros({2, 4});
  std::fill(x.data.begin(), x.data.end(), 1.0f);
  for (const MeshCase& c : {MeshCase{{1}, {"tp"}}, MeshCase{{4}, {"tp"}}}) {
    ShardedLmHead head(testing::make_mesh(c), LmHeadWeights{.weight = w}, 2);
    EXPECT_EQ(head.greedy(x), (std::vector<std::int64_t>{100, 100})) << testing::mesh_label(c);
  }
}

TEST(LmHeadTest, ANanLogitIsPickedAsTorchArgmaxPicksIt) {
  // torch.argmax treats NaN as the largest value: the first NaN of the row wins.
  runtime::HostTensor w = testing::random_host({4, 1000}, 2, 1.0f);
  for (std::int64_t h = 0; h < 4; ++h)
    w.data[static_cast<std::size_t>(h * 1000 + 700)] = std::nanf("");
  const runtime::HostTensor x = testing::random_host({1, 4}, 3, 1.0f);
  ShardedLmHead head(testing::make_mesh({{4}, {"tp"}}), LmHeadWeights{.weight = w}, 1);
  EXPECT_EQ(head.greedy(x), (std::vector<std::int64_t>{700}));
  EXPECT_EQ(argmax_rows(head.logits(x)), (std::vector<std::int64_t>{700}));
  // The host's half on hand-made candidates: (value, index) per shard in vocabulary order.
  runtime::HostTensor candidates = runtime::HostTensor::zeros({3, 6});
  candidates.data = {1,
                     10,
                     3,
                     250,
                     3,
                     600,  // a tie: the first shard's index
                     5,
                     7,
                     std::nanf(""),
                     300,
                     std::nanf(""),
                     800,  // the first NaN
                     -1,
                     0,
                     -2,
                     260,
                     -3,
                     510};
  EXPECT_EQ(pick_greedy(candidates), (std::vector<std::int64_t>{250, 300, 0}));
}

TEST(LmHeadTest, RowArgmaxIsTheSameForAnyThreadCount) {
  const runtime::HostTensor logits = testing::random_host({37, 3000}, 4, 1.0f);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 4, 7}) {
    std::vector<float> out(2 * 37);
    oneapi::tbb::task_arena arena(threads);
    arena.execute(
        [&] { row_argmax(ConstMatrixMap(logits.data.data(), 37, 3000), 5000, out.data()); });
    if (first.empty()) {
      first = out;
      const std::vector<std::int64_t> want = argmax_rows(logits);
      for (std::size_t r = 0; r < 37; ++r)
        EXPECT_EQ(out[2 * r + 1], static_cast<float>(5000 + want[r])) << r;
    } else {
      EXPECT_EQ(out, first) << threads << " threads";
    }
  }
}

TEST(LmHeadTest, RowTopKIsTheSortedHeadOfEveryRow) {
  runtime::HostTensor logits = testing::random_host({9, 300}, 8, 1.0f);
  logits.data[5] = logits.data[6] = 10.0f;  // a tie in row 0: the lower index first
  // k = 1, a few, and every column (the heap then fills the whole second half of each row's
  // output, which it shares with the results).
  for (const std::int64_t k : {1, 5, 300}) {
    std::vector<float> out(static_cast<std::size_t>(2 * k * 9), -1.0f);
    row_top_k(ConstMatrixMap(logits.data.data(), 9, 300), 1000, k, out.data());
    for (std::int64_t r = 0; r < 9; ++r) {
      std::vector<std::pair<float, std::int64_t>> row;
      for (std::int64_t j = 0; j < 300; ++j)
        row.push_back({logits.data[static_cast<std::size_t>(r * 300 + j)], j});
      std::stable_sort(row.begin(), row.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (std::int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(out[static_cast<std::size_t>(r * 2 * k + 2 * i)],
                  row[static_cast<std::size_t>(i)].first)
            << "k " << k << ", row " << r << ", entry " << i;
        ASSERT_EQ(out[static_cast<std::size_t>(r * 2 * k + 2 * i + 1)],
                  static_cast<float>(1000 + row[static_cast<std::size_t>(i)].second))
            << "k " << k << ", row " << r << ", entry " << i;
      }
    }
    EXPECT_EQ(out[1], 1005.0f);
    if (k > 1) {
      EXPECT_EQ(out[3], 1006.0f);
    }
  }
}

TEST(LmHeadTest, SamplingDrawsFromTheSoftmaxOfTheKeptTokens) {
  // Candidates of one row as two devices would give them (each its best, in any order):
  // logits 2, 1, 0, ln 0.5 ... with temperature 1, top-k 3: p = e^2, e^1, e^0 normalised.
  runtime::HostTensor c = runtime::HostTensor::zeros({1, 10});
  c.data = {0.0f, 7.0f, 2.0f, 3.0f, -5.0f, 9.0f, 1.0f, 4.0f, -9.0f, 1.0f};  // (value, index) pairs
  std::mt19937_64 rng(11);
  const SamplingOptions top3{.temperature = 1.0, .top_k = 3, .top_p = 1.0};
  std::map<std::int64_t, int> counts;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[pick_sampled(c, top3, rng).front()];
  const double z = std::exp(2.0) + std::exp(1.0) + 1.0;
  EXPECT_EQ(counts.size(), 3u) << "only the top 3 are drawn";
  EXPECT_NEAR(counts[3] / double(draws), std::exp(2.0) / z, 0.01);
  EXPECT_NEAR(counts[4] / double(draws), std::exp(1.0) / z, 0.01);
  EXPECT_NEAR(counts[7] / double(draws), 1.0 / z, 0.01);
  // Top-p 0.5: the most likely token alone holds 0.665 of the mass.
  const SamplingOptions nucleus{.temperature = 1.0, .top_k = 3, .top_p = 0.5};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(pick_sampled(c, nucleus, rng).front(), 3);
  // A tiny temperature is greedy; top-k 1 is greedy whatever the temperature.
  EXPECT_EQ(
      pick_sampled(c, SamplingOptions{.temperature = 1e-3, .top_k = 5, .top_p = 1.0}, rng).front(),
      3);
  EXPECT_EQ(
      pick_sampled(c, SamplingOptions{.temperature = 50.0, .top_k = 1, .top_p = 1.0}, rng).front(),
      3);
  // The same seed draws the same tokens.
  std::mt19937_64 a(5), b(5);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(pick_sampled(c, top3, a), pick_sampled(c, top3, b));
}

TEST(LmHeadTest, ShardedSamplingKeepsTheGlobalTopK) {
  // Top-k 1 is the argmax: on every mesh the sampled token is the greedy one.
  const LmHeadWeights w{.weight = testing::random_host({32, 1000}, 12, 0.3f)};
  const runtime::HostTensor x = testing::random_host({3, 32}, 13, 1.0f);
  std::mt19937_64 rng(1);
  for (const MeshCase& c :
       {MeshCase{{1}, {"tp"}}, MeshCase{{4}, {"tp"}}, MeshCase{{2, 2}, {"dp", "tp"}}}) {
    ShardedLmHead head(testing::make_mesh(c), w, 3);
    EXPECT_EQ(head.sample(x, SamplingOptions{.temperature = 0.7, .top_k = 1, .top_p = 1.0}, rng),
              head.greedy(x))
        << testing::mesh_label(c);
    // Top-k 40 over the devices' candidates draws only among the global top 40.
    const runtime::HostTensor logits = head.logits(x);
    for (int i = 0; i < 50; ++i) {
      const std::vector<std::int64_t> t =
          head.sample(x, SamplingOptions{.temperature = 1.0, .top_k = 40, .top_p = 1.0}, rng);
      for (std::int64_t r = 0; r < 3; ++r) {
        const float chosen =
            logits.data[static_cast<std::size_t>(r * 1000 + t[static_cast<std::size_t>(r)])];
        int larger = 0;
        for (std::int64_t j = 0; j < 1000; ++j)
          larger += logits.data[static_cast<std::size_t>(r * 1000 + j)] > chosen;
        EXPECT_LT(larger, 40) << testing::mesh_label(c) << " row " << r;
      }
    }
  }
}

TEST(LmHeadTest, BadSamplingOptionsAreRefused) {
  EXPECT_THAT(
      [] { validate(SamplingOptions{.temperature = -1.0}); },
      ThrowsMessage<ValueError>(
          "sampling: temperature -1 must be positive (greedy decoding takes no temperature)"));
  EXPECT_THAT([] { validate(SamplingOptions{.temperature = 1.0, .top_k = 0}); },
              ThrowsMessage<ValueError>("sampling: top-k 0 must be at least 1"));
  EXPECT_THAT([] { validate(SamplingOptions{.temperature = 1.0, .top_k = 4, .top_p = 1.5}); },
              ThrowsMessage<ValueError>("sampling: top-p 1.5 must be in (0, 1]"));
  runtime::HostTensor c = runtime::HostTensor::zeros({1, 4});
  c.data = {1.0f, 0.0f, std::nanf(""), 1.0f};
  std::mt19937_64 rng(1);
  EXPECT_THAT([&] { pick_sampled(c, SamplingOptions{}, rng); },
              ThrowsMessage<ValueError>(
                  "sampling: row 0 holds a logit of nan: nothing sound to sample from"));
  // -inf rules a token out; a row of nothing else is refused.
  c.data = {-std::numeric_limits<float>::infinity(), 0.0f, 2.0f, 1.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(pick_sampled(c, SamplingOptions{}, rng).front(), 1);
  c.data = {-std::numeric_limits<float>::infinity(), 0.0f, -std::numeric_limits<float>::infinity(),
            1.0f};
  EXPECT_THAT(
      [&] { pick_sampled(c, SamplingOptions{}, rng); },
      ThrowsMessage<ValueError>("sampling: row 0 rules out every token (all its logits are -inf)"));
  // A NaN logit on the devices reaches the host's check whatever its rank (row_top_k ranks it
  // first).
  runtime::HostTensor w = testing::random_host({4, 1000}, 2, 1.0f);
  for (std::int64_t h = 0; h < 4; ++h)
    w.data[static_cast<std::size_t>(h * 1000 + 700)] = std::nanf("");
  ShardedLmHead head(testing::make_mesh({{2}, {"tp"}}), LmHeadWeights{.weight = w}, 1);
  EXPECT_THAT(
      [&] {
        head.sample(testing::random_host({1, 4}, 3, 1.0f), SamplingOptions{.top_k = 3}, rng);
      },
      ThrowsMessage<ValueError>(
          "sampling: row 0 holds a logit of nan: nothing sound to sample from"));
}

TEST(LmHeadTest, BadShapesAreRefusedNamingThem) {
  const runtime::DeviceMesh mesh = testing::make_mesh({{2}, {"tp"}});
  EXPECT_THAT(
      [&] { ShardedLmHead(mesh, LmHeadWeights{.weight = runtime::HostTensor::zeros({8})}, 1); },
      ThrowsMessage<ShapeError>(
          "lm head: weight [8] must be [H, V] with H, V >= 1 and V <= 16777216"));
  EXPECT_THAT(
      [&] {
        ShardedLmHead(mesh, LmHeadWeights{.weight = runtime::HostTensor::zeros({8, 10})}, 0);
      },
      ThrowsMessage<ShapeError>("lm head: 0 rows; need at least one"));
  ShardedLmHead head(mesh, LmHeadWeights{.weight = runtime::HostTensor::zeros({8, 10})}, 2);
  EXPECT_THAT(
      [&] {
        head.greedy(runtime::HostTensor::zeros({2, 7}));
      },
      ThrowsMessage<ShapeError>("lm head: input is [2, 7] but the head was compiled for [2, 8]"));
  EXPECT_THAT(
      [] {
        lm_head_reference(runtime::HostTensor::zeros({2, 7}),
                          LmHeadWeights{.weight = runtime::HostTensor::zeros({8, 10})});
      },
      ThrowsMessage<ShapeError>(HasSubstr("lm head: x [2, 7] and weight [8, 10] do not multiply")));
  EXPECT_THAT(
      [] {
        argmax_rows(runtime::HostTensor::zeros({2, 0}));
      },
      ThrowsMessage<ShapeError>("argmax: logits [2, 0] must be [rows, V] with V >= 1"));
  EXPECT_THAT(
      [] {
        pick_greedy(runtime::HostTensor::zeros({2, 3}));
      },
      ThrowsMessage<ShapeError>("greedy pick: candidates [2, 3] must be [rows, 2 * shards]"));
}

}  // namespace
}  // namespace numesh::ops
