#pragma once

#include <cstdint>
#include <memory>

#include "numesh/core/dtype.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

// The library's one entry point from a model on disk to a model on a mesh: the source's
// config, the mesh, eformer's PartitionAxis resolved in a mode into the model's axes, the
// dtype the devices store the matrices in, and the load. Every front end (numesh generate and
// perplexity, and the server and Python to come) assembles a model through it.

namespace numesh::models {

/// How Engine::load lays a model out.
struct EngineOptions {
  /// How the devices store the matrices: f32, bf16 or f16 (norms and routers stay f32).
  DType dtype = DType::kF32;
  /// Sequences each call of the model runs (CausalLm::batch).
  std::int64_t sequences = 1;
  /// Positions each sequence's caches hold; 0: the model's whole context (max_context()).
  std::int64_t context = 0;
  /// eformer's PartitionAxis (in a manager) and the mode its semantic axes resolve in.
  sharding::PartitionManager partitions{};
  sharding::ModeArg mode = sharding::Mode::kDecode;
  /// Told the checkpoint bytes read so far and in all after each matrix.
  CausalLm::LoadProgress progress{};
};

/// A model loaded onto a mesh, with what it was made from and what its load measured.
/// Move-only. Not thread-safe: one thread drives the model.
class Engine {
 public:
  /// Resolves the axes for `options.sequences` sequences, then loads every weight of `source`
  /// onto `mesh` (CausalLm::load: each device reads its own shards).
  /// Throws: ValueError when sequences is not positive, or context is negative or past the
  /// model's max_context() (naming them); what ModelAxes::resolve, HfConfig::transformer_config
  /// and CausalLm::load throw.
  [[nodiscard]] static Engine load(ModelSource source, runtime::DeviceMesh mesh,
                                   const EngineOptions& options = {});

  /// What the model was loaded from.
  [[nodiscard]] const ModelSource& source() const noexcept { return source_; }
  /// Its config.
  [[nodiscard]] const HfConfig& config() const noexcept { return source_.config(); }
  /// The mesh it runs on.
  [[nodiscard]] const runtime::DeviceMesh& mesh() const noexcept { return mesh_; }
  /// The axes its layers are laid out by.
  [[nodiscard]] const ops::ModelAxes& axes() const noexcept { return axes_; }
  /// How the devices store its matrices.
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  /// The model.
  [[nodiscard]] CausalLm& model() noexcept { return *model_; }
  [[nodiscard]] const CausalLm& model() const noexcept { return *model_; }
  /// The checkpoint's tensor bytes.
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_bytes_; }
  /// Seconds the load took: reading, converting and laying out on the devices.
  [[nodiscard]] double load_seconds() const noexcept { return load_seconds_; }


 private:
  Engine(ModelSource source, runtime::DeviceMesh mesh);
  ModelSource source_;
  runtime::DeviceMesh mesh_;
  ops::ModelAxes axes_;
  DType dtype_ = DType::kF32;
  std::unique_ptr<CausalLm> model_;
  std::int64_t checkpoint_bytes_ = 0;
  double load_seconds_ = 0;
};

}  // namespace numesh::models
