// eformer_conformance: evaluates the golden cases produced by running eformer's own code
// (tests/data/eformer, encoding in docs/eformer-compat.md) against numesh.
//
//   eformer_conformance [--compat FILE] [--quiet] [PATH...]
//
// PATH is a vector file or a folder of them (default: the project's copy). Every case either
// passes (numesh's result equals eformer's) or is a documented divergence: an item of
// docs/eformer-compat.md's "## Vector cases that differ" that states numesh's result, which
// the runner checks (compat_doc.hpp has the format), or a case not evaluated for a reason that
// the document's "## Calls that cannot be written in C++" lists. Prints one line per file,
// each failure with expected and actual values, each divergence with both sides, stale items
// and rows and count mismatches, then a summary that counts the documented divergences. Exits
// 1 on an undocumented failure, a documented value that is not numesh's, a stale item or row
// or a count mismatch; 2 on bad arguments, unreadable files or a malformed list.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "compat_doc.hpp"
#include "conformance.hpp"

namespace fs = std::filesystem;
using numesh::conformance::DocumentedDivergence;
using numesh::conformance::json;
using numesh::conformance::UnevaluatedKind;

namespace {

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

// Removes the value at `p`: an object member is erased, an array element becomes null (so the
// indices of its siblings keep their meaning).
void erase_at(json& j, const json::json_pointer& p) {
  if (!j.contains(p)) return;
  json& parent = j[p.parent_pointer()];
  if (parent.is_object()) {
    parent.erase(p.back());
  } else {
    j[p] = nullptr;
  }
}

std::string join_pointers(const std::vector<json::json_pointer>& pointers) {
  std::string out;
  for (const auto& p : pointers) out += (out.empty() ? "" : ", ") + p.to_string();
  return out;
}

// What the runner made of one case: the JSON numesh computed, or why it was not evaluated.
struct Outcome {
  std::optional<json> actual;
  std::string not_evaluated;
  std::string describe() const {
    return actual ? actual->dump() : "not evaluated (" + not_evaluated + ")";
  }
};

std::string describe_statement(const DocumentedDivergence& d) {
  return d.returns ? d.returns->dump() : "not evaluated (" + *d.not_evaluated + ")";
}

// How numesh's outcome contradicts the item `d` (which states a result), or "" when numesh
// does what the item says.
std::string contradiction(const DocumentedDivergence& d, const Outcome& o, const json& expected) {
  if (d.not_evaluated) {
    if (o.actual) return "documented as not evaluated, but the runner evaluates it";
    if (o.not_evaluated != *d.not_evaluated) {
      return "documented as not evaluated for another reason than the runner's";
    }
    return "";
  }
  if (!o.actual) return "documented with a value, but the runner does not evaluate it";
  json actual = normalise(*o.actual);
  if (actual != normalise(*d.returns)) return "numesh's value is not the documented one";
  if (d.differs_only_at.empty()) return "";
  // The item says numesh agrees with eformer everywhere but at these places: check both
  // halves of that (eformer's expected value is the reference for the rest).
  json eformer = normalise(expected);
  std::vector<json::json_pointer> agreeing;
  for (const auto& p : d.differs_only_at) {
    const bool in_e = eformer.contains(p);
    const bool in_a = actual.contains(p);
    if (in_e == in_a && (!in_e || eformer.at(p) == actual.at(p))) agreeing.push_back(p);
    erase_at(eformer, p);
    erase_at(actual, p);
  }
  if (!agreeing.empty()) {
    return fmt::format("numesh agrees with eformer at {}, which the item lists as differing",
                       join_pointers(agreeing));
  }
  if (eformer != actual) {
    return fmt::format(
        "numesh differs from eformer outside {}\n"
        "    eformer elsewhere: {}\n"
        "    numesh elsewhere:  {}",
        join_pointers(d.differs_only_at), eformer.dump(), actual.dump());
  }
  return "";
}

struct Totals {
  int files = 0, cases = 0, passed = 0, not_evaluated = 0, documented = 0,
      documented_not_evaluated = 0, documented_by_kind = 0, value_mismatches = 0, undocumented = 0,
      count_mismatches = 0;
};

// State shared across files: the documented items by key, which items' cases were seen, and
// the stale items found so far (by line, to print them in the document's order).
struct Run {
  std::string doc_name;
  std::map<std::string, const DocumentedDivergence*> items;
  // The kinds of call that cannot be written in C++, by the runner's reason, and the reasons
  // some case of the run reported.
  std::map<std::string, const UnevaluatedKind*> kinds;
  std::set<std::string> kinds_seen;
  std::set<std::string> files_run;
  std::set<std::string> cases_seen;
  std::map<int, std::string> stale;
  bool quiet = false;
  Totals totals;

