// optimizer_check_main: runs AdamW with the global-norm clip and a cosine learning rate, with a
// warm-up and without one, on sharded parameters over several meshes, and writes what
// optimizer_check.py compares with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and the
// same schedule in float64:
//   DIR/param{i}.npy                   the initial parameters
//   DIR/grad{k}_{i}.npy                step k's gradients (before clipping)
//   DIR/{mesh}_w{warmup}_param{i}.npy  the parameters after the last step
//   DIR/results.json                   hyper-parameters, and per run (mesh and warm-up) the norms
//                                      and learning rates
//   optimizer_check_main DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "numesh/models/formats/npy.hpp"
#include "numesh/ops/optimizer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/topology.hpp"

namespace rt = numesh::runtime;
using numesh::ops::AdamW;
using numesh::ops::AdamWOptions;
using numesh::ops::LearningRateSchedule;
using numesh::sharding::AxisRule;
using numesh::sharding::PartitionSpec;

namespace {

rt::HostTensor random_tensor(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  rt::HostTensor t = rt::HostTensor::zeros(std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (float& x : t.data) x = uniform(rng);
  return t;
}

struct MeshChoice {
  std::string label;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: optimizer_check_main DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  constexpr int kSteps = 12;
  const AdamWOptions options{
      .lr = 0.05, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const double max_norm = 1.0;
  // A matrix split over tp, a vector replicated; gradients large enough that the clip acts.
  const std::vector<rt::HostTensor> initial{random_tensor({8, 6}, 1, 1.0f),
                                            random_tensor({5}, 2, 1.0f)};
  for (std::size_t i = 0; i < initial.size(); ++i) {
    numesh::models::save_npy(dir / ("param" + std::to_string(i) + ".npy"), initial[i]);
  }
  std::vector<std::vector<rt::HostTensor>> grads(kSteps);
  for (int k = 0; k < kSteps; ++k) {
    // Shrinking gradients: the first steps are clipped, the last ones not.
    const float scale = 2.0f / static_cast<float>(k + 1);
    grads[static_cast<std::size_t>(k)] = {
        random_tensor({8, 6}, 100 + static_cast<std::uint32_t>(k), scale),
        random_tensor({5}, 200 + static_cast<std::uint32_t>(k), scale)};
    for (std::size_t i = 0; i < 2; ++i) {
      numesh::models::save_npy(
          dir / ("grad" + std::to_string(k) + "_" + std::to_string(i) + ".npy"),
          grads[static_cast<std::size_t>(k)][i]);
    }
  }
  nlohmann::json runs = nlohmann::json::array();
  // A warm-up of 3 steps runs the first step at learning rate 0 (transformers' schedule), which
  // would hide a wrong first step of AdamW; the run without one moves the parameters at step 1.
  const std::vector<MeshChoice> meshes{
      {"tp1", {1}, {"tp"}}, {"tp2", {2}, {"tp"}}, {"dp2xtp2", {2, 2}, {"dp", "tp"}}};
  for (const std::int64_t warmup : {3, 0}) {
    for (const MeshChoice& m : meshes) {
      const LearningRateSchedule schedule{.lr = options.lr,
                                          .warmup = warmup,
                                          .total = kSteps,
                                          .kind = LearningRateSchedule::Kind::kCosine};
      const std::string run = m.label + "_w" + std::to_string(warmup);
      std::int64_t devices = 1;
      for (std::int64_t d : m.dims) devices *= d;
      const rt::DeviceMesh mesh = rt::DeviceMesh::create(
          rt::DeviceSet::create(
              rt::Topology::from_synthetic("numa:" + std::to_string(devices) + " core:1 pu:1")),
          m.dims, m.names);
      const std::vector<PartitionSpec> specs{PartitionSpec({AxisRule("tp"), AxisRule()}),
                                             PartitionSpec({AxisRule()})};
      std::vector<std::unique_ptr<rt::ShardedTensor>> params;
      std::vector<rt::ShardedTensor*> raw;
      for (std::size_t i = 0; i < 2; ++i) {
        params.push_back(std::make_unique<rt::ShardedTensor>(mesh, initial[i].shape, specs[i]));
        rt::scatter(initial[i], *params.back());
        raw.push_back(params.back().get());
      }
      AdamW adam(raw, options);
      nlohmann::json norms = nlohmann::json::array(), lrs = nlohmann::json::array();
      for (int k = 0; k < kSteps; ++k) {
        std::vector<std::unique_ptr<rt::ShardedTensor>> g;
        std::vector<rt::ShardedTensor*> g_raw;
        for (std::size_t i = 0; i < 2; ++i) {
          g.push_back(std::make_unique<rt::ShardedTensor>(mesh, initial[i].shape, specs[i]));
          rt::scatter(grads[static_cast<std::size_t>(k)][i], *g.back());
          g_raw.push_back(g.back().get());
        }
        norms.push_back(numesh::ops::clip_grad_norm(g_raw, max_norm));
        const double lr = schedule.at(k);
        lrs.push_back(lr);
        const std::vector<const rt::ShardedTensor*> const_grads(g_raw.begin(), g_raw.end());
        adam.step(const_grads, lr);
      }
      for (std::size_t i = 0; i < 2; ++i) {
        numesh::models::save_npy(dir / (run + "_param" + std::to_string(i) + ".npy"),
                                 rt::gather(*params[i]));
      }
      runs.push_back(
          {{"run", run}, {"mesh", m.label}, {"warmup", warmup}, {"norms", norms}, {"lrs", lrs}});
    }
  }
  std::ofstream(dir / "results.json") << nlohmann::json{{"steps", kSteps},
                                                        {"lr", options.lr},
                                                        {"beta1", options.beta1},
                                                        {"beta2", options.beta2},
                                                        {"eps", options.eps},
                                                        {"weight_decay", options.weight_decay},
                                                        {"total", kSteps},
                                                        {"max_norm", max_norm},
                                                        {"runs", runs}}
                                             .dump(2);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "optimizer_check_main: %s\n", e.what());
  return 1;
}
