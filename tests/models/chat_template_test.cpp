// ChatTemplate's contract beyond what the jinja2 check proves (chat_template_check.py renders
// 656 cases byte for byte against Python's jinja2): its errors (type, template name, line, the
// template's own message), loading from a model folder, the special tokens beneath the
// variables, and the guards a template cannot get past (recursion, range, unpacking).

#include "numesh/models/chat/chat_template.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "numesh/core/error.hpp"

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::string render(const std::string& source,
                   const ordered_json& variables = ordered_json::object()) {
  return ChatTemplate::parse(source, "test.jinja").render(variables);
}

// The error `source` gives when parsed and rendered; fails the test when it gives none.
ChatTemplateError error_of(const std::string& source,
                           const ordered_json& variables = ordered_json::object()) {
  try {
    (void)render(source, variables);
  } catch (const ChatTemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no ChatTemplateError from " << source;
  return ChatTemplateError("", 0);
}

class ChatTemplateFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("numesh_chat_template_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST(ChatTemplateTest, RendersAConversationWithTheGenerationPrompt) {
  const std::string source =
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  const ordered_json variables = {
      {"bos_token", "<s>"},
      {"messages",
       {{{"role", "user"}, {"content", " hi "}}, {{"role", "assistant"}, {"content", "yo"}}}},
      {"add_generation_prompt", true}};
  EXPECT_EQ(render(source, variables), "<s><user>hi\n<assistant>yo\n<assistant>");
}

TEST(ChatTemplateTest, SyntaxErrorsNameTheTemplateAndTheLine) {
  const ChatTemplateError unclosed = error_of("line one\n{% if x %}\nno end\n");
  EXPECT_EQ(unclosed.line(), 3);
  EXPECT_THAT(unclosed.what(), HasSubstr("chat template test.jinja line 3"));
  EXPECT_THAT(unclosed.what(), HasSubstr("endif"));

  const ChatTemplateError tag = error_of("a\nb\n{% include 'x' %}");
  EXPECT_EQ(tag.line(), 3);
  EXPECT_THAT(tag.what(), HasSubstr("Encountered unknown tag 'include'."));

  EXPECT_THAT(error_of("{{ 'open }}").what(), HasSubstr("a string is not closed"));
  EXPECT_THAT(error_of("{# never closed").what(), HasSubstr("Missing end of comment tag"));
  EXPECT_THAT(error_of("{{ a ? b }}").what(), HasSubstr("unexpected char '?'"));
  EXPECT_THAT(error_of("{{ }}").what(), HasSubstr("expected an expression"));
}

TEST(ChatTemplateTest, UnknownFiltersAndTestsFailAtParseUnlessInsideAnIf) {
  const ChatTemplateError filter = error_of("\n{{ x | shout }}");
  EXPECT_EQ(filter.line(), 2);
  EXPECT_THAT(filter.what(), HasSubstr("No filter named 'shout'."));
  EXPECT_THAT(error_of("{{ x is loud }}").what(), HasSubstr("No test named 'loud'."));
  // jinja2 compiles an if's body leniently: the error comes only if it runs.
  EXPECT_EQ(render("{% if false %}{{ x | shout }}{% endif %}ok"), "ok");
  EXPECT_THAT(error_of("{% if true %}{{ x | shout }}{% endif %}").what(),
              HasSubstr("No filter named 'shout'."));
}

TEST(ChatTemplateTest, RaiseExceptionCarriesTheTemplatesMessageAndLine) {
  const ChatTemplateError e = error_of(
      "{% for m in messages %}\n{% if m.role == 'tool' %}\n"
      "{{ raise_exception('Tool turns are not supported') }}\n{% endif %}{% endfor %}",
      {{"messages", {{{"role", "tool"}, {"content", "x"}}}}});
  EXPECT_EQ(e.line(), 3);
  EXPECT_THAT(e.what(), HasSubstr("Tool turns are not supported"));
  // It is a ValueError too, so callers that catch numesh's bad-input errors see it.
  EXPECT_THROW((void)render("{{ raise_exception('x') }}"), ValueError);
}

TEST(ChatTemplateTest, UsingUndefinedValuesFailsAsJinja2Does) {
  EXPECT_EQ(render("[{{ missing }}][{{ missing | length }}]"), "[][0]");
  EXPECT_THAT(error_of("{{ missing.role }}").what(), HasSubstr("'missing' is undefined"));
  EXPECT_THAT(error_of("{{ m.nope + 1 }}", {{"m", ordered_json::object()}}).what(),
              HasSubstr("'dict object' has no attribute 'nope'"));
  EXPECT_THAT(error_of("{{ 1 + 'a' }}").what(),
              HasSubstr("unsupported operand type(s) for +: 'int' and 'str'"));
  EXPECT_THAT(error_of("{{ 1 // 0 }}").what(), HasSubstr("division or modulo by zero"));
}

TEST(ChatTemplateTest, GuardsATemplateCannotGetPast) {
  EXPECT_THAT(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").what(),
              HasSubstr("calls itself deeper than 64 times"));
  EXPECT_THAT(error_of("{{ range(200000) | length }}").what(), HasSubstr("Range too big"));
  EXPECT_THAT(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").what(),
              HasSubstr("too many values to unpack (expected 2)"));
  EXPECT_THAT(error_of("{% break %}").what(), HasSubstr("break or continue outside a for loop"));
  EXPECT_THAT(error_of("{{ 9223372036854775807 + 1 }}").what(), HasSubstr("integer overflow"));
  // Found by chat_template_fuzz: an attribute that is an integer past 64 bits.
  EXPECT_THAT(error_of("{{ m.99999999999999999999 }}").what(),
              HasSubstr("the integer 99999999999999999999 is past 64 bits"));
  EXPECT_THAT(error_of("{{ 99999999999999999999 }}").what(), HasSubstr("past 64 bits"));
}

TEST(ChatTemplateTest, TheGenerationMarkerRendersItsBody) {
  // transformers' {% generation %} marks the assistant's tokens; it does not change the text.
  EXPECT_EQ(render("a{% generation %}b{% endgeneration %}c"), "abc");
}

TEST(ChatTemplateTest, VariablesMustBeAnObject) {
  const ChatTemplate t = ChatTemplate::parse("x", "t");
  EXPECT_THROW((void)t.render(ordered_json::array()), ValueError);
  EXPECT_EQ(t.name(), "t");
  EXPECT_TRUE(t.special_tokens().empty());
}

TEST_F(ChatTemplateFolderTest, NoTemplateIsNullopt) {
  EXPECT_FALSE(ChatTemplate::load(dir_).has_value());
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_FALSE(ChatTemplate::load(dir_).has_value());
}

TEST_F(ChatTemplateFolderTest, TokenizerConfigGivesTheTemplateAndItsSpecialTokens) {
  write("tokenizer_config.json",
        R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  const auto t = ChatTemplate::load(dir_);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->special_tokens(), (ordered_json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}));
  const ordered_json messages = {{{"role", "user"}, {"content", "hi"}}};
  EXPECT_EQ(t->render({{"messages", messages}}), "<s>hi</s>");
  // The caller's variables win over the special tokens.
  EXPECT_EQ(t->render({{"messages", messages}, {"bos_token", ""}}), "hi</s>");
  EXPECT_THAT(t->name(), HasSubstr("tokenizer_config.json"));
}

