#pragma once

#include <string_view>

#include "numesh/runtime/tensor.hpp"

// What an MLP is, independent of how it runs: its kind and its weights.

namespace numesh::ops {

/// Which MLP.
enum class MlpKind {
  kGelu,    ///< y = gelu(x w1) w2; weights "w1" [H, F], "w2" [F, H]
  kSwiGLU,  ///< y = (silu(x w_gate) .* (x w_up)) w_down; "w_gate", "w_up" [H, F], "w_down" [F, H]
};

/// "gelu" or "swiglu".
inline std::string_view to_string(MlpKind kind) noexcept {
  return kind == MlpKind::kGelu ? "gelu" : "swiglu";
}

/// The weights of an MLP, in host memory (as loaded from .npy). For kGelu, `up` is w1 and
/// `down` w2 and `gate` is unused (empty); for kSwiGLU all three are used.
struct MlpWeights {
  runtime::HostTensor gate;  ///< [H, F], SwiGLU only
  runtime::HostTensor up;    ///< [H, F]
  runtime::HostTensor down;  ///< [F, H]
};

}  // namespace numesh::ops
