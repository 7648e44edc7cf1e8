#include "numesh/ops/attention.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "numesh/core/error.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::devices;
using testing::make_mesh;
using testing::mesh_case_name;
using testing::MeshCase;

runtime::HostTensor random(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  return testing::random_host(std::move(shape), seed, scale);
}

// The dense layer: projections, attention_reference, output projection.
runtime::HostTensor dense_attention(const runtime::HostTensor& x, const AttentionWeights& w,
                                    const AttentionConfig& c) {
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2];
  const Eigen::Map<const RowMatrix> xm(x.data.data(), b * t, h);
  auto project = [&](const runtime::HostTensor& wt, std::int64_t heads) {
    const RowMatrix p = xm * Eigen::Map<const RowMatrix>(wt.data.data(), wt.shape[0], wt.shape[1]);
    runtime::HostTensor r = runtime::HostTensor::zeros({b, t, heads, c.head_dim});
    std::copy(p.data(), p.data() + p.size(), r.data.begin());
    return r;
  };
  const runtime::HostTensor o = attention_reference(project(w.wq, c.num_heads),
                                                    project(w.wk, c.num_kv_heads),
                                                    project(w.wv, c.num_kv_heads), c);
  const RowMatrix y = Eigen::Map<const RowMatrix>(o.data.data(), b * t, c.num_heads * c.head_dim) *
                      Eigen::Map<const RowMatrix>(w.wo.data.data(), w.wo.shape[0], w.wo.shape[1]);
  runtime::HostTensor out = runtime::HostTensor::zeros({b, t, h});
  std::copy(y.data(), y.data() + y.size(), out.data.begin());
  return out;
}


class ShardedAttentionTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ShardedAttentionTest, EqualsTheDenseLayerForMhaGqaAndMqa) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t hidden = 16, d = 8, t = 5;
  for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
    for (std::int64_t batch : {2, 3}) {  // 3 sequences do not split over dp = 2: replicated
      AttentionConfig c;
      c.num_heads = hq;
      c.num_kv_heads = hkv;
      c.head_dim = d;
      AttentionWeights w;
      w.wq = random({hidden, hq * d}, 1, 0.3f);
      w.wk = random({hidden, hkv * d}, 2, 0.3f);
      w.wv = random({hidden, hkv * d}, 3, 0.3f);
      w.wo = random({hq * d, hidden}, 4, 0.3f);
      const runtime::HostTensor x = random({batch, t, hidden}, 5, 1.0f);
      ShardedAttention layer(mesh, c, w, batch, t);
      const runtime::HostTensor y = layer.forward(x);
      const runtime::HostTensor want = dense_attention(x, w, c);
      double err = 0, scale = 0;
      for (std::size_t i = 0; i < y.data.size(); ++i) {
        err = std::max(err, static_cast<double>(std::abs(y.data[i] - want.data[i])));
        scale = std::max(scale, static_cast<double>(std::abs(want.data[i])));
      }
      // The output projection's sum runs split over tp, then the all-reduce: fp32 bound
      // max(1e-5, 2 * (heads * head_dim) * epsilon) relative.
      EXPECT_LT(err / scale, std::max(1e-5, 2.0 * hq * d * std::numeric_limits<float>::epsilon()))
          << "heads " << hq << "/" << hkv << " batch " << batch << " local heads "
          << layer.local_heads();
      EXPECT_EQ(layer.forward(x), y) << "runs again with the same result";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedAttentionTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2}, {"dp"}},
                                           MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{2, 4}, {"dp", "tp"}}),
                         mesh_case_name);

TEST(ShardedAttentionTest, HeadsSplitWhereTheyDivideAndReduceOnce) {
  const auto mesh = runtime::DeviceMesh::create(devices(4), {4}, {"tp"});
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // kv heads do not divide tp = 4: replicated, query heads split
  c.head_dim = 4;
  AttentionWeights w;
  w.wq = random({8, 16}, 1, 0.3f);
  w.wk = random({8, 8}, 2, 0.3f);
  w.wv = random({8, 8}, 3, 0.3f);
  w.wo = random({16, 8}, 4, 0.3f);
  ShardedAttention layer(mesh, c, w, 1, 3);
  EXPECT_EQ(layer.local_heads(), 1);
  ASSERT_EQ(layer.collectives().size(), 1u);
  EXPECT_EQ(layer.collectives()[0].kind, sharding::ReshardStep::Kind::kAllReduce);
}

TEST(ShardedAttentionTest, BadConfigsAreRejectedNamingThem) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 3;
  c.head_dim = 4;
  AttentionWeights w;
  w.wq = random({8, 16}, 1, 0.3f);
  w.wk = random({8, 8}, 2, 0.3f);
  w.wv = random({8, 8}, 3, 0.3f);
  w.wo = random({16, 8}, 4, 0.3f);
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, 1, 3); },
              ThrowsMessage<ValueError>(HasSubstr("num_kv_heads 3 must divide num_heads 4")));
  c.num_kv_heads = 2;
  c.q_offset = 2;
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, 1, 3); },
              ThrowsMessage<ValueError>(HasSubstr("decoding against a KV cache is not lowered yet")));
  c.q_offset = 0;
  w.wo = random({12, 8}, 4, 0.3f);
  EXPECT_THAT([&] { ShardedAttention(mesh, c, w, 1, 3); },
              ThrowsMessage<ShapeError>(HasSubstr("wo [12, 8] do not fit 4 heads, 2 kv heads, head_dim 4")));
  w.wo = random({16, 8}, 4, 0.3f);
  ShardedAttention layer(mesh, c, w, 1, 3);
  EXPECT_THAT([&] { layer.forward(random({1, 4, 8}, 6, 1.0f)); },
              ThrowsMessage<ShapeError>(HasSubstr("input is [1, 4, 8] but the layer was compiled for [1, 3, 8]")));
}

}  // namespace
}  // namespace numesh::ops
