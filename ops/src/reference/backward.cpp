#include "numesh/ops/reference/backward.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "oracle.hpp"

namespace numesh::ops {

namespace {

using oracle::MatrixD;

// t as a [rows, cols] matrix, after checking it has that shape (2-D, or [cols] for rows 1).
MatrixD matrix(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols, const char* what) {
  const bool fits = (t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols) ||
                    (rows == 1 && t.shape.size() == 1 && t.shape[0] == cols);
  NUMESH_CHECK(fits, ShapeError, "{} is [{}], expected [{}, {}]", what, fmt::join(t.shape, ", "), rows, cols);
  return oracle::widen(t, rows, cols);
}

std::int64_t dim(const runtime::HostTensor& t, std::size_t i, const char* what) {
  NUMESH_CHECK(t.shape.size() == 2, ShapeError, "{} is [{}], expected a matrix", what, fmt::join(t.shape, ", "));
  return t.shape[i];
}

}  // namespace

RmsNormGrads rmsnorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                              const runtime::HostTensor& dy, double eps) {
  NUMESH_CHECK(eps >= 0.0, ValueError, "rmsnorm backward: eps {} is negative", eps);
  const std::int64_t rows = dim(x, 0, "rmsnorm backward: x"), h = dim(x, 1, "rmsnorm backward: x");
  const MatrixD xm = matrix(x, rows, h, "rmsnorm backward: x");
  const MatrixD w = matrix(weight, 1, h, "rmsnorm backward: weight");
  const MatrixD g = matrix(dy, rows, h, "rmsnorm backward: dy");
  MatrixD dx(rows, h), dw = MatrixD::Zero(1, h);
  for (std::int64_t r = 0; r < rows; ++r) {
    // y = x s w with s = (mean(x^2) + eps)^(-1/2); ds/dx_j = -s^3 x_j / H.
    const double s = 1.0 / std::sqrt(xm.row(r).squaredNorm() / static_cast<double>(h) + eps);
    double gwx = 0.0;  // sum_j dy_j w_j x_j
    for (std::int64_t j = 0; j < h; ++j) {
      gwx += g(r, j) * w(0, j) * xm(r, j);
      dw(0, j) += g(r, j) * xm(r, j) * s;
    }
    for (std::int64_t j = 0; j < h; ++j) {
      dx(r, j) = s * g(r, j) * w(0, j) - s * s * s * xm(r, j) * gwx / static_cast<double>(h);
    }
  }
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(dw, {1, h})};
}

LinearGrads linear_backward(const runtime::HostTensor& x, const runtime::HostTensor& w, const runtime::HostTensor& dy) {
  const std::int64_t rows = dim(x, 0, "linear backward: x"), in = dim(x, 1, "linear backward: x");
  const std::int64_t out = dim(w, 1, "linear backward: w");
  const MatrixD xm = matrix(x, rows, in, "linear backward: x");
  const MatrixD wm = matrix(w, in, out, "linear backward: w");
  const MatrixD g = matrix(dy, rows, out, "linear backward: dy");
  return {oracle::narrow(g * wm.transpose(), {rows, in}), oracle::narrow(xm.transpose() * g, {in, out})};
}

MlpGrads swiglu_mlp_backward(const runtime::HostTensor& x, const MlpWeights& w, const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.gate_bias.shape.empty() && w.up_bias.shape.empty() && w.down_bias.shape.empty() &&
                   w.stored_as == DType::kF32,
               NotImplementedError, "swiglu backward: biases and 16-bit weights are not differentiated yet");
  const std::int64_t rows = dim(x, 0, "swiglu backward: x"), h = dim(x, 1, "swiglu backward: x");
  const std::int64_t f = dim(w.up, 1, "swiglu backward: up");
  const MatrixD xm = matrix(x, rows, h, "swiglu backward: x");
  const MatrixD wg = matrix(w.gate, h, f, "swiglu backward: gate");
  const MatrixD wu = matrix(w.up, h, f, "swiglu backward: up");
  const MatrixD wd = matrix(w.down, f, h, "swiglu backward: down");
  const MatrixD g = matrix(dy, rows, h, "swiglu backward: dy");
  const MatrixD a = xm * wg, b = xm * wu;  // gate and up pre-activations
  MatrixD act(rows, f), da(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = silu(a) .* b
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < f; ++j) {
      const double sg = oracle::sigmoid(a(r, j));
      const double silu = a(r, j) * sg;
      act(r, j) = silu * b(r, j);
      db(r, j) = dz(r, j) * silu;
      da(r, j) = dz(r, j) * b(r, j) * sg * (1.0 + a(r, j) * (1.0 - sg));  // silu'(a)
    }
  }
  const MatrixD dx = da * wg.transpose() + db * wu.transpose();
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(xm.transpose() * da, {h, f}),
          oracle::narrow(xm.transpose() * db, {h, f}), oracle::narrow(act.transpose() * g, {f, h})};
}

MlpGrads gelu_mlp_backward(const runtime::HostTensor& x, const MlpWeights& w, const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.up_bias.shape.empty() && w.down_bias.shape.empty() && w.stored_as == DType::kF32,
               NotImplementedError, "gelu backward: biases and 16-bit weights are not differentiated yet");
  const std::int64_t rows = dim(x, 0, "gelu backward: x"), h = dim(x, 1, "gelu backward: x");
  const std::int64_t f = dim(w.up, 1, "gelu backward: up");
  const MatrixD xm = matrix(x, rows, h, "gelu backward: x");
  const MatrixD wu = matrix(w.up, h, f, "gelu backward: up");
  const MatrixD wd = matrix(w.down, f, h, "gelu backward: down");
  const MatrixD g = matrix(dy, rows, h, "gelu backward: dy");
  const MatrixD b = xm * wu;  // pre-activation
  MatrixD act(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = gelu(b)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < f; ++j) {
      // gelu(b) = b Phi(b); gelu'(b) = Phi(b) + b phi(b).
      const double v = b(r, j);
      const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * std::numbers::pi);
      act(r, j) = v * cdf;
      db(r, j) = dz(r, j) * (cdf + v * pdf);
    }
  }
  return {oracle::narrow(db * wu.transpose(), {rows, h}), {}, oracle::narrow(xm.transpose() * db, {h, f}),
          oracle::narrow(act.transpose() * g, {f, h})};
}

