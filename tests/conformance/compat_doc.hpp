#pragma once

// The list of documented divergences in docs/eformer-compat.md ("## Vector cases that differ"),
// as the conformance runner reads it. Each item names one case and states numesh's result in
// a form the runner checks:
//
//   - `file.json:case-id`: why numesh differs (prose for the reader).
//     - numesh returns: `{...}`                 the runner's "actual" JSON, compact
//     - differs from eformer's only at: `/a`, `/b/c`   optional: JSON Pointers (RFC 6901)
//
// or, for a case the runner cannot evaluate in C++,
//
//   - `file.json:case-id`: why.
//     - numesh: not evaluated (the evaluator's reason, verbatim)
//
// There are no wildcards: every case is listed, so every documented value is checked. The one
// exception has no value to check: a kind of call that cannot be written in C++ is listed once
// in "## Calls that cannot be written in C++", by the reason the runner reports (see
// UnevaluatedKind).

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace numesh::conformance {

/// The document cannot be read, or an item of the list is malformed (a wildcard, an unknown
/// sub-item, bad JSON, an item listed twice). what() names the file and line.
class CompatDocError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One item of the list.
struct DocumentedDivergence {
  std::string file;    ///< vector file basename, e.g. "helpers.json"
  std::string id;      ///< case id
  std::string reason;  ///< the item's prose
  int line = 0;        ///< 1-based line of the item in the document

  /// `numesh returns: ...`: numesh's result, as the runner encodes it.
  std::optional<json> returns;
  /// `numesh: not evaluated (...)`: the reason the runner reports for the case.
  std::optional<std::string> not_evaluated;
  /// `differs from eformer's only at: ...`: the only places where numesh's result may differ
  /// from eformer's; everything else must equal eformer's expected value.
  std::vector<json::json_pointer> differs_only_at;

  std::string key() const { return file + ":" + id; }
  bool has_statement() const { return returns.has_value() || not_evaluated.has_value(); }
};

/// One row of the "## Calls that cannot be written in C++" section: a kind of eformer call
/// that numesh's typed API cannot express, named by the reason the runner gives for not
/// evaluating it. A case the runner does not evaluate for that reason is a documented
/// divergence even without an item of its own (no value exists to check):
///
///   | runner's reason | eformer | numesh | why |
///   |---|---|---|---|
///   | `a non-array argument does not type-check in C++` | raises TypeError | ... | ... |
struct UnevaluatedKind {
  std::string reason;  ///< the evaluator's reason, verbatim (the first cell, in backticks)
  int line = 0;        ///< 1-based line of the row in the document
};

/// Reads the items of the "## Vector cases that differ" section of `doc`.
/// Throws CompatDocError when the file cannot be read or an item is malformed.
std::vector<DocumentedDivergence> load_documented_divergences(const std::filesystem::path& doc);

/// Reads the rows of the "## Calls that cannot be written in C++" section of `doc` (none when
/// the document has no such section). A row is a table line whose first cell is one reason in
/// backticks; the header and separator lines are skipped.
/// Throws CompatDocError when the file cannot be read, a row's first cell is not one reason in
/// backticks, or a reason is listed twice.
std::vector<UnevaluatedKind> load_unevaluated_kinds(const std::filesystem::path& doc);

}  // namespace numesh::conformance
