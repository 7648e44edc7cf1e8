#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "numesh/ops/kernels/routing.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops {

/// Mesh axes of a MoE layer. Every field has a default (eformer's axis names).
struct MoeAxes {
  /// Tokens split over these axes; each split is a routing group (GShard): top-k and capacity
  /// are decided among the group's tokens. When they include the expert axis, dispatch and
  /// combine are GShard's all-to-alls over it (fixed slot buffers of capacity C per expert);
  /// when they include the tensor axis, the tokens are all-gathered over the weights' axes and
  /// the outputs reduce-scattered back (EasyDeL's ring of experts).
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// Experts split over this axis (E must divide; else every device holds all experts).
  std::string expert = "ep";
  /// Each expert's intermediate dim F split over this axis (F must divide).
  std::string tensor = "tp";
};

/// A MoE layer's weights laid out on a mesh: router [H, E] replicated; gate/up [E, H, F]
/// P(ep, None, tp) and down [E, F, H] P(ep, tp, None) (EasyDeL's get_moe_partition_spec,
/// standard mode), each shard on its device's node. The experts' matrices are stored out-in
/// (WeightLayout::kOutIn: gate and up as [E, F, H] P(ep, tp, None), down as [E, H, F]
/// P(ep, None, tp)), as nn.Linear holds them and the dense layers store theirs. A shared expert is
/// an MlpLayer whose Fs is split over the tensor axis when the experts' F is (and Fs divides), else
/// replicated; its gate [H, 1] is replicated.
struct MoeLayer {
  MoeConfig config;
  std::int64_t hidden = 0;
  std::int64_t ffn = 0;            ///< F, per expert
  std::int64_t local_experts = 0;  ///< experts per device
  std::int64_t local_ffn = 0;      ///< F per device
  std::shared_ptr<runtime::ShardedTensor> router, gate, up, down;
  std::optional<MlpLayer> shared_expert;                       ///< none without one
  std::shared_ptr<runtime::ShardedTensor> shared_expert_gate;  ///< null without one

  /// Validates and lays out the weights.
  /// Throws: ValueError when top_k is not in [1, num_experts] (naming both) or
  /// capacity_factor is negative, or when the experts are in a block format and H or a
  /// device's share of F is not a whole number of blocks (naming the matrix and its split);
  /// ShapeError naming the shapes when the weights or the shared expert (check_shared_expert)
  /// do not fit.
  [[nodiscard]] static MoeLayer create(const runtime::DeviceMesh& mesh, const MoeConfig& config,
                                       const MoeWeights& weights, const MoeAxes& axes = {});
};

/// The routing statistics a MoE program records on every run.
struct MoeRouting {
  /// Per mesh slot, the statistics of its routing group (written by the slot's route node).
  std::vector<MoeStats> per_slot;
  /// Per routing group (a replica group of the tokens: its slots route the same tokens alike),
  /// the first of its slots this rank holds, or -1 when it holds none (a mesh over ranks).
  std::vector<std::int64_t> group_leaders;
  /// Per routing group, the rank that reports its statistics: the rank of its first slot.
  std::vector<int> group_owners;
  /// The mesh's transport and this rank (the statistics of other ranks' groups come through it).
  std::shared_ptr<runtime::Transport> transport;
  int this_rank = 0;

  /// Fills the fields above from the tokens' replica groups on `mesh`.
  void set_groups(const runtime::DeviceMesh& mesh,
                  const std::vector<std::vector<std::int64_t>>& groups);
  /// The number of routing groups (each decides top-k and capacity among its own tokens).
  std::int64_t groups() const noexcept { return static_cast<std::int64_t>(group_leaders.size()); }
  /// The last run's statistics summed over the routing groups in order (tokens_per_expert and
  /// dropped summed; capacity is per group). On a mesh over ranks, a collective: each group's
  /// statistics come from the rank of its first slot, and every rank calls it in the same
  /// order. Throws: what the transport throws.
  MoeStats total() const;
};

