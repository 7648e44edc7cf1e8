#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "backward_detail.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/backward.hpp"

// The attention layer's reference gradients (projections, biases, q/k norms, RoPE, causal softmax).

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::matrix_dim;
using oracle::MatrixD;

namespace {

// RoPE's transpose: the rotation back, as J R J with J negating the second of each pair.
void rope_transpose(MatrixD& x, std::int64_t batch, std::int64_t tokens, std::int64_t heads,
                    std::int64_t d, double theta, const RopeScaling& scaling) {
  const std::int64_t half = d / 2;
  for (std::int64_t h = 0; h < heads; ++h) x.middleCols(h * d + half, half) *= -1.0;
  oracle::rope(x, batch, tokens, heads, d, 0, theta, scaling);
  for (std::int64_t h = 0; h < heads; ++h) x.middleCols(h * d + half, half) *= -1.0;
}

}  // namespace

AttentionGrads attention_layer_backward(const runtime::HostTensor& x, const AttentionWeights& w,
                                        const AttentionConfig& c, const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.stored_as.all_are(DType::kF32), NotImplementedError,
               "attention backward: 16-bit weights are not differentiated yet");
  NUMESH_CHECK(x.shape.size() == 3 && dy.shape == x.shape && c.q_offset == 0 &&
                   c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
               ShapeError,
               "attention backward: x [{}] and dy [{}] must be [B, T, H] alike, q_offset 0",
               fmt::join(x.shape, ", "), fmt::join(dy.shape, ", "));
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = c.head_dim;
  const std::int64_t hq = c.num_heads, hkv = c.num_kv_heads, group = hq / hkv;
  const MatrixD xm = oracle::widen(x, b * t, h);
  const MatrixD wq = checked_matrix(w.wq, h, hq * d, "attention backward: wq");
  const MatrixD wk = checked_matrix(w.wk, h, hkv * d, "attention backward: wk");
  const MatrixD wv = checked_matrix(w.wv, h, hkv * d, "attention backward: wv");
  const MatrixD wo = checked_matrix(w.wo, hq * d, h, "attention backward: wo");
  const MatrixD g = oracle::widen(dy, b * t, h);
  MatrixD q = xm * wq, k = xm * wk, v = xm * wv;
  oracle::add_bias(q, w.bq);
  oracle::add_bias(k, w.bk);
  oracle::add_bias(v, w.bv);
  const MatrixD q_raw = q, k_raw = k;  // before the q/k norms
  oracle::head_rmsnorm(q, d, w.q_norm, c.qk_norm_eps);
  oracle::head_rmsnorm(k, d, w.k_norm, c.qk_norm_eps);
  const bool rope = c.rope_theta > 0.0f;
  if (rope) {
    oracle::rope(q, b, t, hq, d, 0, c.rope_theta, c.rope_scaling);
    oracle::rope(k, b, t, hkv, d, 0, c.rope_theta, c.rope_scaling);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  MatrixD o = MatrixD::Zero(b * t, hq * d), dq = MatrixD::Zero(b * t, hq * d);
  MatrixD dk = MatrixD::Zero(b * t, hkv * d), dv = MatrixD::Zero(b * t, hkv * d);
  const MatrixD d_o = g * wo.transpose();
  for (std::int64_t bi = 0; bi < b; ++bi) {
    for (std::int64_t hi = 0; hi < hq; ++hi) {
      const std::int64_t kvh = hi / group;
      const MatrixD qh = q.block(bi * t, hi * d, t, d), kh = k.block(bi * t, kvh * d, t, d);
      const MatrixD vh = v.block(bi * t, kvh * d, t, d), doh = d_o.block(bi * t, hi * d, t, d);
      MatrixD p = qh * kh.transpose() * scale;
      for (std::int64_t r = 0; r < t; ++r) {
        const std::int64_t visible = c.causal ? r + 1 : t;
        const double m = p.row(r).head(visible).maxCoeff();
        double sum = 0.0;
        for (std::int64_t j = 0; j < visible; ++j) sum += (p(r, j) = std::exp(p(r, j) - m));
        p.row(r).head(visible) /= sum;
        p.row(r).tail(t - visible).setZero();
      }
      o.block(bi * t, hi * d, t, d) = p * vh;
      const MatrixD dp = doh * vh.transpose();
      // dS = P .* (dP - rowsum(P .* dP)).
      MatrixD ds = p.cwiseProduct(dp);
      const Eigen::VectorXd delta = ds.rowwise().sum();
      ds = p.cwiseProduct(dp - delta.replicate(1, t));
      dq.block(bi * t, hi * d, t, d) = ds * kh * scale;
      dk.block(bi * t, kvh * d, t, d) += ds.transpose() * qh * scale;
      dv.block(bi * t, kvh * d, t, d) += p.transpose() * doh;
    }
  }
  if (rope) {
    rope_transpose(dq, b, t, hq, d, c.rope_theta, c.rope_scaling);
    rope_transpose(dk, b, t, hkv, d, c.rope_theta, c.rope_scaling);
  }
  AttentionGrads out;
  // Through the q/k norms: each head's d values a row of its own, one weight for all heads.
  const auto head_norm_backward = [&](MatrixD& dz, const MatrixD& raw, std::int64_t heads,
                                      const runtime::HostTensor& weight,
                                      runtime::HostTensor& dweight) {
    if (weight.shape.empty()) return;
    const MatrixD wn = checked_matrix(weight, 1, d, "attention backward: q/k norm");
    MatrixD dw = MatrixD::Zero(1, d);
    for (std::int64_t r = 0; r < b * t; ++r) {
      for (std::int64_t hh = 0; hh < heads; ++hh) {
        oracle::rmsnorm_row_backward(raw.block(r, hh * d, 1, d), wn.row(0), c.qk_norm_eps,
                                     dz.block(r, hh * d, 1, d), dw.row(0));
      }
    }
    dweight = oracle::narrow(dw, weight.shape);
  };
  head_norm_backward(dq, q_raw, hq, w.q_norm, out.dq_norm);
  head_norm_backward(dk, k_raw, hkv, w.k_norm, out.dk_norm);
  // A bias' gradient sums its output's gradient over the rows.
  const auto bias_grad = [](const MatrixD& dz, const runtime::HostTensor& bias) {
    return bias.shape.empty() ? runtime::HostTensor{}
                              : oracle::narrow(dz.colwise().sum(), bias.shape);
  };
  out.dbq = bias_grad(dq, w.bq);
  out.dbk = bias_grad(dk, w.bk);
  out.dbv = bias_grad(dv, w.bv);
  out.dbo = bias_grad(g, w.bo);
  const MatrixD dx = dq * wq.transpose() + dk * wk.transpose() + dv * wv.transpose();
  out.dx = oracle::narrow(dx, {b, t, h});
  out.dwq = oracle::narrow(xm.transpose() * dq, {h, hq * d});
  out.dwk = oracle::narrow(xm.transpose() * dk, {h, hkv * d});
  out.dwv = oracle::narrow(xm.transpose() * dv, {h, hkv * d});
  out.dwo = oracle::narrow(o.transpose() * g, {hq * d, h});
  return out;
}

}  // namespace numesh::ops
