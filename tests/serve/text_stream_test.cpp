// TextStream: a request's text handed out in whole UTF-8 characters as its tokens come, cut at
// the first stop string (nothing of it handed out, even when it straddles tokens); and
// parse_completion: OpenAI's completion request checked field by field.

#include "text_stream.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "openai/completion_request.hpp"

namespace numesh::serve {
namespace {

// A tokenizer whose tokens are byte strings (a token can end inside a character).
class BytesTokenizer : public models::TextTokenizer {
 public:
  explicit BytesTokenizer(std::map<std::int32_t, std::string> pieces)
      : pieces_(std::move(pieces)) {}
  std::vector<std::int32_t> encode(std::string_view text, bool) const override {
    std::vector<std::int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode(std::span<const std::int32_t> ids, bool) const override {
    std::string out;
    for (const std::int32_t id : ids) out += pieces_.at(id);
    return out;
  }
  std::int64_t vocab_size() const noexcept override { return 1000; }
  bool knows(std::int32_t id) const noexcept override { return pieces_.contains(id); }
  std::string_view kind() const noexcept override { return "bytes"; }

 private:
  std::map<std::int32_t, std::string> pieces_;
};

const BytesTokenizer& tokenizer() {
  // "é" is C3 A9, split over tokens 3 and 4; "€" is E2 82 AC over 5 and 6.
  static const BytesTokenizer t({{1, "Hel"},
                                 {2, "lo"},
                                 {3, "\xC3"},
                                 {4, "\xA9!"},
                                 {5, "\xE2\x82"},
                                 {6, "\xAC"},
                                 {7, " EN"},
                                 {8, "D more"}});
  return t;
}

TEST(TextStreamTest, HandsOutWholeCharactersOnly) {
  TextStream s(&tokenizer(), {});
  EXPECT_EQ(s.add(1), "Hel");
  EXPECT_EQ(s.add(2), "lo");
  EXPECT_EQ(s.add(3), "") << "half of é is held back";
  EXPECT_EQ(s.add(4), "\xC3\xA9!");
  EXPECT_EQ(s.add(5), "");
  EXPECT_EQ(s.add(99), "") << "an id the tokenizer lacks adds no text";
  EXPECT_EQ(s.add(6), "\xE2\x82\xAC");
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.text(), "Hello\xC3\xA9!\xE2\x82\xAC");
  EXPECT_EQ(s.tokens(), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 99, 6}));
  EXPECT_FALSE(s.stopped());
}

TEST(TextStreamTest, CutsAtAStopStringThatStraddlesTokens) {
  TextStream s(&tokenizer(), {"xyz", " END"});
  EXPECT_EQ(s.add(1), "Hel");
  EXPECT_EQ(s.add(2), "lo");
  EXPECT_EQ(s.add(7), "") << "' EN' may begin ' END': held back";
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.add(8), "") << "' END' found: nothing of it, nor after it";
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "Hello");
  EXPECT_EQ(s.finish(), "");
}

TEST(TextStreamTest, AHeldBackTailThatIsNoStopComesOutAtTheEnd) {
  TextStream s(&tokenizer(), {" ENDING"});
  EXPECT_EQ(s.add(1), "Hel");
  EXPECT_EQ(s.add(7), "");
  EXPECT_EQ(s.finish(), " EN");
  EXPECT_EQ(s.text(), "Hel EN");
  TextStream none(nullptr, {"x"});
  EXPECT_EQ(none.add(5), "") << "without a tokenizer: ids only";
  EXPECT_EQ(none.tokens(), std::vector<std::int32_t>{5});
}

