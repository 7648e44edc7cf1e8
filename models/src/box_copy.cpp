#include "box_copy.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::models::detail {
namespace {

// Elements converted per step when the data has to pass through scratch buffers: 12 KiB of
// scratch, well inside L1, so the extra copies cost little next to reading the mapping.
constexpr std::size_t kChunk = 2048;

bool is_aligned(const std::byte* p, std::size_t alignment) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

/// 16-bit values of `from` (kBF16 or kF16) to fp32.
void widen(DType from, std::span<const std::uint16_t> src, std::span<float> dst) {
  switch (from) {
    case DType::kBF16:
      runtime::convert_bf16_to_f32(src, dst);
      return;
    case DType::kF16:
      runtime::convert_f16_to_f32(src, dst);
      return;
    case DType::kF32:
      break;  // convert_elements copies f32 itself
  }
  throw TypeError(fmt::format("widen: {} is not a 16-bit type", to_string(from)));
}

/// fp32 to 16-bit values of `to` (kBF16 or kF16), rounding to nearest even.
void narrow(DType to, std::span<const float> src, std::span<std::uint16_t> dst) {
  switch (to) {
    case DType::kBF16:
      runtime::convert_f32_to_bf16(src, dst);
      return;
    case DType::kF16:
      runtime::convert_f32_to_f16(src, dst);
      return;
    case DType::kF32:
      break;  // convert_elements copies f32 itself
  }
  throw TypeError(fmt::format("narrow: {} is not a 16-bit type", to_string(to)));
}

}  // namespace

void convert_elements(const std::byte* src, DType from, std::byte* dst, DType to,
                      std::size_t count) {
  NUMESH_CHECK(is_element_dtype(from) && is_element_dtype(to), TypeError,
               "convert_elements: {} to {}: converts element types only", to_string(from),
               to_string(to));
  if (count == 0) return;
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  // The converters take typed pointers, which must be aligned; a safetensors buffer starts at
  // 8 + N, which the format does not make a multiple of anything, and the caller's buffer is
  // bytes. Aligned pairs are converted in place; the rest go through aligned scratch.
  if (from == DType::kF32 && is_aligned(src, alignof(float)) &&
      is_aligned(dst, alignof(std::uint16_t))) {
    narrow(to, {reinterpret_cast<const float*>(src), count},
           {reinterpret_cast<std::uint16_t*>(dst), count});
    return;
  }
  if (to == DType::kF32 && is_aligned(src, alignof(std::uint16_t)) &&
      is_aligned(dst, alignof(float))) {
    widen(from, {reinterpret_cast<const std::uint16_t*>(src), count},
          {reinterpret_cast<float*>(dst), count});
    return;
  }
  // bf16 <-> f16 always lands here: through fp32, which holds both exactly, so the one rounding
  // is to the target.
  std::array<float, kChunk> wide{};
  std::array<std::uint16_t, kChunk> half{};
  const std::size_t from_size = dtype_size(from);
  const std::size_t to_size = dtype_size(to);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(kChunk, count - done);
    const std::byte* s = src + done * from_size;
    if (from == DType::kF32) {
      std::memcpy(wide.data(), s, n * sizeof(float));
    } else {
      std::memcpy(half.data(), s, n * sizeof(std::uint16_t));
      widen(from, std::span(half).first(n), std::span(wide).first(n));
    }
    std::byte* d = dst + done * to_size;
    if (to == DType::kF32) {
      std::memcpy(d, wide.data(), n * sizeof(float));
    } else {
      narrow(to, std::span(wide).first(n), std::span(half).first(n));
      std::memcpy(d, half.data(), n * sizeof(std::uint16_t));
    }
    done += n;
  }
}

void copy_box(const std::byte* src, DType from, std::span<const std::int64_t> shape,
              std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
              std::byte* dst, DType to) {
  const std::size_t rank = shape.size();
  NUMESH_DCHECK(offsets.size() == rank && sizes.size() == rank);
  if (std::any_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s == 0; })) return;

  // The run: dims [split, rank) read as one stretch of consecutive elements. Going inwards to
  // outwards, every dim the box covers fully extends it; the first one it does not still joins
  // the run (its elements are consecutive) but ends it.
  std::size_t split = rank;
  std::size_t run = 1;
  while (split > 0) {
    --split;
    run *= static_cast<std::size_t>(sizes[split]);
    if (sizes[split] != shape[split]) break;
  }

  // Element strides of the source, and the first element of the box.
  std::vector<std::size_t> stride(rank, 1);
  for (std::size_t d = rank; d-- > 1;)
    stride[d - 1] = stride[d] * static_cast<std::size_t>(shape[d]);
  std::size_t first = 0;
  for (std::size_t d = 0; d < rank; ++d) first += static_cast<std::size_t>(offsets[d]) * stride[d];

  const std::size_t from_size = dtype_size(from);
  const std::size_t to_size = dtype_size(to);
  // An odometer over the dims outside the run, [0, split), last dim fastest.
  std::vector<std::int64_t> index(split, 0);
  std::size_t source = first;
  for (std::size_t written = 0;;) {
    convert_elements(src + source * from_size, from, dst + written * to_size, to, run);
    written += run;
    std::size_t d = split;
    while (d > 0) {
      --d;
      if (++index[d] < sizes[d]) {
        source += stride[d];
        break;
      }
      source -= static_cast<std::size_t>(index[d] - 1) * stride[d];
      index[d] = 0;
      if (d == 0) return;
    }
    if (split == 0) return;
  }
}

}  // namespace numesh::models::detail