TEST_F(ChatTemplateFolderTest, AListOfNamedTemplatesGivesTheDefaultOne) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                              {"name": "default", "template": "plain"}]})");
  EXPECT_EQ(ChatTemplate::load(dir_)->render(ordered_json::object()), "plain");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}]})");
  EXPECT_THAT(
      [&] { (void)ChatTemplate::load(dir_); },
      ::testing::ThrowsMessage<ValueError>(HasSubstr("without an entry named \"default\"")));
  write("tokenizer_config.json", R"({"chat_template": 7})");
  EXPECT_THAT([&] { (void)ChatTemplate::load(dir_); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("chat_template is a number")));
  write("tokenizer_config.json", "{not json");
  EXPECT_THAT([&] { (void)ChatTemplate::load(dir_); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("is not JSON")));
}

TEST_F(ChatTemplateFolderTest, ChatTemplateJinjaOverridesTokenizerConfig) {
  write("tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "config"})");
  write("chat_template.jinja", "file {{ eos_token }}\n");
  const auto t = ChatTemplate::load(dir_);
  ASSERT_TRUE(t.has_value());
  // One trailing newline goes, as jinja2's keep_trailing_newline=False drops it.
  EXPECT_EQ(t->render(ordered_json::object()), "file </s>");
  EXPECT_THAT(t->name(), HasSubstr("chat_template.jinja"));
  write("chat_template.jinja", "{% for %}");
  EXPECT_THROW((void)ChatTemplate::load(dir_), ChatTemplateError);
}

}  // namespace
}  // namespace numesh::models
