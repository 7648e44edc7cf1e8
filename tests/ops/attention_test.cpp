#include "numesh/ops/lowering/attention.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::devices;
using testing::make_mesh;
using testing::matches_reference;
using testing::mesh_case_name;
using testing::mesh_label;
using testing::MeshCase;
using testing::token_slice;

using testing::random_host;

runtime::HostTensor dense_attention(const runtime::HostTensor& x, const AttentionWeights& w,
                                    const AttentionConfig& c) {
  return attention_layer_reference(x, w, c);
}

// A config of hq/hkv heads of dim d and random weights for hidden size `hidden`.
std::pair<AttentionConfig, AttentionWeights> random_layer(std::int64_t hidden, std::int64_t hq,
                                                          std::int64_t hkv, std::int64_t d,
                                                          std::uint32_t seed) {
  AttentionConfig c;
  c.num_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  AttentionWeights w;
  w.wq = random_host({hidden, hq * d}, seed, 0.3f);
  w.wk = random_host({hidden, hkv * d}, seed + 1, 0.3f);
  w.wv = random_host({hidden, hkv * d}, seed + 2, 0.3f);
  w.wo = random_host({hq * d, hidden}, seed + 3, 0.3f);
  return {c, w};
}

class ShardedAttentionTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ShardedAttentionTest, EqualsTheDenseLayerForMhaGqaAndMqa) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t hidden = 16, d = 8, t = 5;
  for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
    for (std::int64_t batch : {2, 3}) {  // 3 sequences do not split over dp = 2: replicated
      const auto [c, w] = random_layer(hidden, hq, hkv, d, 1);
      const runtime::HostTensor x = random_host({batch, t, hidden}, 5, 1.0f);
      ShardedAttention layer(mesh, c, w, batch);
      const runtime::HostTensor y = layer.forward(x);
      const runtime::HostTensor want = dense_attention(x, w, c);
      // The output projection's sum runs split over tp, then the all-reduce: fp32 bound
      // max(1e-5, 2 * (heads * head_dim) * epsilon) relative.
      EXPECT_TRUE(matches_reference(
          y, want, std::max(1e-5, 2.0 * hq * d * std::numeric_limits<float>::epsilon())))
          << "heads " << hq << "/" << hkv << " batch " << batch << " local heads "
          << layer.local_heads();
      EXPECT_EQ(layer.forward(x), y) << "runs again with the same result";
    }
  }
}

TEST_P(ShardedAttentionTest, KvCachePrefillInsertAndDecodeEqualTheFullSequence) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t hidden = 16, d = 8, batch = 2, total = 7;
  for (KvLayout layout : {KvLayout::kBTHD, KvLayout::kBHTD}) {
    for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
      const auto [c, w] = random_layer(hidden, hq, hkv, d, 11);
      const runtime::HostTensor x = random_host({batch, total, hidden}, 15, 1.0f);
      const runtime::HostTensor want = dense_attention(x, w, c);
      ShardedAttention layer(mesh, c, w, batch, /*max_len=*/8, {}, layout);
      // Prefill 3 tokens, insert a chunk of 2 at position 3, decode one token at 5 and at 6:
      // each step's output equals the full causal layer's rows for those positions.
      const double bound = std::max(1e-5, 2.0 * hq * d * std::numeric_limits<float>::epsilon());
      for (auto [from, n] : {std::pair{0, 3}, std::pair{3, 2}, std::pair{5, 1}, std::pair{6, 1}}) {
        const runtime::HostTensor y = layer.forward(token_slice(x, from, n), from);
        EXPECT_TRUE(matches_reference(y, token_slice(want, from, n), bound))
            << to_string(layout) << " heads " << hq << "/" << hkv << " tokens [" << from << ", "
            << from + n << ")";
      }
      EXPECT_EQ(layer.program(1).plan().tensors.size(), layer.program(3).plan().tensors.size())
          << "every program lists the same weights and caches";
    }
  }
}