  void add_stale(const DocumentedDivergence& d, const std::string& why) {
    stale.emplace(d.line,
                  fmt::format("stale: `{}` ({} line {}): {}", d.key(), doc_name, d.line, why));
  }
};

void run_file(const fs::path& path, Run& run) {
  json file;
  {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path.string());
    file = json::parse(in);
  }
  const std::string name = path.filename().string();
  const auto* evaluator = numesh::conformance::find_evaluator(name);
  const json& cases = file.at("cases");
  run.files_run.insert(name);

  // The count is how the generator says how many cases it wrote: a mismatch means a truncated
  // or hand-edited file.
  std::string count_problem;
  if (!file.contains("count") || !file["count"].is_number_integer()) {
    count_problem =
        fmt::format("count mismatch: {}: no integer \"count\" field, {} cases", name, cases.size());
  } else if (file["count"].get<std::int64_t>() != static_cast<std::int64_t>(cases.size())) {
    count_problem = fmt::format("count mismatch: {}: \"count\" is {} but the file has {} cases",
                                name, file["count"].get<std::int64_t>(), cases.size());
  }

  Totals t;
  std::vector<std::string> lines;
  for (const json& c : cases) {
    ++t.cases;
    const std::string id = c.value("id", "?");
    const std::string key = name + ":" + id;
    run.cases_seen.insert(key);
    Outcome o;
    try {
      if (!evaluator) throw numesh::conformance::NotEvaluated("no evaluator for " + name);
      o.actual = (*evaluator)(file, c);
    } catch (const numesh::conformance::NotEvaluated& e) {
      o.not_evaluated = e.what();
      ++t.not_evaluated;
    } catch (const std::exception& e) {
      o.actual = json{{"uncaught exception", e.what()}};
    }
    const json expected = c.contains("expected") ? c["expected"] : json{{"steps", c["steps"]}};
    const auto item = run.items.find(key);
    const DocumentedDivergence* d = item == run.items.end() ? nullptr : item->second;
    if (!o.actual) run.kinds_seen.insert(o.not_evaluated);

    if (o.actual && normalise(*o.actual) == normalise(expected)) {
      ++t.passed;
      if (d) run.add_stale(*d, "the case now matches eformer; remove the item");
      continue;
    }
    if (!d && !o.actual) {
      // No item of its own: a case that cannot be written in C++ is documented by the row of
      // its kind, which states what eformer does and why numesh cannot.
      if (const auto kind = run.kinds.find(o.not_evaluated); kind != run.kinds.end()) {
        ++t.documented;
        ++t.documented_not_evaluated;
        ++t.documented_by_kind;
        lines.push_back(
            fmt::format("  DOCUMENTED {}: not evaluated ({}), a kind of call {} line {} lists", id,
                        o.not_evaluated, run.doc_name, kind->second->line));
        continue;
      }
    }
    if (!d || !d->has_statement()) {
      ++t.undocumented;
      if (d) {
        run.add_stale(*d,
                      "states no numesh result (add '  - numesh returns: `JSON`' or "
                      "'  - numesh: not evaluated (reason)')");
      }
      const std::string note =
          d ? fmt::format(" (listed on {} line {} without numesh's result)", run.doc_name, d->line)
            : "";
      lines.push_back(o.actual
                          ? fmt::format("  FAIL {}{}\n    expected: {}\n    actual:   {}", id, note,
                                        expected.dump(), o.actual->dump())
                          : fmt::format("  NOT EVALUATED {}{}: {}", id, note, o.not_evaluated));
      continue;
    }
    if (const std::string why = contradiction(*d, o, expected); !why.empty()) {
      ++t.value_mismatches;
      lines.push_back(fmt::format(
          "  VALUE MISMATCH {} ({} line {}): {}\n    expected:   {}\n    documented: {}\n"
          "    actual:     {}",
          id, run.doc_name, d->line, why, expected.dump(), describe_statement(*d), o.describe()));
      continue;
    }
    ++t.documented;
    if (!o.actual) {
      ++t.documented_not_evaluated;
      lines.push_back(fmt::format("  DOCUMENTED {}: not evaluated ({}), as {} line {} states", id,
                                  o.not_evaluated, run.doc_name, d->line));
    } else {
      const std::string only_at =
          d->differs_only_at.empty()
              ? ""
              : ", eformer's value but at " + join_pointers(d->differs_only_at);
      lines.push_back(
          fmt::format("  DOCUMENTED {}: numesh returns what {} line {} states{}\n    expected: {}\n"
                      "    actual:   {}",
                      id, run.doc_name, d->line, only_at, expected.dump(), o.actual->dump()));
    }
  }

