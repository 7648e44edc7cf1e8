// TransformerReference: the dense oracle of ShardedTransformer, in float64 (oracle.hpp).

#include "numesh/ops/reference/transformer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

namespace {

using oracle::MatrixD;

void expect_shape(const runtime::HostTensor& t, const std::vector<std::int64_t>& shape,
                  std::int64_t layer, const char* name) {
  NUMESH_CHECK(t.shape == shape, ShapeError,
               "transformer reference: block {} {} is [{}], expected [{}]", layer, name,
               fmt::join(t.shape, ", "), fmt::join(shape, ", "));
}

// Every weight the forward reads, against the config: the float64 code indexes raw storage.
void check_weights(const TransformerConfig& c, const TransformerWeights& w) {
  NUMESH_CHECK(static_cast<std::int64_t>(w.blocks.size()) == c.layers, ShapeError,
               "transformer reference: {} blocks of weights for {} layers", w.blocks.size(),
               c.layers);
  const std::int64_t h = c.hidden, q = c.attention.num_heads * c.attention.head_dim,
                     kv = c.attention.num_kv_heads * c.attention.head_dim, e = c.moe.num_experts;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const BlockWeights& b = w.blocks[static_cast<std::size_t>(l)];
    expect_shape(b.attn_norm, {1, h}, l, "attn_norm");
    expect_shape(b.ffn_norm, {1, h}, l, "ffn_norm");
    expect_shape(b.attention.wq, {h, q}, l, "wq");
    expect_shape(b.attention.wk, {h, kv}, l, "wk");
    expect_shape(b.attention.wv, {h, kv}, l, "wv");
    expect_shape(b.attention.wo, {q, h}, l, "wo");
    check_biases_and_norms(b.attention, c.attention, h);
    if (c.is_moe(l)) {
      expect_shape(b.moe.router, {h, e}, l, "router");
      expect_shape(b.moe.gate, {e, h, c.moe_ffn}, l, "expert gate");
      expect_shape(b.moe.up, {e, h, c.moe_ffn}, l, "expert up");
      expect_shape(b.moe.down, {e, c.moe_ffn, h}, l, "expert down");
      // The shared expert: there exactly when the config has one, of its size.
      const std::int64_t fs = c.shared_expert_ffn;
      using Shape = std::vector<std::int64_t>;
      expect_shape(b.moe.shared_expert.up, fs > 0 ? Shape{h, fs} : Shape{}, l, "shared expert up");
      check_shared_expert(b.moe, h);
    } else {
      // A GELU MLP has no gate (MlpLayer ignores one; so does the oracle).
      if (mlp_traits(c.mlp_kind).gated) expect_shape(b.mlp.gate, {h, c.ffn}, l, "mlp gate");
      expect_shape(b.mlp.up, {h, c.ffn}, l, "mlp up");
      expect_shape(b.mlp.down, {c.ffn, h}, l, "mlp down");
      check_biases(b.mlp, c.mlp_kind, h, c.ffn);
    }
  }
  if (!w.final_norm.shape.empty()) {
    NUMESH_CHECK(w.final_norm.shape == (std::vector<std::int64_t>{1, h}), ShapeError,
                 "transformer reference: final_norm is [{}], expected [1, {}]",
                 fmt::join(w.final_norm.shape, ", "), h);
  }
}

MatrixD widen2(const runtime::HostTensor& t) { return oracle::widen(t, t.shape[0], t.shape[1]); }

}  // namespace

struct TransformerReference::Caches {
  std::vector<MatrixD> k, v;
};

TransformerReference::TransformerReference(TransformerConfig config, TransformerWeights weights,
                                           std::int64_t batch, std::int64_t max_len,
                                           std::int64_t batch_groups, std::int64_t sequence_groups,
                                           DType kv_dtype)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      batch_(batch),
      max_len_(max_len),
      batch_groups_(batch_groups),
      sequence_groups_(sequence_groups),
      kv_dtype_(kv_dtype),
      caches_(std::make_unique<Caches>()) {
  config_.validate();
  NUMESH_CHECK(batch > 0 && max_len > 0 && batch_groups > 0 && batch % batch_groups == 0 &&
                   sequence_groups > 0,
               ShapeError,
               "transformer reference: batch {}, max_len {} must be positive, {} batch groups must "
               "divide the batch "
               "and {} sequence groups be positive",
               batch, max_len, batch_groups, sequence_groups);
  check_weights(config_, weights_);
  const std::int64_t kv = config_.attention.num_kv_heads * config_.attention.head_dim;
  caches_->k.assign(static_cast<std::size_t>(config_.layers), MatrixD::Zero(batch * max_len, kv));
  caches_->v.assign(static_cast<std::size_t>(config_.layers), MatrixD::Zero(batch * max_len, kv));
}

TransformerReference::~TransformerReference() = default;
TransformerReference::TransformerReference(TransformerReference&&) noexcept = default;
TransformerReference& TransformerReference::operator=(TransformerReference&&) noexcept = default;

