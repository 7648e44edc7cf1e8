// Evaluator for derived_from_source.json: golden cases derived by reading eformer's and EasyDeL's
// code at the pinned commits (JAX cannot run where they were written). Each case is encoded as the
// cases of the vector file it names in `vector_file`, and that file's evaluator evaluates it.

#include <string>

#include "conformance.hpp"

namespace numesh::conformance {
namespace {

json eval_derived(const json& file, const json& c) {
  if (!c.contains("vector_file")) throw NotEvaluated("the case names no vector_file");
  const std::string target = c["vector_file"];
  const Evaluator* evaluator = find_evaluator(target);
  if (evaluator == nullptr || target == "derived_from_source.json") {
    throw NotEvaluated("no evaluator for vector_file " + target);
  }
  return (*evaluator)(file, c);
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("derived_from_source.json", eval_derived);

}  // namespace numesh::conformance
