#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/models/engine/engine.hpp"

// The responses of POST /v1/completions and POST /v1/chat/completions, whole and as the chunks
// of a stream, in OpenAI's shapes (text_completion; chat.completion and chat.completion.chunk).
// One place knows both shapes, so the server's machinery (waiting for the tokens, streaming
// them, cancelling) serves both endpoints.

namespace numesh::serve::openai {

/// Which endpoint a response answers.
enum class Endpoint { kCompletions, kChatCompletions };

/// What every response and chunk of one request repeats, and how its endpoint shapes them.
/// A value; its methods are const (a stream's chunks may be made on any thread).
struct ResponseShape {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;            ///< "cmpl-N" or "chatcmpl-N", the same in every chunk
  std::string model;         ///< the model's name
  std::int64_t created = 0;  ///< Unix seconds

  /// A choice's `logprobs` for `tokens` and their `scores` (one each; null when the request
  /// asked for none): a completion's {tokens, token_logprobs, top_logprobs (the most likely and
  /// the chosen one, by text), text_offset (from `offset`, in characters)}, a chat's {content:
  /// [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. `text_of` gives a
  /// token's text.
  [[nodiscard]] nlohmann::json logprobs(const std::vector<std::int32_t>& tokens,
                                        const std::vector<models::TokenLogprobs>& scores,
                                        const std::function<std::string(std::int32_t)>& text_of,
                                        std::size_t offset) const;
  /// The whole response: the completion's `text`, its `tokens` (a completion's choice carries
  /// them, an extension as llama-server's "tokens"; a chat's message does not), `finish`
  /// ("stop" or "length"), `usage` and the choice's `logprobs` (null: none asked for).
  [[nodiscard]] nlohmann::json whole(const std::string& text,
                                     const std::vector<std::int32_t>& tokens, const char* finish,
                                     const nlohmann::json& usage,
                                     const nlohmann::json& logprobs = nullptr) const;
  /// The chunks a stream opens with: a chat's announces the role (delta {"role": "assistant",
  /// "content": ""}); a completion's none.
  [[nodiscard]] std::vector<nlohmann::json> opening() const;
  /// The chunk of a piece of text and of the tokens generated since the last chunk, with their
  /// `logprobs` (null: none asked for).
  [[nodiscard]] nlohmann::json piece(const std::string& text,
                                     const std::vector<std::int32_t>& tokens,
                                     const nlohmann::json& logprobs = nullptr) const;
  /// The chunks a stream closes with, before `data: [DONE]`: the last piece, `finish` and
  /// `usage`; a completion's in one chunk, a chat's as a piece (when there is text) and a chunk
  /// of an empty delta with the finish reason.
  [[nodiscard]] std::vector<nlohmann::json> closing(const std::string& text,
                                                    const std::vector<std::int32_t>& tokens,
                                                    const char* finish, const nlohmann::json& usage,
                                                    const nlohmann::json& logprobs = nullptr) const;
};

/// OpenAI's usage object: prompt, completion and total tokens.
nlohmann::json usage(std::size_t prompt_tokens, std::size_t completion_tokens);

}  // namespace numesh::serve::openai
