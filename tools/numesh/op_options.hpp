#pragma once

// The options of `numesh op`.

#include <cstdint>
#include <string>
#include <vector>

#include "mesh_options.hpp"
#include "numesh/ops/lowering/layer_table.hpp"

namespace numesh::tools {

/// The options of `numesh op`.
struct OpOptions {
  std::string op;    ///< mlp, attention, moe or block (the positional argument; ops::layer_table())
  MeshOptions mesh;  ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::string dir;   ///< --dir: folder of input .npy files
  std::string out;   ///< --out: folder for y.npy (default: --dir)
  std::string mode = "prefill";  ///< --mode: train, prefill, decode or insert
  std::int64_t position = -1;    ///< --position: insert's first position (default: half of T)
  std::string paxis_json;
  std::vector<std::string> sets;
  std::string kv_layout = "bthd";  ///< --kv-layout
  std::string dtype = "f32";       ///< --dtype: storage dtype of the operator's matrices
  bool refuse_nonfinite = false;   ///< --refuse-nonfinite: an input holding NaN or inf is an error
  /// --heads, --kv-heads, --rope-theta, --top-k, --capacity, --raw-weights, --norm-eps,
  /// --repeats, --no-check, --timing, --trace: what the layer's run reads.
  ops::LayerOptions layer;
  std::string json;  ///< --json FILE
};

}  // namespace numesh::tools