// Qwen2's q/k/v biases (and Llama's attention_bias: o too) and Qwen3's per-head RMSNorm of q
// and k: each device adds its heads' slices of the biases, normalises its heads, and the output
// bias is added once across the devices whose partial sums the all-reduce adds. Through the
// cache (prefill, decode) and without (train).
TEST_P(ShardedAttentionTest, BiasesAndQkNormsEqualTheDenseLayer) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t hidden = 16, d = 8, batch = 2, total = 6;
  for (auto [hq, hkv] : {std::pair{4, 2}, std::pair{4, 1}}) {
    auto [c, w] = random_layer(hidden, hq, hkv, d, 21);
    c.qk_norm_eps = 1e-5f;
    w.bq = random_host({hq * d}, 30, 0.5f);
    w.bk = random_host({hkv * d}, 31, 0.5f);
    w.bv = random_host({hkv * d}, 32, 0.5f);
    w.bo = random_host({hidden}, 33, 0.5f);
    w.q_norm = random_host({d}, 34, 0.2f);
    w.k_norm = random_host({d}, 35, 0.2f);
    for (float& v : w.q_norm.data) v += 1.0f;
    for (float& v : w.k_norm.data) v += 1.0f;
    const runtime::HostTensor x = random_host({batch, total, hidden}, 36, 1.0f);
    const runtime::HostTensor want = dense_attention(x, w, c);
    const double bound = std::max(1e-5, 2.0 * hq * d * std::numeric_limits<float>::epsilon());
    ShardedAttention train(mesh, c, w, batch);
    EXPECT_TRUE(matches_reference(train.forward(x), want, bound))
        << "train, heads " << hq << "/" << hkv;
    ShardedAttention cached(mesh, c, w, batch, /*max_len=*/8);
    for (auto [from, n] : {std::pair{0, 4}, std::pair{4, 1}, std::pair{5, 1}}) {
      EXPECT_TRUE(matches_reference(cached.forward(token_slice(x, from, n), from),
                                    token_slice(want, from, n), bound))
          << "heads " << hq << "/" << hkv << " tokens [" << from << ", " << from + n << ")";
    }
    // Without the extras the layer is another one: the check sees them.
    AttentionWeights plain = w;
    plain.bq = plain.bk = plain.bv = plain.bo = plain.q_norm = plain.k_norm = {};
    EXPECT_FALSE(
        numesh::testing::within_abs(std::span<const float>(dense_attention(x, plain, c).data),
                                    std::span<const float>(want.data), 1e-3));
  }
  // Named references, not a structured binding: clang 14 cannot capture a binding in a lambda.
  auto layer = random_layer(hidden, 4, 2, d, 21);
  auto& c = layer.first;
  auto& w = layer.second;
  w.bk = random_host({3}, 1, 1.0f);
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, batch); },
              ::testing::ThrowsMessage<ShapeError>(
                  "attention: bk [3] must be [16] (num_kv_heads * head_dim) or empty"));
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedAttentionTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2}, {"dp"}},
                                           MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{2, 4}, {"dp", "tp"}}),
                         mesh_case_name);

// Long inputs take the blocked GEMM path (blocks of 64 queries, causal key blocks skipped):
// 150 tokens prefilled (3 blocks, the last partial), then an insert of 20 (blocked again, at an
// offset), then a decode step; against the one-query-at-a-time reference.
TEST(ShardedAttentionTest, TheBlockedPathForLongInputsEqualsTheReference) {
  const std::int64_t hidden = 32, d = 16, batch = 2;
  for (const MeshCase& mc : {MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}}, MeshCase{{2}, {"sp"}}}) {
    const auto mesh = make_mesh(mc);
    const auto [c, w] = random_layer(hidden, 4, 2, d, 31);
    const runtime::HostTensor x = random_host({batch, 171, hidden}, 35, 1.0f);
    const runtime::HostTensor want = dense_attention(x, w, c);
    const double bound = std::max(1e-5, 2.0 * 4 * d * std::numeric_limits<float>::epsilon());
    ShardedAttention layer(mesh, c, w, batch, 171,
                           AttentionAxes{.batch = {"dp"}, .sequence = {"sp"}, .heads = "tp"});
    for (auto [from, n] : {std::pair{0, 150}, std::pair{150, 20}, std::pair{170, 1}}) {
      EXPECT_TRUE(matches_reference(layer.forward(token_slice(x, from, n), from),
                                    token_slice(want, from, n), bound))
          << mesh_label(mc) << " tokens [" << from << ", " << from + n << ")";
    }
    ShardedAttention train(mesh, c, w, batch, 0,
                           AttentionAxes{.batch = {"dp"}, .sequence = {"sp"}, .heads = "tp"});
    EXPECT_TRUE(
        matches_reference(train.forward(token_slice(x, 0, 150)), token_slice(want, 0, 150), bound))
        << mesh_label(mc) << " train";
  }
}

