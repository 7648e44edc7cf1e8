#include "numesh/ops/reference/backward.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

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

// The SwiGLU MLP's gradients in float64: x [rows, H], w_gate and w_up [H, F], w_down [F, H],
// g = dy [rows, H].
struct SwigluGradsD {
  MatrixD dx, dgate, dup, ddown;
  MatrixD dgate_bias, dup_bias;  // [1, F]: the pre-activations' gradients summed over the rows
};
// `gate_bias` and `up_bias`: [1, F] rows added to the pre-activations (empty: none).
SwigluGradsD swiglu_gradients(const MatrixD& xm, const MatrixD& wg, const MatrixD& wu, const MatrixD& wd,
                              const MatrixD& g, const MatrixD& gate_bias = {}, const MatrixD& up_bias = {}) {
  MatrixD a = xm * wg, b = xm * wu;  // gate and up pre-activations
  if (gate_bias.size() > 0) a.rowwise() += gate_bias.row(0);
  if (up_bias.size() > 0) b.rowwise() += up_bias.row(0);
  const Eigen::Index rows = xm.rows(), f = wg.cols();
  MatrixD act(rows, f), da(rows, f), db(rows, f);
  const MatrixD dz = g * wd.transpose();  // gradient of z = silu(a) .* b
  for (Eigen::Index r = 0; r < rows; ++r) {
    for (Eigen::Index j = 0; j < f; ++j) {
      const double sg = oracle::sigmoid(a(r, j));
      const double silu = a(r, j) * sg;
      act(r, j) = silu * b(r, j);
      db(r, j) = dz(r, j) * silu;
      da(r, j) = dz(r, j) * b(r, j) * sg * (1.0 + a(r, j) * (1.0 - sg));  // silu'(a)
    }
  }
  return {da * wg.transpose() + db * wu.transpose(), xm.transpose() * da, xm.transpose() * db, act.transpose() * g,
          da.colwise().sum(), db.colwise().sum()};
}

using RowRef = Eigen::Ref<Eigen::RowVectorXd, 0, Eigen::InnerStride<>>;
using ConstRowRef = Eigen::Ref<const Eigen::RowVectorXd, 0, Eigen::InnerStride<>>;

// RMSNorm's backward for one row z of n values: y = z s w with s = (mean(z^2) + eps)^(-1/2)
// and ds/dz_j = -s^3 z_j / n. `g` holds dy and becomes dz; the row's term is added to dw.
void rmsnorm_row_backward(ConstRowRef z, ConstRowRef w, double eps, RowRef g, RowRef dw) {
  const auto n = static_cast<double>(z.size());
  const double s = 1.0 / std::sqrt(z.squaredNorm() / n + eps);
  const double gwz = (g.array() * w.array() * z.array()).sum();  // sum_j dy_j w_j z_j
  dw.array() += g.array() * z.array() * s;
  g = (s * g.array() * w.array() - s * s * s * z.array() * gwz / n).matrix();
}

}  // namespace

RmsNormGrads rmsnorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                              const runtime::HostTensor& dy, double eps) {
  NUMESH_CHECK(eps >= 0.0, ValueError, "rmsnorm backward: eps {} is negative", eps);
  const std::int64_t rows = dim(x, 0, "rmsnorm backward: x"), h = dim(x, 1, "rmsnorm backward: x");
  const MatrixD xm = matrix(x, rows, h, "rmsnorm backward: x");
  const MatrixD w = matrix(weight, 1, h, "rmsnorm backward: weight");
  MatrixD dx = matrix(dy, rows, h, "rmsnorm backward: dy"), dw = MatrixD::Zero(1, h);
  for (std::int64_t r = 0; r < rows; ++r) rmsnorm_row_backward(xm.row(r), w.row(0), eps, dx.row(r), dw.row(0));
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(dw, {1, h})};
}