namespace {

// RoPE's transpose: the rotation back, as J R J with J negating the second of each pair.
void rope_transpose(MatrixD& x, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t d,
                    double theta, const RopeScaling& scaling) {
  const std::int64_t half = d / 2;
  for (std::int64_t h = 0; h < heads; ++h) x.middleCols(h * d + half, half) *= -1.0;
  oracle::rope(x, batch, tokens, heads, d, 0, theta, scaling);
  for (std::int64_t h = 0; h < heads; ++h) x.middleCols(h * d + half, half) *= -1.0;
}

}  // namespace

AttentionGrads attention_layer_backward(const runtime::HostTensor& x, const AttentionWeights& w,
                                        const AttentionConfig& c, const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.bq.shape.empty() && w.bk.shape.empty() && w.bv.shape.empty() && w.bo.shape.empty() &&
                   w.q_norm.shape.empty() && w.k_norm.shape.empty() && w.stored_as == DType::kF32,
               NotImplementedError,
               "attention backward: biases, q/k norms and 16-bit weights are not differentiated yet");
  NUMESH_CHECK(x.shape.size() == 3 && dy.shape == x.shape && c.q_offset == 0 && c.num_kv_heads > 0 &&
                   c.num_heads % c.num_kv_heads == 0,
               ShapeError, "attention backward: x [{}] and dy [{}] must be [B, T, H] alike, q_offset 0",
               fmt::join(x.shape, ", "), fmt::join(dy.shape, ", "));
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = c.head_dim;
  const std::int64_t hq = c.num_heads, hkv = c.num_kv_heads, group = hq / hkv;
  const MatrixD xm = oracle::widen(x, b * t, h);
  const MatrixD wq = matrix(w.wq, h, hq * d, "attention backward: wq");
  const MatrixD wk = matrix(w.wk, h, hkv * d, "attention backward: wk");
  const MatrixD wv = matrix(w.wv, h, hkv * d, "attention backward: wv");
  const MatrixD wo = matrix(w.wo, hq * d, h, "attention backward: wo");
  const MatrixD g = oracle::widen(dy, b * t, h);
  MatrixD q = xm * wq, k = xm * wk;
  const MatrixD v = xm * wv;
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
  const MatrixD dx = dq * wq.transpose() + dk * wk.transpose() + dv * wv.transpose();
  return {oracle::narrow(dx, {b, t, h}), oracle::narrow(xm.transpose() * dq, {h, hq * d}),
          oracle::narrow(xm.transpose() * dk, {h, hkv * d}), oracle::narrow(xm.transpose() * dv, {h, hkv * d}),
          oracle::narrow(o.transpose() * g, {hq * d, h})};
}

runtime::HostTensor embedding_backward(std::span<const std::int32_t> ids, std::int64_t vocab,
                                       const runtime::HostTensor& dy) {
  const auto rows = static_cast<std::int64_t>(ids.size());
  const std::int64_t h = dim(dy, 1, "embedding backward: dy");
  const MatrixD g = matrix(dy, rows, h, "embedding backward: dy");
  MatrixD table = MatrixD::Zero(vocab, h);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t id = ids[static_cast<std::size_t>(r)];
    NUMESH_CHECK(id >= 0 && id < vocab, IndexError, "embedding backward: token {} at row {} is outside [0, {})", id, r,
                 vocab);
    table.row(id) += g.row(r);
  }
  return oracle::narrow(table, {vocab, h});
}

CrossEntropyGrads lm_head_cross_entropy(const runtime::HostTensor& x, const runtime::HostTensor& w,
                                        std::span<const std::int32_t> targets) {
  const std::int64_t rows = dim(x, 0, "cross entropy: x"), h = dim(x, 1, "cross entropy: x");
  const std::int64_t v = dim(w, 1, "cross entropy: w");
  NUMESH_CHECK(rows >= 1 && static_cast<std::int64_t>(targets.size()) == rows, ShapeError,
               "cross entropy: {} targets for {} rows (at least one)", targets.size(), rows);
  const MatrixD xm = matrix(x, rows, h, "cross entropy: x");
  const MatrixD wm = matrix(w, h, v, "cross entropy: w");
  const MatrixD logits = xm * wm;
  // d loss / d logits = (softmax(l) - onehot(target)) / rows.
  MatrixD dl(rows, v);
  double loss = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    NUMESH_CHECK(t >= 0 && t < v, IndexError, "cross entropy: target {} at row {} is outside [0, {})", t, r, v);
    const double top = logits.row(r).maxCoeff();
    double sum = 0.0;
    for (std::int64_t j = 0; j < v; ++j) sum += std::exp(logits(r, j) - top);
    loss += top + std::log(sum) - logits(r, t);
    for (std::int64_t j = 0; j < v; ++j) dl(r, j) = std::exp(logits(r, j) - top) / sum / static_cast<double>(rows);
    dl(r, t) -= 1.0 / static_cast<double>(rows);
  }
  return {loss / static_cast<double>(rows), oracle::narrow(dl * wm.transpose(), {rows, h}),
          oracle::narrow(xm.transpose() * dl, {h, v})};
}

}  // namespace numesh::ops