// Sequence parallelism: tokens split over sp, keys and values all-gathered over it; without a
// cache and with one (prefill 4 split over sp, then decode steps replicated over sp).
TEST(ShardedAttentionTest, SequenceParallelEqualsTheFullLayer) {
  const std::int64_t hidden = 16, d = 8, batch = 2, total = 6;
  for (const MeshCase& mc : {MeshCase{{2}, {"sp"}}, MeshCase{{2, 2}, {"sp", "tp"}},
                             MeshCase{{2, 2}, {"dp", "sp"}}, MeshCase{{4}, {"sp"}}}) {
    const auto mesh = make_mesh(mc);
    const auto [c, w] = random_layer(hidden, 4, 2, d, 21);
    const runtime::HostTensor x = random_host({batch, total, hidden}, 25, 1.0f);
    const runtime::HostTensor want = dense_attention(x, w, c);
    const double bound = std::max(1e-5, 2.0 * 4 * d * std::numeric_limits<float>::epsilon());
    const AttentionAxes axes{.batch = {"dp"}, .sequence = {"sp"}, .heads = "tp"};
    ShardedAttention train(mesh, c, w, batch, 0, axes);
    const runtime::HostTensor x4 = token_slice(x, 0, 4);
    EXPECT_TRUE(matches_reference(train.forward(x4), token_slice(want, 0, 4), bound))
        << mesh_label(mc) << " train";
    const auto& collectives = train.program(4).plan().collectives;
    const bool gathers =
        std::any_of(collectives.begin(), collectives.end(), [](const CollectivePlan& p) {
          return p.step.kind == sharding::ReshardStep::Kind::kAllGather &&
                 p.step.axes == std::vector<std::string>{"sp"};
        });
    EXPECT_TRUE(gathers) << mesh_label(mc) << ": keys and values gathered over sp";
    ShardedAttention cached(mesh, c, w, batch, total, axes);
    EXPECT_TRUE(matches_reference(cached.forward(x4, 0), token_slice(want, 0, 4), bound))
        << mesh_label(mc) << " prefill";
    for (std::int64_t p : {4, 5}) {
      EXPECT_TRUE(matches_reference(cached.forward(token_slice(x, p, 1), p),
                                    token_slice(want, p, 1), bound))
          << mesh_label(mc) << " decode at " << p;
    }
  }
}

TEST(ShardedAttentionTest, HeadsSplitWhereTheyDivideAndReduceOnce) {
  const auto mesh = runtime::DeviceMesh::create(devices(4), {4}, {"tp"});
  // kv heads (2) do not divide tp = 4: replicated, query heads split.
  const auto [c, w] = random_layer(8, 4, 2, 4, 1);
  ShardedAttention layer(mesh, c, w, 1);
  EXPECT_EQ(layer.local_heads(), 1);
  layer.forward(random_host({1, 3, 8}, 5, 1.0f));
  const auto& collectives = layer.program(3).plan().collectives;
  ASSERT_EQ(collectives.size(), 1u);
  EXPECT_EQ(collectives[0].step.kind, sharding::ReshardStep::Kind::kAllReduce);
  EXPECT_EQ(collectives[0].group_size, 4);
  EXPECT_EQ(collectives[0].payload_bytes, 3 * 8 * 4) << "the whole [1, 3, 8] output per device";
}

TEST(ShardedAttentionTest, BadConfigsAreRejectedNamingThem) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  auto made = random_layer(8, 4, 2, 4, 1);  // named references: see above
  auto& c = made.first;
  auto& w = made.second;
  c.num_kv_heads = 3;
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, 1, 3); },
              ThrowsMessage<ValueError>(HasSubstr("num_kv_heads 3 must divide num_heads 4")));
  c.num_kv_heads = 2;
  c.q_offset = 2;
  EXPECT_THAT(
      [&] { ShardedAttention(mesh, c, w, 1, 3); },
      ThrowsMessage<ValueError>(HasSubstr("q_offset 2: a lowered layer takes positions per run")));
  c.q_offset = 0;
  w.wo = random_host({12, 8}, 4, 0.3f);
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, 1, 3); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("wo [12, 8] do not fit 4 heads, 2 kv heads, head_dim 4")));
  w.wo = random_host({16, 8}, 4, 0.3f);
  ShardedAttention layer(mesh, c, w, 1);
  EXPECT_THAT(
      [&] {
        layer.forward(random_host({1, 4, 9}, 6, 1.0f));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("input is [1, 4, 9] but the layer takes [1, T, 8] with T >= 1")));
  EXPECT_THAT(
      [&] {
        layer.forward(random_host({1, 4, 8}, 6, 1.0f), 2);
      },
      ThrowsMessage<IndexError>(HasSubstr("position 2 without a KV cache")));
  EXPECT_THAT([&] { layer.program(7); },
              ThrowsMessage<KeyError>(HasSubstr("no program compiled for 7 tokens yet")));
  ShardedAttention cached(mesh, c, w, 1, 6);
  cached.forward(random_host({1, 4, 8}, 6, 1.0f), 0);
  EXPECT_THAT(
      [&] {
        cached.forward(random_host({1, 3, 8}, 7, 1.0f), 4);
      },
      ThrowsMessage<IndexError>(
          HasSubstr("3 tokens at position 4 do not fit the KV cache of 6 positions")));
}

}  // namespace
}  // namespace numesh::ops