LayerNormGrads layernorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                                  const runtime::HostTensor& dy, double eps) {
  NUMESH_CHECK(eps >= 0.0, ValueError, "layernorm backward: eps {} is negative", eps);
  const std::int64_t rows = dim(x, 0, "layernorm backward: x"), h = dim(x, 1, "layernorm backward: x");
  const MatrixD xm = matrix(x, rows, h, "layernorm backward: x");
  const MatrixD w = matrix(weight, 1, h, "layernorm backward: weight");
  const MatrixD g = matrix(dy, rows, h, "layernorm backward: dy");
  // y = x̂ w + b with x̂ = (x - mean) s, s = (var + eps)^(-1/2): d x̂ = dy w, and through the
  // mean and the variance dx = s (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)).
  MatrixD dx(rows, h), dw = MatrixD::Zero(1, h);
  const auto n = static_cast<double>(h);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double mean = xm.row(r).sum() / n;
    const double s = 1.0 / std::sqrt((xm.row(r).array() - mean).square().sum() / n + eps);
    const Eigen::RowVectorXd xhat = ((xm.row(r).array() - mean) * s).matrix();
    const Eigen::RowVectorXd dxhat = g.row(r).cwiseProduct(w.row(0));
    dw.row(0) += g.row(r).cwiseProduct(xhat);
    dx.row(r) = (s * (dxhat.array() - dxhat.sum() / n - xhat.array() * dxhat.dot(xhat) / n)).matrix();
  }
  return {oracle::narrow(dx, {rows, h}), oracle::narrow(dw, {1, h}), oracle::narrow(g.colwise().sum(), {1, h})};
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
  NUMESH_CHECK(w.stored_as == DType::kF32, NotImplementedError,
               "swiglu backward: 16-bit weights are not differentiated yet");
  const std::int64_t rows = dim(x, 0, "swiglu backward: x"), h = dim(x, 1, "swiglu backward: x");
  const std::int64_t f = dim(w.up, 1, "swiglu backward: up");
  const MatrixD xm = matrix(x, rows, h, "swiglu backward: x");
  const MatrixD wg = matrix(w.gate, h, f, "swiglu backward: gate");
  const MatrixD wu = matrix(w.up, h, f, "swiglu backward: up");
  const MatrixD wd = matrix(w.down, f, h, "swiglu backward: down");
  const MatrixD g = matrix(dy, rows, h, "swiglu backward: dy");
  const auto bias = [&](const runtime::HostTensor& b, std::int64_t n, const char* what) {
    return b.shape.empty() ? MatrixD() : matrix(b, 1, n, what);
  };
  const SwigluGradsD d = swiglu_gradients(xm, wg, wu, wd, g, bias(w.gate_bias, f, "swiglu backward: gate bias"),
                                          bias(w.up_bias, f, "swiglu backward: up bias"));
  (void)bias(w.down_bias, h, "swiglu backward: down bias");  // checks its shape
  MlpGrads out;
  out.dx = oracle::narrow(d.dx, {rows, h});
  out.dgate = oracle::narrow(d.dgate, {h, f});
  out.dup = oracle::narrow(d.dup, {h, f});
  out.ddown = oracle::narrow(d.ddown, {f, h});
  // Each bias' gradient keeps its bias' shape.
  if (!w.gate_bias.shape.empty()) out.dgate_bias = oracle::narrow(d.dgate_bias, w.gate_bias.shape);
  if (!w.up_bias.shape.empty()) out.dup_bias = oracle::narrow(d.dup_bias, w.up_bias.shape);
  if (!w.down_bias.shape.empty()) out.ddown_bias = oracle::narrow(g.colwise().sum(), w.down_bias.shape);
  return out;
}

