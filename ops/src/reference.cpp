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
#include "numesh/ops/activations.hpp"
#include "numesh/ops/attention.hpp"
#include "numesh/ops/gemm.hpp"

namespace numesh::ops {

using detail::shape_text;

namespace {

RowMatrix matmul(const RowMatrix& a, const RowMatrix& b) {
  RowMatrix c(a.rows(), b.cols());
  gemm(ConstMatrixMap(a.data(), a.rows(), a.cols()), ConstMatrixMap(b.data(), b.rows(), b.cols()),
       MatrixMap(c.data(), c.rows(), c.cols()));
  return c;
}

void check_mlp_shapes(const char* what, const RowMatrix& x, const RowMatrix& w_in,
                      const RowMatrix& w_out) {
  NUMESH_CHECK(w_in.rows() == x.cols() && w_out.rows() == w_in.cols() && w_out.cols() == x.cols(),
               ShapeError,
               "{}: x [{}, {}], up-projection [{}, {}] and down-projection [{}, {}] do not chain "
               "(expected [T, H], [H, F], [F, H])",
               what, x.rows(), x.cols(), w_in.rows(), w_in.cols(), w_out.rows(), w_out.cols());
}

}  // namespace

float gelu(float x) noexcept {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752440f));
}

float silu(float x) noexcept {
  // sigmoid(x) = 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below: neither overflows.
  if (x >= 0.0f) return x / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return x * e / (1.0f + e);
}

RowMatrix mlp_gelu_reference(const RowMatrix& x, const RowMatrix& w1, const RowMatrix& w2) {
  check_mlp_shapes("mlp_gelu", x, w1, w2);
  RowMatrix h = matmul(x, w1);
  gelu_inplace(MatrixMap(h.data(), h.rows(), h.cols()));
  return matmul(h, w2);
}

RowMatrix mlp_swiglu_reference(const RowMatrix& x, const RowMatrix& w_gate,
                               const RowMatrix& w_up, const RowMatrix& w_down) {
  check_mlp_shapes("mlp_swiglu", x, w_gate, w_down);
  NUMESH_CHECK(w_up.rows() == w_gate.rows() && w_up.cols() == w_gate.cols(), ShapeError,
               "mlp_swiglu: gate [{}, {}] and up [{}, {}] projections differ in shape",
               w_gate.rows(), w_gate.cols(), w_up.rows(), w_up.cols());
  RowMatrix gate = matmul(x, w_gate);
  const RowMatrix up = matmul(x, w_up);
  silu_mul_inplace(MatrixMap(gate.data(), gate.rows(), gate.cols()),
                   ConstMatrixMap(up.data(), up.rows(), up.cols()));
  return matmul(gate, w_down);
}

RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps) {
  NUMESH_CHECK(weight.rows() == 1 && weight.cols() == x.cols(), ShapeError,
               "rmsnorm: weight is [{}, {}], expected [1, {}] for x [{}, {}]", weight.rows(),
               weight.cols(), x.cols(), x.rows(), x.cols());
  NUMESH_CHECK(eps >= 0.0f, ValueError, "rmsnorm: eps {} is negative", eps);
  RowMatrix y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const float mean_square = x.row(t).squaredNorm() / static_cast<float>(x.cols());
    const float scale = 1.0f / std::sqrt(mean_square + eps);
    y.row(t) = (x.row(t) * scale).cwiseProduct(weight.row(0));
  }
  return y;
}

void apply_rope_reference(runtime::HostTensor& x, std::int64_t first_position, float theta) {
  NUMESH_CHECK(x.shape.size() == 4, ShapeError, "rope: expected [B, T, H, D], got rank {}",
               x.shape.size());
  NUMESH_CHECK(x.shape[3] % 2 == 0, ShapeError, "rope: head_dim {} is odd", x.shape[3]);
  rope_inplace(x.data.data(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], first_position,
               theta);
}

