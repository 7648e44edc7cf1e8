#pragma once

// The options of `numesh op`, apart from the command so that the operator table (op_table.hpp)
// and the command that runs it (op_command.hpp) both read them without including each other.

#include <cstdint>
#include <string>
#include <vector>

#include "mesh_options.hpp"

namespace numesh::tools {

/// The options of `numesh op`.
struct OpOptions {
  std::string op;    ///< mlp, attention, moe or block (the positional argument; op_table.hpp)
  MeshOptions mesh;  ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::string dir;   ///< --dir: folder of input .npy files
  std::string out;   ///< --out: folder for y.npy (default: --dir)
  std::string mode = "prefill";  ///< --mode: train, prefill, decode or insert
  std::int64_t position = -1;    ///< --position: insert's first position (default: half of T)
  std::string paxis_json;
  std::vector<std::string> sets;
  std::int64_t heads = 0;          ///< --heads (attention, block)
  std::int64_t kv_heads = 0;       ///< --kv-heads (default: --heads)
  double rope_theta = 10000.0;     ///< --rope-theta (0: no RoPE)
  std::int64_t top_k = 2;          ///< --top-k (moe, block)
  double capacity = 0.0;           ///< --capacity (0: dropless)
  bool raw_weights = false;        ///< --raw-weights: no top-k renormalisation
  double norm_eps = 1e-6;          ///< --norm-eps (block)
  std::string kv_layout = "bthd";  ///< --kv-layout
  std::string dtype = "f32";       ///< --dtype: storage dtype of the operator's matrices
  int repeats = 5;                 ///< --repeats: timed runs (median)
  bool no_check = false;           ///< --no-check: skip the dense comparison
  bool refuse_nonfinite = false;   ///< --refuse-nonfinite: an input holding NaN or inf is an error
  std::string json;                ///< --json FILE
  bool timing = false;             ///< --timing: print the per-node timing of one more run
  std::string trace;               ///< --trace FILE: Chrome trace of that run
};

}  // namespace numesh::tools
