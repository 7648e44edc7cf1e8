#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/models/engine/engine.hpp"

// What OpenAI's completion and chat completion requests share, checked field by field: the body
// itself, how a request generates (max_tokens, n, temperature, top_p, top_k and ignore_eos, as
// llama-server extends them, seed, logprobs) and how its text comes back (stop, stream); and
// OpenAI's error object. Unknown fields are ignored, as OpenAI does.

namespace numesh::serve::openai {

/// A request that failed a check: HTTP status 400, OpenAI's error object with `param`.
struct RequestError {
  std::string message;
  std::string param;  ///< the offending field ("" when none)
};

/// Refuses a request. Throws: RequestError{message, param}, always.
[[noreturn]] void refuse(const std::string& param, const std::string& message);

/// How a request generates and how its text comes back: the fields both endpoints share.
struct GenerationRequest {
  /// max_new_tokens (0: the request gave none), stop ids (EOS unless ignore_eos), sampling, seed.
  models::RequestOptions options;
  std::vector<std::string> stop;  ///< stop strings
  bool stream = false;
};

/// Nesting depth past which parse_body() refuses a body: a chat's values reach its template,
/// whose interpreter walks them recursively.
inline constexpr int kMaxBodyDepth = 64;
/// Keys an object of a body may hold at most: an ordered object finds a key by a linear search,
/// so a 1 MiB object of short keys would cost minutes to parse.
inline constexpr std::size_t kMaxObjectKeys = 1024;

/// `text` parsed into a JSON object, its keys in the order they came (a chat's tools and
/// arguments reach its template as sent; templates write them with tojson).
/// Throws: RequestError (param "") for a body that is not JSON, not an object, nested deeper
/// than kMaxBodyDepth or holding an object of more than kMaxObjectKeys keys.
nlohmann::ordered_json parse_body(const std::string& text);

/// Reads the fields both endpoints share from `body`, a JSON object, for a model whose
/// end-of-sequence ids are `eos`: the completion's length from the field `max_tokens_field`
/// (`default_max_tokens` when absent or null), n, logprobs, temperature, top_p, top_k, seed,
/// ignore_eos, stop, stream.
/// Throws: RequestError naming the field.
GenerationRequest parse_generation(const nlohmann::ordered_json& body,
                                   const std::vector<std::int64_t>& eos,
                                   const char* max_tokens_field, std::int64_t default_max_tokens);

/// The boolean field `name` of `body`, or `fallback` when absent or null.
/// Throws: RequestError naming it when it is not a boolean.
bool boolean_field(const nlohmann::ordered_json& body, const char* name, bool fallback);

/// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_object(const std::string& message, const std::string& type,
                            const std::string& param = "");

}  // namespace numesh::serve::openai
