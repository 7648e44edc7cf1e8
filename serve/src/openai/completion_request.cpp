#include "completion_request.hpp"

#include <fmt/format.h>

#include "numesh/core/error.hpp"

namespace numesh::serve::openai {

namespace {

using Json = nlohmann::ordered_json;

std::vector<std::int32_t> prompt_ids(const Json& body, const models::TextTokenizer* tokenizer,
                                     std::int64_t vocab) {
  if (!body.contains("prompt")) refuse("prompt", "'prompt' is required");
  const Json& p = body["prompt"];
  std::vector<std::int32_t> ids;
  if (p.is_string()) {
    if (tokenizer == nullptr) {
      refuse("prompt", "the model has no tokenizer: give the prompt as a list of token ids");
    }
    try {
      ids = tokenizer->encode(p.get<std::string>(), /*add_special_tokens=*/true);
    } catch (const Error& e) {
      refuse("prompt", e.what());
    }
  } else if (p.is_array() && !p.empty() && p.front().is_string()) {
    refuse("prompt", "one prompt per request: 'prompt' is a list of strings");
  } else if (p.is_array()) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      const bool id = p[i].is_number_integer() && p[i].get<std::int64_t>() >= 0 &&
                      p[i].get<std::int64_t>() < vocab;
      if (!id) {
        refuse("prompt", fmt::format("'prompt'[{}] is {}; token ids are integers in [0, {})", i,
                                     p[i].dump(), vocab));
      }
      ids.push_back(p[i].get<std::int32_t>());
    }
  } else {
    refuse("prompt",
           fmt::format("'prompt' must be a string or a list of token ids, not {}", p.dump()));
  }
  if (ids.empty()) refuse("prompt", "'prompt' is empty");
  return ids;
}

}  // namespace

CompletionRequest parse_completion(const std::string& body_text,
                                   const models::TextTokenizer* tokenizer, std::int64_t vocab,
                                   const std::vector<std::int64_t>& eos) {
  const Json body = parse_body(body_text);
  // The prompt first: a request bad in both ways is refused for its prompt.
  std::vector<std::int32_t> prompt = prompt_ids(body, tokenizer, vocab);
  return CompletionRequest{parse_generation(body, eos, "max_tokens", 16), std::move(prompt)};
}

}  // namespace numesh::serve::openai
