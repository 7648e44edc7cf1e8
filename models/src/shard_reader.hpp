#pragma once

// PRIVATE to models/src: reading a checkpoint's matrix straight into a laid-out tensor's shards.

#include <functional>
#include <span>

#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::models::detail {

/// One matrix of a load: where its values are, the tensor laid out for it (from a shape-only
/// matrix), and how that tensor stores it.
struct MatrixFill {
  const MatrixSource* source = nullptr;
  runtime::ShardedTensor* tensor = nullptr;
  ops::WeightLayout stored = ops::WeightLayout::kInOut;
};

/// Fills every device's shard of each matrix of `matrices` with the values its source names:
/// each device reads only its own box from the checkpoint's mapping, converts it to the shard's
/// dtype and, for nn.Linear weights going to a tensor stored in-out, transposes it on the way
/// (out-in tensors take them as they are), in its own arena (the pages it writes are its node's,
/// the work is spread over its threads). The devices go through the list in order, all at once
/// and without waiting for each other between matrices (runtime::fill_shards over the tensors).
/// No copy of a whole matrix is made: each thread stages one block of at most 64 source rows,
/// which a shard stored in panels (runtime/weight_panels.hpp) takes as its panels at once.
/// `after(i)`, when set, is called for every i in order, once the first device has read its
/// shard of matrix i, on that device's thread (never two calls at once; any not called by the
/// end of the fill are called then): how far the load has come.
/// With `in_place`, a shard whose bytes are one run of the checkpoint's file in its own format
/// and order (Checkpoint::box_in_place: a matrix stored as the file stores it, out-in, in rows,
/// the shard whole rows of one tensor) reads the file's mapping in place instead
/// (Tensor::use_mapped): no copy, no new page. Returns the bytes of shards read in place.
/// REQUIRES: the tensors share one mesh; each tensor's shape is what CausalLmWeights::deferred
/// gave its source (checked there), its last two dims swapped when stored out-in; no program
/// runs on them during the fill.
/// Throws: what reading the checkpoint throws.
std::int64_t read_shards(const Checkpoint& checkpoint, std::span<const MatrixFill> matrices,
                         bool in_place, const std::function<void(std::size_t i)>& after);

/// Bytes of the local shards of the matrices of `matrices` that keep_in_place_rows would lay out
/// again in rows: what a load copies into panels that it could have read in place.
std::int64_t panel_bytes_of_rows_in_place(const Checkpoint& checkpoint,
                                          std::span<const MatrixFill> matrices);

/// Lays out again in rows (unfilled) each matrix of `matrices` stored in panels whose every
/// local shard read_shards could read from the file in place were it stored in rows, so that it
/// does: a load that keeps the file's pages rather than a copy in the faster order (panels are
/// made from a file's rows by copying). The tensor objects stay (the layers hold them); their
/// shards are new. Returns how many were laid out again.
/// REQUIRES: as read_shards, called before it.
int keep_in_place_rows(const Checkpoint& checkpoint, std::span<const MatrixFill> matrices);

}  // namespace numesh::models::detail
