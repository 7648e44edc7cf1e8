#include "numesh/ops/reference/attention.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "../shape_text.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using detail::shape_text;

void apply_rope_reference(runtime::HostTensor& x, std::int64_t first_position, float theta,
                          const RopeScaling& scaling) {
  NUMESH_CHECK(x.shape.size() == 4, ShapeError, "rope: expected [B, T, H, D], got rank {}",
               x.shape.size());
  NUMESH_CHECK(x.shape[3] % 2 == 0, ShapeError, "rope: head_dim {} is odd", x.shape[3]);
  validate(scaling);
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = x.shape[3];
  oracle::MatrixD m = oracle::widen(x, b * t, h * d);
  oracle::rope(m, b, t, h, d, first_position, theta, scaling);
  x = oracle::narrow(m, x.shape);
}

runtime::HostTensor attention_reference(const runtime::HostTensor& q, const runtime::HostTensor& k,
                                        const runtime::HostTensor& v,
                                        const AttentionConfig& config) {
  NUMESH_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4, ShapeError,
               "attention: q {}, k {}, v {} must all be [B, T, heads, head_dim]", shape_text(q),
               shape_text(k), shape_text(v));
  const std::int64_t b = q.shape[0], t = q.shape[1], s = k.shape[1];
  const std::int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_dim;
  NUMESH_CHECK(hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0, ShapeError,
               "attention: num_kv_heads {} must divide num_heads {} (both positive, head_dim {})",
               hkv, hq, d);
  NUMESH_CHECK(q.shape == (std::vector<std::int64_t>{b, t, hq, d}) &&
                   k.shape == (std::vector<std::int64_t>{b, s, hkv, d}) && v.shape == k.shape,
               ShapeError,
               "attention: q {}, k {}, v {} do not fit num_heads {}, num_kv_heads {}, head_dim {} "
               "(expected q [B, T, {}, {}], k and v [B, S, {}, {}])",
               shape_text(q), shape_text(k), shape_text(v), hq, hkv, d, hq, d, hkv, d);
  NUMESH_CHECK(!config.causal || s >= config.q_offset + t, ShapeError,
               "attention: {} keys cannot cover causal queries at positions {}..{}", s,
               config.q_offset, config.q_offset + t - 1);
  NUMESH_CHECK(config.rope_theta <= 0.0f || d % 2 == 0, ShapeError, "rope: head_dim {} is odd", d);
  validate(config.rope_scaling);
  oracle::MatrixD qd = oracle::widen(q, b * t, hq * d), kd = oracle::widen(k, b * s, hkv * d);
  if (config.rope_theta > 0.0f) {
    oracle::rope(qd, b, t, hq, d, config.q_offset, config.rope_theta, config.rope_scaling);
    oracle::rope(kd, b, s, hkv, d, 0, config.rope_theta, config.rope_scaling);
  }
  const oracle::AttentionShape shape{.batch = b,
                                     .q_len = t,
                                     .kv_len = s,
                                     .heads = hq,
                                     .kv_heads = hkv,
                                     .head_dim = d,
                                     .q_offset = config.q_offset,
                                     .causal = config.causal};
  return oracle::narrow(oracle::attention(qd, kd, oracle::widen(v, b * s, hkv * d), shape),
                        {b, t, hq, d});
}

runtime::HostTensor attention_layer_reference(const runtime::HostTensor& x,
                                              const AttentionWeights& w, const AttentionConfig& c) {
  NUMESH_CHECK(
      x.shape.size() == 3 && w.wq.shape.size() == 2 && w.wk.shape.size() == 2 &&
          w.wv.shape == w.wk.shape && w.wo.shape.size() == 2 && w.wq.shape[0] == x.shape[2] &&
          w.wk.shape[0] == x.shape[2] && w.wq.shape[1] == c.num_heads * c.head_dim &&
          w.wk.shape[1] == c.num_kv_heads * c.head_dim &&
          w.wo.shape == (std::vector<std::int64_t>{w.wq.shape[1], x.shape[2]}),
      ShapeError,
      "attention: x {}, wq {}, wk {}, wv {}, wo {} do not fit {} heads, {} kv heads, head_dim {}",
      shape_text(x), shape_text(w.wq), shape_text(w.wk), shape_text(w.wv), shape_text(w.wo),
      c.num_heads, c.num_kv_heads, c.head_dim);
  NUMESH_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
               ShapeError, "attention: num_kv_heads {} must divide num_heads {}", c.num_kv_heads,
               c.num_heads);
  NUMESH_CHECK(c.rope_theta <= 0.0f || c.head_dim % 2 == 0, ShapeError, "rope: head_dim {} is odd",
               c.head_dim);
  validate(c.rope_scaling);
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = c.head_dim;
  const oracle::MatrixD xd = oracle::widen(x, b * t, h);
  check_biases_and_norms(w, c, h);
  oracle::MatrixD q = oracle::project(xd, w.wq, w.stored_as.wq),
                  k = oracle::project(xd, w.wk, w.stored_as.wk);
  oracle::MatrixD v = oracle::project(xd, w.wv, w.stored_as.wv);
  oracle::add_bias(q, w.bq);
  oracle::add_bias(k, w.bk);
  oracle::add_bias(v, w.bv);
  oracle::head_rmsnorm(q, d, w.q_norm, c.qk_norm_eps);
  oracle::head_rmsnorm(k, d, w.k_norm, c.qk_norm_eps);
  if (c.rope_theta > 0.0f) {
    oracle::rope(q, b, t, c.num_heads, d, c.q_offset, c.rope_theta, c.rope_scaling);
    oracle::rope(k, b, t, c.num_kv_heads, d, 0, c.rope_theta, c.rope_scaling);
  }
  NUMESH_CHECK(!c.causal || c.q_offset == 0, ShapeError,
               "attention: {} keys cannot cover causal queries at positions {}..{}", t, c.q_offset,
               c.q_offset + t - 1);
  const oracle::AttentionShape shape{.batch = b,
                                     .q_len = t,
                                     .kv_len = t,
                                     .heads = c.num_heads,
                                     .kv_heads = c.num_kv_heads,
                                     .head_dim = d,
                                     .q_offset = c.q_offset,
                                     .causal = c.causal};
  oracle::MatrixD y = oracle::project(oracle::attention(q, k, v, shape), w.wo, w.stored_as.wo);
  oracle::add_bias(y, w.bo);
  return oracle::narrow(y, {b, t, h});
}

}  // namespace numesh::ops
