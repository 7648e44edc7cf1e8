#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "numesh/core/error.hpp"

// A model's chat template: the Jinja program that turns a conversation (`messages`, `tools`)
// into the prompt text the model was trained on. Hugging Face keeps it in tokenizer_config.json
// (`chat_template`, a string or a list of named templates) or in chat_template.jinja, which
// overrides it. No C++ Jinja engine is packaged in Debian 12, so numesh renders templates with
// its own interpreter of the Jinja subset real templates use, and renders them exactly as
// transformers' apply_chat_template does with Python's jinja2: trim_blocks and lstrip_blocks,
// the loop controls (break, continue), `tojson` as json.dumps without ASCII escapes,
// `raise_exception(message)` and `strftime_now(format)`, Python's str() and repr() of values.
// What the interpreter does not know (a filter, a test, a tag) is an error naming it and the
// template's line, never a silent difference.

namespace numesh::models {

/// A chat template that cannot be parsed or rendered: a syntax error, an unknown filter, test or
/// method, an operation on values of the wrong kind, or the template's own raise_exception.
/// `what()` names the template and the line; `line()` is that line (1-based; 0 when unknown).
class ChatTemplateError : public ValueError {
 public:
  ChatTemplateError(const std::string& message, int line) : ValueError(message), line_(line) {}
  /// The template's line the error was found on (1-based), 0 when it is not known.
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  int line_;
};

namespace chat {
struct Program;  // the parsed template (src/chat/jinja_ast.hpp)
}  // namespace chat

/// A parsed chat template. Immutable and cheap to copy (the program is shared); render() may
/// run on several threads at once.
class ChatTemplate {
 public:
  /// Parses `source`, Jinja text; `name` names it in errors ("tokenizer_config.json", a path);
  /// `special_tokens` ({"bos_token": "<s>", ...}) are defaults beneath render()'s variables.
  /// Throws: ChatTemplateError naming the line of the first syntax error or unknown tag;
  /// ValueError when `special_tokens` is not an object.
  [[nodiscard]] static ChatTemplate parse(
      std::string source, std::string name,
      nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  /// The chat template of a model folder: chat_template.jinja when the folder has one, else
  /// tokenizer_config.json's `chat_template` (a string, or the entry named "default" of a list
  /// of {name, template}); with the special tokens tokenizer_config.json names (bos_token,
  /// eos_token, unk_token, pad_token; a string or an added token's `content`). nullopt when the
  /// folder has no template.
  /// Throws: IoError for a file that cannot be read; ValueError for a tokenizer_config.json that
  /// is not JSON or whose chat_template is neither a string nor a list with a "default" entry;
  /// ChatTemplateError for a template that does not parse.
  [[nodiscard]] static std::optional<ChatTemplate> load(const std::filesystem::path& folder);

  /// Renders the template. `variables` is a JSON object: `messages` (a list of objects with
  /// `role` and `content`, and whatever else the template reads: `tool_calls`,
  /// `reasoning_content`...), `tools` (a list or null), `add_generation_prompt`, and any other
  /// variable the template reads (`enable_thinking`, `date_string`). The special tokens of
  /// load() are defaults beneath them. Objects keep their keys' order (as Python's dicts do,
  /// which `tojson` shows).
  /// Throws: ChatTemplateError naming the line, for an error while rendering (the template's
  /// raise_exception among them); ValueError when `variables` is not an object.
  [[nodiscard]] std::string render(const nlohmann::ordered_json& variables) const;

  /// The template's Jinja text, as given to parse() or read by load().
  [[nodiscard]] const std::string& source() const noexcept { return *source_; }
  /// The name given to parse() or the file load() read it from.
  [[nodiscard]] const std::string& name() const noexcept;
  /// The special tokens load() found or parse() was given ({"bos_token": "<s>", ...}).
  [[nodiscard]] const nlohmann::ordered_json& special_tokens() const noexcept {
    return special_tokens_;
  }

 private:
  std::shared_ptr<const chat::Program> program_;
  std::shared_ptr<const std::string> source_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace numesh::models
