#include <array>
#include <cmath>
#include <cstring>

#include "numesh/core/check.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::runtime {

namespace {

// Elements converted per step through the scratch buffers: a multiple of every block, 8 KiB of
// fp32, well inside L1 beside the blocks and 16-bit values.
constexpr std::size_t kConvertChunk = 2048;
static_assert(kConvertChunk % static_cast<std::size_t>(kQ8_0BlockElements) == 0 &&
              kConvertChunk % static_cast<std::size_t>(kQ4_0BlockElements) == 0 &&
              kConvertChunk % static_cast<std::size_t>(kQ4_KBlockElements) == 0 &&
              kConvertChunk % static_cast<std::size_t>(kQ6_KBlockElements) == 0);

bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// Scratch of one chunk in every shape a format needs, aligned for the typed codecs.
struct ConvertScratch {
  std::array<float, kConvertChunk> wide;
  std::array<std::uint16_t, kConvertChunk> half;
  std::array<BlockQ8_0, kConvertChunk / 32> q8_0;
  std::array<BlockQ4_0, kConvertChunk / 32> q4_0;
  std::array<BlockQ4_K, kConvertChunk / 256> q4_k;
  std::array<BlockQ6_K, kConvertChunk / 256> q6_k;
};

// n elements at `src` (stored as `from`, unaligned) into s.wide.
void widen_chunk(const std::byte* src, DType from, std::size_t n, ConvertScratch& s) {
  const std::span<float> out(s.wide.data(), n);
  switch (from) {
    case DType::kF32:
      std::memcpy(s.wide.data(), src, n * sizeof(float));
      return;
    case DType::kBF16:
      std::memcpy(s.half.data(), src, n * sizeof(std::uint16_t));
      convert_bf16_to_f32({s.half.data(), n}, out);
      return;
    case DType::kF16:
      std::memcpy(s.half.data(), src, n * sizeof(std::uint16_t));
      convert_f16_to_f32({s.half.data(), n}, out);
      return;
    case DType::kQ8_0:
      std::memcpy(s.q8_0.data(), src, n / 32 * sizeof(BlockQ8_0));
      dequantize_q8_0({s.q8_0.data(), n / 32}, out);
      return;
    case DType::kQ4_0:
      std::memcpy(s.q4_0.data(), src, n / 32 * sizeof(BlockQ4_0));
      dequantize_q4_0({s.q4_0.data(), n / 32}, out);
      return;
    case DType::kQ4_K:
      std::memcpy(s.q4_k.data(), src, n / 256 * sizeof(BlockQ4_K));
      dequantize_q4_k({s.q4_k.data(), n / 256}, out);
      return;
    case DType::kQ6_K:
      std::memcpy(s.q6_k.data(), src, n / 256 * sizeof(BlockQ6_K));
      dequantize_q6_k({s.q6_k.data(), n / 256}, out);
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
  }
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, s.wide.data(), n * sizeof(float));
      return;
    case DType::kBF16:
      convert_f32_to_bf16(in, {s.half.data(), n});
      std::memcpy(dst, s.half.data(), n * sizeof(std::uint16_t));
      return;
    case DType::kF16:
      convert_f32_to_f16(in, {s.half.data(), n});
      std::memcpy(dst, s.half.data(), n * sizeof(std::uint16_t));
      return;
    case DType::kQ8_0:
      quantize_q8_0(in, {s.q8_0.data(), n / 32});
      std::memcpy(dst, s.q8_0.data(), n / 32 * sizeof(BlockQ8_0));
      return;
    case DType::kQ4_0:
      quantize_q4_0(in, {s.q4_0.data(), n / 32});
      std::memcpy(dst, s.q4_0.data(), n / 32 * sizeof(BlockQ4_0));
      return;
    case DType::kQ4_K:
      quantize_q4_k(in, {s.q4_k.data(), n / 256});
      std::memcpy(dst, s.q4_k.data(), n / 256 * sizeof(BlockQ4_K));
      return;
    case DType::kQ6_K:
      quantize_q6_k(in, {s.q6_k.data(), n / 256});
      std::memcpy(dst, s.q6_k.data(), n / 256 * sizeof(BlockQ6_K));
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
