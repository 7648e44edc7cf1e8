#pragma once

#include <cstdint>
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
/// `down` w2 and `gate` is unused (empty); for kSwiGLU all three are used. The biases are
/// optional (Llama's mlp_bias): each is empty (no bias) or a vector added to its projection's
/// output, before the activation for gate and up.
struct MlpWeights {
  runtime::HostTensor gate;  ///< [H, F], SwiGLU only
  runtime::HostTensor up;    ///< [H, F]
  runtime::HostTensor down;  ///< [F, H]
  /// The dtype the layer stores the matrices in: the host values are fp32 and are rounded to
  /// nearest even when laid out (bf16 / f16 halve the bytes a decode step reads). Products
  /// accumulate in fp32; bf16 weights multiply activations rounded to bf16 (device_gemm), f16
  /// weights fp32 activations. The dense references honour it the same way.
  DType stored_as = DType::kF32;
  /// Biases [F], [F], [H]; empty: none. Kept in fp32, as the attention biases. (Last, with
  /// braces: designated initializers may leave them out without GCC's warning.)
  runtime::HostTensor gate_bias{}, up_bias{}, down_bias{};
};

/// Checks the optional biases of `w` against the MLP's sizes: gate_bias (SwiGLU only) and
/// up_bias empty or [intermediate], down_bias empty or [hidden].
/// Throws: ShapeError naming the bias, its shape and the size it must have; a gate_bias on a
/// GELU MLP (which has no gate).
void check_biases(const MlpWeights& w, MlpKind kind, std::int64_t hidden,
                  std::int64_t intermediate);

}  // namespace numesh::ops
