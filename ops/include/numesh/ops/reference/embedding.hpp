#pragma once

#include <cstdint>
#include <span>

#include "numesh/ops/embedding_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The embedding reference (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// x[r, :] = table[ids[r], :] * output_scale, the table as stored (stored_as rounding,
/// widened; the product in fp32); returns [ids.size(), H].
/// Throws: ShapeError when the table is not [V, H]; IndexError naming the position and the id
/// when an id is outside [0, V).
runtime::HostTensor embedding_reference(std::span<const std::int32_t> ids,
                                        const EmbeddingWeights& weights);

}  // namespace numesh::ops
