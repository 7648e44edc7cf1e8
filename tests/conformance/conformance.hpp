#pragma once

// The eformer conformance runner's shared vocabulary: decoding the vector encoding of
// tests/data/eformer (SPEC section 17) into numesh values, encoding results back, and the
// registry of per-file evaluators.
//
// An evaluator receives one case and returns the JSON it computed, shaped like the case's
// "expected" object; the runner compares the two. An evaluator that cannot evaluate a case
// throws NotEvaluated with the reason, and the runner counts and names it.

#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::conformance {

using json = nlohmann::json;

/// Thrown by an evaluator for a case it cannot evaluate (with the reason).
class NotEvaluated : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One vector file's evaluator: `file` is the whole file (for shared tables such as
/// partition_axis_configs), `c` the case. Returns the computed counterpart of c["expected"].
using Evaluator = std::function<json(const json& file, const json& c)>;

/// Registers the evaluator for vector files named `file_name` (basename, e.g. "mesh.json").
/// Returns true so that it can initialise a static.
bool register_evaluator(const std::string& file_name, Evaluator evaluator);
/// The evaluator for `file_name`, or nullptr.
const Evaluator* find_evaluator(const std::string& file_name);

// ---- decoding -------------------------------------------------------------------------------

/// A Python value of the axis vocabulary: null -> None, "x" -> name, [..] -> tuple (the
/// encoding does not tell tuples from lists; both canonicalise alike), {"$not_given": true},
/// {"$unconstrained": true}, {"$int": n}.
sharding::AxisRule decode_rule(const json& j);
/// A list of axis entries (the `axes` argument of resolve_axis and friends).
std::vector<sharding::AxisRule> decode_rules(const json& j);
/// A PartitionSpec from its JSON list, canonicalised (so it may throw as P() does).
sharding::PartitionSpec decode_spec(const json& j);
/// A mesh from {"names", "sizes"}; null gives the empty mesh.
sharding::Mesh decode_mesh(const json& j);
/// A shape from a JSON list of ints.
std::vector<std::int64_t> decode_shape(const json& j);

// ---- encoding -------------------------------------------------------------------------------

/// Inverse of decode_rule (tuples and lists both become JSON lists).
json encode_rule(const sharding::AxisRule& r);
/// Inverse of decode_spec.
json encode_spec(const sharding::PartitionSpec& spec);
/// {"names": [...], "sizes": [...]}.
json encode_mesh(const sharding::Mesh& mesh);

/// Python's exception class name for a numesh error (numesh::ValueError -> "ValueError",
/// NoMeshError -> "AssertionError", ...).
std::string python_error_type(const Error& e);
/// {"type": ..., "message": ...}; for KeyError the message is the key, as the vectors encode it.
json encode_error(const Error& e);

/// Runs `fn`; returns {"ok": fn()} or {"error": encode_error(e)} for a numesh::Error.
json capture(const std::function<json()>& fn);

/// misc.json's `partition_manager_context_semantics` case (eval_partition_axis.cpp owns the
/// PartitionManager evaluators; eval_misc.cpp delegates that one case).
json eval_partition_manager_context_semantics(const json& file, const json& c);

/// Looks up a PartitionAxis config by name in file["partition_axis_configs"] (the kwargs object).
const json& partition_axis_config(const json& file, const std::string& name);

}  // namespace numesh::conformance

/// Registers `fn` as the evaluator for vector file `file` at static-initialisation time.
#define NUMESH_CONFORMANCE_EVALUATOR(file, fn)           \
  static const bool numesh_conformance_registered_##fn = \
      ::numesh::conformance::register_evaluator(file, fn)
