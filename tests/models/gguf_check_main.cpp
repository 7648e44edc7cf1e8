// gguf_check_main: loads the GGUF files gguf_check.py converted (DIR/NAME/model.FMT.gguf) and the
// safetensors checkpoints they came from (DIR/NAME), the latter stored in the file's format (a
// mixture's matrices each in its own), on meshes of 1, 2 and 4 devices (and expert-parallel ones
// for MoE models), and writes what the script checks: the configs' differences, whether the
// prompt's logits are the same bits and the greedy tokens the same, and the formats a default
// load keeps (DIR/results.json).
//   gguf_check_main DIR

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/gguf_export.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/models/hf/weight_formats.hpp"
#include "numesh/models/lm/causal_lm.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using numesh::models::CausalLm;
using numesh::models::HfConfig;
using numesh::models::testing::make_mesh;
using numesh::models::testing::MeshChoice;

// The fields of the GGUF file's config that differ from config.json's.
std::vector<std::string> config_differences(const HfConfig& a, const HfConfig& b) {
  std::vector<std::string> out;
  const auto same = [&](const char* field, const auto& x, const auto& y) {
    if (!(x == y)) out.push_back(field);
  };
  same("architecture", a.architecture, b.architecture);
  same("vocab_size", a.vocab_size, b.vocab_size);
  same("hidden_size", a.hidden_size, b.hidden_size);
  same("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  same("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  same("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  same("head_dim", a.head_dim, b.head_dim);
  // GGUF stores the epsilon as float32: compared at that precision.
  same("rms_norm_eps", static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));
  same("rope_theta", static_cast<float>(a.rope_theta), static_cast<float>(b.rope_theta));
  same("max_position_embeddings", a.max_position_embeddings, b.max_position_embeddings);
  same("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  same("qkv_bias", a.qkv_bias, b.qkv_bias);
  same("o_bias", a.o_bias, b.o_bias);
  same("mlp_bias", a.mlp_bias, b.mlp_bias);
  same("qk_norm", a.qk_norm, b.qk_norm);
  same("num_experts", a.num_experts, b.num_experts);
  same("num_experts_per_tok", a.num_experts_per_tok, b.num_experts_per_tok);
  same("moe_intermediate_size", a.moe_intermediate_size, b.moe_intermediate_size);
  same("norm_topk_prob", a.norm_topk_prob, b.norm_topk_prob);
  same("shared_expert_intermediate_size", a.shared_expert_intermediate_size,
       b.shared_expert_intermediate_size);
  for (std::int64_t l = 0; l < a.num_hidden_layers; ++l) {
    if (a.is_moe_layer(l) != b.is_moe_layer(l)) out.push_back(fmt::format("layer {} MoE", l));
  }
  if (a.is_moe_layer(0) || a.num_experts == 0)
    same("intermediate_size", a.intermediate_size, b.intermediate_size);
  same("bos_token_ids", a.bos_token_ids, b.bos_token_ids);
  same("eos_token_ids", a.eos_token_ids, b.eos_token_ids);
  return out;
}

void run(const fs::path& dir) {
  json cases;
  std::ifstream(dir / "cases.json") >> cases;
  json results = json::array();
  for (const json& c : cases["cases"]) {
    const std::string name = c["name"];
    const HfConfig config = HfConfig::load(dir / name);
    const auto safetensors = numesh::models::SafetensorsCheckpoint::open(dir / name);
    std::vector<std::int32_t> prompt;
    for (const json& row : c["prompt"]) {
      for (const json& id : row) prompt.push_back(id.get<std::int32_t>());
    }
    const auto batch = static_cast<std::int64_t>(c["prompt"].size());
    const auto prompt_len = static_cast<std::int64_t>(prompt.size()) / batch;
    std::vector<MeshChoice> meshes{
        {"tp1", {1}, {"tp"}}, {"tp2", {2}, {"tp"}}, {"dp2xtp2", {2, 2}, {"dp", "tp"}}};
    if (config.num_experts > 0) meshes.push_back({"ep2xtp2", {2, 2}, {"ep", "tp"}});
    for (const json& format : c["formats"]) {
      const std::string fmt_name = format.get<std::string>();
      // llama.cpp's Q4_K_M and Q5_K_M mixtures: most bytes Q4_K or Q5_K, some matrices Q6_K.
      const bool mixture = fmt_name.ends_with("_k_m");
      const numesh::DType stored =
          numesh::parse_dtype(mixture ? fmt_name.substr(0, fmt_name.size() - 2) : fmt_name);
      const fs::path file = dir / name / ("model." + fmt_name + ".gguf");
      const auto gguf = numesh::models::GgufCheckpoint::open(file);
      std::vector<std::string> differences = config_differences(config, gguf.config());
      if (gguf.stored_dtype() != stored) differences.push_back("stored_dtype");
      // Each matrix in the format the file stores it in (one format, or the mixture's), for the
      // file and for the safetensors checkpoint it came from alike.
      const numesh::models::WeightFormats formats =
          mixture ? numesh::models::WeightFormats::as_stored(gguf) : stored;
      // The formats a default load (no dtype asked) keeps, as numesh generate prints them.
      const std::string loaded_as =
          numesh::models::Engine::load(numesh::models::ModelSource::open(file),
                                       make_mesh(meshes.front()), {.context = prompt_len + 1})
              .formats();
      // The formats the load gives a few matrices the mixture treats differently.
      const numesh::models::CausalLmWeights layout =
          numesh::models::CausalLmWeights::deferred(gguf.config(), gguf, formats).weights;
      const auto& blocks = layout.stack.blocks;
      const json matrix_formats = {
          {"embedding", numesh::to_string(layout.embedding.stored_as)},
          {"lm_head", numesh::to_string(layout.lm_head.stored_as)},
          {"layers.0.wq", numesh::to_string(blocks.front().attention.stored_as.wq)},
          {"layers.0.wv", numesh::to_string(blocks.front().attention.stored_as.wv)},
          {"layers.1.wv", numesh::to_string(blocks.back().attention.stored_as.wv)},
          {"layers.0.down", numesh::to_string(blocks.front().mlp.stored_as.down)},
          {"layers.1.down", numesh::to_string(blocks.back().mlp.stored_as.down)}};
      // numesh's own writer, from the same checkpoint: read back below, and compared with the
      // script's file by the script (it writes one format: not for a mixture).
      const fs::path written = dir / name / ("numesh." + fmt_name + ".gguf");
      std::string refused;
      if (!mixture) {
        try {
          (void)numesh::models::write_gguf(numesh::models::ModelSource::open(dir / name), written,
                                           stored);
        } catch (const numesh::NotImplementedError& e) {
          refused = e.what();
        }
      }
      std::optional<numesh::models::GgufCheckpoint> own;
      if (refused.empty() && !mixture) {
        own.emplace(numesh::models::GgufCheckpoint::open(written));
        for (const std::string& d : config_differences(config, own->config()))
          differences.push_back("numesh's file: " + d);
      }
      for (const MeshChoice& m : meshes) {
        const numesh::runtime::DeviceMesh mesh = make_mesh(m);
        CausalLm want = CausalLm::load(mesh, config, safetensors, batch, prompt_len + 1, formats);
        CausalLm got = CausalLm::load(mesh, gguf.config(), gguf, batch, prompt_len + 1, formats);
        const auto a = want.logits(prompt, prompt_len, 0), b = got.logits(prompt, prompt_len, 0);
        // The same bits, or (a model whose RoPE scaling the file holds as f32 divisors) within
        // the case's tolerance, relative to the largest logit.
        const double tolerance = c["tolerance"].get<double>();
        const auto within = [&](const std::vector<float>& x, const std::vector<float>& y) {
          if (x.size() != y.size()) return false;
          if (tolerance == 0) {
            return std::equal(x.begin(), x.end(), y.begin(), [](float p, float q) {
              return std::bit_cast<std::uint32_t>(p) == std::bit_cast<std::uint32_t>(q);
            });
          }
          float diff = 0, largest = 0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            diff = std::max(diff, std::abs(x[i] - y[i]));
            largest = std::max(largest, std::abs(y[i]));
          }
          return static_cast<double>(diff) <= tolerance * static_cast<double>(largest);
        };
        float max_diff = 0;
        for (std::size_t i = 0; i < std::min(a.data.size(), b.data.size()); ++i)
          max_diff = std::max(max_diff, std::abs(a.data[i] - b.data[i]));
        const bool same_bits = within(b.data, a.data);
        const auto greedy_want = want.greedy(prompt, prompt_len, 0);
        const auto greedy_got = got.greedy(prompt, prompt_len, 0);
        bool own_same = true;
        if (own) {
          CausalLm back = CausalLm::load(mesh, own->config(), *own, batch, prompt_len + 1, stored);
          own_same = within(back.logits(prompt, prompt_len, 0).data, a.data) &&
                     back.greedy(prompt, prompt_len, 0) == greedy_want;
        }
        results.push_back({{"name", name},
                           {"format", fmt_name},
                           {"mesh", m.label},
                           {"config_differences", differences},
                           {"same_logits", same_bits},
                           {"max_diff", max_diff},
                           {"same_greedy", greedy_want == greedy_got},
                           {"formats", loaded_as},
                           {"matrix_formats", matrix_formats},
                           {"written", own.has_value() ? written.filename().string() : ""},
                           {"written_refused", refused},
                           {"written_same", own_same},
                           {"greedy", greedy_got},
                           {"expected_greedy", greedy_want}});
      }
    }
  }
  std::ofstream(dir / "results.json") << json{{"results", results}}.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_check_main DIR\n");
    return 2;
  }
  try {
    run(argv[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_check_main: %s\n", e.what());
    return 1;
  }
}
