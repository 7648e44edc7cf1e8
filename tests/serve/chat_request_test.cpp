// parse_chat: OpenAI's chat completion request checked field by field, its variables in the
// order sent; chat_prompt: the template rendered and encoded without special tokens; the body's
// limits; and the chunks and responses of both endpoints (ResponseShape).

#include "openai/chat_request.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "openai/response.hpp"

namespace numesh::serve {
namespace {

// A tokenizer of one id per byte, which remembers whether it was asked for special tokens.
class ByteIdTokenizer : public models::TextTokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const override {
    asked_special = add_special;
    std::vector<std::int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode(std::span<const std::int32_t> ids, bool) const override {
    std::string out;
    for (const std::int32_t id : ids) out += static_cast<char>(id);
    return out;
  }
  std::int64_t vocab_size() const noexcept override { return 256; }
  bool knows(std::int32_t id) const noexcept override { return id >= 0 && id < 256; }
  std::string_view kind() const noexcept override { return "byte ids"; }
  mutable bool asked_special = true;
};

TEST(ParseChatTest, KeepsTheMessagesToolsAndKeywordsInTheOrderSent) {
  const std::vector<std::int64_t> eos{9};
  const openai::ChatRequest r = openai::parse_chat(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                       {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                        "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}}]}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 0, "a": 0}}}],
          "chat_template_kwargs": {"enable_thinking": false, "add_generation_prompt": false},
          "max_tokens": 3, "max_completion_tokens": 5, "temperature": 0, "stop": "x",
          "stream": true})",
      eos);
  EXPECT_EQ(r.variables.dump(),
            R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},)"
            R"({"role":"assistant","content":null,"tool_calls":[{"type":"function",)"
            R"("function":{"name":"f","arguments":{"z":1,"a":2}}}]}],)"
            R"("tools":[{"type":"function","function":{"name":"f","parameters":{"z":0,"a":0}}}],)"
            R"("add_generation_prompt":false,"enable_thinking":false})")
      << "tool call arguments sent as a JSON string become the object, keys in order; "
         "chat_template_kwargs come last and may replace add_generation_prompt";
  EXPECT_EQ(r.options.max_new_tokens, 5) << "max_completion_tokens before max_tokens";
  EXPECT_FALSE(r.options.sampling.has_value());
  EXPECT_EQ(r.options.stop_ids, eos);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream);
  const openai::ChatRequest plain =
      openai::parse_chat(R"({"messages": [{"role": "user", "content": "Hi"}]})", eos);
  EXPECT_EQ(plain.variables.dump(), R"({"messages":[{"role":"user","content":"Hi"}],"tools":null,)"
                                    R"("add_generation_prompt":true})");
  EXPECT_EQ(plain.options.max_new_tokens, 0) << "none given: the server gives the rest";
}

TEST(ParseChatTest, RefusesBadOnesByName) {
  const auto refused = [](const std::string& body, const std::string& param,
                          const std::string& message) {
    try {
      (void)openai::parse_chat(body, {});
      ADD_FAILURE() << body << " was accepted";
    } catch (const openai::RequestError& e) {
      EXPECT_EQ(e.param, param) << body;
      EXPECT_EQ(e.message, message) << body;
    }
  };
  const std::string ok = R"("messages": [{"role": "user", "content": "Hi"}])";
  refused("{}", "messages", "'messages' is required");
  refused(R"({"messages": []})", "messages",
          "'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  refused(R"({"messages": [1]})", "messages[0]", "'messages[0]' must be an object, not number");
  refused(R"({"messages": [{"content": "Hi"}]})", "messages[0].role",
          "'messages[0].role' must be a string ('system', 'user', 'assistant', 'tool')");
  refused(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "user"}]})",
          "messages[1].content",
          "'messages[1].content' is required (only an assistant's message with tool_calls may "
          "have none)");
  refused(R"({"messages": [{"role": "assistant", "content": null}]})", "messages[0].content",
          "'messages[0].content' is required (only an assistant's message with tool_calls may "
          "have none)");
  refused(R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
          "'messages[0].content' must be a string or a list of text parts, not number");
  refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
          "messages[0].content",
          "'messages[0].content'[0] is a part of type 'image_url'; the model reads text parts "
          "only");
  refused(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
          "messages[0].content", "'messages[0].content'[0] is a text part without a string 'text'");
  refused("{" + ok + R"(, "tools": {"a": 1}})", "tools",
          "'tools' must be a list of objects ({\"type\": \"function\", ...})");
  refused("{" + ok + R"(, "chat_template_kwargs": [1]})", "chat_template_kwargs",
          "'chat_template_kwargs' must be an object, not array");
  refused("{" + ok + R"(, "chat_template_kwargs": {"messages": []}})", "chat_template_kwargs",
          "'chat_template_kwargs' may not set 'messages'");
  refused("{" + ok + R"(, "add_generation_prompt": 1})", "add_generation_prompt",
          "'add_generation_prompt' must be true or false, not 1");
  refused("{" + ok + R"(, "max_completion_tokens": 0})", "max_completion_tokens",
          "'max_completion_tokens' is 0; it must be between 1 and 1073741824");
  refused("{" + ok + R"(, "logprobs": "yes"})", "logprobs",
          "'logprobs' must be true or false, not \"yes\"");
  refused("{" + ok + R"(, "top_logprobs": 2})", "top_logprobs",
          "'top_logprobs' needs 'logprobs': true");
  refused("{" + ok + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs",
          "'top_logprobs' is 21; it must be between 0 and 20");
  EXPECT_FALSE(openai::parse_chat("{" + ok + R"(, "logprobs": false})", {}).options.logprobs);
  EXPECT_EQ(openai::parse_chat("{" + ok + R"(, "logprobs": true, "top_logprobs": 3})", {})
                .options.logprobs,
            3);
  EXPECT_EQ(openai::parse_chat("{" + ok + R"(, "logprobs": true})", {}).options.logprobs, 0);
}