runtime::HostTensor attention_reference(const runtime::HostTensor& q_in,
                                        const runtime::HostTensor& k_in,
                                        const runtime::HostTensor& v,
                                        const AttentionConfig& config) {
  NUMESH_CHECK(q_in.shape.size() == 4 && k_in.shape.size() == 4 && v.shape.size() == 4,
               ShapeError, "attention: q {}, k {}, v {} must all be [B, T, heads, head_dim]",
               shape_text(q_in), shape_text(k_in), shape_text(v));
  const std::int64_t b = q_in.shape[0], t = q_in.shape[1], s = k_in.shape[1];
  const std::int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_dim;
  NUMESH_CHECK(hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0, ShapeError,
               "attention: num_kv_heads {} must divide num_heads {} (both positive, head_dim {})",
               hkv, hq, d);
  NUMESH_CHECK(q_in.shape == (std::vector<std::int64_t>{b, t, hq, d}) &&
                   k_in.shape == (std::vector<std::int64_t>{b, s, hkv, d}) && v.shape == k_in.shape,
               ShapeError,
               "attention: q {}, k {}, v {} do not fit num_heads {}, num_kv_heads {}, head_dim {} "
               "(expected q [B, T, {}, {}], k and v [B, S, {}, {}])",
               shape_text(q_in), shape_text(k_in), shape_text(v), hq, hkv, d, hq, d, hkv, d);
  NUMESH_CHECK(!config.causal || s >= config.q_offset + t, ShapeError,
               "attention: {} keys cannot cover causal queries at positions {}..{}", s,
               config.q_offset, config.q_offset + t - 1);
  runtime::HostTensor q = q_in, k = k_in;
  runtime::HostTensor out = runtime::HostTensor::zeros({b, t, hq, d});
  std::vector<float> scores(static_cast<std::size_t>(s));
  attention_kernel(q.data.data(), k.data.data(), v.data.data(), out.data.data(),
                   AttentionSlice{.batch = b, .q_len = t, .kv_len = s, .q_heads = hq,
                                  .kv_heads = hkv, .group = hq / hkv, .q_head_offset = 0,
                                  .kv_head_offset = 0},
                   config, scores);
  return out;
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

  // Router probabilities, one row per token.
  const RowMatrix router = Eigen::Map<const RowMatrix>(w.router.data.data(), h, e);
  RowMatrix probs = matmul(x, router);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    const float m = probs.row(ti).maxCoeff();
    probs.row(ti) = (probs.row(ti).array() - m).exp().matrix();
    probs.row(ti) /= probs.row(ti).sum();
  }
  // Top-k per token: highest probability first, ties to the lower index.
  std::vector<std::vector<std::int64_t>> chosen(static_cast<std::size_t>(t));
  std::vector<std::vector<float>> weight(static_cast<std::size_t>(t));
  for (std::int64_t ti = 0; ti < t; ++ti) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(e));
    for (std::int64_t i = 0; i < e; ++i) order[static_cast<std::size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return probs(ti, a) > probs(ti, b);
    });
    order.resize(static_cast<std::size_t>(k));
    float total = 0.0f;
    for (std::int64_t j : order) total += probs(ti, j);
    for (std::int64_t j : order) {
      weight[static_cast<std::size_t>(ti)].push_back(c.renormalize ? probs(ti, j) / total
                                                                    : probs(ti, j));
    }
    chosen[static_cast<std::size_t>(ti)] = std::move(order);
  }
  // Capacity, in GShard's priority order: choice rank first, then token order.
  const std::int64_t capacity =
      c.capacity_factor > 0.0f
          ? static_cast<std::int64_t>(std::ceil(static_cast<double>(c.capacity_factor) *
                                                static_cast<double>(t * k) / static_cast<double>(e)))
          : 0;
  std::vector<std::int64_t> load(static_cast<std::size_t>(e), 0);
  std::vector<std::vector<bool>> kept(static_cast<std::size_t>(t),
                                      std::vector<bool>(static_cast<std::size_t>(k), false));
  std::int64_t dropped = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const std::int64_t ex = chosen[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)];
      if (capacity > 0 && load[static_cast<std::size_t>(ex)] >= capacity) {
        ++dropped;
        continue;
      }
      ++load[static_cast<std::size_t>(ex)];
      kept[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] = true;
    }
  }
  // Experts: each runs its SwiGLU MLP on the tokens it kept.
  RowMatrix y = RowMatrix::Zero(t, h);
  const std::size_t hf = static_cast<std::size_t>(h * f);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    std::vector<std::int64_t> rows;
    std::vector<float> scale;
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (std::int64_t j = 0; j < k; ++j) {
        if (kept[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] &&
            chosen[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] == ex) {
          rows.push_back(ti);
          scale.push_back(weight[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)]);
        }
      }
    }
    if (rows.empty()) continue;
    RowMatrix xe(static_cast<Eigen::Index>(rows.size()), h);
    for (std::size_t r = 0; r < rows.size(); ++r) xe.row(static_cast<Eigen::Index>(r)) = x.row(rows[r]);
    const auto off = static_cast<std::size_t>(ex) * hf;
    const RowMatrix wg = Eigen::Map<const RowMatrix>(w.gate.data.data() + off, h, f);
    const RowMatrix wu = Eigen::Map<const RowMatrix>(w.up.data.data() + off, h, f);
    const RowMatrix wd = Eigen::Map<const RowMatrix>(w.down.data.data() + off, f, h);
    const RowMatrix ye = mlp_swiglu_reference(xe, wg, wu, wd);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      y.row(rows[r]) += scale[r] * ye.row(static_cast<Eigen::Index>(r));
    }
  }
  if (stats != nullptr) {
    stats->tokens_per_expert = load;
    stats->dropped = dropped;
    stats->capacity = capacity;
  }
  return y;
}

}  // namespace numesh::ops
