#include "hidden_steps.hpp"

#include <algorithm>
#include <random>

namespace numesh::tools {

runtime::HostTensor random_tokens(std::int64_t batch, std::int64_t tokens, std::int64_t hidden,
                                  std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  runtime::HostTensor t = runtime::HostTensor::zeros({batch, tokens, hidden});
  for (float& v : t.data) v = normal(rng);
  return t;
}

runtime::HostTensor last_token(const runtime::HostTensor& y) {
  const std::int64_t b = y.shape[0], t = y.shape[1], h = y.shape[2];
  runtime::HostTensor x = runtime::HostTensor::zeros({b, 1, h});
  for (std::int64_t bi = 0; bi < b; ++bi) {
    std::copy_n(y.data.begin() + ((bi * t) + t - 1) * h, h, x.data.begin() + bi * h);
  }
  return x;
}

}  // namespace numesh::tools
