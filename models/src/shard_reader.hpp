#pragma once

// PRIVATE to models/src: reading a checkpoint's matrix straight into a laid-out tensor's shards.

#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::models::detail {

/// Fills every device's shard of `tensor` (laid out from a shape-only matrix) with the values
/// `source` names: each device reads only its own box from the checkpoint's mapping, converts it
/// to the shard's dtype and, for nn.Linear weights going to a tensor stored in-out (`stored`),
/// transposes it on the way (out-in tensors take them as they are), in its own arena
/// (the pages it writes are its node's, the work is spread over its threads), all devices at
/// once. No copy of the whole matrix is made: each thread stages one block of at most 64
/// source rows.
/// REQUIRES: the tensor's shape is what CausalLmWeights::deferred gave the source (checked
/// there), its last two dims swapped when stored out-in.
/// Throws: what reading the checkpoint throws.
void read_shards(const Checkpoint& checkpoint, const MatrixSource& source,
                 runtime::ShardedTensor& tensor, ops::WeightLayout stored);

}  // namespace numesh::models::detail
