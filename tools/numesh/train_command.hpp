#pragma once

// `numesh train`: trains a Hugging Face causal LM (config.json, and safetensors to start from
// or --init random) on the machine's mesh from token ids (.npy [S, T+1]) or text, with AdamW,
// gradient clipping and a warm-up/cosine schedule; logs each step to CSV, saves Hugging Face
// checkpoints with the optimizer's state, and resumes from them.

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh train`.
struct TrainOptions {
  MeshOptions mesh;                 ///< topology, placement, --dims, --names
  std::string mode = "train";       ///< --mode: the mode the semantic axes resolve in
  std::string paxis_json;           ///< --paxis-json FILE
  std::vector<std::string> sets;    ///< --set field=value
  std::string model;                ///< --model DIR: config.json (+ safetensors, optimizer state)
  std::string init = "checkpoint";  ///< --init checkpoint|random
  std::uint32_t seed = 0;           ///< --seed: random initial weights
  std::string data;                 ///< --data FILE: .npy [S, T+1] ids, or text
  std::int64_t tokens = 0;          ///< --tokens T: sequence length for text data
  std::int64_t batch = 8;           ///< --batch
  std::int64_t steps = 100;         ///< --steps: the step count to reach (resumed steps count)
  double lr = 1e-3;                 ///< --lr
  double weight_decay = 1e-2;       ///< --weight-decay (torch.optim.AdamW's default)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< --beta1, --beta2, --eps
  double clip = 1.0;                              ///< --clip: max global gradient norm; 0: none
  std::int64_t warmup = 0;                        ///< --warmup steps
  std::string schedule = "constant";              ///< --schedule constant|cosine
  std::string log;                                ///< --log FILE.csv
  /// --router-aux-loss-coef (NaN: as config.json says, transformers' output_router_logits)
  double router_aux_loss_coef = std::numeric_limits<double>::quiet_NaN();
  std::string dtype = "f32";      ///< --dtype: the compute dtype (f32 or bf16; weights stay f32)
  std::string trace;              ///< --trace FILE.json: the last step's program as a Chrome trace
  std::string save;               ///< --save DIR
  std::int64_t save_every = 0;    ///< --save-every K (0: only at the end)
  bool refuse_nonfinite = false;  ///< --refuse-nonfinite: a weight holding NaN or inf is an error
  bool quiet = false;             ///< --quiet: no progress on stderr
};

/// Registers `train`. Not thread-safe (CLI11 setup).
CLI::App* add_train_command(CLI::App& app, TrainOptions& options);

/// Checks every option and the data, builds the trainer, trains and reports to `out`.
/// Returns 0.
/// Throws: numesh::Error naming a bad option, file, id or checkpoint (before the first step).
int run_train(const TrainOptions& options, std::ostream& out);

}  // namespace numesh::tools
