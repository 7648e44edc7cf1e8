#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "numesh/models/lm/causal_lm.hpp"

// Perplexity of a model over a token stream, the way llama.cpp's llama-perplexity computes it:
// the stream cut into chunks of `context` tokens, each run from position 0 with its first token
// replaced by BOS (when the tokenizer adds one), and only the second half of each chunk scored, so
// that every scored token sees at least context / 2 tokens before it.

namespace numesh::models {

/// What perplexity() measured.
struct PerplexityResult {
  std::int64_t chunks = 0;      ///< chunks of `context` tokens run
  std::int64_t scored = 0;      ///< tokens whose probability was scored
  double mean_nll = 0.0;        ///< mean negative log-likelihood (natural log) per scored token
  double perplexity = 0.0;      ///< exp(mean_nll)
  double standard_error = 0.0;  ///< of the perplexity, from the NLLs' spread (llama.cpp's ±)
  std::vector<double> running;  ///< the perplexity after each chunk
};

/// Runs `tokens` through `model` (batch 1, max_len >= context) in floor(n / context) chunks
/// and scores, in each, token j + 1 from the logits at j for j in [context / 2, context - 1),
/// in double (log-softmax of the fp32 logits). `progress`, when given, is called after each
/// chunk with its index (from 1) and the running perplexity.
/// Throws: ValueError when context < 4 or the stream is shorter than one chunk (naming both),
/// or the model's batch is not 1 or its max_len < context; what the model throws.
PerplexityResult perplexity(CausalLm& model, std::span<const std::int32_t> tokens,
                            std::int64_t context, std::optional<std::int32_t> bos,
                            const std::function<void(std::int64_t, double)>& progress = {});

/// The negative log-likelihood of `next` under logits row `row` of `logits` [rows, V], in double.
double token_nll(const runtime::HostTensor& logits, std::int64_t row, std::int64_t next);

}  // namespace numesh::models
