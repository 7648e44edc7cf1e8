#include "response.hpp"

#include <algorithm>

namespace numesh::serve::openai {

namespace {

using nlohmann::json;

// A completion's choice: its text, its token ids and, at the end, why it stopped.
json text_choice(const std::string& text, const std::vector<std::int32_t>& tokens,
                 const json& finish, const json& logprobs) {
  return json{{"text", text},
              {"index", 0},
              {"logprobs", logprobs},
              {"finish_reason", finish},
              {"tokens", tokens}};
}

// A chat's choice: the whole message or a chunk's delta ("message" or "delta").
json chat_choice(const char* key, json message, const json& finish, const json& logprobs) {
  return json{
      {key, std::move(message)}, {"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish}};
}

json body(const ResponseShape& s, const char* object, json choice) {
  return json{{"id", s.id},
              {"object", object},
              {"created", s.created},
              {"model", s.model},
              {"choices", json::array({std::move(choice)})}};
}

json chat_chunk(const ResponseShape& s, json delta, const json& finish,
                const json& logprobs = nullptr) {
  return body(s, "chat.completion.chunk", chat_choice("delta", std::move(delta), finish, logprobs));
}

// A token's text in a chat's logprobs: the text and its UTF-8 bytes.
json chat_token(const std::string& text, double logprob) {
  return json{
      {"token", text}, {"logprob", logprob}, {"bytes", std::vector<int>(text.begin(), text.end())}};
}

std::size_t characters(const std::string& text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

}  // namespace

json ResponseShape::logprobs(const std::vector<std::int32_t>& tokens,
                             const std::vector<models::TokenLogprobs>& scores,
                             const std::function<std::string(std::int32_t)>& text_of,
                             std::size_t offset) const {
  if (scores.empty()) return nullptr;
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (std::size_t i = 0; i < scores.size() && i < tokens.size(); ++i) {
      json entry = chat_token(text_of(tokens[i]), scores[i].logprob);
      entry["top_logprobs"] = json::array();
      for (const auto& [token, logprob] : scores[i].top) {
        entry["top_logprobs"].push_back(chat_token(text_of(token), logprob));
      }
      content.push_back(std::move(entry));
    }
    return json{{"content", std::move(content)}};
  }
  json texts = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (std::size_t i = 0; i < scores.size() && i < tokens.size(); ++i) {
    const std::string text = text_of(tokens[i]);
    texts.push_back(text);
    values.push_back(scores[i].logprob);
    // The most likely by text, and the chosen one (OpenAI lists up to logprobs + 1).
    json top = json::object();
    for (const auto& [token, logprob] : scores[i].top) top[text_of(token)] = logprob;
    top[text] = scores[i].logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += characters(text);
  }
  return json{{"tokens", std::move(texts)},
              {"token_logprobs", std::move(values)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

json ResponseShape::whole(const std::string& text, const std::vector<std::int32_t>& tokens,
                          const char* finish, const json& usage, const json& logprobs) const {
  json out = endpoint == Endpoint::kCompletions
                 ? body(*this, "text_completion", text_choice(text, tokens, finish, logprobs))
                 : body(*this, "chat.completion",
                        chat_choice("message", {{"role", "assistant"}, {"content", text}}, finish,
                                    logprobs));
  out["usage"] = usage;
  return out;
}

std::vector<json> ResponseShape::opening() const {
  if (endpoint == Endpoint::kCompletions) return {};
  return {chat_chunk(*this, {{"role", "assistant"}, {"content", ""}}, nullptr)};
}

json ResponseShape::piece(const std::string& text, const std::vector<std::int32_t>& tokens,
                          const json& logprobs) const {
  if (endpoint == Endpoint::kCompletions) {
    return body(*this, "text_completion", text_choice(text, tokens, nullptr, logprobs));
  }
  return chat_chunk(*this, {{"content", text}}, nullptr, logprobs);
}

std::vector<json> ResponseShape::closing(const std::string& text,
                                         const std::vector<std::int32_t>& tokens,
                                         const char* finish, const json& usage,
                                         const json& logprobs) const {
  std::vector<json> out;
  if (endpoint == Endpoint::kCompletions) {
    out.push_back(body(*this, "text_completion", text_choice(text, tokens, finish, logprobs)));
  } else {
    if (!text.empty() || !logprobs.is_null()) out.push_back(piece(text, tokens, logprobs));
    out.push_back(chat_chunk(*this, json::object(), finish));
  }
  out.back()["usage"] = usage;
  return out;
}

json usage(std::size_t prompt_tokens, std::size_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace numesh::serve::openai
