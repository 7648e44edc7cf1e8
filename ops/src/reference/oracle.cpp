#include "oracle.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

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

namespace {
constexpr double kGeluTanhK = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluTanhC = 0.044715;
}  // namespace

double gelu_tanh(double x) noexcept {
  return 0.5 * x * (1.0 + std::tanh(kGeluTanhK * (x + kGeluTanhC * x * x * x)));
}

double sigmoid(double x) noexcept {
  // 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below: neither overflows.
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

double silu(double x) noexcept { return x * sigmoid(x); }

double activation(Activation act, double x) noexcept {
  switch (act) {
    case Activation::kGeluErf:
      return gelu(x);
    case Activation::kGeluTanh:
      return gelu_tanh(x);
    case Activation::kSilu:
      return silu(x);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double activation_slope(Activation act, double x) noexcept {
  switch (act) {
    case Activation::kGeluErf: {  // Phi(x) + x phi(x)
      const double cdf = 0.5 * std::erfc(-x / std::numbers::sqrt2);
      const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
      return cdf + x * pdf;
    }
    case Activation::kGeluTanh: {
      const double t = std::tanh(kGeluTanhK * (x + kGeluTanhC * x * x * x));
      return 0.5 * (1.0 + t) +
             0.5 * x * (1.0 - t * t) * kGeluTanhK * (1.0 + 3.0 * kGeluTanhC * x * x);
    }
    case Activation::kSilu: {
      const double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

MatrixD stored(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols, DType dtype) {
  if (is_element_dtype(dtype)) return widen(runtime::rounded_to(t, dtype), rows, cols);
  // A block format's blocks run along each output's inputs (the matrix is stored out-in): the
  // rows of the transpose.
  runtime::HostTensor out_in = runtime::HostTensor::zeros({cols, rows});
  Eigen::Map<RowMatrix>(out_in.data.data(), cols, rows) =
      Eigen::Map<const RowMatrix>(t.data.data(), rows, cols).transpose();
  const runtime::HostTensor q = runtime::rounded_to(out_in, dtype);
  return widen(q, cols, rows).transpose();
}

MatrixD stored(const float* data, std::int64_t rows, std::int64_t cols, DType dtype) {
  runtime::HostTensor t{{rows, cols}, std::vector<float>(data, data + rows * cols)};
  return stored(t, rows, cols, dtype);
}

namespace {

// x's rows quantized as the 8-bit-product formats' kernels quantize activations
// (ops/kernels/block_gemm.hpp, quantize_activations_q8), and dequantized: per 32-element block
// of the fp32 values, d = max|x| / 127, codes rounded to nearest even within +-127, value =
// code * d in fp32; a block with a non-finite value is NaN. Written from the definition.
MatrixD quantized_activations(const MatrixD& x) {
  constexpr Eigen::Index kBlock = 32;
  NUMESH_CHECK(x.cols() % kBlock == 0, ShapeError,
               "oracle: a projection input of {} columns is not whole blocks of 32", x.cols());
  MatrixD out(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index b = 0; b < x.cols(); b += kBlock) {
      float values[kBlock];
      float amax = 0.0f;
      bool finite = true;
      for (Eigen::Index e = 0; e < kBlock; ++e) {
        values[e] = static_cast<float>(x(i, b + e));
        finite = finite && std::isfinite(values[e]);
        amax = std::max(amax, std::fabs(values[e]));
      }
      const float d = amax / 127.0f;
      // As the kernels: a scale whose reciprocal overflows (max|x| below ~3.7e-37) gives codes 0.
      const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
      const float id = std::isfinite(inverse) ? inverse : 0.0f;
      for (Eigen::Index e = 0; e < kBlock; ++e) {
        const float code = std::clamp(std::nearbyint(values[e] * id), -127.0f, 127.0f);
        out(i, b + e) =
            finite ? static_cast<double>(code * d) : std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return out;
}

}  // namespace

MatrixD projection_input(const MatrixD& x, DType weights) {
  // Every block format's kernels take 8-bit blocks of activations (block_gemm.hpp).
  if (!is_element_dtype(weights)) return quantized_activations(x);
  switch (element_type(weights)) {
    case ElementType::kF32:
    case ElementType::kF16:
      return x;
    case ElementType::kBF16:
      break;
  }
  return x.unaryExpr([](double v) {
    return static_cast<double>(f32_from_bf16(bf16_from_f32(static_cast<float>(v))));
  });
}

MatrixD project(const MatrixD& x, const runtime::HostTensor& m, DType format) {
  return projection_input(x, format) * stored(m, m.shape[0], m.shape[1], format);
}

namespace {

// act(x w_in + b_in) w_out + b_out without a gate, else act(x w_gate + b_gate) .* (x w_up +
// b_up); `biases` (nullptr: none) gives the b's, an empty one adding nothing.
MatrixD mlp_of(const MatrixD& x, Activation act, const MatrixD* w_gate, const MatrixD& w_in,
               const MatrixD& w_out, const MlpFormats& weights, const MlpWeights* biases) {
  const runtime::HostTensor none;
  MatrixD up = projection_input(x, weights.up) * w_in;
  add_bias(up, biases != nullptr ? biases->up_bias : none);
  MatrixD h;
  if (w_gate == nullptr) {
    h = up.unaryExpr([act](double v) { return activation(act, v); });
  } else {
    MatrixD gate = projection_input(x, weights.gate) * *w_gate;
    add_bias(gate, biases != nullptr ? biases->gate_bias : none);
    h = gate.unaryExpr([act](double v) { return activation(act, v); }).cwiseProduct(up);
  }
  MatrixD y = projection_input(h, weights.down) * w_out;
  add_bias(y, biases != nullptr ? biases->down_bias : none);
  return y;
}

}  // namespace

MatrixD gelu_mlp(const MatrixD& x, const MatrixD& w1, const MatrixD& w2,
                 const MlpFormats& weights) {
  return mlp_of(x, Activation::kGeluErf, nullptr, w1, w2, weights, nullptr);
}

MatrixD swiglu_mlp(const MatrixD& x, const MatrixD& w_gate, const MatrixD& w_up,
                   const MatrixD& w_down, const MlpFormats& weights) {
  return mlp_of(x, Activation::kSilu, &w_gate, w_up, w_down, weights, nullptr);
}

MatrixD mlp(const MatrixD& x, MlpKind kind, const MlpWeights& w) {
  const std::int64_t h = w.up.shape[0], f = w.up.shape[1];
  const MlpFormats& d = w.stored_as;
  const MlpKindTraits traits = mlp_traits(kind);
  const MatrixD gate = traits.gated ? stored(w.gate, h, f, d.gate) : MatrixD();
  return mlp_of(x, traits.activation, traits.gated ? &gate : nullptr, stored(w.up, h, f, d.up),
                stored(w.down, f, h, d.down), d, &w);
}

MatrixD rmsnorm(const MatrixD& x, const MatrixD& weight, double eps) {
  MatrixD y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const double mean_square = x.row(t).squaredNorm() / static_cast<double>(x.cols());
    y.row(t) = x.row(t).cwiseProduct(weight.row(0)) / std::sqrt(mean_square + eps);
  }
  return y;
}

MatrixD layernorm(const MatrixD& x, const MatrixD& weight, const MatrixD& bias, double eps) {
  MatrixD y(x.rows(), x.cols());
  const auto h = static_cast<double>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const double mean = x.row(t).sum() / h;
    const double var = (x.row(t).array() - mean).square().sum() / h;
    y.row(t) = ((x.row(t).array() - mean) / std::sqrt(var + eps) * weight.row(0).array()).matrix();
    if (bias.size() > 0) y.row(t) += bias.row(0);
  }
  return y;
}

void add_bias(MatrixD& x, const runtime::HostTensor& bias) {
  if (bias.shape.empty()) return;
  for (Eigen::Index c = 0; c < x.cols(); ++c)
    x.col(c).array() += static_cast<double>(bias.data[static_cast<std::size_t>(c)]);
}

void head_rmsnorm(MatrixD& x, std::int64_t d, const runtime::HostTensor& weight, double eps) {
  if (weight.shape.empty()) return;
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index h = 0; h * d < x.cols(); ++h) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < d; ++i) sum += x(r, h * d + i) * x(r, h * d + i);
      const double scale = 1.0 / std::sqrt(sum / static_cast<double>(d) + eps);
      for (std::int64_t i = 0; i < d; ++i) {
        x(r, h * d + i) *= scale * static_cast<double>(weight.data[static_cast<std::size_t>(i)]);
      }
    }
  }
}

namespace {

// Hugging Face's inverse frequency of pair i after rope_scaling, written as its
// _compute_llama3_parameters and linear scaling are: wavelengths against the original context.
double scaled_frequency(std::int64_t i, std::int64_t d, double theta, const RopeScaling& scaling) {
  const double inv_freq =
      1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(d));
  if (scaling.kind == RopeScaling::Kind::kLinear) return inv_freq / scaling.factor;
  if (scaling.kind == RopeScaling::Kind::kFactors)
    return inv_freq / scaling.frequency_factors[static_cast<std::size_t>(i)];
  if (scaling.kind != RopeScaling::Kind::kLlama3) return inv_freq;
  const double context = static_cast<double>(scaling.original_max_position);
  const double low_freq_wavelen = context / scaling.low_freq_factor;
  const double high_freq_wavelen = context / scaling.high_freq_factor;
  const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
  const double llama = wavelen > low_freq_wavelen ? inv_freq / scaling.factor : inv_freq;
  const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  if (!medium) return llama;
  const double smooth = (context / wavelen - scaling.low_freq_factor) /
                        (scaling.high_freq_factor - scaling.low_freq_factor);
  return (1.0 - smooth) * llama / scaling.factor + smooth * llama;
}

}  // namespace

void rope(MatrixD& x, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t d,
          std::int64_t first_position, double theta, const RopeScaling& scaling) {
  const std::int64_t half = d / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double freq = scaled_frequency(i, d, theta, scaling);
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

Routing route(const MatrixD& x, const runtime::HostTensor& router, const MoeConfig& c) {
  const std::int64_t t = x.rows(), h = x.cols(), e = c.num_experts, k = c.top_k;
  Routing r;
  // Router probabilities, one row per token (stable softmax).
  r.probs = x * widen(router, h, e);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    const double m = r.probs.row(ti).maxCoeff();
    r.probs.row(ti) = (r.probs.row(ti).array() - m).exp().matrix();
    r.probs.row(ti) /= r.probs.row(ti).sum();
  }
  // Top-k per token: highest probability first, ties to the lower expert index.
  r.chosen.resize(static_cast<std::size_t>(t));
  r.weight.resize(static_cast<std::size_t>(t));
  r.kept.assign(static_cast<std::size_t>(t), std::vector<bool>(static_cast<std::size_t>(k), false));
  for (std::int64_t ti = 0; ti < t; ++ti) {
    auto& order = r.chosen[static_cast<std::size_t>(ti)];
    for (std::int64_t i = 0; i < e; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return r.probs(ti, a) > r.probs(ti, b);
    });
    order.resize(static_cast<std::size_t>(k));
    double total = 0.0;
    for (std::int64_t j : order) total += r.probs(ti, j);
    for (std::int64_t j : order) {
      r.weight[static_cast<std::size_t>(ti)].push_back(c.renormalize ? r.probs(ti, j) / total
                                                                     : r.probs(ti, j));
    }
  }
  // Capacity, in GShard's priority order: every token's first choice before any second.
  r.capacity = expert_capacity(c, t);
  r.load.assign(static_cast<std::size_t>(e), 0);
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const auto ex = static_cast<std::size_t>(
          r.chosen[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)]);
      if (r.capacity > 0 && r.load[ex] >= r.capacity) {
        ++r.dropped;
        continue;
      }
      ++r.load[ex];
      r.kept[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] = true;
    }
  }
  return r;
}

