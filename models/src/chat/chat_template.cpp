#include "numesh/models/chat/chat_template.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "chat/jinja_interpreter.hpp"
#include "chat/jinja_parser.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in.good()) throw IoError(fmt::format("cannot read {}", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} whose
// "default" entry is the chat template (transformers' choice when none is named).
std::string template_of(const nlohmann::ordered_json& field, const std::string& file) {
  if (field.is_string()) return field.get<std::string>();
  if (field.is_array()) {
    for (const auto& entry : field) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    throw ValueError(fmt::format(
        "{}: chat_template is a list without an entry named \"default\" (numesh takes that one)",
        file));
  }
  throw ValueError(
      fmt::format("{}: chat_template is a {}, not a string or a list of named templates", file,
                  field.type_name()));
}

// The special tokens transformers passes to a template: a string, or an added token's content.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!config.contains(key)) continue;
    const auto& token = config[key];
    if (token.is_string()) {
      tokens[key] = token;
    } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      tokens[key] = token["content"];
    }
  }
  return tokens;
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string name,
                                 nlohmann::ordered_json special_tokens) {
  NUMESH_CHECK(special_tokens.is_object(), ValueError,
               "{}: the special tokens are {}, expected an object", name,
               special_tokens.type_name());
  auto program = std::make_shared<chat::Program>(chat::parse_template(source, name));
  chat::check_names(*program);
  ChatTemplate t;
  t.program_ = std::move(program);
  t.source_ = std::make_shared<const std::string>(std::move(source));
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

std::optional<ChatTemplate> ChatTemplate::load(const std::filesystem::path& folder) {
  const std::filesystem::path config_file = folder / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_file)) {
    try {
      config = nlohmann::ordered_json::parse(read_text(config_file));
    } catch (const nlohmann::ordered_json::exception& e) {
      throw ValueError(fmt::format("{} is not JSON: {}", config_file.string(), e.what()));
    }
    if (!config.is_object()) {
      throw ValueError(
          fmt::format("{} holds a {}, not an object", config_file.string(), config.type_name()));
    }
  }
  const std::filesystem::path jinja_file = folder / "chat_template.jinja";
  std::optional<ChatTemplate> found;
  if (std::filesystem::exists(jinja_file)) {
    found = parse(read_text(jinja_file), jinja_file.string());
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    found = parse(template_of(config["chat_template"], config_file.string()), config_file.string());
  }
  if (found) found->special_tokens_ = special_tokens_of(config);
  return found;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) {
    throw ValueError(fmt::format("a chat template's variables are a JSON object, not {}",
                                 variables.type_name()));
  }
  nlohmann::ordered_json all = special_tokens_;
  for (const auto& [key, value] : variables.items()) all[key] = value;
  return chat::render(*program_, chat::from_json(all));
}

const std::string& ChatTemplate::name() const noexcept { return program_->name; }

}  // namespace numesh::models
