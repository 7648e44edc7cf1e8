// train_check_main: trains the tiny Hugging Face checkpoints train_check.py wrote (DIR/NAME,
// listed in DIR/cases.json with the options) with CausalLmTrainer on many meshes, and writes
// what the script compares with the same run in PyTorch: each step's loss and gradient norm
// (DIR/results.json) and the final checkpoint (DIR/runs/NAME_MESH, numesh's save). One run stops
// halfway, saves, and resumes from the saved folder in a new trainer.
//   train_check_main DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/models/lm/trainer.hpp"

namespace {

namespace fs = std::filesystem;
namespace rt = numesh::runtime;
using nlohmann::json;
using numesh::models::CausalLmTrainer;

using numesh::models::testing::make_mesh;
using numesh::models::testing::MeshChoice;

// The ZeRO-3 axis splits the MLP weights whenever the mesh has it; tokens go over sp, and
// over ep too when `tokens_over_ep` (the MoE blocks then dispatch by all-to-all).
numesh::ops::ModelAxes axes_for(const MeshChoice& m, bool tokens_over_ep = false) {
  numesh::ops::ModelAxes axes;
  for (const std::string& name : m.names) {
    if (name == "fsdp") axes.weights = {"fsdp"};
  }
  if (tokens_over_ep) axes.batch.push_back("ep");
  return axes;
}

numesh::models::TrainingOptions options_of(const json& o) {
  numesh::models::TrainingOptions t;
  t.batch = o["batch"];
  t.tokens = o["tokens"];
  t.adamw = numesh::ops::AdamWOptions{.lr = o["lr"],
                                      .beta1 = o["beta1"],
                                      .beta2 = o["beta2"],
                                      .eps = o["eps"],
                                      .weight_decay = o["weight_decay"]};
  t.clip = o["clip"];
  t.schedule = numesh::ops::LearningRateSchedule{
      .lr = o["lr"],
      .warmup = o["warmup"],
      .total = o["steps"],
      .kind = o["schedule"] == "cosine" ? numesh::ops::LearningRateSchedule::Kind::kCosine
                                        : numesh::ops::LearningRateSchedule::Kind::kConstant};
  return t;
}

// What a run's steps gave: each step's loss and its gradients' global norm before clipping.
struct Trajectory {
  json losses = json::array();
  json grad_norms = json::array();
};

// Steps [from, to) of `trainer` on `data`, appended to `out`.
void train(CausalLmTrainer& trainer, const numesh::models::NpyIds& data, std::int64_t from,
           std::int64_t to, const numesh::models::TrainingOptions& o, Trajectory& out) {
  for (std::int64_t k = from; k < to; ++k) {
    const numesh::models::StepStats s =
        trainer.step(numesh::models::training_batch(data.values, data.shape, k, o.batch, o.tokens));
    out.losses.push_back(s.loss);
    out.grad_norms.push_back(s.grad_norm);
  }
}

void run(const fs::path& dir) {
  json spec;
  std::ifstream(dir / "cases.json") >> spec;
  const numesh::models::TrainingOptions options = options_of(spec["options"]);
  const std::int64_t steps = spec["options"]["steps"];
  const std::vector<MeshChoice> meshes{{"tp1", {1}, {"tp"}},
                                       {"tp2", {2}, {"tp"}},
                                       {"tp4", {4}, {"tp"}},
                                       {"dp2", {2}, {"dp"}},
                                       {"fsdp2", {2}, {"fsdp"}},
                                       {"sp2", {2}, {"sp"}},
                                       {"dp2xtp2", {2, 2}, {"dp", "tp"}},
                                       {"sp2xtp2", {2, 2}, {"sp", "tp"}},
                                       {"dp2xfsdp2xtp2", {2, 2, 2}, {"dp", "fsdp", "tp"}},
                                       {"dp2xsp2xtp2", {2, 2, 2}, {"dp", "sp", "tp"}}};
  // The MoE model's experts split over ep, alone and with every other axis.
  const std::vector<MeshChoice> moe_meshes{{"tp1", {1}, {"tp"}},
                                           {"tp2", {2}, {"tp"}},
                                           {"ep2", {2}, {"ep"}},
                                           {"dp2", {2}, {"dp"}},
                                           {"ep4", {4}, {"ep"}},
                                           {"sp2xep2", {2, 2}, {"sp", "ep"}},
                                           {"dp2xep2", {2, 2}, {"dp", "ep"}},
                                           {"ep2xtp2", {2, 2}, {"ep", "tp"}},
                                           {"fsdp2xep2", {2, 2}, {"fsdp", "ep"}},
                                           {"dp2xep2xtp2", {2, 2, 2}, {"dp", "ep", "tp"}}};
  // The MoE models once more with the tokens split over ep as well (GShard's all-to-all
  // dispatch and combine, and their transposes in the backward).
  const std::vector<MeshChoice> all_to_all_meshes{{"ep2_a2a", {2}, {"ep"}},
                                                  {"dp2xep2_a2a", {2, 2}, {"dp", "ep"}},
                                                  {"ep2xtp2_a2a", {2, 2}, {"ep", "tp"}}};
  json results = json::array();
  for (const json& c : spec["cases"]) {
    const std::string name = c["name"];
    const numesh::models::NpyIds data = numesh::models::load_npy_ids(dir / name / "data.npy");
    const bool moe = c.value("moe", false);
    const std::vector<MeshChoice>& run_on = moe ? moe_meshes : meshes;
    std::vector<std::pair<MeshChoice, bool>> runs;  // each mesh, and whether its tokens go over ep
    for (const MeshChoice& m : run_on) runs.emplace_back(m, false);
    if (moe) {
      for (const MeshChoice& m : all_to_all_meshes) runs.emplace_back(m, true);
    }
    for (const auto& [m, tokens_over_ep] : runs) {
      CausalLmTrainer trainer =
          CausalLmTrainer::load(make_mesh(m), dir / name, options, axes_for(m, tokens_over_ep));
      Trajectory run;
      train(trainer, data, 0, steps, options, run);
      const fs::path out = dir / "runs" / (name + "_" + m.label);
      trainer.save(out);
      results.push_back({{"case", name},
                         {"mesh", m.label},
                         {"losses", run.losses},
                         {"grad_norms", run.grad_norms},
                         {"checkpoint", fs::relative(out, dir)}});
      std::printf("trained %s on %s\n", name.c_str(), m.label.c_str());
    }
    // Stopped halfway on tp2, saved, resumed by a new trainer on dp2 (MoE: ep2) from the saved
    // folder.
    Trajectory run;
    const fs::path half = dir / "runs" / (name + "_half");
    {
      CausalLmTrainer first = CausalLmTrainer::load(make_mesh(run_on[1]), dir / name, options);
      train(first, data, 0, steps / 2, options, run);
      first.save(half);
    }
    const MeshChoice& second = run_on[2 + !c.value("moe", false)];  // dp2, or ep2 for MoE
    CausalLmTrainer resumed = CausalLmTrainer::load(make_mesh(second), half, options);
    train(resumed, data, resumed.steps(), steps, options, run);
    const fs::path out = dir / "runs" / (name + "_resumed");
    resumed.save(out);
    results.push_back({{"case", name},
                       {"mesh", "tp2 then resumed on " + second.label},
                       {"losses", run.losses},
                       {"grad_norms", run.grad_norms},
                       {"checkpoint", fs::relative(out, dir)}});
  }
  std::ofstream(dir / "results.json") << json{{"results", results}}.dump(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: train_check_main DIR\n");
    return 2;
  }
  try {
    run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_check_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
