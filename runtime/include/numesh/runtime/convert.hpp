#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

// Bulk conversions between fp32 and the 16-bit storage types, on the calling thread, at a kernel
// level chosen at run time (runtime::kernel_level(): the widest this CPU runs). Every level gives
// the same bits as the scalar conversions of numesh/core/dtype.hpp: round to nearest even,
// subnormals kept, NaN canonical (quiet, the input's sign; f16 to f32 keeps the payload).

namespace numesh::runtime {

/// dst[i] = bf16 bits of src[i]. REQUIRES: dst.size() >= src.size(); `level` runs on this CPU.
void convert_f32_to_bf16(std::span<const float> src, std::span<std::uint16_t> dst,
                         KernelLevel level = kernel_level());
/// dst[i] = the fp32 value of bf16 bits src[i] (exact). REQUIRES: as above.
void convert_bf16_to_f32(std::span<const std::uint16_t> src, std::span<float> dst,
                         KernelLevel level = kernel_level());
/// dst[i] = f16 bits of src[i]. REQUIRES: as above.
void convert_f32_to_f16(std::span<const float> src, std::span<std::uint16_t> dst,
                        KernelLevel level = kernel_level());
/// dst[i] = the fp32 value of f16 bits src[i] (exact). REQUIRES: as above.
void convert_f16_to_f32(std::span<const std::uint16_t> src, std::span<float> dst,
                        KernelLevel level = kernel_level());

/// Writes `count` elements at `src` (stored as `from`) to `dst` as `to`, on the calling thread:
/// every format's one codec. The same format is a byte copy; otherwise the values pass through
/// fp32, which holds every element of every format exactly (bf16 and f16 widen exactly, blocks
/// dequantize as GGML does), and are stored as `to` (bf16 / f16 rounded to nearest even, blocks
/// by GGML's reference quantizers: runtime/block_formats.hpp). Neither pointer needs any
/// alignment (a safetensors or GGUF buffer's data starts where its header ends). A block
/// format's elements are whole blocks: `count` is a multiple of its block, and `src` / `dst`
/// point at a block's start.
/// Throws: ValueError naming the format when `count` is not whole blocks of `from` or `to`;
/// ValueError naming the element's index (counted from `src`) and value when a non-finite value
/// would be quantized to a block format, which cannot hold it.
void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

}  // namespace numesh::runtime
