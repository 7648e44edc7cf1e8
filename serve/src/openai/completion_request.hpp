#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "numesh/models/engine/engine.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"

// POST /v1/completions's body, as OpenAI defines it (and llama-server's extensions top_k and
// ignore_eos), checked field by field; unknown fields are ignored, as OpenAI does.

namespace numesh::serve::openai {

/// A request that failed a check: HTTP status 400, OpenAI's error object with `param`.
struct RequestError {
  std::string message;
  std::string param;  ///< the offending field ("" when none)
};

/// A completion request, checked.
struct CompletionRequest {
  std::vector<std::int32_t> prompt;  ///< the prompt's ids (a string prompt encoded)
  models::RequestOptions options;    ///< max_tokens, stop ids (EOS unless ignore_eos), sampling
  std::vector<std::string> stop;     ///< stop strings
  bool stream = false;
};

/// Parses `body` for a model of `vocab` tokens whose end-of-sequence ids are `eos`; a string
/// prompt is encoded by `tokenizer` (with its special tokens, as llama-server does), which may be
/// null (ids only). Throws: RequestError naming the field.
CompletionRequest parse_completion(const std::string& body, const models::TextTokenizer* tokenizer,
                                   std::int64_t vocab, const std::vector<std::int64_t>& eos);

/// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_object(const std::string& message, const std::string& type,
                            const std::string& param = "");

}  // namespace numesh::serve::openai
