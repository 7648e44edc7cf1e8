#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>

#include "numesh/core/dtype.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"

// Models with random weights written in Hugging Face layout: what `numesh generate` runs when
// no checkpoint is given (the main job needs no download) and what tests load, through the
// very path a real checkpoint takes (config.json, safetensors, HfConfig, CausalLmWeights).

namespace numesh::models {

/// A small Llama-style config document (llama3 RoPE scaling, GQA, its own LM head: a random
/// model that tied it would mostly repeat its last token) of `hidden`
/// hidden size: vocabulary 4096, ffn 4 x hidden (rounded to 64), hidden / 64 heads of 64, a
/// quarter of them kv heads (at least 1), `layers` layers, 4096 positions.
/// REQUIRES: hidden a positive multiple of 64, layers >= 1.
nlohmann::json small_llama_config(std::int64_t hidden, std::int64_t layers);

/// Writes dir/config.json (`config`) and dir/model.safetensors holding every tensor
/// CausalLmWeights::load reads for it, stored as `dtype`: linear layers normal(0, 1/sqrt(in)),
/// the embedding normal(0, 1), norms 1 + normal(0, 0.1) as they scale (Gemma's stored w
/// normal(0, 0.1): it scales by 1 + w), biases (mlp_bias, attention biases)
/// normal(0, 0.1), a shared expert and its gate when the config has one, from a generator
/// seeded with `seed`. Creates `dir` when missing.
/// Throws: as HfConfig::parse and HfConfig::transformer_config for a config numesh cannot read;
/// IoError when a file cannot be written.
void write_random_model(const std::filesystem::path& dir, const nlohmann::json& config, DType dtype,
                        std::uint32_t seed);

/// Weights to train `config` from scratch, initialised as transformers' _init_weights does for
/// the Llama family: the embedding and every linear layer (attention, MLP, router, experts, LM
/// head) normal(0, stddev) with transformers' default initializer_range 0.02, RMSNorm weights
/// scaling by 1 (Gemma's stored w 0), biases 0, from a generator seeded with `seed`. Laid out as
/// CausalLmWeights holds weights (matrices [in, out]); a tied head is the table's transpose.
/// Throws: ValueError as HfConfig::transformer_config(); ValueError for a stddev not positive.
CausalLmWeights initial_weights(const HfConfig& config, std::uint32_t seed, double stddev = 0.02);

}  // namespace numesh::models