MlpGrads gelu_mlp_backward(const runtime::HostTensor& x, const MlpWeights& w, const runtime::HostTensor& dy) {
  NUMESH_CHECK(w.stored_as == DType::kF32, NotImplementedError,
               "gelu backward: 16-bit weights are not differentiated yet");
  const std::int64_t rows = dim(x, 0, "gelu backward: x"), h = dim(x, 1, "gelu backward: x");
  const std::int64_t f = dim(w.up, 1, "gelu backward: up");
  const MatrixD xm = matrix(x, rows, h, "gelu backward: x");
  const MatrixD wu = matrix(w.up, h, f, "gelu backward: up");
  const MatrixD wd = matrix(w.down, f, h, "gelu backward: down");
  const MatrixD g = matrix(dy, rows, h, "gelu backward: dy");
  MatrixD b = xm * wu;  // pre-activation
  if (!w.up_bias.shape.empty()) b.rowwise() += matrix(w.up_bias, 1, f, "gelu backward: up bias").row(0);
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
  MlpGrads out;
  out.dx = oracle::narrow(db * wu.transpose(), {rows, h});
  out.dup = oracle::narrow(xm.transpose() * db, {h, f});
  out.ddown = oracle::narrow(act.transpose() * g, {f, h});
  if (!w.up_bias.shape.empty()) out.dup_bias = oracle::narrow(db.colwise().sum(), w.up_bias.shape);
  if (!w.down_bias.shape.empty()) {
    (void)matrix(w.down_bias, 1, h, "gelu backward: down bias");  // checks its shape
    out.ddown_bias = oracle::narrow(g.colwise().sum(), w.down_bias.shape);
  }
  return out;
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
  NUMESH_CHECK(w.stored_as == DType::kF32, NotImplementedError,
               "attention backward: 16-bit weights are not differentiated yet");
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
                                      const runtime::HostTensor& weight, runtime::HostTensor& dweight) {
    if (weight.shape.empty()) return;
    const MatrixD wn = matrix(weight, 1, d, "attention backward: q/k norm");
    MatrixD dw = MatrixD::Zero(1, d);
    for (std::int64_t r = 0; r < b * t; ++r) {
      for (std::int64_t hh = 0; hh < heads; ++hh) {
        rmsnorm_row_backward(raw.block(r, hh * d, 1, d), wn.row(0), c.qk_norm_eps, dz.block(r, hh * d, 1, d),
                             dw.row(0));
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

MoeGrads moe_backward(const runtime::HostTensor& x, const MoeWeights& w, const MoeConfig& c,
                      const runtime::HostTensor& dy, std::span<const double> dprobs) {
  NUMESH_CHECK(w.stored_as == DType::kF32 && w.shared_expert.stored_as == DType::kF32, NotImplementedError,
               "moe backward: 16-bit experts are not differentiated yet");
  const std::int64_t t = dim(x, 0, "moe backward: x"), h = dim(x, 1, "moe backward: x");
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e && c.capacity_factor >= 0.0f, ValueError,
               "moe backward: top_k {} must be between 1 and the {} experts and capacity_factor {} not negative", k,
               e, c.capacity_factor);
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) && w.up.shape == w.gate.shape &&
                   w.down.shape == (std::vector<std::int64_t>{e, f, h}),
               ShapeError, "moe backward: gate [{}], up [{}], down [{}] do not fit {} experts and hidden {}",
               fmt::join(w.gate.shape, ", "), fmt::join(w.up.shape, ", "), fmt::join(w.down.shape, ", "), e, h);
  NUMESH_CHECK(dprobs.empty() || static_cast<std::int64_t>(dprobs.size()) == e, ShapeError,
               "moe backward: {} probability gradients for {} experts", dprobs.size(), e);
  check_shared_expert(w, h);
  const MatrixD xm = matrix(x, t, h, "moe backward: x");
  const MatrixD wr = matrix(w.router, h, e, "moe backward: router");
  const MatrixD g = matrix(dy, t, h, "moe backward: dy");
  const oracle::Routing r = oracle::route(xm, w.router, c);

  // y[t] = sum over kept choices j of w_tj E_j(x[t]). The experts see dy scaled by the weight;
  // each weight sees dy . E_j(x[t]) (dropped choices: nothing).
  MatrixD dx = MatrixD::Zero(t, h), dweight = MatrixD::Zero(t, k);
  MatrixD dgate(e * h, f), dup(e * h, f), ddown(e * f, h);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    std::vector<std::pair<std::int64_t, std::int64_t>> uses;  // (token, choice) kept for ex
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (std::int64_t j = 0; j < k; ++j) {
        const auto i = static_cast<std::size_t>(ti), jj = static_cast<std::size_t>(j);
        if (r.kept[i][jj] && r.chosen[i][jj] == ex) uses.emplace_back(ti, j);
      }
    }
    const MatrixD wg = oracle::widen(w.gate.data.data() + ex * h * f, h, f);
    const MatrixD wu = oracle::widen(w.up.data.data() + ex * h * f, h, f);
    const MatrixD wd = oracle::widen(w.down.data.data() + ex * f * h, f, h);
    const auto n = static_cast<Eigen::Index>(uses.size());
    MatrixD xe(n, h), ge(n, h);
    for (Eigen::Index u = 0; u < n; ++u) {
      const auto [ti, j] = uses[static_cast<std::size_t>(u)];
      xe.row(u) = xm.row(ti);
      ge.row(u) = r.weight[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] * g.row(ti);
    }
    const MatrixD out = oracle::swiglu_mlp(xe, wg, wu, wd);
    const SwigluGradsD d = swiglu_gradients(xe, wg, wu, wd, ge);
    for (Eigen::Index u = 0; u < n; ++u) {
      const auto [ti, j] = uses[static_cast<std::size_t>(u)];
      dx.row(ti) += d.dx.row(u);
      dweight(ti, j) = g.row(ti).dot(out.row(u));
    }
    dgate.middleRows(ex * h, h) = d.dgate;
    dup.middleRows(ex * h, h) = d.dup;
    ddown.middleRows(ex * f, f) = d.ddown;
  }
  // Through the weights to the probabilities: w_j = p_j / Z with Z the sum of the k chosen
  // probabilities (renormalised), so dp_i = (dw_i - sum_j w_j dw_j) / Z; else dp_i = dw_i.
  // Then the softmax: dlogits = p .* (dp - p . dp).
  MatrixD dlogits = MatrixD::Zero(t, e);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    const auto i = static_cast<std::size_t>(ti);
    double z = 0.0, mean = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      z += r.probs(ti, r.chosen[i][static_cast<std::size_t>(j)]);
      mean += r.weight[i][static_cast<std::size_t>(j)] * dweight(ti, j);
    }
    Eigen::RowVectorXd dp = Eigen::RowVectorXd::Zero(e);
    for (std::int64_t j = 0; j < k; ++j) {
      dp(r.chosen[i][static_cast<std::size_t>(j)]) = c.renormalize ? (dweight(ti, j) - mean) / z : dweight(ti, j);
    }
    for (std::size_t ex = 0; ex < dprobs.size(); ++ex) dp(static_cast<Eigen::Index>(ex)) += dprobs[ex];
    const double pdp = r.probs.row(ti).dot(dp);
    dlogits.row(ti) = r.probs.row(ti).array() * (dp.array() - pdp);
  }
  dx += dlogits * wr.transpose();
  MoeGrads out;
  out.drouter = oracle::narrow(xm.transpose() * dlogits, {h, e});
  out.dgate = oracle::narrow(dgate, {e, h, f});
  out.dup = oracle::narrow(dup, {e, h, f});
  out.ddown = oracle::narrow(ddown, {e, f, h});
  // The shared expert: y += s S(x) with s = sigmoid(x g) per token. S sees dy scaled by s; the
  // gate's logit gets s (1 - s) (dy . S(x)).
  if (w.has_shared_expert()) {
    const std::int64_t fs = w.shared_expert.up.shape[1];
    const MatrixD sg = matrix(w.shared_expert.gate, h, fs, "moe backward: shared expert gate");
    const MatrixD su = matrix(w.shared_expert.up, h, fs, "moe backward: shared expert up");
    const MatrixD sd = matrix(w.shared_expert.down, fs, h, "moe backward: shared expert down");
    const MatrixD gate = matrix(w.shared_expert_gate, h, 1, "moe backward: shared_expert_gate");
    const MatrixD logit = xm * gate;
    const MatrixD shared = oracle::swiglu_mlp(xm, sg, su, sd);
    MatrixD scaled(t, h), dlogit(t, 1);
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const double s = oracle::sigmoid(logit(ti, 0));
      scaled.row(ti) = s * g.row(ti);
      dlogit(ti, 0) = s * (1.0 - s) * g.row(ti).dot(shared.row(ti));
    }
    const SwigluGradsD d = swiglu_gradients(xm, sg, su, sd, scaled);
    dx += d.dx + dlogit * gate.transpose();
    out.dshared_gate = oracle::narrow(d.dgate, {h, fs});
    out.dshared_up = oracle::narrow(d.dup, {h, fs});
    out.dshared_down = oracle::narrow(d.ddown, {fs, h});
    out.dshared_expert_gate = oracle::narrow(xm.transpose() * dlogit, {h, 1});
  }
  out.dx = oracle::narrow(dx, {t, h});
  return out;
}

