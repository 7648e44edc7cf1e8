#include "numesh/ops/kernels/key_block.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;

class KeyBlockLevelTest : public numesh::testing::KernelLevelTest {};

// A block of `count` keys and values of `d` floats, rows `stride` floats apart (as a cache lays
// them out), with a query.
struct Block {
  std::vector<float> q, kv_k, kv_v;
  std::vector<const float*> keys, values;
};

Block make_block(std::int64_t count, std::int64_t d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const std::int64_t stride = d + 3;
  Block b;
  b.q.resize(static_cast<std::size_t>(d));
  b.kv_k.resize(static_cast<std::size_t>(count * stride));
  b.kv_v.resize(static_cast<std::size_t>(count * stride));
  for (float& v : b.q) v = 2.0f * normal(rng);
  for (float& v : b.kv_k) v = normal(rng);
  for (float& v : b.kv_v) v = normal(rng);
  for (std::int64_t i = 0; i < count; ++i) {
    b.keys.push_back(b.kv_k.data() + i * stride);
    b.values.push_back(b.kv_v.data() + i * stride);
  }
  return b;
}

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

TEST_P(KeyBlockLevelTest, GivesTheScalarLevelsBitsAndTheSoftmaxWeightedValues) {
  for (const std::int64_t d : {1, 4, 15, 16, 17, 32, 64, 80, 96, 128, 144, 256}) {
    for (const std::int64_t count : {1, 7, 16, 17, 100, 256}) {
      const std::string what = "d " + std::to_string(d) + ", " + std::to_string(count) + " keys";
      const Block b = make_block(count, d, static_cast<unsigned>(d * 1000 + count));
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      std::vector<float> scores0(static_cast<std::size_t>(count)), scores(scores0.size());
      std::vector<float> o0(static_cast<std::size_t>(d), 9.0f), o(o0.size(), 9.0f);
      const KeyBlockStats want =
          attend_key_block(b.q.data(), b.keys.data(), b.values.data(), count, d, scale,
                           scores0.data(), o0.data(), KernelLevel::kScalar);
      const KeyBlockStats got = attend_key_block(b.q.data(), b.keys.data(), b.values.data(), count,
                                                 d, scale, scores.data(), o.data(), level());
      ASSERT_EQ(bits(got.max), bits(want.max)) << what;
      ASSERT_EQ(bits(got.sum), bits(want.sum)) << what;
      for (std::size_t i = 0; i < scores.size(); ++i)
        ASSERT_EQ(bits(scores[i]), bits(scores0[i])) << what << ", e of key " << i;
      for (std::size_t j = 0; j < o.size(); ++j)
        ASSERT_EQ(bits(o[j]), bits(o0[j])) << what << ", output " << j;
      // Against double: the scores, their max, the exponentials' sum and the weighted values.
      std::vector<double> s(static_cast<std::size_t>(count));
      double top = -INFINITY;
      for (std::int64_t i = 0; i < count; ++i) {
        double dot = 0;
        for (std::int64_t j = 0; j < d; ++j) dot += double{b.q[j]} * b.keys[i][j];
        s[static_cast<std::size_t>(i)] = dot * scale;
        top = std::max(top, s[static_cast<std::size_t>(i)]);
      }
      EXPECT_NEAR(want.max, top, 1e-5 * (1.0 + std::abs(top))) << what;
      double total = 0;
      std::vector<double> ref(static_cast<std::size_t>(d), 0.0);
      for (std::int64_t i = 0; i < count; ++i) {
        const double e = std::exp(s[static_cast<std::size_t>(i)] - top);
        total += e;
        for (std::int64_t j = 0; j < d; ++j) ref[static_cast<std::size_t>(j)] += e * b.values[i][j];
      }
      EXPECT_NEAR(want.sum, total, 1e-4 * total) << what;
      for (std::int64_t j = 0; j < d; ++j) {
        EXPECT_NEAR(o0[static_cast<std::size_t>(j)], ref[static_cast<std::size_t>(j)],
                    1e-4 * (1.0 + total))
            << what << ", output " << j;
      }
    }
  }
}