runtime::HostTensor TransformerReference::forward(const runtime::HostTensor& x,
                                                  std::int64_t position) {
  const TransformerConfig& c = config_;
  const std::int64_t h = c.hidden, hq = c.attention.num_heads, hkv = c.attention.num_kv_heads,
                     d = c.attention.head_dim;
  NUMESH_CHECK(x.shape.size() == 3 && x.shape[0] == batch_ && x.shape[1] > 0 && x.shape[2] == h,
               ShapeError, "transformer: input is [{}] but the model takes [{}, T, {}] with T >= 1",
               fmt::join(x.shape, ", "), batch_, h);
  const std::int64_t t = x.shape[1];
  NUMESH_CHECK(position >= 0 && position + t <= max_len_, IndexError,
               "transformer: {} tokens at position {} do not fit the KV cache of {} positions", t,
               position, max_len_);
  const std::int64_t seen = position + t;
  // A block or final norm's weight as it scales: plus the config's offset (Gemma's 1 + w).
  const auto norm_weight = [&](const runtime::HostTensor& w) {
    return MatrixD(widen2(w).array() + static_cast<double>(c.norm_weight_offset));
  };
  MatrixD xs = oracle::widen(x, batch_ * t, h);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const BlockWeights& b = weights_.blocks[static_cast<std::size_t>(l)];
    const MatrixD n1 = oracle::rmsnorm(xs, norm_weight(b.attn_norm), c.norm_eps);
    const AttentionFormats& formats = b.attention.stored_as;
    MatrixD q = oracle::project(n1, b.attention.wq, formats.wq),
            k = oracle::project(n1, b.attention.wk, formats.wk);
    MatrixD v = oracle::project(n1, b.attention.wv, formats.wv);
    oracle::add_bias(q, b.attention.bq);
    oracle::add_bias(k, b.attention.bk);
    oracle::add_bias(v, b.attention.bv);
    oracle::head_rmsnorm(q, d, b.attention.q_norm, c.attention.qk_norm_eps);
    oracle::head_rmsnorm(k, d, b.attention.k_norm, c.attention.qk_norm_eps);
    if (c.attention.rope_theta > 0.0f) {
      oracle::rope(q, batch_, t, hq, d, position, c.attention.rope_theta, c.attention.rope_scaling);
      oracle::rope(k, batch_, t, hkv, d, position, c.attention.rope_theta,
                   c.attention.rope_scaling);
    }
    // The cache holds positions [0, seen) of every sequence; attention reads exactly those.
    if (kv_dtype_ != DType::kF32) {
      // As a 16-bit cache holds them: the fp32 value rounded to nearest even.
      const auto narrow = [&](double value) {
        const float f = static_cast<float>(value);
        return kv_dtype_ == DType::kBF16 ? double{f32_from_bf16(bf16_from_f32(f))}
                                         : double{f32_from_f16(f16_from_f32(f))};
      };
      k = k.unaryExpr(narrow);
      v = v.unaryExpr(narrow);
    }
    MatrixD& kc = caches_->k[static_cast<std::size_t>(l)];
    MatrixD& vc = caches_->v[static_cast<std::size_t>(l)];
    MatrixD keys(batch_ * seen, hkv * d), values(batch_ * seen, hkv * d);
    for (std::int64_t s = 0; s < batch_; ++s) {
      kc.middleRows(s * max_len_ + position, t) = k.middleRows(s * t, t);
      vc.middleRows(s * max_len_ + position, t) = v.middleRows(s * t, t);
      keys.middleRows(s * seen, seen) = kc.middleRows(s * max_len_, seen);
      values.middleRows(s * seen, seen) = vc.middleRows(s * max_len_, seen);
    }
    const oracle::AttentionShape shape{.batch = batch_,
                                       .q_len = t,
                                       .kv_len = seen,
                                       .heads = hq,
                                       .kv_heads = hkv,
                                       .head_dim = d,
                                       .q_offset = position,
                                       .causal = c.attention.causal};
    MatrixD attended =
        oracle::project(oracle::attention(q, keys, values, shape), b.attention.wo, formats.wo);
    oracle::add_bias(attended, b.attention.bo);
    const MatrixD hs = xs + attended;
    const MatrixD n2 = oracle::rmsnorm(hs, norm_weight(b.ffn_norm), c.norm_eps);
    MatrixD f(batch_ * t, h);
    if (c.is_moe(l)) {
      // Group (i, j): sequences block i, tokens block j (tokens split only when T divides).
      const std::int64_t sg = t % sequence_groups_ == 0 ? sequence_groups_ : 1;
      const std::int64_t seqs = batch_ / batch_groups_, toks = t / sg;
      MatrixD group(seqs * toks, h);
      for (std::int64_t gi = 0; gi < batch_groups_; ++gi) {
        for (std::int64_t gj = 0; gj < sg; ++gj) {
          for (std::int64_t bi = 0; bi < seqs; ++bi) {
            group.middleRows(bi * toks, toks) =
                n2.middleRows((gi * seqs + bi) * t + gj * toks, toks);
          }
          const MatrixD out = oracle::moe(group, b.moe, c.moe, nullptr);
          for (std::int64_t bi = 0; bi < seqs; ++bi) {
            f.middleRows((gi * seqs + bi) * t + gj * toks, toks) = out.middleRows(bi * toks, toks);
          }
        }
      }
    } else {
      f = oracle::mlp(n2, c.mlp_kind, b.mlp);
    }
    xs = hs + f;
  }
  if (!weights_.final_norm.shape.empty())
    xs = oracle::rmsnorm(xs, norm_weight(weights_.final_norm), c.norm_eps);
  return oracle::narrow(xs, {batch_, t, h});
}

}  // namespace numesh::ops
