#pragma once

// PRIVATE to models/src: the "did you mean" part of a failed tensor lookup. Checkpoint names are
// long and differ by one field ("model.layers.0.mlp.up_proj.weight" against "...gate_proj..."
// or a missing "model." prefix), so a message that shows the nearest names saves a reader from
// listing hundreds of them.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace numesh::models::detail {

/// "; the closest names are 'a', 'b' and 'c'" (or "; the closest name is 'a'"): the up to
/// `count` entries of `names` nearest to `wanted` in edit distance, ties in the order of
/// `names`; "; there are no tensors" when `names` is empty.
[[nodiscard]] std::string closest_names_hint(std::string_view wanted,
                                             std::span<const std::string> names,
                                             std::size_t count = 3);

}  // namespace numesh::models::detail
