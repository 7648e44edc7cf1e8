#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "request_fields.hpp"

// POST /v1/completions's body, as OpenAI defines it (and llama-server's extensions top_k and
// ignore_eos), checked field by field; unknown fields are ignored, as OpenAI does.

namespace numesh::serve::openai {

/// A completion request, checked: its prompt, how it generates and how its text comes back.
struct CompletionRequest : GenerationRequest {
  std::vector<std::int32_t> prompt;  ///< the prompt's ids (a string prompt encoded)
};

/// Parses `body` for a model of `vocab` tokens whose end-of-sequence ids are `eos`; a string
/// prompt is encoded by `tokenizer` (with its special tokens, as llama-server does), which may be
/// null (ids only). max_tokens defaults to 16, as OpenAI's does.
/// Throws: RequestError naming the field.
CompletionRequest parse_completion(const std::string& body, const models::TextTokenizer* tokenizer,
                                   std::int64_t vocab, const std::vector<std::int64_t>& eos);

}  // namespace numesh::serve::openai
