#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "numesh/core/option_text.hpp"
#include "numesh/ops/rope_scaling.hpp"
#include "numesh/runtime/tensor.hpp"

// What an attention layer is, independent of how it runs: its shape, its weights, the KV cache
// layouts and its arithmetic cost. The references, the kernels and the lowering depend on this.

namespace numesh::ops {

/// Shape of an attention computation. Layout bthd: q is [B, T, num_heads, head_dim], k and v
/// are [B, S, num_kv_heads, head_dim] (S keys, T queries).
struct AttentionConfig {
  /// Query heads.
  std::int64_t num_heads = 1;
  /// Key/value heads; must divide num_heads (GQA: query head h uses kv head
  /// h / (num_heads / num_kv_heads); MHA when equal).
  std::int64_t num_kv_heads = 1;
  /// Per-head dim; even when RoPE is applied.
  std::int64_t head_dim = 1;
  /// Causal mask: query t (at absolute position q_offset + t) sees keys 0..q_offset + t.
  bool causal = true;
  /// Absolute position of the first query: 0 for prefill/train, the cache length when decoding
  /// new tokens against a KV cache.
  std::int64_t q_offset = 0;
  /// Rotary position embedding applied to q (positions q_offset + t) and k (positions s),
  /// rotate-half form (LLaMA, Hugging Face): pairs (i, i + head_dim / 2), frequency
  /// theta^(-2i / head_dim). 0 disables RoPE.
  float rope_theta = 10000.0f;
  /// How those frequencies are scaled (Llama 3.1's llama3, linear, or not at all). The braces
  /// let designated initializers of AttentionConfig leave it out without GCC's
  /// missing-initializer warning.
  RopeScaling rope_scaling{};
  /// eps of the per-head RMSNorm of q and k (AttentionWeights::q_norm, k_norm; Qwen3).
  float qk_norm_eps = 1e-6f;
};

/// The format each projection of an attention layer is stored in on the devices (as
/// MlpFormats: a GGUF Q4_K_M file keeps some wv as Q6_K among Q4_K ones).
struct AttentionFormats {
  DType wq = DType::kF32;
  DType wk = DType::kF32;
  DType wv = DType::kF32;
  DType wo = DType::kF32;

  /// Every projection as `dtype`.
  static constexpr AttentionFormats all(DType dtype) noexcept {
    return {dtype, dtype, dtype, dtype};
  }
  /// Whether every projection is stored as `dtype`.
  [[nodiscard]] constexpr bool all_are(DType dtype) const noexcept { return *this == all(dtype); }
  friend constexpr bool operator==(const AttentionFormats&, const AttentionFormats&) = default;
};

/// "q4_k" when every projection has that format, else each by name ("wq q4_k, wk q4_k, wv
/// q6_k, wo q4_k").
std::string to_string(const AttentionFormats& formats);

/// The weights of an attention layer (head-major columns: head h owns columns
/// [h * head_dim, (h + 1) * head_dim)).
struct AttentionWeights {
  runtime::HostTensor wq;  ///< [H, num_heads * head_dim]
  runtime::HostTensor wk;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wv;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wo;  ///< [num_heads * head_dim, H]
  /// The formats the layer stores the projections in (as MlpWeights::stored_as).
  AttentionFormats stored_as{};
  /// Biases added to the projections (Qwen2's q, k, v; Llama's attention_bias): [num_heads *
  /// head_dim], [num_kv_heads * head_dim] twice, [H]. Empty (no shape): no bias. Kept in fp32.
  /// (Last, with braces: designated initializers may leave them out without GCC warning.)
  runtime::HostTensor bq{}, bk{}, bv{}, bo{};
  /// RMSNorm weights [head_dim] applied to every head of q and of k after the projections and
  /// before RoPE (Qwen3), with AttentionConfig::qk_norm_eps. Empty: none. Kept in fp32.
  runtime::HostTensor q_norm{}, k_norm{};
};

/// Checks the optional biases and q/k norms of `w` against `c` and the hidden size: each is
/// empty or a vector of its size (bq [num_heads * head_dim], bk and bv [num_kv_heads *
/// head_dim], bo [hidden], q_norm and k_norm [head_dim]).
/// Throws: ShapeError naming the tensor, its shape and the size it must have.
void check_biases_and_norms(const AttentionWeights& w, const AttentionConfig& c,
                            std::int64_t hidden);

/// Memory layout of a KV cache (EasyDeL's attention layouts).
enum class KvLayout : std::uint8_t {
  kBTHD,  ///< [batch, position, kv_heads, head_dim]: one token's heads together
  kBHTD,  ///< [batch, kv_heads, position, head_dim]: one head's positions together
};

/// "bthd" or "bhtd".
inline std::string_view to_string(KvLayout layout) noexcept {
  return layout == KvLayout::kBTHD ? "bthd" : "bhtd";
}

/// Parses a front end's KV layout option: bthd or bhtd. Throws: ValueError naming the option as
/// `style` does ("--kv-layout 'x': expected bthd or bhtd").
KvLayout parse_kv_layout(std::string_view text, OptionStyle style);

/// FLOPs of one attention layer run over `batch` sequences of `q_len` new tokens whose first
/// sits at `position` (causal: token t attends to position + t + 1 keys): the four
/// projections plus QK^T and PV, multiply-add = 2.
inline double attention_flops(const AttentionConfig& c, std::int64_t hidden, std::int64_t batch,
                              std::int64_t q_len, std::int64_t position) noexcept {
  const auto rows = static_cast<double>(batch * q_len);
  const auto d = static_cast<double>(c.head_dim);
  const double projections = 2.0 * rows * static_cast<double>(hidden) * d *
                             static_cast<double>(2 * c.num_heads + 2 * c.num_kv_heads);
  // Keys seen, summed over the new tokens: (position + 1) + ... + (position + q_len).
  const double keys = static_cast<double>(q_len) * static_cast<double>(position) +
                      static_cast<double>(q_len) * static_cast<double>(q_len + 1) / 2.0;
  return projections +
         2.0 * 2.0 * static_cast<double>(batch) * keys * static_cast<double>(c.num_heads) * d;
}

}  // namespace numesh::ops
