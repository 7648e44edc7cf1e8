#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "numesh/core/check.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::runtime {

namespace {

// Elements converted per step through the scratch buffers: whole blocks of every format, 8 KiB
// of fp32, well inside L1 beside the blocks and 16-bit values.
constexpr std::size_t kConvertChunk = 2048;
static_assert(whole_blocks_of_every_format(kConvertChunk));

// Bytes of the blocks of one chunk in the format that takes the most.
constexpr std::size_t block_scratch_bytes() {
  std::size_t most = 0;
  for (const DTypeTraits& f : kDTypes) {
    most = std::max(most, kConvertChunk / static_cast<std::size_t>(f.block_elements) *
                              static_cast<std::size_t>(f.block_bytes));
  }
  return most;
}

bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// Scratch of one chunk in every shape a format needs, aligned for the typed codecs.
struct ConvertScratch {
  std::array<float, kConvertChunk> wide;
  std::array<std::uint16_t, kConvertChunk> half;
  alignas(16) std::array<std::byte, block_scratch_bytes()> blocks;
};

// n elements at `src` (stored as `from`, unaligned) into s.wide.
void widen_chunk(const std::byte* src, DType from, std::size_t n, ConvertScratch& s) {
  const std::span<float> out(s.wide.data(), n);
  if (!is_element_dtype(from)) {
    std::memcpy(s.blocks.data(), src,
                static_cast<std::size_t>(row_bytes(from, static_cast<std::int64_t>(n))));
    runtime::block_codec(from).dequantize(s.blocks.data(), out);
    return;
  }
  switch (element_type(from)) {
    case ElementType::kF32:
      std::memcpy(s.wide.data(), src, n * sizeof(float));
      return;
    case ElementType::kBF16:
      std::memcpy(s.half.data(), src, n * sizeof(std::uint16_t));
      convert_bf16_to_f32({s.half.data(), n}, out);
      return;
    case ElementType::kF16:
      std::memcpy(s.half.data(), src, n * sizeof(std::uint16_t));
      convert_f16_to_f32({s.half.data(), n}, out);
      return;
  }
}

// s.wide's first n values stored as `to` at `dst` (unaligned). `first`: the index of s.wide[0]
// among the caller's elements, for the message naming a value a block cannot hold.
void narrow_chunk(ConvertScratch& s, std::size_t n, std::byte* dst, DType to, std::size_t first) {
  const std::span<const float> in(s.wide.data(), n);
  if (!is_element_dtype(to)) {
    for (std::size_t i = 0; i < n; ++i) {
      NUMESH_CHECK(std::isfinite(in[i]), ValueError, "{}: element {} is {}, which it cannot hold",
                   to_string(to), first + i, in[i]);
    }
    runtime::block_codec(to).quantize(in, s.blocks.data());
    std::memcpy(dst, s.blocks.data(),
                static_cast<std::size_t>(row_bytes(to, static_cast<std::int64_t>(n))));
    return;
  }
  switch (element_type(to)) {
    case ElementType::kF32:
      std::memcpy(dst, s.wide.data(), n * sizeof(float));
      return;
    case ElementType::kBF16:
      convert_f32_to_bf16(in, {s.half.data(), n});
      std::memcpy(dst, s.half.data(), n * sizeof(std::uint16_t));
      return;
    case ElementType::kF16:
      convert_f32_to_f16(in, {s.half.data(), n});
      std::memcpy(dst, s.half.data(), n * sizeof(std::uint16_t));
      return;
  }
}

}  // namespace

void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count) {
  const auto elements = static_cast<std::int64_t>(count);
  // row_bytes refuses a count that is not whole blocks, naming the format.
  const auto src_bytes = static_cast<std::size_t>(row_bytes(from, elements));
  (void)row_bytes(to, elements);
  if (count == 0) return;
  if (from == to) {
    std::memcpy(dst, src, src_bytes);
    return;
  }
  // Aligned fp32 <-> 16-bit pairs convert in place (the checkpoint reader's common case).
  const bool f32_to_16 = from == DType::kF32 && (to == DType::kBF16 || to == DType::kF16);
  const bool f16_to_32 = to == DType::kF32 && (from == DType::kBF16 || from == DType::kF16);
  if (f32_to_16 && is_aligned(src, alignof(float)) && is_aligned(dst, alignof(std::uint16_t))) {
    const std::span<const float> in(static_cast<const float*>(src), count);
    const std::span<std::uint16_t> out(static_cast<std::uint16_t*>(dst), count);
    if (to == DType::kBF16) {
      convert_f32_to_bf16(in, out);
    } else {
      convert_f32_to_f16(in, out);
    }
    return;
  }
  if (f16_to_32 && is_aligned(src, alignof(std::uint16_t)) && is_aligned(dst, alignof(float))) {
    const std::span<const std::uint16_t> in(static_cast<const std::uint16_t*>(src), count);
    const std::span<float> out(static_cast<float*>(dst), count);
    if (from == DType::kBF16) {
      convert_bf16_to_f32(in, out);
    } else {
      convert_f16_to_f32(in, out);
    }
    return;
  }
  // Everything else chunk by chunk through fp32 (one rounding, to the target).
  ConvertScratch scratch;
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(kConvertChunk, count - done);
    const auto at = static_cast<std::int64_t>(done);
    widen_chunk(s + row_bytes(from, at), from, n, scratch);
    narrow_chunk(scratch, n, d + row_bytes(to, at), to, done);
    done += n;
  }
}

}  // namespace numesh::runtime