TEST(CompleteUtf8LengthTest, StopsBeforeAnUnfinishedCharacterOrAReplacementCharacter) {
  EXPECT_EQ(complete_utf8_length("ab"), 2u);
  EXPECT_EQ(complete_utf8_length("a\xC3"), 1u);
  EXPECT_EQ(complete_utf8_length("a\xE2\x82"), 1u);
  EXPECT_EQ(complete_utf8_length("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(complete_utf8_length("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(complete_utf8_length("a\xEF\xBF\xBD"), 1u);
  EXPECT_EQ(complete_utf8_length(""), 0u);
}

TEST(ParseCompletionTest, ReadsOpenAIsFieldsAndRefusesBadOnesByName) {
  const std::vector<std::int64_t> eos{9};
  openai::CompletionRequest r = openai::parse_completion(
      R"({"prompt": "Hi", "max_tokens": 5, "temperature": 0.5, "top_k": 8, "top_p": 0.9,
          "seed": 3, "stop": "x", "stream": true, "whatever": {}})",
      &tokenizer(), 1000, eos);
  EXPECT_EQ(r.prompt, (std::vector<std::int32_t>{'H', 'i'}));
  EXPECT_EQ(r.options.max_new_tokens, 5);
  ASSERT_TRUE(r.options.sampling.has_value());
  EXPECT_EQ(r.options.sampling->top_k, 8);
  EXPECT_DOUBLE_EQ(r.options.sampling->temperature, 0.5);
  EXPECT_EQ(r.options.seed, 3u);
  EXPECT_EQ(r.options.stop_ids, eos);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream);
  r = openai::parse_completion(R"({"prompt": [1, 2], "temperature": 0, "ignore_eos": true})",
                               nullptr, 1000, eos);
  EXPECT_FALSE(r.options.sampling.has_value()) << "temperature 0: greedy";
  EXPECT_TRUE(r.options.stop_ids.empty()) << "ignore_eos";
  EXPECT_EQ(r.options.max_new_tokens, 16) << "OpenAI's default";
  const auto refused = [&](const std::string& body, const std::string& param,
                           const std::string& message) {
    try {
      (void)openai::parse_completion(body, nullptr, 1000, eos);
      ADD_FAILURE() << body << " was accepted";
    } catch (const openai::RequestError& e) {
      EXPECT_EQ(e.param, param) << body;
      EXPECT_EQ(e.message, message) << body;
    }
  };
  refused("[1]", "", "the body must be a JSON object");
  refused(R"({"prompt": "Hi"})", "prompt",
          "the model has no tokenizer: give the prompt as a list of token ids");
  refused(R"({"prompt": [1, 1000]})", "prompt",
          "'prompt'[1] is 1000; token ids are integers in [0, 1000)");
  refused(R"({"prompt": []})", "prompt", "'prompt' is empty");
  refused(R"({"prompt": [1], "max_tokens": 0})", "max_tokens",
          "'max_tokens' is 0; it must be between 1 and 1073741824");
  refused(R"({"prompt": [1], "temperature": "hot"})", "temperature",
          "'temperature' must be a number, not \"hot\"");
  refused(R"({"prompt": [1], "top_p": 0})", "top_p", "'top_p' must be above 0");
  refused(R"({"prompt": [1], "n": 3})", "n", "'n' is 3; it must be between 1 and 1");
  refused(R"({"prompt": [1], "stop": ["a", ""]})", "stop",
          "'stop' holds \"\"; it takes non-empty strings");
  refused(R"({"prompt": [1], "stream": 1})", "stream", "'stream' must be true or false, not 1");
  refused(R"({"prompt": [1], "stop": ""})", "stop", "'stop' is empty; it takes non-empty strings");
}

TEST(ErrorObjectTest, HasOpenAIsFourFields) {
  const nlohmann::json e = openai::error_object("bad", "invalid_request_error", "prompt");
  EXPECT_EQ(
      e.dump(),
      R"({"error":{"code":null,"message":"bad","param":"prompt","type":"invalid_request_error"}})");
  EXPECT_TRUE(openai::error_object("x", "y")["error"]["param"].is_null());
}

}  // namespace
}  // namespace numesh::serve
