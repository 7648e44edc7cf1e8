// gguf_tokenizer_check_main: the tokenizers of the GGUF files gguf_tokenizer_check.py wrote
// (DIR/cases.json), and of the model folders it wrote once numesh's own writer has converted
// them, against the tokenizers they came from, over the tokenizer corpus: ids with and without
// special tokens, and the decoded texts (DIR/results.json).
//   gguf_tokenizer_check_main DIR

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/models/engine/gguf_export.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/formats/gguf.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void run(const fs::path& dir) {
  json cases;
  std::ifstream(dir / "cases.json") >> cases;
  json corpus;
  std::ifstream(cases["corpus"].get<std::string>()) >> corpus;
  json results = json::array();
  for (const json& c : cases["cases"]) {
    fs::path gguf = c.contains("gguf") ? dir / c["gguf"].get<std::string>() : fs::path();
    std::string lost;            // what the writer says the file cannot carry: nothing, for these
    if (c.contains("folder")) {  // through numesh's own writer first
      gguf = dir / (c["folder"].get<std::string>() + ".numesh.gguf");
      lost = numesh::models::write_gguf(
                 numesh::models::ModelSource::open(dir / c["folder"].get<std::string>()), gguf,
                 numesh::DType::kF32)
                 .tokenizer_lost;
    }
    const auto file = numesh::models::GgufFile::open(gguf);
    const auto got = numesh::models::TextTokenizer::from_gguf(file);
    const auto want = numesh::models::TextTokenizer::load(c["reference"].get<std::string>());
    std::int64_t texts = 0, tokens = 0, differences = 0;
    std::string first;
    const auto differ = [&](const std::string& what) {
      if (differences++ == 0) first = what;
    };
    if (!lost.empty()) differ("the writer's note: " + lost);
    for (const json& t : corpus) {
      const std::string text = t.get<std::string>();
      ++texts;
      for (const bool special : {true, false}) {
        const auto a = got->encode(text, special), b = want->encode(text, special);
        tokens += static_cast<std::int64_t>(a.size());
        if (a != b) {
          differ(fmt::format("text {} (special {}): [{}] vs [{}]", texts - 1, special,
                             fmt::join(a, ","), fmt::join(b, ",")));
        }
        if (got->decode(b, false) != want->decode(b, false))
          differ(fmt::format("text {}: decode", texts - 1));
      }
    }
    if (got->vocab_size() != want->vocab_size())
      differ(fmt::format("vocab_size {} vs {}", got->vocab_size(), want->vocab_size()));
    results.push_back({{"name", c["name"]},
                       {"kind", std::string(got->kind())},
                       {"texts", texts},
                       {"tokens", tokens},
                       {"differences", differences},
                       {"first_difference", first}});
  }
  std::ofstream(dir / "results.json") << json{{"results", results}}.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_tokenizer_check_main DIR\n");
    return 2;
  }
  try {
    run(argv[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_tokenizer_check_main: %s\n", e.what());
    return 1;
  }
}
