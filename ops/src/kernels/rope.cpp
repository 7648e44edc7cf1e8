#include "numesh/ops/kernels/rope.hpp"

#include <cmath>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta) {
  const std::int64_t half = d / 2;
  // Tasks over blocks of (sequence, token) rows; every pair is turned by its own angle.
  parallel_blocks(b * t, row_block_for(h * d), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t bi = r / t, ti = r % t;
      const auto position = static_cast<double>(first_position + ti);
      for (std::int64_t i = 0; i < half; ++i) {
        // Angles in double: positions times frequencies lose digits in fp32 at long contexts.
        const double freq = std::pow(static_cast<double>(theta),
                                     -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const auto c = static_cast<float>(std::cos(position * freq));
        const auto sn = static_cast<float>(std::sin(position * freq));
        for (std::int64_t hi = 0; hi < h; ++hi) {
          float* row = x + ((bi * t + ti) * h + hi) * d;
          const float x1 = row[i], x2 = row[i + half];
          row[i] = x1 * c - x2 * sn;
          row[i + half] = x2 * c + x1 * sn;
        }
      }
    }
  });
}

}  // namespace numesh::ops
