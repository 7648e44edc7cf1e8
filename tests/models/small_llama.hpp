#pragma once

// The small random Llama the generation and engine tests serve: hidden 128 (2 heads of 64, as
// many KV heads), 2 layers, 256 tokens, F32, written in Hugging Face layout to a scratch folder.

#include <nlohmann/json.hpp>

#include "numesh/core/dtype.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models::testing {

/// Writes the model to `dir` and returns its config.
inline HfConfig write_small_llama(const ScratchDir& dir) {
  nlohmann::json config = small_llama_config(128, 2);
  config["vocab_size"] = 256;
  config["num_key_value_heads"] = 2;
  write_random_model(dir.path(), config, DType::kF32, 7);
  return HfConfig::load(dir.path());
}

}  // namespace numesh::models::testing
