#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

// RoPE frequency scaling: how a model stretches its rotary position embedding past the context
// it was trained on (Hugging Face's `rope_scaling` in config.json). Part of AttentionConfig; the
// RoPE kernel and the float64 references each apply it with code of their own.

namespace numesh::ops {

/// The frequency scaling of rotate-half RoPE. The unscaled frequencies are
/// f_i = theta^(-2i / head_dim), i < head_dim / 2, and token p turns pair i by p * f_i.
struct RopeScaling {
  enum class Kind : std::uint8_t {
    kNone,     ///< f_i as they are
    kLinear,   ///< every f_i / factor (positions interpolated; Hugging Face "linear")
    kLlama3,   ///< Llama 3.1's band scaling (Hugging Face "llama3"), below
    kFactors,  ///< f_i / frequency_factors[i]: GGUF's rope_freqs (llama.cpp stores Llama 3.1's
               ///< scaling so, one divisor per pair, computed by its converter)
  };
  Kind kind = Kind::kNone;
  /// linear: the divisor of every frequency; llama3: of the low frequencies. Positive.
  double factor = 1.0;
  /// llama3: with wavelength w_i = 2 pi / f_i and L = original_max_position, frequencies with
  /// w_i < L / high_freq_factor are kept, those with w_i > L / low_freq_factor are divided by
  /// factor, and those between blend the two: (1 - s) f_i / factor + s f_i with
  /// s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
  /// REQUIRES (llama3): 0 < low_freq_factor < high_freq_factor.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  /// llama3: the context length the model was trained on (`original_max_position_embeddings`).
  std::int64_t original_max_position = 8192;

  /// kFactors: one positive divisor per pair (head_dim / 2 of them).
  std::vector<double> frequency_factors{};

  /// Every frequency divided by `factor`.
  static RopeScaling linear(double factor) {
    RopeScaling s;
    s.kind = Kind::kLinear;
    s.factor = factor;
    return s;
  }
  /// Llama 3.1's scaling (its published values: 8, 1, 4, 8192).
  static RopeScaling llama3(double factor, double low_freq_factor, double high_freq_factor,
                            std::int64_t original_max_position) {
    RopeScaling s;
    s.kind = Kind::kLlama3;
    s.factor = factor;
    s.low_freq_factor = low_freq_factor;
    s.high_freq_factor = high_freq_factor;
    s.original_max_position = original_max_position;
    return s;
  }
};

/// Frequency i divided by `divisors[i]` (GGUF's rope_freqs).
inline RopeScaling rope_frequency_factors(std::vector<double> divisors) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::kFactors;
  s.frequency_factors = std::move(divisors);
  return s;
}

/// The llama3 scaling whose divisors per pair (the unscaled frequency over the scaled one, as
/// GGUF's rope_freqs holds them, in f32) are `divisors`, for head_dim `d` and `theta`: Llama
/// 3.1's scaling read back from llama.cpp's form, for a config.json. The divisors fix the
/// factor and original_max_position over each band factor, not the three alone, so the answer
/// takes low_freq_factor 1 (Llama 3.1's own), and its frequencies are within 1e-5 of the
/// divisors' (f32's rounding aside, the same). A band of one blended pair leaves its edges
/// open: it is read with Llama 3.1's high_freq_factor / low_freq_factor of 4. nullopt when no
/// llama3 scaling (of that ratio, for one pair) gives them, or no pair is blended.
std::optional<RopeScaling> llama3_of_divisors(std::span<const double> divisors, std::int64_t d,
                                              double theta);

/// "none", "linear", "llama3" (the names of Hugging Face's `rope_type`), "factors".
std::string_view to_string(RopeScaling::Kind kind) noexcept;

/// Checks the fields `kind` uses.
/// Throws: ValueError naming the field and its value (factor <= 0 or not finite; for llama3
/// also low_freq_factor <= 0, low_freq_factor >= high_freq_factor, original_max_position <= 0;
/// for factors none given, or one not finite and positive).
void validate(const RopeScaling& scaling);

}  // namespace numesh::ops
