#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "numesh/models/hf/nonfinite_weights.hpp"

namespace numesh::tools {

/// What numesh generate and numesh train say about a checkpoint whose weights hold NaN or
/// infinities (models::find_nonfinite_weights): a line "note: DIR: <weight> holds N non-finite
/// values of M (the first, nan, at [i, j])" for each of the first five such weights (then how
/// many more), or, with `refuse` (--refuse-nonfinite), nothing written and an error.
/// Throws: ValueError naming the first such weight and how many there are, when `refuse`.
void note_nonfinite_weights(const std::vector<models::NonfiniteWeight>& found, bool refuse,
                            const std::string& where, std::ostream& out);

}  // namespace numesh::tools