TEST(ParseBodyTest, RefusesADeepBodyAndAnObjectOfTooManyKeys) {
  const std::string deep =
      std::string(openai::kMaxBodyDepth, '[') + "0" + std::string(openai::kMaxBodyDepth, ']');
  EXPECT_NO_THROW((void)openai::parse_body(R"({"a": )" + deep.substr(1, deep.size() - 2) + "}"));
  try {
    (void)openai::parse_body(R"({"a": )" + deep + "}");
    ADD_FAILURE() << "a body " << openai::kMaxBodyDepth + 1 << " deep was accepted";
  } catch (const openai::RequestError& e) {
    EXPECT_EQ(e.message, "the body nests deeper than 64 levels");
  }
  std::string wide = "{";
  for (std::size_t i = 0; i <= openai::kMaxObjectKeys; ++i) {
    wide += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\":0";
  }
  try {
    (void)openai::parse_body(R"({"a": [)" + wide + "}]}");
    ADD_FAILURE() << "an object of " << openai::kMaxObjectKeys + 1 << " keys was accepted";
  } catch (const openai::RequestError& e) {
    EXPECT_EQ(e.message, "an object of the body holds more than 1024 keys");
  }
}

TEST(ChatPromptTest, RendersOverTheSpecialTokensAndEncodesWithoutAddingThem) {
  const models::ChatTemplate t = models::ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\n"
      "{% if add_generation_prompt %}{{ raise_exception('no generation prompt here') }}"
      "{% endif %}",
      "t.jinja");
  openai::ChatSetup setup;
  setup.chat_template = &t;
  setup.special_tokens["bos_token"] = "<s>";
  const ByteIdTokenizer tokenizer;
  const openai::ChatRequest r = openai::parse_chat(
      R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false})", {});
  const std::vector<std::int32_t> ids = openai::chat_prompt(setup, r, tokenizer);
  EXPECT_EQ(tokenizer.decode(ids, false), "<s>[user]Hi");
  EXPECT_FALSE(tokenizer.asked_special) << "the template writes BOS itself";
  try {
    (void)openai::chat_prompt(
        setup, openai::parse_chat(R"({"messages": [{"role": "user", "content": "Hi"}]})", {}),
        tokenizer);
    ADD_FAILURE() << "the template's raise_exception was not refused";
  } catch (const openai::RequestError& e) {
    EXPECT_NE(e.message.find("t.jinja"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("line 2"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("no generation prompt here"), std::string::npos) << e.message;
  }
  openai::ChatSetup none;
  none.unavailable = "the model has no chat template";
  try {
    (void)openai::chat_prompt(none, r, tokenizer);
    ADD_FAILURE() << "a chat without a template was not refused";
  } catch (const openai::RequestError& e) {
    EXPECT_EQ(e.message, "the model has no chat template");
  }
}

TEST(DefaultMaxTokensTest, TakesTheRestOfThePositions) {
  EXPECT_EQ(openai::default_max_tokens(512, 10), 503) << "10 + 503 - 1 = 512 positions";
  EXPECT_EQ(openai::default_max_tokens(512, 512), 1);
  EXPECT_EQ(openai::default_max_tokens(512, 600), 1) << "the engine then refuses it";
}

TEST(ResponseShapeTest, ShapesCompletionsAndChatsAsOpenAIDoes) {
  const nlohmann::json usage = openai::usage(3, 2);
  EXPECT_EQ(usage.dump(), R"({"completion_tokens":2,"prompt_tokens":3,"total_tokens":5})");
  const openai::ResponseShape chat{openai::Endpoint::kChatCompletions, "chatcmpl-7", "m", 1};
  EXPECT_EQ(chat.whole("Hi", {1, 2}, "stop", usage).dump(),
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,)"
            R"("message":{"content":"Hi","role":"assistant"}}],"created":1,"id":"chatcmpl-7",)"
            R"("model":"m","object":"chat.completion","usage":)" +
                usage.dump() + "}");
  ASSERT_EQ(chat.opening().size(), 1u);
  EXPECT_EQ(chat.opening()[0]["choices"][0]["delta"].dump(),
            R"({"content":"","role":"assistant"})");
  EXPECT_EQ(chat.piece("H", {1})["choices"][0]["delta"].dump(), R"({"content":"H"})");
  const std::vector<nlohmann::json> closing = chat.closing("i", {2}, "length", usage);
  ASSERT_EQ(closing.size(), 2u) << "the last piece, then the finish reason in an empty delta";
  EXPECT_EQ(closing[0]["choices"][0]["delta"].dump(), R"({"content":"i"})");
  EXPECT_EQ(closing[1]["choices"][0]["delta"].dump(), "{}");
  EXPECT_EQ(closing[1]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(closing[1]["object"], "chat.completion.chunk");
  EXPECT_EQ(closing[1]["usage"], usage);
  EXPECT_EQ(chat.closing("", {}, "stop", usage).size(), 1u) << "no text: no piece";
  const openai::ResponseShape text{openai::Endpoint::kCompletions, "cmpl-7", "m", 1};
  EXPECT_TRUE(text.opening().empty());
  const std::vector<nlohmann::json> last = text.closing("i", {2}, "stop", usage);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].dump(),
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":"i",)"
            R"("tokens":[2]}],"created":1,"id":"cmpl-7","model":"m","object":"text_completion",)"
            R"("usage":)" +
                usage.dump() + "}");
}

}  // namespace
}  // namespace numesh::serve
