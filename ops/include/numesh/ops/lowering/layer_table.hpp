#pragma once

// The layers that run alone, one table entry each: `numesh op` reads their inputs from .npy
// files, Python's numesh.ops from NumPy arrays. An entry holds the layer's name, its inputs,
// its line of --help and the function that builds it on the mesh, runs it and returns what it
// produced; the front ends do the rest (options, the report, the check, where y goes). Adding
// an operator is one entry in layer_table() (layer_table.cpp) and its run function.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/option_text.hpp"
#include "numesh/ops/attention_config.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::ops {

/// Where a layer's named inputs (x, wq, router, ...) come from, and how errors name them: a
/// folder of .npy files for `numesh op`, the arrays of a call for numesh.ops.
class LayerInputs {
 public:
  virtual ~LayerInputs() = default;
  /// The input `name`. REQUIRES: has(name). Throws: what the source throws for one it cannot
  /// read (IoError for a file).
  [[nodiscard]] virtual runtime::HostTensor load(const std::string& name) const = 0;
  /// True when the input `name` was given.
  [[nodiscard]] virtual bool has(const std::string& name) const = 0;
  /// The input as errors name it: "wq.npy" for a file, "wq" for an argument.
  [[nodiscard]] virtual std::string label(std::string_view name) const = 0;
  /// How errors name the caller's options (numesh::option_text): flags for the command line,
  /// keywords for Python.
  [[nodiscard]] virtual OptionStyle option_style() const = 0;
};

/// The inputs of a layer besides x: `required` always, then `when_present` if `switch_input`
/// is given (it picks the variant: SwiGLU over GELU, MoE over MLP) and `when_absent`
/// otherwise. In the order errors list them.
struct LayerInputNames {
  std::vector<std::string> required;
  std::string switch_input;  ///< empty: no variant
  std::vector<std::string> when_present;
  std::vector<std::string> when_absent;
};

/// Which tokens of x [B, T, H] the timed call runs, after which prefix: prefill/train run all
/// T from 0; decode runs the last token after the others; insert runs [position, T) after
/// [0, position). For layers on x [T, H]: {0, T}.
struct TokenPlan {
  std::int64_t prefix = 0;  ///< tokens written to the cache first
  std::int64_t count = 0;   ///< tokens of the timed call, at position `prefix`
};

/// The options of a layer run alone (`numesh op`'s flags, numesh.ops's keywords); each layer
/// reads those that apply to it.
struct LayerOptions {
  std::int64_t heads = 0;       ///< query heads (attention, block)
  std::int64_t kv_heads = 0;    ///< key/value heads (0: heads)
  double rope_theta = 10000.0;  ///< RoPE base (0: no RoPE)
  std::int64_t top_k = 2;       ///< experts per token (moe, block)
  double capacity = 0.0;        ///< MoE capacity factor (0: dropless)
  bool raw_weights = false;     ///< MoE: no top-k renormalisation
  double norm_eps = 1e-6;       ///< RMSNorm epsilon (block)
  int repeats = 5;              ///< timed runs (the median is reported)
  bool no_check = false;        ///< skip the dense reference
  bool timing = false;          ///< the per-node timing table of one more run
  std::string trace;            ///< a Chrome trace of that run to this file (empty: none)
};

/// What a layer's run function receives: the options and everything the front end checked and
/// built from them. References live for the duration of the call.
struct LayerContext {
  const LayerOptions& options;
  const LayerInputs& inputs;        ///< every input of needed_inputs() is given
  const runtime::HostTensor& x;     ///< of the rank LayerEntry::sequence says (check_x)
  sharding::Mode mode;              ///< the mode the axes resolved in
  const ModelAxes& axes;            ///< resolved in `mode`
  const runtime::DeviceMesh& mesh;  ///< the devices the layer is built on
  KvLayout kv_layout;               ///< the KV cache's layout (attention, block)
  TokenPlan tokens;                 ///< the timed call's tokens (token_plan)
  DType weights = DType::kF32;      ///< the storage dtype of the layer's matrices
};

/// What a layer's run produced.
struct LayerResult {
  runtime::HostTensor y;                    ///< the timed call's output
  std::optional<runtime::HostTensor> want;  ///< the dense reference's output (not with no_check)
  ProgramPlan plan;               ///< a copy: the layer (and its program) dies with the run
  double seconds = 0.0;           ///< median of `repeats` timed calls
  std::optional<MoeStats> stats;  ///< routing of the last call, for layers with a MoE
  std::string timing_table;       ///< options.timing: the per-node table of one more run
};

/// One layer that runs alone.
struct LayerEntry {
  std::string_view name;  ///< mlp, attention, ...
  /// Its inputs and shapes, as the "Input files" part of `numesh op --help` lists them (lines
  /// after the first are indented under it).
  std::string_view inputs_help;
  /// True: x is [B, T, H] and the mode and position choose the timed tokens (TokenPlan);
  /// false: x is [T, H] and the call runs all T.
  bool sequence = false;
  LayerInputNames inputs;
  /// Builds the layer on ctx.mesh from ctx.inputs, times `repeats` calls (median), runs the
  /// timing/trace run, and computes the dense reference's output unless no_check. Prints
  /// nothing. Throws: ValueError / ShapeError naming a bad option or shape (before anything
  /// runs); IoError for a trace file it cannot write.
  LayerResult (*run)(const LayerContext& ctx) = nullptr;
};

/// Every layer, in the order --help lists them. Thread-safe (built once).
[[nodiscard]] std::span<const LayerEntry> layer_table();

/// The entry named `name`, or nullptr. Thread-safe.
[[nodiscard]] const LayerEntry* find_layer(std::string_view name);

/// The layers' names as a sentence: "mlp, attention, moe or block". Thread-safe.
[[nodiscard]] std::string layer_names_text();

/// x, then the inputs `entry` needs given which ones `inputs` has (LayerInputNames).
[[nodiscard]] std::vector<std::string> needed_inputs(const LayerEntry& entry,
                                                     const LayerInputs& inputs);

/// Checks that x has the rank `entry` takes. Throws: ShapeError ("x.npy is [2, 3, 4, 5]; mlp
/// takes x [T, H]").
void check_x(const LayerEntry& entry, const runtime::HostTensor& x, const LayerInputs& inputs);

/// The tokens the timed call of `entry` runs on x (checked by check_x) in `mode`; `position`
/// is insert's first position (negative: half of T). Throws: ValueError for a position at or
/// past T in insert, or a positive one outside insert, named as `inputs` names options
/// (option_style).
[[nodiscard]] TokenPlan token_plan(const LayerEntry& entry, const runtime::HostTensor& x,
                                   sharding::Mode mode, std::int64_t position,
                                   const LayerInputs& inputs);

}  // namespace numesh::ops
