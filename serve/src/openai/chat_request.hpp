#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/models/chat/chat_template.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "request_fields.hpp"

// POST /v1/chat/completions's body, as OpenAI defines it (messages, tools, max_completion_tokens
// or max_tokens, and the fields completions share), with vLLM's and llama-server's extensions
// chat_template_kwargs, add_generation_prompt, top_k and ignore_eos; and the prompt a chat
// template makes of it. The server never formats a conversation itself: the model's template
// (or --chat-template's) decides everything, content parts and tool calls included.

namespace numesh::serve::openai {

/// A chat completion request, checked.
struct ChatRequest : GenerationRequest {
  /// What the template renders, in this order: `messages` (as sent, but for tool calls'
  /// `arguments` given as a JSON string, which become the object they hold, as vLLM does),
  /// `tools` (null when absent, as transformers passes None), `add_generation_prompt` (default
  /// true), then the entries of `chat_template_kwargs` (which may replace the last two).
  nlohmann::ordered_json variables;
};

/// Parses `body` for a model whose end-of-sequence ids are `eos`. The completion's length is
/// max_completion_tokens, else max_tokens; options.max_new_tokens is 0 when neither is given
/// (the server then gives the rest of the context: default_max_tokens()).
/// Throws: RequestError naming the field ("messages[2].content" for a message's).
ChatRequest parse_chat(const std::string& body, const std::vector<std::int64_t>& eos);

/// How a server renders chats: its template, or why it has none.
struct ChatSetup {
  /// The template chats are rendered with; null when there is none (chats are refused).
  const models::ChatTemplate* chat_template = nullptr;
  /// Why chats are refused when chat_template is null: the model has no template, or its
  /// template did not parse (with its error); both say how to give one.
  std::string unavailable;
  /// Variables beneath every chat's: the model's special tokens (bos_token, eos_token...).
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

/// The chat setup of the model opened as `source` (which must outlive it); `override`
/// (--chat-template's, which must outlive it too; may be null) takes the place of the model's
/// template. The special tokens are those of the model's tokenizer_config.json when its
/// template came from there, else the texts of config.json's BOS and EOS ids (llama-server's
/// rule for a template of its own).
ChatSetup chat_setup(const models::ModelSource& source, const models::ChatTemplate* override);

/// The prompt of `request`: `setup`'s template rendered over its special tokens and the
/// request's variables, encoded by `tokenizer` without adding special tokens (the template
/// writes BOS itself, as transformers' apply_chat_template does with tokenize=True).
/// Throws: RequestError without a template (setup.unavailable), for an error while rendering
/// (the template's raise_exception among them: its message names the template and the line),
/// and for an empty prompt.
std::vector<std::int32_t> chat_prompt(const ChatSetup& setup, const ChatRequest& request,
                                      const models::TextTokenizer& tokenizer);

/// The completion's length of a chat that gives none: what is left of `positions` (the
/// positions a request may take: the context, and the whole cache) after `prompt_tokens`, as
/// vLLM's default; at least 1, so that a prompt past them is refused as a completion's is.
std::int64_t default_max_tokens(std::int64_t positions, std::size_t prompt_tokens);

}  // namespace numesh::serve::openai
