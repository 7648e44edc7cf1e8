#pragma once

// PRIVATE to ops/src/kernels: the element type a KV cache stores its keys and values in (fp32,
// or the bits of bf16 / f16), for the attention kernels that read it through KvView and
// PagedKvView: one dispatch on the view's dtype, then row pointers of the stored type.

#include <fmt/format.h>

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/key_block.hpp"

namespace numesh::ops::detail {

/// Calls f.template operator()<T>() with T the stored element type of `dtype`: float for kF32,
/// std::uint16_t for kBF16 and kF16. Throws: TypeError for any other dtype.
template <class F>
decltype(auto) with_kv_element(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f.template operator()<float>();
    case DType::kBF16:
    case DType::kF16:
      return f.template operator()<std::uint16_t>();
    default:
      throw TypeError(fmt::format(
          "attention: keys and values stored as {}: expected f32, bf16 or f16", to_string(dtype)));
  }
}

/// attend_key_block_heads over rows of either stored type (`dtype` names the 16-bit one).
inline void attend_rows(const float* q, std::int64_t q_stride, std::int64_t heads,
                        const float* const* keys, const float* const* values, DType /*dtype*/,
                        std::int64_t count, std::int64_t d, float scale, float* scores, float* o,
                        std::int64_t o_stride, KeyBlockStats* stats, runtime::KernelLevel level) {
  attend_key_block_heads(q, q_stride, heads, keys, values, count, d, scale, scores, o, o_stride,
                         stats, level);
}
inline void attend_rows(const float* q, std::int64_t q_stride, std::int64_t heads,
                        const std::uint16_t* const* keys, const std::uint16_t* const* values,
                        DType dtype, std::int64_t count, std::int64_t d, float scale, float* scores,
                        float* o, std::int64_t o_stride, KeyBlockStats* stats,
                        runtime::KernelLevel level) {
  attend_key_block_heads(q, q_stride, heads, keys, values, dtype, count, d, scale, scores, o,
                         o_stride, stats, level);
}

}  // namespace numesh::ops::detail
