#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/mlp_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/placement.hpp"

namespace numesh::ops {

/// Mesh axes the MLP is split over. Every field has a default (eformer's axis names).
struct MlpAxes {
  /// Tokens (rows of x) are split over these axes (data parallel); replicated when the token
  /// count does not divide (eformer's correction).
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// Tokens are further split over these axes (sequence parallel), after the batch axes. When
  /// one of them is also the tensor axis (Megatron sequence parallelism, sp = tp), the tokens
  /// are all-gathered over it before the up projection and the partial sums are
  /// reduce-scattered back to the token split instead of all-reduced.
  std::vector<std::string> sequence = {};
  /// The weights' H dim is split over these axes (ZeRO-3 / FSDP, EasyDeL's ColumnWise
  /// ((fsdp, sp), tp)): each device stores 1/n of every weight, and every run all-gathers them
  /// before use. Empty: weights replicated along H.
  std::vector<std::string> weights = {};
  /// The intermediate dim F is split over this axis (tensor parallel): up and gate are
  /// column-parallel, down is row-parallel, and the partial sums of the down projection are
  /// all-reduced over it. Replicated (no collective) when F does not divide.
  std::string tensor = "tp";
};

/// An MLP's weights laid out on a mesh: up/gate P(None, tensor), down P(tensor, None) as [in,
/// out] matrices, stored out-in (up/gate [F, H], down [H, F], their specs swapped to match;
/// WeightLayout::kOutIn), each shard on its device's node (written by the device's own threads).
/// Shared by every program that runs the layer (prefill and decode programs read the same shards).
struct MlpLayer {
  MlpKind kind = MlpKind::kGelu;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::shared_ptr<runtime::ShardedTensor> gate;  ///< null for kGelu
  std::shared_ptr<runtime::ShardedTensor> up;
  std::shared_ptr<runtime::ShardedTensor> down;
  /// The optional biases (MlpWeights' gate_bias, up_bias, down_bias) as rows [1, n], fp32:
  /// gate's and up's split over the tensor axis as F is (each device adds its slice), down's
  /// replicated (added by one device per partial sum). Null when absent. Trainable parameters.
  std::shared_ptr<runtime::ShardedTensor> gate_bias, up_bias, down_bias;

