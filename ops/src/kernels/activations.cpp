#include "numesh/ops/kernels/activations.hpp"

#include <unsupported/Eigen/SpecialFunctions>

#include "numesh/ops/kernels/exp_kernels.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops {

namespace {

// Each activation as a pair of Eigen array expressions: value(a) = act(a) and slope(a) =
// act'(a), both lazy, so that a kernel below fuses them into one pass over its rows.

struct GeluErf {
  // gelu(x) = x Phi(x); gelu'(x) = Phi(x) + x phi(x), Phi and phi the standard normal's
  // distribution and density.
  template <class A>
  static auto value(const A& a) {
    return 0.5f * a * (1.0f + (a * 0.70710678118654752440f).erf());
  }
  template <class A>
  static auto slope(const A& a) {
    const auto cdf = 0.5f * (1.0f + (a * 0.70710678118654752440f).erf());
    const auto pdf = 0.39894228040143267794f * (-0.5f * a * a).exp();
    return cdf + a * pdf;
  }
};

struct GeluTanh {
  // gelu(x) ~ 0.5 x (1 + t), t = tanh(u), u = k (x + c x^3), k = sqrt(2 / pi), c = 0.044715
  // (PyTorch's approximate="tanh"); its slope 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2).
  // Eigen's float tanh is vectorized, and saturates to +-1 for large |u|: no NaN.
  static constexpr float kK = 0.79788456080286535588f, kC = 0.044715f;
  template <class A>
  static auto value(const A& a) {
    return 0.5f * a * (1.0f + (kK * (a + kC * a * a * a)).tanh());
  }
  template <class A>
  static auto slope(const A& a) {
    const auto t = (kK * (a + kC * a * a * a)).tanh();
    return 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * kK * (1.0f + 3.0f * kC * a * a);
  }
};

struct Silu {
  // silu(x) = x s, s = sigmoid(x); silu'(x) = s (1 + x (1 - s)). exp(-x) overflows to inf for
  // x < -88, and x / inf = -0, s = 0: the limits, no NaN.
  template <class A>
  static auto value(const A& a) {
    return a / (1.0f + (-a).exp());
  }
  template <class A>
  static auto slope(const A& a) {
    const auto s = (1.0f + (-a).exp()).inverse();
    return s * (1.0f + a * (1.0f - s));
  }
};

// Runs `body.template operator()<Act>()` for act's functor.
template <class Body>
void with_activation(Activation act, Body&& body) {
  switch (act) {
    case Activation::kGeluErf:
      body.template operator()<GeluErf>();
      return;
    case Activation::kGeluTanh:
      body.template operator()<GeluTanh>();
      return;
    case Activation::kSilu:
      body.template operator()<Silu>();
      return;
  }
}

}  // namespace

void activation_inplace(Activation act, MatrixMap x) {
  with_activation(act, [&]<class Act>() {
    parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
      auto a = x.middleRows(r0, r1 - r0).array();
      a = Act::value(a);
    });
  });
}

void activation_backward_inplace(Activation act, ConstMatrixMap x, MatrixMap dy) {
  with_activation(act, [&]<class Act>() {
    parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
      dy.middleRows(r0, r1 - r0).array() *= Act::slope(x.middleRows(r0, r1 - r0).array());
    });
  });
}

void gated_inplace(Activation act, MatrixMap gate, ConstMatrixMap up) {
  if (act == Activation::kSilu) {  // SwiGLU's, at the kernel level's width (exp_kernels.hpp)
    const runtime::KernelLevel level = runtime::kernel_level();
    const std::int64_t cols = gate.cols();
    parallel_blocks(gate.rows(), row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
      silu_mul_row(gate.data() + r0 * cols, up.data() + r0 * cols, (r1 - r0) * cols, level);
    });
    return;
  }
  with_activation(act, [&]<class Act>() {
    parallel_blocks(gate.rows(), row_block_for(gate.cols()), [&](std::int64_t r0, std::int64_t r1) {
      auto g = gate.middleRows(r0, r1 - r0).array();
      g = Act::value(g) * up.middleRows(r0, r1 - r0).array();
    });
  });
}

void gated_backward(Activation act, ConstMatrixMap gate, ConstMatrixMap up, ConstMatrixMap da,
                    MatrixMap d_gate, MatrixMap d_up) {
  with_activation(act, [&]<class Act>() {
    parallel_blocks(gate.rows(), row_block_for(gate.cols()), [&](std::int64_t r0, std::int64_t r1) {
      const std::int64_t n = r1 - r0;
      const auto g = gate.middleRows(r0, n).array();
      const auto u = up.middleRows(r0, n).array();
      const auto a = da.middleRows(r0, n).array();
      // d_up first: `da` may be d_gate's storage, which the second line overwrites.
      d_up.middleRows(r0, n).array() = a * Act::value(g);
      d_gate.middleRows(r0, n).array() = a * u * Act::slope(g);
    });
  });
}

}  // namespace numesh::ops
