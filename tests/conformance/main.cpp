// eformer_conformance: evaluates the golden cases produced by running eformer's own code
// (tests/data/eformer, encoding in docs/eformer-compat.md) against numesh.
//
//   eformer_conformance [--compat FILE] [--quiet] [PATH...]
//
// PATH is a vector file or a folder of them (default: the project's copy). Prints one line per
// file, `FILE: N passed, M failed`, each failure with expected and actual, each case it could
// not evaluate with the reason, and a last line `N passed, M failed`. Exits 1 when a case fails
// or cannot be evaluated and docs/eformer-compat.md does not list it (with its reason) as a
// known difference; 2 on bad arguments or unreadable files.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace fs = std::filesystem;
using numesh::conformance::json;

namespace {

// A documented difference: `file:id` (a trailing '*' matches any id with that prefix).
struct KnownDifference {
  std::string pattern;
  std::string reason;
  bool matches(const std::string& key) const {
    if (!pattern.empty() && pattern.back() == '*') {
      return key.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
    }
    return key == pattern;
  }
};

// Reads the list items "- `file.json:case-id`: reason" of the section headed
// "## Vector cases that differ" in docs/eformer-compat.md.
std::vector<KnownDifference> load_known_differences(const fs::path& doc) {
  std::vector<KnownDifference> out;
  std::ifstream in(doc);
  if (!in) return out;
  static const std::regex item(R"(^- `([^`]+\.json:[^`]*)`: (.+)$)");
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line.find("Vector cases that differ") != std::string::npos;
    std::smatch m;
    if (in_section && std::regex_match(line, m, item)) out.push_back({m[1], m[2]});
  }
  return out;
}

// Python error classes that numesh folds into one class: AttributeError (eformer reads an
// attribute of None) is numesh::TypeError.
json normalise(json j) {
  if (j.is_object()) {
    if (j.contains("type") && j.contains("message") && j["type"] == "AttributeError") {
      j["type"] = "TypeError";
    }
    for (auto& [k, v] : j.items()) v = normalise(v);
  } else if (j.is_array()) {
    for (auto& v : j) v = normalise(v);
  }
  return j;
}

struct Totals {
  int passed = 0, failed = 0, unlisted_failures = 0, not_evaluated = 0;
};

void run_file(const fs::path& path, const std::vector<KnownDifference>& known, bool quiet,
              Totals& totals) {
  json file;
  {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path.string());
    file = json::parse(in);
  }
  const std::string name = path.filename().string();
  const auto* evaluator = numesh::conformance::find_evaluator(name);
  Totals t;
  std::vector<std::string> lines;
  for (const json& c : file.at("cases")) {
    const std::string id = c.value("id", "?");
    const std::string key = name + ":" + id;
    json actual;
    try {
      if (!evaluator) throw numesh::conformance::NotEvaluated("no evaluator for " + name);
      actual = (*evaluator)(file, c);
    } catch (const numesh::conformance::NotEvaluated& e) {
      ++t.not_evaluated;
      auto it = std::find_if(known.begin(), known.end(),
                             [&](const KnownDifference& k) { return k.matches(key); });
      if (it == known.end()) ++t.unlisted_failures;
      lines.push_back(fmt::format("  NOT EVALUATED {}: {}{}", id, e.what(),
                                  it == known.end() ? "" : " (documented: " + it->reason + ")"));
      continue;
    } catch (const std::exception& e) {
      actual = json{{"uncaught exception", e.what()}};
    }
    const json expected = c.contains("expected") ? c["expected"] : json{{"steps", c["steps"]}};
    if (normalise(actual) == normalise(expected)) {
      ++t.passed;
      continue;
    }
    ++t.failed;
    auto it = std::find_if(known.begin(), known.end(),
                           [&](const KnownDifference& k) { return k.matches(key); });
    if (it == known.end()) ++t.unlisted_failures;
    lines.push_back(fmt::format("  FAIL {}{}\n    expected: {}\n    actual:   {}", id,
                                it == known.end() ? "" : " (documented difference: " + it->reason + ")",
                                expected.dump(), actual.dump()));
  }
  std::cout << name << ": " << t.passed << " passed, " << t.failed << " failed";
  if (t.not_evaluated) std::cout << ", " << t.not_evaluated << " not evaluated";
  std::cout << "\n";
  if (!quiet) {
    for (const auto& l : lines) std::cout << l << "\n";
  }
  totals.passed += t.passed;
  totals.failed += t.failed;
  totals.unlisted_failures += t.unlisted_failures;
  totals.not_evaluated += t.not_evaluated;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path compat = NUMESH_COMPAT_DOC;
  bool quiet = false;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: eformer_conformance [--compat FILE] [--quiet] [PATH...]\n"
                   "Evaluates eformer golden vectors (files or folders; default "
                << NUMESH_VECTOR_DIR
                << ").\n  --compat FILE  list of documented differences (default "
                << NUMESH_COMPAT_DOC << ")\n  --quiet        only the per-file and total lines\n";
      return 0;
    } else if (arg == "--compat" && i + 1 < argc) {
      compat = argv[++i];
    } else if (arg == "--quiet") {
      quiet = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "eformer_conformance: unknown option '" << arg << "' (see --help)\n";
      return 2;
    } else {
      inputs.emplace_back(arg);
    }
  }
  if (inputs.empty()) inputs.emplace_back(NUMESH_VECTOR_DIR);

  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    if (fs::is_directory(in)) {
      for (const auto& e : fs::directory_iterator(in)) {
        if (e.path().extension() == ".json") files.push_back(e.path());
      }
    } else if (fs::exists(in)) {
      files.push_back(in);
    } else {
      std::cerr << "eformer_conformance: no such file or folder '" << in.string() << "'\n";
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  const auto known = load_known_differences(compat);

  Totals totals;
  for (const auto& f : files) {
    try {
      run_file(f, known, quiet, totals);
    } catch (const std::exception& e) {
      std::cerr << "eformer_conformance: " << f.string() << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (totals.not_evaluated) std::cout << totals.not_evaluated << " cases not evaluated\n";
  if (totals.failed || totals.not_evaluated) {
    std::cout << totals.unlisted_failures << " failures not listed in " << compat.filename().string()
              << "\n";
  }
  std::cout << totals.passed << " passed, " << totals.failed << " failed\n";
  return totals.unlisted_failures ? 1 : 0;
}
