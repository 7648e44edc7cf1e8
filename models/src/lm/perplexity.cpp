#include "numesh/models/lm/perplexity.hpp"

#include <algorithm>
#include <cmath>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

double token_nll(const runtime::HostTensor& logits, std::int64_t row, std::int64_t next) {
  const std::int64_t v = logits.shape[1];
  const float* l = logits.data.data() + row * v;
  const double top = *std::max_element(l, l + v);
  double sum = 0.0;
  for (std::int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(l[j]) - top);
  return std::log(sum) + top - static_cast<double>(l[next]);
}

PerplexityResult perplexity(CausalLm& model, std::span<const std::int32_t> tokens,
                            std::int64_t context, std::optional<std::int32_t> bos,
                            const std::function<void(std::int64_t, double)>& progress) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  NUMESH_CHECK(context >= 4 && n >= context, ValueError,
               "perplexity: the text has {} tokens; a context of {} needs at least 4 and that many "
               "tokens (one chunk)",
               n, context);
  NUMESH_CHECK(
      model.batch() == 1 && model.max_len() >= context, ValueError,
      "perplexity: the model runs {} sequences of up to {} tokens; it needs 1 of at least {}",
      model.batch(), model.max_len(), context);
  PerplexityResult r;
  r.chunks = n / context;
  double sum = 0.0, sum_squares = 0.0;
  std::vector<std::int32_t> chunk(static_cast<std::size_t>(context));
  const std::int64_t first = context / 2;
  for (std::int64_t c = 0; c < r.chunks; ++c) {
    std::copy_n(tokens.begin() + c * context, context, chunk.begin());
    if (bos) chunk[0] = *bos;  // llama.cpp starts every chunk with BOS
    const runtime::HostTensor logits = model.logits(chunk, context, 0);
    for (std::int64_t j = first; j < context - 1; ++j) {
      const double nll = token_nll(logits, j, chunk[static_cast<std::size_t>(j + 1)]);
      sum += nll;
      sum_squares += nll * nll;
      ++r.scored;
    }
    r.running.push_back(std::exp(sum / static_cast<double>(r.scored)));
    if (progress) progress(c + 1, r.running.back());
  }
  r.mean_nll = sum / static_cast<double>(r.scored);
  r.perplexity = std::exp(r.mean_nll);
  // llama.cpp's uncertainty: the standard error of the mean NLL, carried through exp().
  const double variance = sum_squares / static_cast<double>(r.scored) - r.mean_nll * r.mean_nll;
  r.standard_error =
      r.scored > 1
          ? r.perplexity * std::sqrt(std::max(0.0, variance) / static_cast<double>(r.scored - 1))
          : 0.0;
  return r;
}

}  // namespace numesh::models
