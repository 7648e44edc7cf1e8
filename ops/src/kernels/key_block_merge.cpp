#include "key_block_merge.hpp"

#include <Eigen/Core>
#include <cmath>
#include <limits>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops::detail {

namespace {
// Partials below this many floats are merged on the calling thread: about 128 KiB, a few
// microseconds of one core, the cost of handing tasks to the other threads and waiting for them.
constexpr std::int64_t kSerialMergeFloats = std::int64_t{1} << 15;
}  // namespace

void merge_key_blocks(const float* partials, std::int64_t batch, std::int64_t q_heads,
                      std::int64_t q_len, std::int64_t blocks, std::int64_t d, std::int64_t stride,
                      float* out) {
  using Vec = Eigen::Map<const Eigen::VectorXf>;
  // Pair i = (b * q_heads + h) * q_len + t, in the partials' order.
  const auto merge = [&](std::int64_t i) {
    const std::int64_t t = i % q_len, h = i / q_len % q_heads, b = i / q_len / q_heads;
    const float* part = partials + i * blocks * stride;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t k = 0; k < blocks; ++k) m = std::max(m, part[k * stride]);
    Eigen::Map<Eigen::VectorXf> o(out + ((b * q_len + t) * q_heads + h) * d, d);
    o.setZero();
    float sum = 0.0f;
    for (std::int64_t k = 0; k < blocks; ++k) {
      if (part[k * stride + 1] == 0.0f) continue;  // a masked block
      const float w = std::exp(part[k * stride] - m);
      sum += w * part[k * stride + 1];
      o += w * Vec(part + k * stride + 2, d);
    }
    o /= sum;
  };
  const std::int64_t pairs = batch * q_heads * q_len;
  if (pairs * blocks * stride < kSerialMergeFloats) {
    for (std::int64_t i = 0; i < pairs; ++i) merge(i);
  } else {
    for_each_task(pairs, merge);
  }
}

}  // namespace numesh::ops::detail
