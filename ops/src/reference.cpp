#include "numesh/ops/reference.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "lowering_util.hpp"
#include "numesh/ops/attention.hpp"
#include "oracle.hpp"

namespace numesh::ops {

using detail::shape_text;

// ---------------------------------------------------------------------------------------------
// The float64 arithmetic (oracle.hpp).

namespace oracle {

MatrixD widen(const float* data, std::int64_t rows, std::int64_t cols) {
  return Eigen::Map<const RowMatrix>(data, rows, cols).cast<double>();
}

MatrixD widen(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols) {
  return widen(t.data.data(), rows, cols);
}

runtime::HostTensor narrow(const MatrixD& m, std::vector<std::int64_t> shape) {
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  Eigen::Map<RowMatrix>(t.data.data(), m.rows(), m.cols()) = m.cast<float>();
  return t;
}

RowMatrix narrow(const MatrixD& m) { return m.cast<float>(); }

double gelu(double x) noexcept { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

double silu(double x) noexcept {
  // sigmoid(x) = 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below: neither overflows.
  if (x >= 0.0) return x / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return x * e / (1.0 + e);
}

MatrixD gelu_mlp(const MatrixD& x, const MatrixD& w1, const MatrixD& w2) {
  const MatrixD h = (x * w1).unaryExpr([](double v) { return gelu(v); });
  return h * w2;
}

MatrixD swiglu_mlp(const MatrixD& x, const MatrixD& w_gate, const MatrixD& w_up, const MatrixD& w_down) {
  const MatrixD gate = (x * w_gate).unaryExpr([](double v) { return silu(v); });
  const MatrixD h = gate.cwiseProduct(x * w_up);
  return h * w_down;
}

MatrixD rmsnorm(const MatrixD& x, const MatrixD& weight, double eps) {
  MatrixD y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const double mean_square = x.row(t).squaredNorm() / static_cast<double>(x.cols());
    y.row(t) = x.row(t).cwiseProduct(weight.row(0)) / std::sqrt(mean_square + eps);
  }
  return y;
}

void rope(MatrixD& x, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t d,
          std::int64_t first_position, double theta) {
  const std::int64_t half = d / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const double angle = static_cast<double>(first_position + t) * freq;
      const double c = std::cos(angle), s = std::sin(angle);
      for (std::int64_t b = 0; b < batch; ++b) {
        for (std::int64_t h = 0; h < heads; ++h) {
          double& x1 = x(b * tokens + t, h * d + i);
          double& x2 = x(b * tokens + t, h * d + i + half);
          const double a1 = x1, a2 = x2;
          x1 = a1 * c - a2 * s;
          x2 = a2 * c + a1 * s;
        }
      }
    }
  }
}

MatrixD attention(const MatrixD& q, const MatrixD& k, const MatrixD& v, const AttentionShape& s) {
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Queries in blocks, so that a long prompt needs [block, kv_len] scores, not [T, kv_len].
  constexpr std::int64_t kBlock = 256;
  MatrixD out = MatrixD::Zero(s.batch * s.q_len, s.heads * d);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t kvh = h / group;
      const MatrixD keys = k.block(b * s.kv_len, kvh * d, s.kv_len, d);
      const MatrixD values = v.block(b * s.kv_len, kvh * d, s.kv_len, d);
      for (std::int64_t t0 = 0; t0 < s.q_len; t0 += kBlock) {
        const std::int64_t rows = std::min(kBlock, s.q_len - t0);
        MatrixD p = q.block(b * s.q_len + t0, h * d, rows, d) * keys.transpose() * scale;
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t visible = s.causal ? s.q_offset + t0 + r + 1 : s.kv_len;
          const double m = p.row(r).head(visible).maxCoeff();  // finite inputs: no NaN here
          double sum = 0.0;
          for (std::int64_t j = 0; j < visible; ++j) sum += (p(r, j) = std::exp(p(r, j) - m));
          p.row(r).head(visible) /= sum;
          p.row(r).tail(s.kv_len - visible).setZero();
        }
        out.block(b * s.q_len + t0, h * d, rows, d) = p * values;
      }
    }
  }
  return out;
}