// The queries of one kv head at once give each query's bits alone, at every level: every run
// length the kernel takes, head sizes that do and do not fill a pass of output chunks, and
// queries and outputs laid out apart (as a ragged batch's partials are).
TEST_P(KeyBlockLevelTest, QueriesOfOneKvHeadAtOnceGiveEachQuerysBitsAlone) {
  for (std::int64_t heads = 1; heads <= kKeyBlockMaxHeads; ++heads) {
    for (const std::int64_t d : {1, 15, 16, 17, 32, 48, 64, 80, 96, 112, 128, 130, 144, 256}) {
      for (const std::int64_t count : {1, 16, 17, 256}) {
        const std::string what = std::to_string(heads) + " heads, d " + std::to_string(d) + ", " +
                                 std::to_string(count) + " keys";
        const Block b = make_block(count, d, static_cast<unsigned>(heads * 7 + d * 1000 + count));
        const std::int64_t q_stride = d + 5, o_stride = d + 9;
        std::vector<float> q(static_cast<std::size_t>(heads * q_stride));
        std::mt19937 rng(static_cast<unsigned>(count + heads));
        std::normal_distribution<float> normal;
        for (float& v : q) v = 2.0f * normal(rng);
        std::vector<float> scores(static_cast<std::size_t>(heads * count));
        std::vector<float> o(static_cast<std::size_t>(heads * o_stride), 9.0f);
        std::vector<KeyBlockStats> stats(static_cast<std::size_t>(heads));
        attend_key_block_heads(q.data(), q_stride, heads, b.keys.data(), b.values.data(), count, d,
                               0.125f, scores.data(), o.data(), o_stride, stats.data(), level());
        for (std::int64_t g = 0; g < heads; ++g) {
          std::vector<float> scores1(static_cast<std::size_t>(count)),
              o1(static_cast<std::size_t>(d));
          const KeyBlockStats want =
              attend_key_block(q.data() + g * q_stride, b.keys.data(), b.values.data(), count, d,
                               0.125f, scores1.data(), o1.data(), level());
          const auto gi = static_cast<std::size_t>(g);
          ASSERT_EQ(bits(stats[gi].max), bits(want.max)) << what << ", head " << g;
          ASSERT_EQ(bits(stats[gi].sum), bits(want.sum)) << what << ", head " << g;
          for (std::int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(bits(scores[static_cast<std::size_t>(g * count + i)]),
                      bits(scores1[static_cast<std::size_t>(i)]))
                << what << ", head " << g << ", e of key " << i;
          }
          for (std::int64_t j = 0; j < d; ++j) {
            ASSERT_EQ(bits(o[static_cast<std::size_t>(g * o_stride + j)]),
                      bits(o1[static_cast<std::size_t>(j)]))
                << what << ", head " << g << ", output " << j;
          }
          // The gaps between a head's outputs are the caller's and stay as they were.
          for (std::int64_t j = d; j < o_stride; ++j)
            ASSERT_EQ(o[static_cast<std::size_t>(g * o_stride + j)], 9.0f) << what << ", gap " << j;
        }
      }
    }
  }
}