  /// Validates the weights and lays them out. The tensor axis splits F when the mesh has it
  /// and F divides (eformer's correction), else the weights are replicated.
  /// Throws: ShapeError naming the shapes when the weights do not fit one another or a bias
  /// is misshapen (check_biases).
  [[nodiscard]] static MlpLayer create(const runtime::DeviceMesh& mesh, MlpKind kind,
                                       const MlpWeights& weights, const MlpAxes& axes = {});
};

/// What a forward emit_mlp keeps for its backward: the tensors as the products read them and
/// each device's intermediate values, all owned by the program. Filled by emit_mlp.
struct MlpSaved {
  runtime::ShardedTensor* x = nullptr;     ///< the input as multiplied (gathered over F's axes)
  runtime::ShardedTensor* up = nullptr;    ///< the weights as multiplied (gathered over H's axes)
  runtime::ShardedTensor* gate = nullptr;  ///< null for kGelu
  runtime::ShardedTensor* down = nullptr;
  /// Per mesh slot: x w_up (+ b_up) and, SwiGLU, x w_gate (+ b_gate), before the activation;
  /// and the activation's output, the down projection's input. Each [rows, F_local].
  std::vector<runtime::Tensor*> up_pre, gate_pre, hidden;
  std::vector<sharding::Placement> x_placed;        ///< the input's placements (before any gather)
  std::vector<sharding::Placement> partial_placed;  ///< the down projection's output's
  std::vector<sharding::Placement> y_placed;        ///< the output's
};

/// Emits y = mlp(x) into `program`: weights split along H are all-gathered (FSDP); tokens split
/// over an axis that also splits F are all-gathered over it (sequence parallelism); then per
/// device h = act(x_local w_up_local + b_up_local) (SwiGLU: silu(x w_gate + b_gate) .* (x w_up
/// + b_up)) and y_partial = h w_down_local (+ b_down on the first device of each partial sum), a
/// Partial(sum) over the axes splitting F, resharded into y's layout: an
/// all-reduce over tp, or a reduce-scatter when y's tokens are split over tp; nothing when F
/// is not split. x is [..., H] with H not split; y must have x's shape. Starts after `after`;
/// returns the frontier after which y is complete. Node and tensor names start with `name`. With
/// `saved`, the forward also keeps what emit_mlp_backward needs (one more [rows, F_local] buffer
/// per device for SwiGLU's gate). Throws: ShapeError when x or y do not fit the layer (naming the
/// shapes); as reshard().
runtime::Frontier emit_mlp(ProgramBuilder& program, const MlpLayer& layer,
                           runtime::ShardedTensor& x, const runtime::Frontier& after,
                           runtime::ShardedTensor& y, const std::string& name,
                           MlpSaved* saved = nullptr);

/// A parameter gradient for each of an MlpLayer's matrices, laid out as the matrix is
/// (gradient_like: stored out-in, same spec), fp32. gate is null for kGelu.
struct MlpGradients {
  std::shared_ptr<runtime::ShardedTensor> gate, up, down;
  std::shared_ptr<runtime::ShardedTensor> gate_bias, up_bias, down_bias;  ///< null where no bias
  /// Zero gradients laid out like `layer`'s matrices and biases.
  [[nodiscard]] static MlpGradients like(const MlpLayer& layer);
};

/// Emits the backward of the emit_mlp that filled `saved`: given dy (laid out as that y: its
/// gradient's canonical placement, gradients.hpp), fills dx (laid out as that x) and
/// overwrites the weights' gradients in `grads`. Per device: da = dy w_down, the activation's
/// backward, dx_partial = d_gate w_gate + d_up w_up, and each weight's dW = d_out^T in over the
/// device's rows. The collectives are the forward's transposed (gradients.hpp): dy gathered
/// over the F axes under sequence parallelism, dx_partial all-reduced over them (or
/// reduce-scattered to the token split), the weights' gradients all-reduced over the axes that
/// split the tokens and reduce-scattered over those that split the stored weights (FSDP).
/// The weights gathered for the forward are read again, not gathered twice. Biases get
/// their gradients too: their outputs' gradients summed over the rows, reduced as the weights'.
/// Returns the frontier after which dx and every gradient are complete.
/// `dx_ready` (when given) receives the frontier after which dx alone is complete: what the
/// next backward in a chain waits for, so that the gradients' reductions overlap the rest of
/// the backward instead of holding it up.
/// Throws: ShapeError when dy, dx or a gradient does not fit (naming the shapes);
/// ValueError when a bias of the layer has no gradient in `grads`.
runtime::Frontier emit_mlp_backward(ProgramBuilder& program, const MlpLayer& layer,
                                    const MlpSaved& saved, runtime::ShardedTensor& dy,
                                    const runtime::Frontier& after, runtime::ShardedTensor& dx,
                                    const MlpGradients& grads, const std::string& name,
                                    runtime::Frontier* dx_ready = nullptr);

/// The MLP lowered onto a device mesh as one program, compiled once, run many times:
/// x [T, H] sharded P(batch, None) (each device its rows, replicated over tp), MlpLayer's
/// weights, emit_mlp, y [T, H] like x. Specs pass through eformer's correction, so axes the
/// mesh lacks or that do not divide are replicated instead.
/// Not thread-safe: one thread drives an instance.
class ShardedMlp {
 public:
  /// Lays out the weights on the mesh and compiles the program for `tokens` rows.
  /// Throws: ShapeError naming the shapes when the weights do not fit one another or `tokens`
  /// is not positive; what the layout and correction throw for bad axes.
  ShardedMlp(runtime::DeviceMesh mesh, MlpKind kind, const MlpWeights& weights, std::int64_t tokens,
             MlpAxes axes = {});

  /// Runs the MLP on x [T, H] and returns y [T, H].
  /// Throws: ShapeError when x's shape is not [tokens, H]; what a node throws.
  runtime::HostTensor forward(const runtime::HostTensor& x);

  /// The specs chosen (after correction): x/y, and up/gate and down as [in, out] matrices.
  const sharding::PartitionSpec& activation_spec() const noexcept { return activation_spec_; }
  sharding::PartitionSpec up_spec() const { return swap_last_two(layer_.up->spec(), 2); }
  sharding::PartitionSpec down_spec() const { return swap_last_two(layer_.down->spec(), 2); }
  /// The collectives the program emits (empty: none needed).
  const std::vector<CollectivePlan>& collectives() const noexcept {
    return program_->plan().collectives;
  }
  /// The program (plan, graph).
  Program& program() noexcept { return *program_; }
  /// The compiled graph (DOT, timing).
  runtime::CompiledGraph& graph() noexcept { return program_->graph(); }

 private:
  MlpLayer layer_;
  std::int64_t tokens_;
  sharding::PartitionSpec activation_spec_;
  std::unique_ptr<Program> program_;
};

}  // namespace numesh::ops