MatrixD moe(const MatrixD& x, const MoeWeights& w, const MoeConfig& c, MoeStats* stats) {
  const std::int64_t t = x.rows(), h = x.cols(), e = c.num_experts, k = c.top_k, f = w.gate.shape[2];
  // Router probabilities, one row per token (stable softmax).
  MatrixD probs = x * widen(w.router, h, e);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    const double m = probs.row(ti).maxCoeff();
    probs.row(ti) = (probs.row(ti).array() - m).exp().matrix();
    probs.row(ti) /= probs.row(ti).sum();
  }
  // Top-k per token: highest probability first, ties to the lower expert index.
  std::vector<std::vector<std::int64_t>> chosen(static_cast<std::size_t>(t));
  std::vector<std::vector<double>> weight(static_cast<std::size_t>(t));
  for (std::int64_t ti = 0; ti < t; ++ti) {
    auto& order = chosen[static_cast<std::size_t>(ti)];
    for (std::int64_t i = 0; i < e; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return probs(ti, a) > probs(ti, b); });
    order.resize(static_cast<std::size_t>(k));
    double total = 0.0;
    for (std::int64_t j : order) total += probs(ti, j);
    for (std::int64_t j : order) {
      weight[static_cast<std::size_t>(ti)].push_back(c.renormalize ? probs(ti, j) / total : probs(ti, j));
    }
  }
  // Capacity, in GShard's priority order: every token's first choice before any second.
  const std::int64_t capacity =
      c.capacity_factor > 0.0f
          ? static_cast<std::int64_t>(std::ceil(static_cast<double>(c.capacity_factor) * static_cast<double>(t * k) /
                                                static_cast<double>(e)))
          : 0;
  std::vector<std::int64_t> load(static_cast<std::size_t>(e), 0);
  std::int64_t dropped = 0;
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(e));  // kept tokens per expert
  std::vector<std::vector<double>> scales(static_cast<std::size_t>(e));      // and their weights
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const auto ex = static_cast<std::size_t>(chosen[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)]);
      if (capacity > 0 && load[ex] >= capacity) {
        ++dropped;
        continue;
      }
      ++load[ex];
      rows[ex].push_back(ti);
      scales[ex].push_back(weight[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)]);
    }
  }
  // Each expert's SwiGLU MLP on the tokens it kept, scaled by their routing weights.
  MatrixD y = MatrixD::Zero(t, h);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    const auto& kept = rows[static_cast<std::size_t>(ex)];
    if (kept.empty()) continue;
    MatrixD xe(static_cast<Eigen::Index>(kept.size()), h);
    for (std::size_t r = 0; r < kept.size(); ++r) xe.row(static_cast<Eigen::Index>(r)) = x.row(kept[r]);
    const std::size_t off = static_cast<std::size_t>(ex * h * f);
    const MatrixD out = swiglu_mlp(xe, widen(w.gate.data.data() + off, h, f), widen(w.up.data.data() + off, h, f),
                                   widen(w.down.data.data() + off, f, h));
    for (std::size_t r = 0; r < kept.size(); ++r) {
      y.row(kept[r]) += scales[static_cast<std::size_t>(ex)][r] * out.row(static_cast<Eigen::Index>(r));
    }
  }
  if (stats != nullptr) {
    stats->tokens_per_expert = load;
    stats->dropped = dropped;
    stats->capacity = capacity;
  }
  return y;
}

}  // namespace oracle

// ---------------------------------------------------------------------------------------------
// The public references: validation, then the float64 arithmetic, rounded once.