RouterAuxLoss router_aux_loss(const std::vector<runtime::HostTensor>& xs,
                              const std::vector<runtime::HostTensor>& routers, const MoeConfig& c) {
  NUMESH_CHECK(!xs.empty() && xs.size() == routers.size(), ValueError,
               "router aux loss: {} layers' inputs and {} routers (at least one of each, as many)", xs.size(),
               routers.size());
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e, ValueError, "router aux loss: top_k {} must be between 1 and the {} experts",
               k, e);
  std::vector<double> choices(static_cast<std::size_t>(e), 0.0), probs(static_cast<std::size_t>(e), 0.0);
  std::int64_t n = 0;
  for (std::size_t l = 0; l < xs.size(); ++l) {
    const std::int64_t t = dim(xs[l], 0, "router aux loss: x"), h = dim(xs[l], 1, "router aux loss: x");
    NUMESH_CHECK(routers[l].shape == (std::vector<std::int64_t>{h, e}), ShapeError,
                 "router aux loss: layer {}'s router is [{}], expected [{}, {}]", l, fmt::join(routers[l].shape, ", "),
                 h, e);
    const oracle::Routing r = oracle::route(matrix(xs[l], t, h, "router aux loss: x"), routers[l], c);
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (const std::int64_t ex : r.chosen[static_cast<std::size_t>(ti)]) choices[static_cast<std::size_t>(ex)] += 1.0;
      for (std::int64_t ex = 0; ex < e; ++ex) probs[static_cast<std::size_t>(ex)] += r.probs(ti, ex);
    }
    n += t;
  }
  RouterAuxLoss out;
  const double nn = static_cast<double>(n) * static_cast<double>(n);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    const auto i = static_cast<std::size_t>(ex);
    out.loss += static_cast<double>(e) * choices[i] * probs[i] / nn;
    out.dprobs.push_back(static_cast<double>(e) * choices[i] / nn);
  }
  return out;
}

}  // namespace numesh::ops
