#include "chat_request.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "numesh/core/error.hpp"

namespace numesh::serve::openai {

namespace {

using Json = nlohmann::ordered_json;

// A content part the template receives as it is: {"type": "text", "text": ...}. The models
// numesh serves read text only, so a part of any other type (an image) is refused here rather
// than dropped by a template that does not know it.
void check_part(const Json& part, const std::string& at, std::size_t j) {
  if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
    refuse(at, fmt::format("'{}'[{}] must be an object with a 'type'", at, j));
  }
  const std::string type = part["type"].get<std::string>();
  if (type != "text") {
    refuse(at, fmt::format("'{}'[{}] is a part of type '{}'; the model reads text parts only", at,
                           j, type));
  }
  if (!part.contains("text") || !part["text"].is_string()) {
    refuse(at, fmt::format("'{}'[{}] is a text part without a string 'text'", at, j));
  }
}

// A message's content: a string, a list of text parts, or none (null or absent) for an
// assistant's turn that calls tools, as OpenAI allows.
void check_content(const Json& message, std::size_t i) {
  const std::string at = fmt::format("messages[{}].content", i);
  const bool calls_tools = message["role"] == "assistant" && message.contains("tool_calls") &&
                           message["tool_calls"].is_array() && !message["tool_calls"].empty();
  if (!message.contains("content") || message["content"].is_null()) {
    if (calls_tools) return;
    refuse(at, fmt::format("'{}' is required (only an assistant's message with tool_calls may "
                           "have none)",
                           at));
  }
  const Json& content = message["content"];
  if (content.is_array()) {
    for (std::size_t j = 0; j < content.size(); ++j) check_part(content[j], at, j);
  } else if (!content.is_string()) {
    refuse(at, fmt::format("'{}' must be a string or a list of text parts, not {}", at,
                           content.type_name()));
  }
}

// OpenAI sends a tool call's arguments as a JSON string; templates (Llama 3.1's, Qwen's) write
// them with tojson and expect the object, which transformers' callers pass: the string becomes
// the object it holds, as vLLM does. A string that holds no object stays as it is.
void parse_arguments(Json& message) {
  if (message["role"] != "assistant" || !message.contains("tool_calls") ||
      !message["tool_calls"].is_array()) {
    return;
  }
  for (Json& call : message["tool_calls"]) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
    Json& function = call["function"];
    if (!function.contains("arguments") || !function["arguments"].is_string()) continue;
    try {
      Json parsed = parse_body(function["arguments"].get<std::string>());
      if (parsed.is_object()) function["arguments"] = std::move(parsed);
    } catch (const RequestError&) {
    }
  }
}

Json messages(Json& body) {
  if (!body.contains("messages")) refuse("messages", "'messages' is required");
  Json& list = body["messages"];
  if (!list.is_array() || list.empty()) {
    refuse("messages", "'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    Json& m = list[i];
    if (!m.is_object()) {
      refuse(fmt::format("messages[{}]", i),
             fmt::format("'messages[{}]' must be an object, not {}", i, m.type_name()));
    }
    if (!m.contains("role") || !m["role"].is_string()) {
      refuse(fmt::format("messages[{}].role", i),
             fmt::format("'messages[{}].role' must be a string ('system', 'user', 'assistant', "
                         "'tool')",
                         i));
    }
    check_content(m, i);
    parse_arguments(m);
  }
  return std::move(list);
}

// `tools` as sent (null when absent).
Json tools(const Json& body) {
  if (!body.contains("tools") || body["tools"].is_null()) return nullptr;
  const Json& t = body["tools"];
  const bool objects =
      t.is_array() && std::all_of(t.begin(), t.end(), [](const Json& x) { return x.is_object(); });
  if (!objects)
    refuse("tools", "'tools' must be a list of objects ({\"type\": \"function\", ...})");
  return t;
}

Json template_kwargs(const Json& body) {
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null()) {
    return Json::object();
  }
  const Json& k = body["chat_template_kwargs"];
  if (!k.is_object()) {
    refuse("chat_template_kwargs",
           fmt::format("'chat_template_kwargs' must be an object, not {}", k.type_name()));
  }
  if (k.contains("messages")) {
    refuse("chat_template_kwargs", "'chat_template_kwargs' may not set 'messages'");
  }
  return k;
}

}  // namespace

ChatRequest parse_chat(const std::string& body_text, const std::vector<std::int64_t>& eos) {
  Json body = parse_body(body_text);
  Json variables = Json::object();
  variables["messages"] = messages(body);
  variables["tools"] = tools(body);
  variables["add_generation_prompt"] = boolean_field(body, "add_generation_prompt", true);
  const Json kwargs = template_kwargs(body);
  for (const auto& [key, value] : kwargs.items()) variables[key] = value;
  // OpenAI's chat API names the length max_completion_tokens, and keeps max_tokens as before.
  const bool newer =
      body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null();
  return ChatRequest{parse_generation(body, eos, newer ? "max_completion_tokens" : "max_tokens", 0),
                     std::move(variables)};
}

ChatSetup chat_setup(const models::ModelSource& source, const models::ChatTemplate* override) {
  ChatSetup s;
  const models::ChatTemplate* own = source.chat_template();
  s.chat_template = override != nullptr ? override : own;
  if (own != nullptr) {
    s.special_tokens = own->special_tokens();
  } else if (const models::TextTokenizer* tokenizer = source.tokenizer(); tokenizer != nullptr) {
    const auto text = [&](const std::vector<std::int64_t>& ids, const char* name) {
      if (ids.empty() || !tokenizer->knows(static_cast<std::int32_t>(ids.front()))) return;
      const std::int32_t id = static_cast<std::int32_t>(ids.front());
      s.special_tokens[name] =
          tokenizer->decode(std::span<const std::int32_t>(&id, 1), /*skip_special_tokens=*/false);
    };
    text(source.config().bos_token_ids, "bos_token");
    text(source.config().eos_token_ids, "eos_token");
  }
  if (s.chat_template == nullptr) {
    s.unavailable =
        source.chat_template_error().empty()
            ? std::string(
                  "the model has no chat template (no chat_template.jinja, no "
                  "chat_template in tokenizer_config.json): give one with `numesh serve "
                  "--chat-template FILE`, or use /v1/completions")
            : fmt::format(
                  "the model's chat template cannot be used ({}): give one with `numesh "
                  "serve --chat-template FILE`, or use /v1/completions",
                  source.chat_template_error());
  }
  return s;
}

std::vector<std::int32_t> chat_prompt(const ChatSetup& setup, const ChatRequest& request,
                                      const models::TextTokenizer& tokenizer) {
  if (setup.chat_template == nullptr) refuse("", setup.unavailable);
  Json variables = setup.special_tokens;
  for (const auto& [key, value] : request.variables.items()) variables[key] = value;
  std::string text;
  try {
    text = setup.chat_template->render(variables);
  } catch (const Error& e) {
    refuse("", e.what());  // names the template and the line ("chat template NAME line N: ...")
  }
  std::vector<std::int32_t> ids;
  try {
    ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  } catch (const Error& e) {
    refuse("messages", fmt::format("the chat template's text cannot be encoded: {}", e.what()));
  }
  if (ids.empty()) refuse("messages", "the chat template made an empty prompt of the messages");
  return ids;
}

std::int64_t default_max_tokens(std::int64_t positions, std::size_t prompt_tokens) {
  // The last token generated takes no position: a prompt of p tokens and n new ones take
  // p + n - 1 (the scheduler's count).
  return std::max<std::int64_t>(1, positions - static_cast<std::int64_t>(prompt_tokens) + 1);
}

}  // namespace numesh::serve::openai
