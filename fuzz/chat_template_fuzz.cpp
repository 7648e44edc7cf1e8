// Fuzzes chat templates: arbitrary bytes parsed as a template and rendered over a small
// conversation with a tool. A template comes from a model's files or --chat-template, so the
// interpreter must end every input with a rendered text or a ChatTemplateError (a numesh::Error):
// no crash, no exception of another kind, no runaway (nesting, steps and output are bounded).

#include <string>

#include "fuzz_target.hpp"
#include "numesh/models/chat/chat_template.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris? \u00e9\u4e16 \ud83d\ude00"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5]}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  const std::string source(fuzz::as_text(data, size));
  fuzz::expect_clear_error_only([&] {
    const models::ChatTemplate t = models::ChatTemplate::parse(source, "fuzz");
    (void)t.render(variables);
  });
  return 0;
}