MatrixD moe(const MatrixD& x, const MoeWeights& w, const MoeConfig& c, MoeStats* stats) {
  const std::int64_t t = x.rows(), h = x.cols(), e = c.num_experts, k = c.top_k,
                     f = w.gate.shape[2];
  const Routing routing = route(x, w.router, c);
  // Per expert, its kept tokens (in the priority order they were taken) and their weights.
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(e));
  std::vector<std::vector<double>> scales(static_cast<std::size_t>(e));
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const auto i = static_cast<std::size_t>(ti), jj = static_cast<std::size_t>(j);
      if (!routing.kept[i][jj]) continue;
      const auto ex = static_cast<std::size_t>(routing.chosen[i][jj]);
      rows[ex].push_back(ti);
      scales[ex].push_back(routing.weight[i][jj]);
    }
  }
  // Each expert's SwiGLU MLP on the tokens it kept, scaled by their routing weights.
  MatrixD y = MatrixD::Zero(t, h);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    const auto& kept = rows[static_cast<std::size_t>(ex)];
    if (kept.empty()) continue;
    MatrixD xe(static_cast<Eigen::Index>(kept.size()), h);
    for (std::size_t r = 0; r < kept.size(); ++r)
      xe.row(static_cast<Eigen::Index>(r)) = x.row(kept[r]);
    const std::size_t off = static_cast<std::size_t>(ex * h * f);
    const MatrixD out =
        swiglu_mlp(xe, stored(w.gate.data.data() + off, h, f, w.stored_as.gate),
                   stored(w.up.data.data() + off, h, f, w.stored_as.up),
                   stored(w.down.data.data() + off, f, h, w.stored_as.down), w.stored_as);
    for (std::size_t r = 0; r < kept.size(); ++r) {
      y.row(kept[r]) +=
          scales[static_cast<std::size_t>(ex)][r] * out.row(static_cast<Eigen::Index>(r));
    }
  }
  // The shared expert, every token through it, scaled by its own gate; SwiGLU as the experts.
  if (w.has_shared_expert()) {
    const MatrixD gate = x * widen(w.shared_expert_gate, h, 1);
    const MatrixD shared = mlp(x, MlpKind::kSwiGLU, w.shared_expert);
    for (std::int64_t ti = 0; ti < t; ++ti) y.row(ti) += sigmoid(gate(ti, 0)) * shared.row(ti);
  }
  if (stats != nullptr) {
    stats->tokens_per_expert = routing.load;
    stats->dropped = routing.dropped;
    stats->capacity = routing.capacity;
  }
  return y;
}

}  // namespace oracle

}  // namespace numesh::ops