  std::cout << fmt::format("{}: {} passed, {} documented, {} failed", name, t.passed, t.documented,
                           t.undocumented + t.value_mismatches);
  if (t.not_evaluated) std::cout << ", " << t.not_evaluated << " not evaluated";
  std::cout << "\n";
  if (!run.quiet) {
    for (const auto& l : lines) std::cout << l << "\n";
  }
  if (!count_problem.empty()) {
    ++t.count_mismatches;
    std::cout << "  " << count_problem << "\n";
  }
  Totals& all = run.totals;
  ++all.files;
  all.cases += t.cases;
  all.passed += t.passed;
  all.documented += t.documented;
  all.documented_not_evaluated += t.documented_not_evaluated;
  all.documented_by_kind += t.documented_by_kind;
  all.value_mismatches += t.value_mismatches;
  all.undocumented += t.undocumented;
  all.count_mismatches += t.count_mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path compat = NUMESH_COMPAT_DOC;
  Run run;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout
          << "usage: eformer_conformance [--compat FILE] [--quiet] [PATH...]\n"
             "Evaluates eformer golden vectors (files or folders; default "
          << NUMESH_VECTOR_DIR
          << ").\nA case passes when numesh's result equals eformer's, or is a documented "
             "divergence when\nFILE lists it under \"## Vector cases that differ\" with the "
             "result numesh returns,\nwhich is checked, or it is not evaluated for a reason "
             "FILE lists under\n\"## Calls that cannot be written in C++\". Items whose "
             "case passes or does not exist,\nand rows no case needs, are stale; with PATHs "
             "that are files (not folders),\nonly the items of those files are checked for "
             "staleness, and rows are not.\n"
             "  --compat FILE  list of documented divergences (default "
          << NUMESH_COMPAT_DOC
          << ")\n  --quiet        no per-case lines\n"
             "Exit status: 0 all as expected; 1 an undocumented failure, a documented value "
             "numesh\ndoes not return, a stale item or row or a count mismatch; 2 bad arguments, "
             "unreadable files\nor a malformed list.\n";
      return 0;
    } else if (arg == "--compat") {
      if (i + 1 == argc) {
        std::cerr << "eformer_conformance: --compat needs a FILE (see --help)\n";
        return 2;
      }
      compat = argv[++i];
    } else if (arg == "--quiet") {
      run.quiet = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "eformer_conformance: unknown option '" << arg << "' (see --help)\n";
      return 2;
    } else {
      inputs.emplace_back(arg);
    }
  }
  if (inputs.empty()) inputs.emplace_back(NUMESH_VECTOR_DIR);

  // Given single files, the run covers only part of the vectors, so an item of another file
  // cannot be called stale; given folders, every item must name a case that was run.
  bool only_run_files = false;
  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    if (fs::is_directory(in)) {
      for (const auto& e : fs::directory_iterator(in)) {
        if (e.path().extension() == ".json") files.push_back(e.path());
      }
    } else if (fs::exists(in)) {
      files.push_back(in);
      only_run_files = true;
    } else {
      std::cerr << "eformer_conformance: no such file or folder '" << in.string() << "'\n";
      return 2;
    }
  }
  std::sort(files.begin(), files.end());

  std::vector<DocumentedDivergence> documented;
  std::vector<UnevaluatedKind> kinds;
  try {
    documented = numesh::conformance::load_documented_divergences(compat);
    kinds = numesh::conformance::load_unevaluated_kinds(compat);
  } catch (const numesh::conformance::CompatDocError& e) {
    std::cerr << "eformer_conformance: " << e.what() << "\n";
    return 2;
  }
  run.doc_name = compat.filename().string();
  for (const auto& d : documented) run.items.emplace(d.key(), &d);
  for (const auto& k : kinds) run.kinds.emplace(k.reason, &k);

  for (const auto& f : files) {
    try {
      run_file(f, run);
    } catch (const std::exception& e) {
      std::cerr << "eformer_conformance: " << f.string() << ": " << e.what() << "\n";
      return 2;
    }
  }
  for (const auto& d : documented) {
    if (run.cases_seen.contains(d.key())) continue;
    if (run.files_run.contains(d.file)) {
      run.add_stale(d, "names no case: " + d.file + " has no case with this id");
    } else if (!only_run_files) {
      run.add_stale(d, "names no case: no vector file " + d.file + " was run");
    }
  }
  // A row no case of a full run needs documents nothing; with single files, other files may
  // need it.
  if (!only_run_files) {
    for (const auto& k : kinds) {
      if (run.kinds_seen.contains(k.reason)) continue;
      run.stale.emplace(k.line, fmt::format("stale: the kind `{}` ({} line {}): no case of the "
                                            "run is not evaluated for this reason",
                                            k.reason, run.doc_name, k.line));
    }
  }
  for (const auto& [line, message] : run.stale) std::cout << message << "\n";

  const Totals& t = run.totals;
  const int stale = static_cast<int>(run.stale.size());
  const bool ok = !t.undocumented && !t.value_mismatches && !stale && !t.count_mismatches;
  std::cout << fmt::format("summary: {} cases in {} file{}: {}\n", t.cases, t.files,
                           t.files == 1 ? "" : "s", ok ? "OK" : "FAILED");
  std::cout << fmt::format("  {} passed\n", t.passed);
  std::cout << fmt::format(
      "  {} documented divergences, each returning the value {} states ({} not evaluated, as "
      "stated)\n",
      t.documented, run.doc_name, t.documented_not_evaluated);
  std::cout << fmt::format(
      "  {} of them documented by kind (not evaluated for a reason {} lists under \"Calls that "
      "cannot be written in C++\")\n",
      t.documented_by_kind, run.doc_name);
  std::cout << fmt::format("  {} documented divergences whose value differs from {}\n",
                           t.value_mismatches, run.doc_name);
  std::cout << fmt::format("  {} failed undocumented\n", t.undocumented);
  std::cout << fmt::format("  {} stale entries in {}\n", stale, run.doc_name);
  std::cout << fmt::format("  {} count mismatches\n", t.count_mismatches);
  return ok ? 0 : 1;
}