/// What a forward emit_moe keeps for its backward: the tokens as routed, each device's routing
/// decisions and its experts' intermediate values, all owned by the program. Filled by emit_moe.
struct MoeSaved {
  runtime::ShardedTensor* x = nullptr;  ///< the tokens as routed (gathered over the weights' axes)
  /// The weights as the program registered them.
  runtime::ShardedTensor *router = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;
  /// Per mesh slot: its routing tables and its router probabilities [rows, E].
  std::vector<RoutingTables*> tables;
  std::vector<runtime::Tensor*> probs;
  /// Per mesh slot, its local experts' kept assignments packed expert after expert, in the
  /// order of RoutingTables::expert_rows (with the all-to-all dispatch: the slots it received,
  /// every token block's slots of an expert together): the gate and up pre-activations and the
  /// activation [assignments, F_local], and (not with the all-to-all) each expert's output
  /// before its routing weight [assignments, H] (a partial sum over F's axes).
  std::vector<runtime::Tensor*> gate_pre, up_pre, hidden, expert_out;
  /// With tokens split over the expert axis (the all-to-all dispatch), the slot tensors
  /// [P, E, C, H]: as the experts received them, their counts [P, E], and the experts' outputs
  /// back at the tokens' devices. Null otherwise.
  runtime::ShardedTensor *dispatched = nullptr, *dispatched_counts = nullptr, *combined = nullptr;
  std::vector<sharding::Placement> x_placed;        ///< the input's placements (before any gather)
  std::vector<sharding::Placement> partial_placed;  ///< the partial output's (the routed x's,
                                                    ///< Partial over the weights' axes)
  std::vector<sharding::Placement> y_placed;        ///< the output's
  /// With a shared expert: its weights and gate as the program registered them; the mesh axes
  /// over which its devices share the rows out (the partial output's axes that do not split
  /// Fs); and per mesh slot, the rows of x it ran on ([first, first + count)), their gate and
  /// up pre-activations and activation [count, Fs_local] and the expert's output before its
  /// gate [count, H] (a partial sum over Fs's axes). Empty without one.
  runtime::ShardedTensor *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr,
                         *shared_expert_gate = nullptr;
  std::vector<std::size_t> shared_sharing;
  std::vector<std::int64_t> shared_first, shared_count;
  std::vector<runtime::Tensor*> shared_gate_pre, shared_up_pre, shared_hidden, shared_out;
};

/// Emits y = moe(x) into `program`. Per device: router logits, softmax, top-k, capacity
/// within the device's routing group (its tokens), then its local experts' SwiGLU on the
/// tokens routed to them (with its slice of F), each output scaled by its routing weight and
/// added into a partial y: a Partial(sum) over the expert and tensor axes, resharded into y
/// (one all-reduce over ep x tp). Tokens replicated over ep (EasyDeL's expert mesh: hidden
/// P(dp, None, None)) need no dispatch; tokens split over ep go to their experts' devices and
/// back by all-to-all (see MoeAxes::batch). A shared expert adds its gated output into the
/// same partial y before that one reduction: its Fs is split over a subset of the axes the
/// partial sum runs over, and over the others each device takes a share of the rows, so that
/// every row's term is added once. x is [T, H] or [B, T, H] with any token dims
/// split, H whole; y like x. Returns the frontier after which y is complete;
/// `routing` (owned by the program) is filled on every run.
/// With `saved`, the forward also keeps what emit_moe_backward needs (per device, buffers for
/// its local experts' assignments: three [rows x min(k, local experts), F_local] and one
/// [same, H]; with the all-to-all dispatch, three [slots received, F_local]; with a shared
/// expert, three [its rows, Fs_local] and one [its rows, H]).
/// Throws: ShapeError when x or y do not fit (naming them); as reshard().
runtime::Frontier emit_moe(ProgramBuilder& program, const MoeLayer& layer,
                           runtime::ShardedTensor& x, const runtime::Frontier& after,
                           runtime::ShardedTensor& y, const std::string& name,
                           MoeRouting** routing = nullptr, MoeSaved* saved = nullptr);

/// A parameter gradient for each of a MoeLayer's matrices, laid out as the matrix is
/// (gradient_like), fp32.
struct MoeGradients {
  std::shared_ptr<runtime::ShardedTensor> router, gate, up, down;
  /// The shared expert's matrices (laid out as MlpLayer stores them, out-in) and its gate's
  /// [H, 1]; null without a shared expert.
  std::shared_ptr<runtime::ShardedTensor> shared_gate, shared_up, shared_down, shared_expert_gate;
  /// Zero gradients laid out like `layer`'s matrices.
  [[nodiscard]] static MoeGradients like(const MoeLayer& layer);
};

