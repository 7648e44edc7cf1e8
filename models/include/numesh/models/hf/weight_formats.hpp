#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/checkpoint.hpp"

// Which format each large matrix of a model is stored in on the devices when it is loaded: one
// format for all of them (a front end's --dtype), or each as its checkpoint stores it, so that a
// GGUF file's mixed formats are kept as the file has them (a Q4_K_M file stores some attn_v and
// ffn_down matrices as Q6_K among Q4_K ones, and its output as Q6_K).

namespace numesh::models {

/// The format of each large matrix of a load (CausalLmWeights::load, CausalLm::load). Norms,
/// biases and routers are not matrices in this sense: they stay f32 whatever this says.
class WeightFormats {
 public:
  /// Every matrix as `dtype`. Implicit: one format is what most loads ask for.
  WeightFormats(DType dtype = DType::kF32) noexcept : fallback_(dtype) {}  // NOLINT

  /// Each matrix in the format `checkpoint` stores its tensor in (Checkpoint::stored_format:
  /// its bytes copied as they are); a tensor in a type numesh does not keep weights in, or a
  /// matrix whose tensors differ in format (experts stored one tensor each), as `fallback`.
  [[nodiscard]] static WeightFormats as_stored(const Checkpoint& checkpoint,
                                               DType fallback = DType::kF32);

  /// The format of the matrix read from `tensors` (one tensor, or one per expert of a stacked
  /// matrix): their common stored format (as_stored()), else the one format.
  [[nodiscard]] DType of(std::span<const std::string> tensors) const;
  /// Whether every matrix takes one format (a WeightFormats made from a DType).
  [[nodiscard]] bool uniform() const noexcept { return stored_.empty(); }

 private:
  DType fallback_;
  std::map<std::string, DType, std::less<>> stored_;  // tensor -> format (as_stored() only)
  // as_stored(): the bytes of the checkpoint's matrices (rank 2 or more) by format.
  std::map<DType, std::uint64_t> matrix_bytes_;

  friend std::string to_string(const WeightFormats& formats);
};

/// The one format's name ("q8_0"), or, as stored, each format the checkpoint's matrices are
/// in, most bytes first, joined by '+' ("q4_k+q6_k+f32": a Q4_K_M file with f32 routers).
[[nodiscard]] std::string to_string(const WeightFormats& formats);

}  // namespace numesh::models
