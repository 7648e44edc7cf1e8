// numesh's side of the tokenizer check (tokenizer_check.cmake): reads DIR/reference.json, which
// tokenizer_check/reference.mjs wrote with Hugging Face's tokenizers.js, encodes and decodes
// every text with numesh's Tokenizer loaded from the same tokenizer.json, and compares ids and
// text exactly. Prints the first difference of each tokenizer (the text, the position, the ids
// around it) and exits 1 if there is any; prints the encode speed on the longest text.
//
//   tokenizer_check_main DIR

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "numesh/models/tokenizers/tokenizer.hpp"

namespace {

// `text` with control characters and non-ASCII escaped, cut to 120 bytes, for a message.
std::string shown(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < 120; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (text.size() > 120) out += "...";
  return out;
}

// The ids of `v` in [at - 3, at + 4), for a message.
std::string around(const std::vector<std::int32_t>& v, std::size_t at) {
  const std::size_t from = at > 3 ? at - 3 : 0;
  const std::size_t to = std::min(v.size(), at + 4);
  return fmt::format("[{}{}{}]", from > 0 ? "... " : "",
                     fmt::join(v.begin() + static_cast<std::ptrdiff_t>(from),
                               v.begin() + static_cast<std::ptrdiff_t>(to), ", "),
                     to < v.size() ? " ..." : "");
}

// "" when equal, else where and how `got` differs from `want`.
std::string id_difference(const std::vector<std::int32_t>& want,
                          const std::vector<std::int32_t>& got) {
  if (want == got) return "";
  std::size_t at = 0;
  while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
  return fmt::format(
      "first difference at position {} (Hugging Face {} ids, numesh {}):\n"
      "      Hugging Face {}\n      numesh       {}",
      at, want.size(), got.size(), around(want, at), around(got, at));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tokenizer_check_main DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::ifstream in(dir + "/reference.json");
  if (!in) {
    std::fprintf(stderr, "tokenizer_check_main: cannot open %s/reference.json\n", dir.c_str());
    return 1;
  }
  const auto reference = nlohmann::json::parse(in);
  int failures = 0;
  std::size_t texts = 0;
  for (const auto& entry : reference) {
    const auto name = entry["name"].get<std::string>();
    const auto file = entry["file"].get<std::string>();
    const auto start = std::chrono::steady_clock::now();
    std::optional<numesh::models::Tokenizer> tokenizer;
    try {
      tokenizer.emplace(numesh::models::Tokenizer::load(file));
    } catch (const std::exception& e) {
      fmt::print("{}: FAILED to load {}: {}\n", name, file, e.what());
      ++failures;
      continue;
    }
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int mismatches = 0;
    std::size_t longest = 0;
    std::string longest_text;
    for (const auto& c : entry["cases"]) {
      ++texts;
      const auto text = c["text"].get<std::string>();
      if (text.size() > longest) {
        longest = text.size();
        longest_text = text;
      }
      std::vector<std::string> problems;
      try {
        const auto ids = tokenizer->encode(text);
        const auto plain = tokenizer->encode(text, /*add_special_tokens=*/false);
        if (auto d = id_difference(c["ids"].get<std::vector<std::int32_t>>(), ids); !d.empty()) {
          problems.push_back("encode: " + d);
        }
        if (auto d = id_difference(c["ids_no_special"].get<std::vector<std::int32_t>>(), plain);
            !d.empty()) {
          problems.push_back("encode(add_special_tokens=false): " + d);
        }
        // Decoding Hugging Face's ids checks decode on its own even where encode differs.
        const auto hf_ids = c["ids"].get<std::vector<std::int32_t>>();
        for (const bool skip : {false, true}) {
          const auto want = c[skip ? "decoded_skip_special" : "decoded"].get<std::string>();
          const auto got = tokenizer->decode(hf_ids, skip);
          if (want != got) {
            std::size_t at = 0;
            while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
            problems.push_back(fmt::format(
                "decode(skip_special_tokens={}): first difference at byte {}:\n      Hugging Face "
                "'{}'\n      numesh       '{}'",
                skip, at, shown(want.substr(at > 20 ? at - 20 : 0)),
                shown(got.substr(at > 20 ? at - 20 : 0))));
          }
        }
      } catch (const std::exception& e) {
        problems.push_back(fmt::format("threw: {}", e.what()));
      }
      if (!problems.empty()) {
        if (mismatches == 0) {
          fmt::print("{}: MISMATCH on '{}':\n", name, shown(text));
          for (const auto& p : problems) fmt::print("    {}\n", p);
        }
        ++mismatches;
      }
    }
    // Encode speed on the longest text (the corpus 40 times over); the BPE cache is warm after
    // the first pass, as it is in a server.
    constexpr int kRepeats = 3;
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t n_ids = 0;
    for (int r = 0; r < kRepeats; ++r) n_ids = tokenizer->encode(longest_text).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print(
        "{}: {} texts, {} mismatching; loaded in {:.2f} s; encode {:.1f} MB/s ({} bytes -> "
        "{} ids)\n",
        name, entry["cases"].size(), mismatches, load_s,
        static_cast<double>(longest) * kRepeats / s / 1e6, longest, n_ids);
    if (mismatches > 0) ++failures;
  }
  if (failures > 0) {
    fmt::print("tokenizer_check: FAILED: {} of {} tokenizers differ from Hugging Face\n", failures,
               reference.size());
    return 1;
  }
  fmt::print(
      "tokenizer_check: {} tokenizers, {} texts: ids and decoded text match Hugging "
      "Face's exactly\n",
      reference.size(), texts);
  return 0;
}
