#include "response.hpp"

namespace numesh::serve::openai {

namespace {

using nlohmann::json;

// A completion's choice: its text, its token ids and, at the end, why it stopped.
json text_choice(const std::string& text, const std::vector<std::int32_t>& tokens,
                 const json& finish) {
  return json{{"text", text},
              {"index", 0},
              {"logprobs", nullptr},
              {"finish_reason", finish},
              {"tokens", tokens}};
}

// A chat's choice: the whole message or a chunk's delta ("message" or "delta").
json chat_choice(const char* key, json message, const json& finish) {
  return json{
      {key, std::move(message)}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
}

json body(const ResponseShape& s, const char* object, json choice) {
  return json{{"id", s.id},
              {"object", object},
              {"created", s.created},
              {"model", s.model},
              {"choices", json::array({std::move(choice)})}};
}

json chat_chunk(const ResponseShape& s, json delta, const json& finish) {
  return body(s, "chat.completion.chunk", chat_choice("delta", std::move(delta), finish));
}

}  // namespace

json ResponseShape::whole(const std::string& text, const std::vector<std::int32_t>& tokens,
                          const char* finish, const json& usage) const {
  json out = endpoint == Endpoint::kCompletions
                 ? body(*this, "text_completion", text_choice(text, tokens, finish))
                 : body(*this, "chat.completion",
                        chat_choice("message", {{"role", "assistant"}, {"content", text}}, finish));
  out["usage"] = usage;
  return out;
}

std::vector<json> ResponseShape::opening() const {
  if (endpoint == Endpoint::kCompletions) return {};
  return {chat_chunk(*this, {{"role", "assistant"}, {"content", ""}}, nullptr)};
}

json ResponseShape::piece(const std::string& text, const std::vector<std::int32_t>& tokens) const {
  if (endpoint == Endpoint::kCompletions) {
    return body(*this, "text_completion", text_choice(text, tokens, nullptr));
  }
  return chat_chunk(*this, {{"content", text}}, nullptr);
}

std::vector<json> ResponseShape::closing(const std::string& text,
                                         const std::vector<std::int32_t>& tokens,
                                         const char* finish, const json& usage) const {
  std::vector<json> out;
  if (endpoint == Endpoint::kCompletions) {
    out.push_back(body(*this, "text_completion", text_choice(text, tokens, finish)));
  } else {
    if (!text.empty()) out.push_back(piece(text, tokens));
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
