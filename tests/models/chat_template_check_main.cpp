// numesh's side of the chat template check (chat_template_check.py): renders every case of
// CASES.json with numesh's ChatTemplate and writes what it got to OUT.json, which the script
// compares byte for byte with what Python's jinja2 renders, configured as transformers'
// apply_chat_template configures it.
//
//   chat_template_check_main CASES.json OUT.json
//
// CASES.json: {"templates": {NAME: SOURCE, ...}, "cases": [{"template": NAME, "variables": {...}},
// ...]}, read keeping the objects' key order (tojson prints keys in order, as Python's dicts
// keep them). OUT.json: one entry per case, {"text": ...} or, for a ChatTemplateError while
// parsing or rendering, {"error": what(), "line": line()}. Any other exception ends the program
// with its message and status 1.

#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "numesh/models/chat/chat_template.hpp"

namespace {

using nlohmann::ordered_json;
using numesh::models::ChatTemplate;
using numesh::models::ChatTemplateError;

ordered_json error_entry(const ChatTemplateError& e) {
  ordered_json entry = ordered_json::object();
  entry["error"] = e.what();
  entry["line"] = e.line();
  return entry;
}

ordered_json run(const ordered_json& input) {
  const ordered_json& templates = input.at("templates");
  // Each template is parsed once, at its first case: the program, or its parse error.
  std::map<std::string, std::variant<ChatTemplate, ChatTemplateError>> parsed;
  ordered_json out = ordered_json::array();
  for (const ordered_json& c : input.at("cases")) {
    const std::string name = c.at("template").get<std::string>();
    auto it = parsed.find(name);
    if (it == parsed.end()) {
      const std::string source = templates.at(name).get<std::string>();
      try {
        it = parsed.emplace(name, ChatTemplate::parse(source, name)).first;
      } catch (const ChatTemplateError& e) {
        it = parsed.emplace(name, e).first;
      }
    }
    if (const auto* error = std::get_if<ChatTemplateError>(&it->second)) {
      out.push_back(error_entry(*error));
      continue;
    }
    const auto& chat_template = std::get<ChatTemplate>(it->second);
    try {
      ordered_json entry = ordered_json::object();
      entry["text"] = chat_template.render(c.at("variables"));
      out.push_back(std::move(entry));
    } catch (const ChatTemplateError& e) {
      out.push_back(error_entry(e));
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: chat_template_check_main CASES.json OUT.json\n");
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) {
      std::fprintf(stderr, "chat_template_check_main: cannot open %s\n", argv[1]);
      return 1;
    }
    const ordered_json input = ordered_json::parse(in);
    const ordered_json out = run(input);
    std::ofstream file(argv[2]);
    // Invalid UTF-8 in a rendered text (a template cutting a character in two) is written as
    // U+FFFD rather than refused, so that the script reports the difference.
    file << out.dump(1, ' ', false, ordered_json::error_handler_t::replace) << '\n';
    if (!file) {
      std::fprintf(stderr, "chat_template_check_main: cannot write %s\n", argv[2]);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chat_template_check_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
