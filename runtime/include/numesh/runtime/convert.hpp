#pragma once

#include <cstdint>
#include <span>

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

}  // namespace numesh::runtime
