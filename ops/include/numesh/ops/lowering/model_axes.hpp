#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

// The mesh axes a model's lowering splits each dim over, resolved from eformer's semantic axes.

namespace numesh::ops {

/// The mesh axes a model's lowering uses, resolved from eformer's semantic axes.
struct ModelAxes {
  std::vector<std::string> batch = {"dp", "fsdp"};  ///< sequences (BATCH)
  std::string heads = "tp";                         ///< attention heads (HEAD)
  std::string mlp = "tp";                           ///< MLP intermediate (MLP_INTERMEDIATE)
  std::string expert = "ep";                        ///< experts (EXPERT)
  std::string expert_tensor = "tp";                 ///< each expert's F (TENSOR_PARALLEL)
  std::string sequence = "sp";                      ///< tokens (QUERY_LENGTH): sequence parallel
  /// Axes splitting the MLP weights' H dim (FSDP / ZeRO-3, EasyDeL's ColumnWise dim 0): stored
  /// split, all-gathered every run. Attention and expert weights are not split this way yet.
  std::vector<std::string> weights = {};

  /// Resolves BATCH, HEAD, MLP_INTERMEDIATE, EXPERT, TENSOR_PARALLEL and QUERY_LENGTH with
  /// `pm` in `mode`, and `weights` from the ColumnWise preset's dim 0. Throws: ValueError naming
  /// the token when HEAD, MLP_INTERMEDIATE, EXPERT or TENSOR_PARALLEL resolves to more than one
  /// mesh axis (numesh splits those dims over one axis); what PartitionManager::resolve throws.
  [[nodiscard]] static ModelAxes resolve(const sharding::PartitionManager& pm, sharding::Mode mode);
  /// As above for eformer's mode argument on the model's activations [batch, T, hidden]. A
  /// named mode resolves as above. An integer mode (ModeArg::from_dim) is inferred per call as
  /// EasyDeL's get_mode does: decode when the dim's extent is 1, else train. When the dim is T
  /// (1 or -2) a model sees both (prefill calls and decode steps) but lays its weights and
  /// caches out once, so train and decode must resolve every axis alike; the sequence axis is
  /// train's (a one-token call never splits T).
  /// Throws: as above; IndexError when the dim is outside [-3, 3); ValueError naming each
  /// field whose axes differ between train and decode.
  [[nodiscard]] static ModelAxes resolve(const sharding::PartitionManager& pm,
                                         sharding::ModeArg mode, std::int64_t batch,
                                         std::int64_t hidden);
};

/// The routing groups (or any split) the lowering makes of `extent` rows over `axes`: the
/// product of the sizes of the axes the mesh has, when it divides extent; 1 otherwise (the
/// corrected spec then replicates that dim). The dense references take it from here, from the
/// mesh and the axes the user chose, never from the sharded layer they check.
[[nodiscard]] std::int64_t split_count(const sharding::Mesh& mesh,
                                       const std::vector<std::string>& axes, std::int64_t extent);

/// The token groups of a call whose T the sequence axis divides: that axis's size, 1 without
/// one (the dense transformer reference's `sequence_groups`).
[[nodiscard]] std::int64_t sequence_groups(const sharding::Mesh& mesh,
                                           const std::string& sequence_axis);

}  // namespace numesh::ops
