#pragma once

// The operators of `numesh op`, one table entry each: its name, its input files, its line of
// --help and the function that builds it on the mesh, runs it and returns what it produced.
// run_op (op_command.cpp) does everything the operators share: options, file checks, the mesh,
// the report, the check against the dense reference, y.npy and --json. Adding an operator is
// one entry in op_table() (op_table.cpp) and its run function.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/attention_config.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/semantic_axis.hpp"
#include "op_options.hpp"

namespace numesh::tools {

/// The folder of input .npy files (`--dir`).
struct OpInputs {
  std::filesystem::path dir;
  /// --refuse-nonfinite: an input holding NaN or infinities is an error, not a note.
  bool refuse_nonfinite = false;
  /// Where an input's non-finite values are noted (nullptr: nowhere).
  std::ostream* notes = nullptr;
  /// `name`.npy, loaded. Non-finite values in it are noted, counted and located ("note: x.npy
  /// holds 1 non-finite value of 24 (the first, nan, at [1, 2])"), or refused.
  /// Throws: what models::load_npy throws (IoError naming the file); ValueError with that text
  /// when refuse_nonfinite.
  runtime::HostTensor load(const std::string& name) const;
  /// True when `name`.npy exists.
  bool has(const std::string& name) const;
};

/// The input files of an operator besides x: `required` always, then `when_present` if
/// `switch_file`.npy exists (it picks the variant: SwiGLU over GELU, MoE over MLP) and
/// `when_absent` otherwise. Names without ".npy", in the order errors list them.
struct OpFiles {
  std::vector<std::string> required;
  std::string switch_file;  ///< empty: no variant
  std::vector<std::string> when_present;
  std::vector<std::string> when_absent;
};

/// Which tokens of x [B, T, H] the timed call runs, after which prefix: prefill/train run all
/// T from 0; decode runs the last token after the others; insert runs [position, T) after
/// [0, position). For operators on x [T, H]: {0, T}.
struct TokenPlan {
  std::int64_t prefix = 0;  ///< tokens written to the cache first
  std::int64_t count = 0;   ///< tokens of the timed call, at position `prefix`
};

/// What run_op hands an operator's run function: the options and everything run_op checked
/// and built from them. References live for the duration of the call.
struct OpContext {
  const OpOptions& options;
  const OpInputs& inputs;        ///< every file of needed_files() exists
  const runtime::HostTensor& x;  ///< of the rank OpEntry::sequence says
  sharding::Mode mode;
  const ops::ModelAxes& axes;  ///< resolved in `mode`
  const runtime::DeviceMesh& mesh;
  ops::KvLayout kv_layout;
  TokenPlan tokens;
  DType weights = DType::kF32;  ///< --dtype: the storage dtype of the operator's matrices
};

/// What an operator's run produced.
struct OpResult {
  runtime::HostTensor y;                    ///< the timed call's output
  std::optional<runtime::HostTensor> want;  ///< the dense reference's output (not with --no-check)
  ops::ProgramPlan plan;               ///< a copy: the layer (and its program) dies with the run
  double seconds = 0.0;                ///< median of --repeats timed calls
  std::optional<ops::MoeStats> stats;  ///< routing of the last call, for operators with a MoE
  std::string timing_table;            ///< --timing: the per-node table of one more run
};

/// One operator of `numesh op`.
struct OpEntry {
  std::string_view name;  ///< the positional argument: mlp, attention, ...
  /// Its input files and shapes, as the "Input files" part of --help lists them (lines after
  /// the first are indented under it).
  std::string_view inputs_help;
  /// True: x is [B, T, H] and --mode/--position choose the timed tokens (TokenPlan); false:
  /// x is [T, H] and the call runs all T.
  bool sequence = false;
  OpFiles files;
  /// Builds the operator on ctx.mesh from ctx.inputs, times --repeats calls (median), runs
  /// the --timing/--trace run, and computes the dense reference's output unless --no-check.
  /// Prints nothing. Throws: ValueError / ShapeError naming a bad option or shape (before
  /// anything runs); IoError for a --trace file it cannot write.
  OpResult (*run)(const OpContext& ctx) = nullptr;
};

/// Every operator, in the order --help lists them. Thread-safe (built once).
std::span<const OpEntry> op_table();

/// The entry named `name`, or nullptr. Thread-safe.
const OpEntry* find_op(std::string_view name);

/// The operators' names as a sentence: "mlp, attention, moe or block". Thread-safe.
std::string op_names_text();

/// x, then the files `entry` needs given which files `inputs` holds (OpFiles). Thread-safe.
std::vector<std::string> needed_files(const OpEntry& entry, const OpInputs& inputs);

}  // namespace numesh::tools
