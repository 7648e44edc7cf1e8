#include "numesh/ops/transformer_config.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

namespace {

runtime::HostTensor normal(std::vector<std::int64_t> shape, std::mt19937& rng, float mean,
                           float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = dist(rng);
  return t;
}

float fan_in_scale(std::int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

}  // namespace

void TransformerConfig::validate() const {
  const AttentionConfig& a = attention;
  NUMESH_CHECK(
      hidden > 0 && layers > 0 && ffn > 0 && a.num_heads > 0 && a.num_kv_heads > 0 &&
          a.head_dim > 0,
      ValueError,
      "transformer: hidden {}, layers {}, ffn {}, heads {}, kv heads {}, head_dim {} must all "
      "be positive",
      hidden, layers, ffn, a.num_heads, a.num_kv_heads, a.head_dim);
  // Before anything that walks the layers (a config's count is outside input: 8.9e12 layers
  // kept a fuzzed config.json's validation busy past its timeout).
  NUMESH_CHECK(layers <= kMaxLayers, ValueError,
               "transformer: {} layers; at most {} (no model has more)", layers, kMaxLayers);
  NUMESH_CHECK(a.num_heads % a.num_kv_heads == 0, ValueError,
               "transformer: kv heads {} must divide heads {}", a.num_kv_heads, a.num_heads);
  NUMESH_CHECK(a.rope_theta <= 0.0f || a.head_dim % 2 == 0, ValueError,
               "transformer: head_dim {} is odd, RoPE needs it even", a.head_dim);
  ops::validate(a.rope_scaling);
  NUMESH_CHECK(
      a.rope_scaling.kind != RopeScaling::Kind::kFactors ||
          static_cast<std::int64_t>(a.rope_scaling.frequency_factors.size()) == a.head_dim / 2,
      ValueError, "transformer: {} RoPE frequency factors for head_dim {} (one a pair: {})",
      a.rope_scaling.frequency_factors.size(), a.head_dim, a.head_dim / 2);
  NUMESH_CHECK(moe_every >= 0, ValueError, "transformer: moe_every {} is negative", moe_every);
  if (moe_every > 0) {
    NUMESH_CHECK(moe.num_experts >= 1 && moe.top_k >= 1 && moe.top_k <= moe.num_experts, ValueError,
                 "transformer: top_k {} must be between 1 and the {} experts", moe.top_k,
                 moe.num_experts);
    NUMESH_CHECK(moe_ffn > 0 && std::isfinite(moe.capacity_factor) && moe.capacity_factor >= 0.0f,
                 ValueError,
                 "transformer: moe_ffn {} must be positive and capacity_factor {} not negative",
                 moe_ffn, moe.capacity_factor);
  }
  NUMESH_CHECK(shared_expert_ffn >= 0, ValueError, "transformer: shared_expert_ffn {} is negative",
               shared_expert_ffn);
  for (std::size_t i = 0; i < dense_layers.size(); ++i) {
    const std::int64_t l = dense_layers[i];
    NUMESH_CHECK(l >= 0 && l < layers, ValueError,
                 "transformer: dense layer {} is outside the {} layers", l, layers);
    NUMESH_CHECK(
        std::find(dense_layers.begin(), dense_layers.begin() + static_cast<std::ptrdiff_t>(i), l) ==
            dense_layers.begin() + static_cast<std::ptrdiff_t>(i),
        ValueError, "transformer: dense layer {} is listed twice", l);
  }
  NUMESH_CHECK(norm_eps >= 0.0f, ValueError, "transformer: norm_eps {} is negative", norm_eps);
  NUMESH_CHECK(std::isfinite(norm_weight_offset), ValueError,
               "transformer: norm_weight_offset {} is not finite", norm_weight_offset);
  for (std::int64_t l = 0; l < layers; ++l) {
    NUMESH_CHECK(mlp_kind == MlpKind::kSwiGLU || !is_moe(l), NotImplementedError,
                 "transformer: layer {} is MoE and mlp_kind is {}: MoE experts are SwiGLU only", l,
                 to_string(mlp_kind));
  }
}

namespace {

// Matrices of a dense MLP: a gated one's gate, up and down; else up and down.
double dense_mlp_matrices(MlpKind kind) { return mlp_traits(kind).gated ? 3.0 : 2.0; }

}  // namespace

std::int64_t TransformerConfig::parameters() const noexcept {
  const AttentionConfig& a = attention;
  std::int64_t total = hidden;  // final norm
  for (std::int64_t l = 0; l < layers; ++l) {
    total += 2 * hidden + hidden * a.head_dim * (2 * a.num_heads + 2 * a.num_kv_heads);
    total += is_moe(l) ? hidden * moe.num_experts + 3 * moe.num_experts * hidden * moe_ffn
                       : static_cast<std::int64_t>(dense_mlp_matrices(mlp_kind)) * hidden * ffn;
    if (is_moe(l) && shared_expert_ffn > 0) total += 3 * hidden * shared_expert_ffn + hidden;
  }
  return total;
}

double TransformerConfig::flops(std::int64_t batch, std::int64_t tokens,
                                std::int64_t position) const noexcept {
  const auto rows = static_cast<double>(batch * tokens);
  const auto h = static_cast<double>(hidden);
  double total = 0.0;
  for (std::int64_t l = 0; l < layers; ++l) {
    total += attention_flops(attention, hidden, batch, tokens, position);
    total +=
        is_moe(l)
            ? rows * (2.0 * h * static_cast<double>(moe.num_experts) +
                      static_cast<double>(moe.top_k) * 3.0 * 2.0 * h * static_cast<double>(moe_ffn))
            : rows * dense_mlp_matrices(mlp_kind) * 2.0 * h * static_cast<double>(ffn);
    if (is_moe(l) && shared_expert_ffn > 0) {
      total += rows * (3.0 * 2.0 * h * static_cast<double>(shared_expert_ffn) + 2.0 * h);
    }
  }
  return total;
}

TransformerWeights TransformerWeights::random(const TransformerConfig& c, std::uint32_t seed) {
  c.validate();
  std::mt19937 rng(seed);
  const std::int64_t h = c.hidden, hq = c.attention.num_heads, hkv = c.attention.num_kv_heads,
                     d = c.attention.head_dim;
  TransformerWeights w;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    BlockWeights b;
    b.attn_norm = normal({1, h}, rng, 1.0f, 0.1f);
    b.attention.wq = normal({h, hq * d}, rng, 0.0f, fan_in_scale(h));
    b.attention.wk = normal({h, hkv * d}, rng, 0.0f, fan_in_scale(h));
    b.attention.wv = normal({h, hkv * d}, rng, 0.0f, fan_in_scale(h));
    b.attention.wo = normal({hq * d, h}, rng, 0.0f, fan_in_scale(hq * d));
    b.ffn_norm = normal({1, h}, rng, 1.0f, 0.1f);
    if (c.is_moe(l)) {
      const std::int64_t e = c.moe.num_experts, f = c.moe_ffn;
      b.moe.router = normal({h, e}, rng, 0.0f, fan_in_scale(h));
      b.moe.gate = normal({e, h, f}, rng, 0.0f, fan_in_scale(h));
      b.moe.up = normal({e, h, f}, rng, 0.0f, fan_in_scale(h));
      b.moe.down = normal({e, f, h}, rng, 0.0f, fan_in_scale(f));
      if (c.shared_expert_ffn > 0) {
        const std::int64_t fs = c.shared_expert_ffn;
        b.moe.shared_expert.gate = normal({h, fs}, rng, 0.0f, fan_in_scale(h));
        b.moe.shared_expert.up = normal({h, fs}, rng, 0.0f, fan_in_scale(h));
        b.moe.shared_expert.down = normal({fs, h}, rng, 0.0f, fan_in_scale(fs));
        b.moe.shared_expert_gate = normal({h, 1}, rng, 0.0f, fan_in_scale(h));
      }
    } else {
      if (mlp_traits(c.mlp_kind).gated) b.mlp.gate = normal({h, c.ffn}, rng, 0.0f, fan_in_scale(h));
      b.mlp.up = normal({h, c.ffn}, rng, 0.0f, fan_in_scale(h));
      b.mlp.down = normal({c.ffn, h}, rng, 0.0f, fan_in_scale(c.ffn));
    }
    w.blocks.push_back(std::move(b));
  }
  w.final_norm = normal({1, h}, rng, 1.0f, 0.1f);
  return w;
}

void TransformerWeights::store_as(DType dtype) {
  for (BlockWeights& b : blocks) {
    b.attention.stored_as = AttentionFormats::all(dtype);
    b.mlp.stored_as = MlpFormats::all(dtype);
    b.moe.stored_as = MlpFormats::all(dtype);
    b.moe.shared_expert.stored_as = MlpFormats::all(dtype);
  }
}

}  // namespace numesh::ops
