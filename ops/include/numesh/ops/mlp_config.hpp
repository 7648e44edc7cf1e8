#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "numesh/runtime/tensor.hpp"

// What an MLP is, independent of how it runs: its kind and its weights.

namespace numesh::ops {

/// An element-wise activation of an MLP's hidden values.
enum class Activation : std::uint8_t {
  kGeluErf,   ///< gelu(x) = 0.5 x (1 + erf(x / sqrt(2))), the exact form
  kGeluTanh,  ///< 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), PyTorch's
              ///< gelu(approximate="tanh"), transformers' "gelu_pytorch_tanh"
  kSilu,      ///< silu(x) = x / (1 + exp(-x))
};

/// "gelu", "gelu_tanh" or "silu".
constexpr std::string_view to_string(Activation a) noexcept {
  switch (a) {
    case Activation::kGeluErf:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}

/// Which MLP.
enum class MlpKind : std::uint8_t {
  kGelu,    ///< y = gelu(x w1) w2; weights "w1" [H, F], "w2" [F, H]
  kSwiGLU,  ///< y = (silu(x w_gate) .* (x w_up)) w_down; "w_gate", "w_up" [H, F], "w_down" [F, H]
  kGeGLU,   ///< y = (gelu_tanh(x w_gate) .* (x w_up)) w_down, SwiGLU's weights (Gemma)
};

/// Every MlpKind, in the enum's order.
inline constexpr std::array kAllMlpKinds{MlpKind::kGelu, MlpKind::kSwiGLU, MlpKind::kGeGLU};

/// What an MLP kind is made of: every kind is act(x w_up) w_down, or, gated, (act(x w_gate) .*
/// (x w_up)) w_down. The lowering, the references and the loaders read these, never the kind
/// itself, so a new kind is one more row here.
struct MlpKindTraits {
  bool gated = false;  ///< has a gate projection (w_gate [H, F])
  Activation activation = Activation::kGeluErf;
  std::string_view name;  ///< as to_string() gives it
};

/// The traits of `kind`.
constexpr MlpKindTraits mlp_traits(MlpKind kind) noexcept {
  switch (kind) {
    case MlpKind::kGelu:
      return {.gated = false, .activation = Activation::kGeluErf, .name = "gelu"};
    case MlpKind::kSwiGLU:
      return {.gated = true, .activation = Activation::kSilu, .name = "swiglu"};
    case MlpKind::kGeGLU:
      return {.gated = true, .activation = Activation::kGeluTanh, .name = "geglu"};
  }
  return {.name = "?"};
}

/// "gelu", "swiglu" or "geglu".
constexpr std::string_view to_string(MlpKind kind) noexcept { return mlp_traits(kind).name; }

/// The format each matrix of an MLP (or of a MoE layer's experts) is stored in on the devices,
/// one per matrix, so that a checkpoint's mixed formats are kept as they are (a GGUF Q4_K_M
/// file stores some down projections as Q6_K among Q4_K ones). all() stores them alike. A
/// layer without a gate never reads `gate`; keep it equal to `up` (the loaders do), since
/// all_are(), == and to_string() compare all three.
struct MlpFormats {
  DType gate = DType::kF32;
  DType up = DType::kF32;
  DType down = DType::kF32;

  /// Every matrix as `dtype`.
  static constexpr MlpFormats all(DType dtype) noexcept { return {dtype, dtype, dtype}; }
  /// Whether every matrix is stored as `dtype`.
  [[nodiscard]] constexpr bool all_are(DType dtype) const noexcept { return *this == all(dtype); }
  friend constexpr bool operator==(const MlpFormats&, const MlpFormats&) = default;
};

/// "q4_k" when every matrix has that format, else each by name ("gate q4_k, up q4_k, down
/// q6_k").
std::string to_string(const MlpFormats& formats);

/// The weights of an MLP, in host memory (as loaded from .npy). Without a gate (kGelu) `up` is
/// w1 and `down` w2 and `gate` is unused (empty); a gated kind uses all three. The biases are
/// optional (Llama's mlp_bias): each is empty (no bias) or a vector added to its projection's
/// output, before the activation for gate and up.
struct MlpWeights {
  runtime::HostTensor gate;  ///< [H, F], gated kinds only
  runtime::HostTensor up;    ///< [H, F]
  runtime::HostTensor down;  ///< [F, H]
  /// The formats the layer stores the matrices in: the host values are fp32 and are rounded
  /// to nearest even when laid out (bf16 / f16 halve the bytes a decode step reads), or
  /// quantized along each row for a block format. Products accumulate in fp32; bf16 weights
  /// multiply activations rounded to bf16 (device_gemm), f16 weights fp32 activations, block
  /// formats activations quantized to 8 bits. The dense references honour it the same way.
  MlpFormats stored_as{};
  /// Biases [F], [F], [H]; empty: none. Kept in fp32, as the attention biases. (Last, with
  /// braces: designated initializers may leave them out without GCC's warning.)
  runtime::HostTensor gate_bias{}, up_bias{}, down_bias{};
};

/// Checks the optional biases of `w` against the MLP's sizes: gate_bias (gated kinds only) and
/// up_bias empty or [intermediate], down_bias empty or [hidden].
/// Throws: ShapeError naming the bias, its shape and the size it must have; a gate_bias on an
/// MLP without a gate.
void check_biases(const MlpWeights& w, MlpKind kind, std::int64_t hidden,
                  std::int64_t intermediate);

}  // namespace numesh::ops