/// The router's load-balancing loss in a training step (LmTrainingStep; router_aux_loss in
/// reference/backward.hpp): every MoE layer's router backward adds dp[e] = scale x C_e to
/// each of its rows' probability gradients, with C the step's choice counts over every MoE
/// layer (the first E values of `stats` [1, 2E], then the probability sums; reduced over the
/// mesh and replicated, complete after `ready`).
struct RouterAuxGradient {
  runtime::ShardedTensor* stats = nullptr;
  runtime::Frontier ready;
  /// coef x E / (N' N): N the rows all MoE layers route, N' the rows `stats` counted (C / N' is
  /// the fraction of choices however often a row was counted), making dp = coef E C_e / N^2.
  double scale = 0.0;
};

/// Emits the backward of the emit_moe that filled `saved`: given dy (laid out as that y),
/// fills dx (laid out as that x) and overwrites the gradients in `grads`. The collectives are
/// the forward's transposed (gradients.hpp): dy gathered over the weights' axes as x was, then
/// per device, for each local expert, its assignments' rows of dy: the routing weights'
/// gradients dy . expert_out, the expert's SwiGLU backward on dy scaled by the weights (its
/// weight gradients over the device's rows, its input gradient added into a partial dx). The
/// routing weights' gradients, a partial sum over the weights' axes (each device saw only its
/// experts and its slice of F), are all-reduced over them ([rows, k] values: small); then
/// every device differentiates the renormalisation and the softmax and has the router's
/// gradient over its rows, and the first device of each partial sum adds the router's input
/// gradient into dx. dx is reduced over the weights' axes (the transpose of the token gather),
/// the weights' gradients over the axes splitting the tokens. Dropped assignments pass no
/// gradient; the routing decisions are constants. A shared expert runs its SwiGLU backward on
/// the rows its forward ran on (dy scaled by its gate; its weights' gradients reduced over the
/// axes sharing the rows out and those splitting the tokens) and puts dy . its output beside
/// the routing weights' gradients (one more column, reduced with them), from which every
/// device has its gate's logit gradient for all its rows, as for the router. Returns the
/// frontier after which dx and every gradient are complete.
/// Throws: ShapeError when dy, dx or a gradient does not fit (naming the shapes); ValueError
/// when `saved` was not filled, or a shared expert has no gradients in `grads`.
/// With `aux`, the router's gradient also carries the load-balancing loss's (see above).
/// `dx_ready` (when given) receives the frontier after which dx alone is complete: what the
/// next backward in a chain waits for, so that the gradients' reductions overlap the rest of
/// the backward instead of holding it up.
runtime::Frontier emit_moe_backward(ProgramBuilder& program, const MoeLayer& layer,
                                    const MoeSaved& saved, runtime::ShardedTensor& dy,
                                    const runtime::Frontier& after, runtime::ShardedTensor& dx,
                                    const MoeGradients& grads, const std::string& name,
                                    const RouterAuxGradient* aux = nullptr,
                                    runtime::Frontier* dx_ready = nullptr);

/// A MoE layer as one program over [tokens, H]. Not thread-safe: one thread drives it.
class ShardedMoe {
 public:
  /// Lays out the weights and compiles for `tokens` rows, split over axes.batch.
  /// Throws: as MoeLayer::create; ShapeError when tokens is not positive.
  ShardedMoe(runtime::DeviceMesh mesh, const MoeConfig& config, const MoeWeights& weights,
             std::int64_t tokens, MoeAxes axes = {});

  /// y = moe(x) for x [tokens, H]. Throws: ShapeError for another shape; what a node throws.
  runtime::HostTensor forward(const runtime::HostTensor& x);
  /// The last forward's routing statistics, summed over the routing groups (a collective on a
  /// mesh over ranks: MoeRouting::total).
  MoeStats stats() const { return routing_->total(); }
  /// Routing groups (token splits); each decides top-k and capacity among its own tokens.
  std::int64_t groups() const noexcept { return routing_->groups(); }
  /// The layer.
  const MoeLayer& layer() const noexcept { return layer_; }
  /// The program (plan, graph).
  Program& program() noexcept { return *program_; }

 private:
  MoeLayer layer_;
  std::int64_t tokens_;
  MoeRouting* routing_ = nullptr;
  std::unique_ptr<Program> program_;
};

}  // namespace numesh::ops
