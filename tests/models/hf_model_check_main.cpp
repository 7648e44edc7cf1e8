// hf_model_check_main: loads the tiny Hugging Face checkpoints hf_model_check.py wrote (DIR/NAME,
// listed in DIR/cases.json) through HfConfig, SafetensorsCheckpoint, CausalLmWeights and
// CausalLm on several meshes, and writes what the script compares with its PyTorch forward:
// the prompt's logits, the greedy tokens, each decode step's logits, and the perplexity of a
// token stream (DIR/results.json and .npy files).
//   hf_model_check_main DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/perplexity.hpp"

namespace {

namespace fs = std::filesystem;
namespace rt = numesh::runtime;
using nlohmann::json;
using numesh::models::CausalLm;

using numesh::models::testing::make_mesh;
using numesh::models::testing::MeshChoice;

void run(const fs::path& dir) {
  json cases;
  std::ifstream(dir / "cases.json") >> cases;
  json results = json::array();
  for (const json& c : cases["cases"]) {
    const std::string name = c["name"];
    const numesh::models::HfConfig config = numesh::models::HfConfig::load(dir / name);
    const auto checkpoint = numesh::models::SafetensorsCheckpoint::open(dir / name);
    std::vector<std::int32_t> prompt;
    for (const json& row : c["prompt"]) {
      for (const json& id : row) prompt.push_back(id.get<std::int32_t>());
    }
    const auto batch = static_cast<std::int64_t>(c["prompt"].size());
    const auto prompt_len = static_cast<std::int64_t>(prompt.size()) / batch;
    const std::int64_t new_tokens = c["new_tokens"];
    std::vector<MeshChoice> meshes{{"tp1", {1}, {"tp"}},
                                   {"tp2", {2}, {"tp"}},
                                   {"dp2", {2}, {"dp"}},
                                   {"dp2xtp2", {2, 2}, {"dp", "tp"}}};
    if (config.num_experts > 0) {
      meshes.push_back({"ep2", {2}, {"ep"}});
      meshes.push_back({"ep2xtp2", {2, 2}, {"ep", "tp"}});
    }
    for (const json& stored_name : c["stored"]) {
      const numesh::DType stored = numesh::parse_dtype(stored_name.get<std::string>());
      const auto weights = numesh::models::CausalLmWeights::load(config, checkpoint, stored);
      for (const MeshChoice& m : meshes) {
        const std::string tag = name + "_" + stored_name.get<std::string>() + "_" + m.label;
        const rt::DeviceMesh mesh = make_mesh(m);
        // Greedy generation: the prompt, then one token per sequence per step, on a model whose
        // devices read their shards straight from the checkpoint (CausalLm::load; the scorer
        // below takes the host path, so PyTorch checks both).
        CausalLm generator =
            CausalLm::load(mesh, config, checkpoint, batch, prompt_len + new_tokens, stored);
        std::vector<std::vector<std::int64_t>> generated(static_cast<std::size_t>(batch));
        std::vector<std::int64_t> next = generator.greedy(prompt, prompt_len, 0);
        std::vector<std::vector<std::int32_t>> fed;  // the tokens each decode step feeds
        for (std::int64_t step = 0; step < new_tokens; ++step) {
          for (std::int64_t b = 0; b < batch; ++b)
            generated[static_cast<std::size_t>(b)].push_back(next[static_cast<std::size_t>(b)]);
          if (step + 1 == new_tokens) break;
          fed.emplace_back(next.begin(), next.end());
          next = generator.greedy(fed.back(), 1, prompt_len + step);
        }
        // Logits: the whole prompt, then each decode step fed the greedy tokens.
        CausalLm scorer(mesh, config, weights, batch, prompt_len + new_tokens);
        const std::string prompt_file = tag + "_prompt_logits.npy";
        numesh::models::save_npy(dir / prompt_file, scorer.logits(prompt, prompt_len, 0));
        json step_files = json::array();
        for (std::size_t i = 0; i < fed.size(); ++i) {
          const std::string file = tag + "_step" + std::to_string(i + 1) + "_logits.npy";
          numesh::models::save_npy(
              dir / file, scorer.logits(fed[i], 1, prompt_len + static_cast<std::int64_t>(i)));
          step_files.push_back(file);
        }
        // Perplexity over the case's stream, as numesh perplexity computes it.
        const json& p = c["perplexity"];
        const std::int64_t context = p["context"];
        CausalLm ppl_model(mesh, config, weights, 1, context);
        const std::vector<std::int32_t> stream = p["tokens"].get<std::vector<std::int32_t>>();
        const double ppl =
            numesh::models::perplexity(ppl_model, stream, context, p["bos"].get<std::int32_t>())
                .perplexity;
        results.push_back({{"name", name},
                           {"stored", stored_name},
                           {"mesh", m.label},
                           {"prompt_logits", prompt_file},
                           {"greedy_ids", generated},
                           {"step_logits", step_files},
                           {"perplexity", ppl}});
      }
    }
  }
  std::ofstream(dir / "results.json") << json{{"results", results}}.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hf_model_check_main DIR\n");
    return 2;
  }
  try {
    run(argv[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_model_check_main: %s\n", e.what());
    return 1;
  }
}
