#include "numesh/ops/kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

namespace {

// out[i] = exp(in[i] - shift) for n values, every one through Eigen's vectorized exp (within
// 2 ulp; NaN stays NaN): blocks of 16 are copied into an aligned buffer, the last one padded.
// Eigen on the rows themselves would take its scalar std::exp for the elements before the first
// aligned address, so the bits of an element would depend on where the buffer lies (a resumed
// training run differed from a straight one under ASan, whose allocations lie elsewhere).
// Below ln(FLT_MIN) the result is 0 on every ISA: Eigen's vector exp clamps its argument near
// -88.4, so on AVX2 exp(-inf) came out 1.8e-39 instead of 0 (AVX-512 gave 0).
void shifted_exp(const float* in, float shift, std::int64_t n, float* out) {
  constexpr std::int64_t kLanes = 16;
  using Block = Eigen::Array<float, kLanes, 1>;  // fixed size: aligned, evaluated in whole vectors
  const float lowest = std::log(std::numeric_limits<float>::min());
  Block block;
  for (std::int64_t at = 0; at < n; at += kLanes) {
    const std::int64_t m = std::min(kLanes, n - at);
    block.setZero();
    std::copy_n(in + at, m, block.data());
    block -= shift;
    block = (block < lowest).select(Block::Zero(), block.exp());  // NaN compares false: stays NaN
    std::copy_n(block.data(), m, out + at);
  }
}

}  // namespace

void row_max(ConstMatrixMap logits, std::span<float> max) {
  parallel_blocks(logits.rows(), row_block_for(logits.cols()),
                  [&](std::int64_t r0, std::int64_t r1) {
                    for (std::int64_t r = r0; r < r1; ++r) {
                      float best = -std::numeric_limits<float>::infinity();
                      for (std::int64_t c = 0; c < logits.cols(); ++c) {
                        const float v = logits(r, c);
                        if (std::isnan(v)) {
                          best = v;
                          break;
                        }
                        best = v > best ? v : best;
                      }
                      max[static_cast<std::size_t>(r)] = best;
                    }
                  });
}

void cross_entropy_sums(ConstMatrixMap logits, std::span<const float> max,
                        std::span<const std::int32_t> targets, std::int64_t v0,
                        std::span<float> sums) {
  const std::int64_t cols = logits.cols();
  parallel_blocks(logits.rows(), row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    // The exponentials (shifted_exp) into the task's buffer, then summed in double by eight
    // interleaved partial sums (which vectorize) added in a fixed order: the scalar double exp
    // this replaces took 8 ms of a 21 M-parameter model's step.
    std::vector<float> terms(static_cast<std::size_t>(cols));
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const float top = max[i];
      shifted_exp(logits.row(r).data(), top, cols, terms.data());
      double partial[8] = {};
      const std::int64_t whole = cols / 8 * 8;
      for (std::int64_t c = 0; c < whole; c += 8) {
        for (std::int64_t j = 0; j < 8; ++j)
          partial[j] += static_cast<double>(terms[static_cast<std::size_t>(c + j)]);
      }
      for (std::int64_t c = whole; c < cols; ++c)
        partial[c - whole] += static_cast<double>(terms[static_cast<std::size_t>(c)]);
      const double total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                           ((partial[4] + partial[5]) + (partial[6] + partial[7]));
      sums[2 * i] = static_cast<float>(total);
      const std::int64_t t = targets[i] - v0;
      sums[2 * i + 1] = t >= 0 && t < cols ? logits(r, t) : 0.0f;
    }
  });
}

void cross_entropy_logit_gradient(MatrixMap logits, std::span<const float> max,
                                  std::span<const float> sums,
                                  std::span<const std::int32_t> targets, std::int64_t v0,
                                  double scale) {
  const std::int64_t cols = logits.cols();
  parallel_blocks(logits.rows(), row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const float top = max[i];
      const auto per = static_cast<float>(scale / static_cast<double>(sums[2 * i]));
      float* row = logits.row(r).data();
      shifted_exp(row, top, cols, row);
      Eigen::Map<Eigen::ArrayXf>(row, cols) *= per;
      const std::int64_t t = targets[i] - v0;
      if (t >= 0 && t < cols) logits(r, t) -= static_cast<float>(scale);
    }
  });
}

}  // namespace numesh::ops