// Keys and values stored as bf16 or f16 give, at every level, the bits the fp32 kernel gives over
// the same rows widened (and so the scalar level's): every run length, head sizes of one to
// sixteen chunks of 16, and queries and outputs laid out apart.
TEST_P(KeyBlockLevelTest, SixteenBitRowsGiveTheBitsOfTheirWidenedRows) {
  for (const DType rows : {DType::kBF16, DType::kF16}) {
    for (std::int64_t heads = 1; heads <= kKeyBlockMaxHeads; ++heads) {
      for (const std::int64_t d : {16, 32, 64, 80, 128, 144, 256}) {
        for (const std::int64_t count : {1, 16, 17, 256}) {
          const std::string what = std::string(to_string(rows)) + ", " + std::to_string(heads) +
                                   " heads, d " + std::to_string(d) + ", " + std::to_string(count) +
                                   " keys";
          const Block b = make_block(count, d, static_cast<unsigned>(heads * 11 + d * 100 + count));
          // The rows stored as 16 bits (the block's stride kept), and widened back.
          std::vector<std::uint16_t> k16(b.kv_k.size()), v16(b.kv_v.size());
          std::vector<float> kw(b.kv_k.size()), vw(b.kv_v.size());
          for (std::size_t i = 0; i < k16.size(); ++i) {
            k16[i] = rows == DType::kBF16 ? bf16_from_f32(b.kv_k[i]) : f16_from_f32(b.kv_k[i]);
            v16[i] = rows == DType::kBF16 ? bf16_from_f32(b.kv_v[i]) : f16_from_f32(b.kv_v[i]);
            kw[i] = rows == DType::kBF16 ? f32_from_bf16(k16[i]) : f32_from_f16(k16[i]);
            vw[i] = rows == DType::kBF16 ? f32_from_bf16(v16[i]) : f32_from_f16(v16[i]);
          }
          std::vector<const std::uint16_t*> keys16, values16;
          std::vector<const float*> keys, values;
          for (std::int64_t i = 0; i < count; ++i) {
            const std::ptrdiff_t at = b.keys[static_cast<std::size_t>(i)] - b.kv_k.data();
            keys16.push_back(k16.data() + at);
            values16.push_back(v16.data() + at);
            keys.push_back(kw.data() + at);
            values.push_back(vw.data() + at);
          }
          const std::int64_t q_stride = d + 5, o_stride = d + 9;
          std::vector<float> q(static_cast<std::size_t>(heads * q_stride));
          std::mt19937 rng(static_cast<unsigned>(count + heads + d));
          std::normal_distribution<float> normal;
          for (float& v : q) v = 2.0f * normal(rng);
          const auto n = static_cast<std::size_t>(heads);
          std::vector<float> scores(n * static_cast<std::size_t>(count)), scores_w(scores.size()),
              scores_s(scores.size());
          std::vector<float> o(n * static_cast<std::size_t>(o_stride), 9.0f), o_w(o), o_s(o);
          std::vector<KeyBlockStats> stats(n), stats_w(n), stats_s(n);
          attend_key_block_heads(q.data(), q_stride, heads, keys16.data(), values16.data(), rows,
                                 count, d, 0.125f, scores.data(), o.data(), o_stride, stats.data(),
                                 level());
          attend_key_block_heads(q.data(), q_stride, heads, keys.data(), values.data(), count, d,
                                 0.125f, scores_w.data(), o_w.data(), o_stride, stats_w.data(),
                                 level());
          attend_key_block_heads(q.data(), q_stride, heads, keys.data(), values.data(), count, d,
                                 0.125f, scores_s.data(), o_s.data(), o_stride, stats_s.data(),
                                 KernelLevel::kScalar);
          for (std::size_t g = 0; g < n; ++g) {
            ASSERT_EQ(bits(stats[g].max), bits(stats_w[g].max)) << what << ", head " << g;
            ASSERT_EQ(bits(stats[g].sum), bits(stats_w[g].sum)) << what << ", head " << g;
            ASSERT_EQ(bits(stats[g].sum), bits(stats_s[g].sum)) << what << ", head " << g;
          }
          for (std::size_t i = 0; i < scores.size(); ++i) {
            ASSERT_EQ(bits(scores[i]), bits(scores_w[i])) << what << ", e " << i;
            ASSERT_EQ(bits(scores[i]), bits(scores_s[i])) << what << ", e " << i;
          }
          for (std::size_t j = 0; j < o.size(); ++j) {
            ASSERT_EQ(bits(o[j]), bits(o_w[j])) << what << ", output " << j;
            ASSERT_EQ(bits(o[j]), bits(o_s[j])) << what << ", output " << j;
          }
        }
      }
    }
  }
}

TEST_P(KeyBlockLevelTest, SixteenBitRowsRefuseOtherDtypesAndHeadSizesOutsideWholeChunks) {
  const std::vector<std::uint16_t> row(48, 0);
  const std::uint16_t* rows[1] = {row.data()};
  std::vector<float> q(48, 1.0f), scores(1), o(48);
  KeyBlockStats st;
  try {
    attend_key_block_heads(q.data(), 40, 1, rows, rows, DType::kBF16, 1, 40, 1.0f, scores.data(),
                           o.data(), 40, &st, level());
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16, not 40"), std::string::npos) << e.what();
  }
  try {
    attend_key_block_heads(q.data(), 48, 1, rows, rows, DType::kQ8_0, 1, 48, 1.0f, scores.data(),
                           o.data(), 48, &st, level());
    FAIL() << "expected TypeError";
  } catch (const TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("stored as q8_0: expected bf16 or f16"), std::string::npos)
        << e.what();
  }
}

NUMESH_INSTANTIATE_LEVELS(KeyBlockLevelTest);

}  // namespace
}  // namespace numesh::ops
