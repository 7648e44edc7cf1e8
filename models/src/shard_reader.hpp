#pragma once

// PRIVATE to models/src: reading a checkpoint's matrix straight into a laid-out tensor's shards.

#include "numesh/models/hf_weights.hpp"
#include "numesh/models/safetensors_checkpoint.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::models::detail {

/// Fills every device's shard of `tensor` (laid out from a shape-only matrix) with the values
/// `source` names: each device reads only its own box from the checkpoint's mapping, converts it
/// to the shard's dtype and, for nn.Linear weights, transposes it on the way, in its own arena
/// (the pages it writes are its node's, the work is spread over its threads), all devices at
/// once. No copy of the whole matrix is made: each thread stages one block of at most 64
/// source rows.
/// REQUIRES: the tensor's shape is what CausalLmWeights::deferred gave the source (checked
/// there).
/// Throws: what reading the checkpoint throws.
void read_shards(const SafetensorsCheckpoint& checkpoint, const MatrixSource& source, runtime::ShardedTensor& tensor);

}  // namespace numesh::models::detail