namespace {

void check_mlp_shapes(const char* what, const RowMatrix& x, const RowMatrix& w_in,
                      const RowMatrix& w_out) {
  NUMESH_CHECK(w_in.rows() == x.cols() && w_out.rows() == w_in.cols() && w_out.cols() == x.cols(),
               ShapeError,
               "{}: x [{}, {}], up-projection [{}, {}] and down-projection [{}, {}] do not chain "
               "(expected [T, H], [H, F], [F, H])",
               what, x.rows(), x.cols(), w_in.rows(), w_in.cols(), w_out.rows(), w_out.cols());
}

oracle::MatrixD wide(const RowMatrix& m) { return m.cast<double>(); }

}  // namespace

float gelu(float x) noexcept { return static_cast<float>(oracle::gelu(x)); }

float silu(float x) noexcept { return static_cast<float>(oracle::silu(x)); }

RowMatrix mlp_gelu_reference(const RowMatrix& x, const RowMatrix& w1, const RowMatrix& w2) {
  check_mlp_shapes("mlp_gelu", x, w1, w2);
  return oracle::narrow(oracle::gelu_mlp(wide(x), wide(w1), wide(w2)));
}

RowMatrix mlp_swiglu_reference(const RowMatrix& x, const RowMatrix& w_gate,
                               const RowMatrix& w_up, const RowMatrix& w_down) {
  check_mlp_shapes("mlp_swiglu", x, w_gate, w_down);
  NUMESH_CHECK(w_up.rows() == w_gate.rows() && w_up.cols() == w_gate.cols(), ShapeError,
               "mlp_swiglu: gate [{}, {}] and up [{}, {}] projections differ in shape",
               w_gate.rows(), w_gate.cols(), w_up.rows(), w_up.cols());
  return oracle::narrow(oracle::swiglu_mlp(wide(x), wide(w_gate), wide(w_up), wide(w_down)));
}

RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps) {
  NUMESH_CHECK(weight.rows() == 1 && weight.cols() == x.cols(), ShapeError,
               "rmsnorm: weight is [{}, {}], expected [1, {}] for x [{}, {}]", weight.rows(),
               weight.cols(), x.cols(), x.rows(), x.cols());
  NUMESH_CHECK(eps >= 0.0f, ValueError, "rmsnorm: eps {} is negative", eps);
  return oracle::narrow(oracle::rmsnorm(wide(x), wide(weight), eps));
}

void apply_rope_reference(runtime::HostTensor& x, std::int64_t first_position, float theta) {
  NUMESH_CHECK(x.shape.size() == 4, ShapeError, "rope: expected [B, T, H, D], got rank {}",
               x.shape.size());
  NUMESH_CHECK(x.shape[3] % 2 == 0, ShapeError, "rope: head_dim {} is odd", x.shape[3]);
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = x.shape[3];
  oracle::MatrixD m = oracle::widen(x, b * t, h * d);
  oracle::rope(m, b, t, h, d, first_position, theta);
  x = oracle::narrow(m, x.shape);
}

runtime::HostTensor attention_reference(const runtime::HostTensor& q, const runtime::HostTensor& k,
                                        const runtime::HostTensor& v, const AttentionConfig& config) {
  NUMESH_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4,
               ShapeError, "attention: q {}, k {}, v {} must all be [B, T, heads, head_dim]",
               shape_text(q), shape_text(k), shape_text(v));
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
  oracle::MatrixD qd = oracle::widen(q, b * t, hq * d), kd = oracle::widen(k, b * s, hkv * d);
  if (config.rope_theta > 0.0f) {
    oracle::rope(qd, b, t, hq, d, config.q_offset, config.rope_theta);
    oracle::rope(kd, b, s, hkv, d, 0, config.rope_theta);
  }
  const oracle::AttentionShape shape{.batch = b, .q_len = t, .kv_len = s, .heads = hq, .kv_heads = hkv,
                                     .head_dim = d, .q_offset = config.q_offset, .causal = config.causal};
  return oracle::narrow(oracle::attention(qd, kd, oracle::widen(v, b * s, hkv * d), shape), {b, t, hq, d});
}

