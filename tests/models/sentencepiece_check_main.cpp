// sentencepiece_check_main: encodes and decodes every text of DIR/expected.json (written by
// sentencepiece_check.py) with numesh's TextTokenizer over DIR/tokenizer.model, and writes
// DIR/numesh.json for the script to compare with SentencePiece's own.
//   sentencepiece_check_main DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "numesh/models/tokenizers/text_tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sentencepiece_check_main DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    const auto tokenizer = numesh::models::TextTokenizer::load(dir / "tokenizer.model");
    nlohmann::json expected;
    std::ifstream(dir / "expected.json") >> expected;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : expected) {
      const std::vector<std::int32_t> ids = tokenizer->encode(e["text"].get<std::string>(), true);
      out.push_back({{"ids", ids}, {"decoded", tokenizer->decode(ids, false)}});
    }
    std::ofstream(dir / "numesh.json") << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sentencepiece_check_main: %s\n", e.what());
    return 1;
  }
}
