#include "numesh/ops/kernels/rope.hpp"

#include <cmath>
#include <numbers>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

std::vector<double> rope_frequencies(std::int64_t d, double theta, const RopeScaling& scaling) {
  const std::int64_t half = d / 2;
  std::vector<double> f(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    const double base = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    double scaled = base;
    switch (scaling.kind) {
      case RopeScaling::Kind::kNone:
        break;
      case RopeScaling::Kind::kLinear:
        scaled = base / scaling.factor;
        break;
      case RopeScaling::Kind::kLlama3: {
        const double wavelength = 2.0 * std::numbers::pi / base;
        const auto context = static_cast<double>(scaling.original_max_position);
        if (wavelength > context / scaling.low_freq_factor) {
          scaled = base / scaling.factor;
        } else if (wavelength >= context / scaling.high_freq_factor) {
          // Between the bands: a blend that runs from base / factor (long waves) to base.
          const double s = (context / wavelength - scaling.low_freq_factor) /
                           (scaling.high_freq_factor - scaling.low_freq_factor);
          scaled = (1.0 - s) * base / scaling.factor + s * base;
        }
        break;
      }
      case RopeScaling::Kind::kFactors:
        scaled = base / scaling.frequency_factors[static_cast<std::size_t>(i)];
        break;
    }
    f[static_cast<std::size_t>(i)] = scaled;
  }
  return f;
}

void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta, const RopeScaling& scaling,
                  bool inverse) {
  const std::vector<double> freq = rope_frequencies(d, static_cast<double>(theta), scaling);
  rope_inplace(x, b, t, h, d, first_position, freq, inverse);
}

void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, std::span<const double> freq, bool inverse) {
  const std::int64_t half = d / 2;
  // Tasks over blocks of (sequence, token) rows; every pair is turned by its own angle.
  parallel_blocks(b * t, row_block_for(h * d), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t bi = r / t, ti = r % t;
      const auto position = static_cast<double>(first_position + ti);
      for (std::int64_t i = 0; i < half; ++i) {
        // Angles in double: positions times frequencies lose digits in fp32 at long contexts.
        const double angle = position * freq[static_cast<std::size_t>(i)];
        const auto c = static_cast<float>(std::cos(angle));
        const auto sn = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
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