runtime::HostTensor attention_layer_reference(const runtime::HostTensor& x, const AttentionWeights& w,
                                              const AttentionConfig& c) {
  NUMESH_CHECK(x.shape.size() == 3 && w.wq.shape.size() == 2 && w.wk.shape.size() == 2 && w.wv.shape == w.wk.shape &&
                   w.wo.shape.size() == 2 && w.wq.shape[0] == x.shape[2] && w.wk.shape[0] == x.shape[2] &&
                   w.wq.shape[1] == c.num_heads * c.head_dim && w.wk.shape[1] == c.num_kv_heads * c.head_dim &&
                   w.wo.shape == (std::vector<std::int64_t>{w.wq.shape[1], x.shape[2]}),
               ShapeError, "attention: x {}, wq {}, wk {}, wv {}, wo {} do not fit {} heads, {} kv heads, head_dim {}",
               shape_text(x), shape_text(w.wq), shape_text(w.wk), shape_text(w.wv), shape_text(w.wo), c.num_heads,
               c.num_kv_heads, c.head_dim);
  NUMESH_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, ShapeError,
               "attention: num_kv_heads {} must divide num_heads {}", c.num_kv_heads, c.num_heads);
  NUMESH_CHECK(c.rope_theta <= 0.0f || c.head_dim % 2 == 0, ShapeError, "rope: head_dim {} is odd", c.head_dim);
  const std::int64_t b = x.shape[0], t = x.shape[1], h = x.shape[2], d = c.head_dim;
  const oracle::MatrixD xd = oracle::widen(x, b * t, h);
  auto weight = [](const runtime::HostTensor& m) { return oracle::widen(m, m.shape[0], m.shape[1]); };
  oracle::MatrixD q = xd * weight(w.wq), k = xd * weight(w.wk);
  const oracle::MatrixD v = xd * weight(w.wv);
  if (c.rope_theta > 0.0f) {
    oracle::rope(q, b, t, c.num_heads, d, c.q_offset, c.rope_theta);
    oracle::rope(k, b, t, c.num_kv_heads, d, 0, c.rope_theta);
  }
  NUMESH_CHECK(!c.causal || c.q_offset == 0, ShapeError,
               "attention: {} keys cannot cover causal queries at positions {}..{}", t, c.q_offset, c.q_offset + t - 1);
  const oracle::AttentionShape shape{.batch = b, .q_len = t, .kv_len = t, .heads = c.num_heads,
                                     .kv_heads = c.num_kv_heads, .head_dim = d, .q_offset = c.q_offset,
                                     .causal = c.causal};
  return oracle::narrow(oracle::attention(q, k, v, shape) * weight(w.wo), {b, t, h});
}

RowMatrix moe_reference(const RowMatrix& x, const MoeWeights& w, const MoeConfig& c,
                        MoeStats* stats) {
  const std::int64_t t = x.rows(), h = x.cols(), e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e, ValueError,
               "moe: top_k {} must be between 1 and the {} experts", k, e);
  NUMESH_CHECK(c.capacity_factor >= 0.0f, ValueError, "moe: capacity_factor {} is negative",
               c.capacity_factor);
  NUMESH_CHECK(w.router.shape == (std::vector<std::int64_t>{h, e}), ShapeError,
               "moe: router is {}, expected [{}, {}] for x [{}, {}] and {} experts",
               shape_text(w.router), h, e, t, h, e);
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) &&
                   w.up.shape == w.gate.shape &&
                   w.down.shape == (std::vector<std::int64_t>{e, f, h}),
               ShapeError,
               "moe: expert weights gate {}, up {}, down {} do not fit {} experts and hidden {} "
               "(expected [E, H, F], [E, H, F], [E, F, H])",
               shape_text(w.gate), shape_text(w.up), shape_text(w.down), e, h);
  return oracle::narrow(oracle::moe(wide(x), w, c, stats));
}

}  // namespace numesh::ops
