#include "numesh/ops/lowering/lm_training.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/routing.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/cross_entropy.hpp"
#include "numesh/ops/lowering/embedding.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/lowering/rmsnorm.hpp"

namespace numesh::ops {

namespace {

using runtime::ShardedTensor;
using sharding::AxisRule;
using sharding::PartitionSpec;

// The product of the sizes of those of `axes` the mesh has.
std::int64_t size_over(const std::vector<std::string>& axes, const sharding::Mesh& mesh) {
  std::int64_t n = 1;
  for (const std::string& a : axes) {
    if (mesh.has_axis(a)) n *= mesh.axis_size(a);
  }
  return n;
}

// The sequence-parallel axis as a list of axes (empty: tokens are not split).
std::vector<std::string> sequence_axes(const ModelAxes& axes) {
  return axes.sequence.empty() ? std::vector<std::string>{}
                               : std::vector<std::string>{axes.sequence};
}

// One node per device copying its shard of `from` into its shard of `to`: the same values seen
// under another shape (the activations [B, T, H] as the head's rows [B x T, H]), which the
// layouts place on the same devices in the same order (position_of_row_ makes it so).
runtime::Frontier emit_same_shards(ProgramBuilder& pb, ShardedTensor& from, ShardedTensor& to,
                                   const runtime::Frontier& after, const std::string& name) {
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& f = from.shard(s);
    runtime::Tensor& t = to.shard(s);
    NUMESH_CHECK(f.values().size() == t.values().size(), ValueError,
                 "{}: (internal) shard {} holds {} values in one view and {} in the other", name, s,
                 f.values().size(), t.values().size());
    return [&f, &t] {
      std::memcpy(t.values().data(), f.values().data(), f.values().size() * sizeof(float));
    };
  });
}

// Refuses a weight the trainer cannot update in place as fp32 master weights: `stored_as` is
// a DType or a layer's per-matrix formats (AttentionFormats, MlpFormats).
template <class Formats>
void check_fp32(const Formats& stored_as, std::string_view what) {
  bool fp32 = false;
  if constexpr (std::is_same_v<Formats, DType>) {
    fp32 = stored_as == DType::kF32;
  } else {
    fp32 = stored_as.all_are(DType::kF32);
  }
  NUMESH_CHECK(fp32, ValueError,
               "training: {} is stored as {}; training keeps fp32 master weights (load it as f32)",
               what, to_string(stored_as));
}

// Refuses what the step cannot train: a negative or non-finite aux loss coefficient, a batch or
// tokens that do not split over their axes, a block count other than the layers', no final
// norm, an embedding or head not stored as fp32.
void check_training_arguments(const sharding::Mesh& m, const TransformerConfig& config,
                              const ModelAxes& axes, const EmbeddingWeights& embedding,
                              const TransformerWeights& stack, const LmHeadWeights* head,
                              std::int64_t batch, std::int64_t tokens,
                              double router_aux_loss_coef) {
  NUMESH_CHECK(router_aux_loss_coef >= 0.0 && std::isfinite(router_aux_loss_coef), ValueError,
               "training: the router's aux loss coefficient {} must be finite and not negative",
               router_aux_loss_coef);
  NUMESH_CHECK(batch > 0 && tokens > 0, ShapeError,
               "training: batch {} and tokens {} must be positive", batch, tokens);
  const std::int64_t batch_ways = size_over(axes.batch, m);
  NUMESH_CHECK(batch % batch_ways == 0, ShapeError,
               "training: a batch of {} sequences does not split over the data-parallel axes ({}) "
               "of size {}; use a "
               "batch that is a multiple of {}",
               batch, fmt::join(axes.batch, ", "), batch_ways, batch_ways);
  const std::int64_t sequence_ways = size_over(sequence_axes(axes), m);
  NUMESH_CHECK(tokens % sequence_ways == 0, ShapeError,
               "training: {} tokens per sequence do not split over the sequence axis {} of size {}",
               tokens, axes.sequence, sequence_ways);
  NUMESH_CHECK(static_cast<std::int64_t>(stack.blocks.size()) == config.layers, ShapeError,
               "training: {} blocks of weights for {} layers", stack.blocks.size(), config.layers);
  NUMESH_CHECK(!stack.final_norm.shape.empty(), ShapeError,
               "training: the model has no final norm");
  check_fp32(embedding.stored_as, "the embedding");
  if (head != nullptr) check_fp32(head->stored_as, "the LM head");
}

// The LM head: with no head weights, the embedding's table itself (both are [V, H] split over
// the vocabulary alike); else laid out from them and checked against the model.
LmHeadLayer training_head(const runtime::DeviceMesh& mesh, const TransformerConfig& config,
                          const LmHeadWeights* head, const EmbeddingLayer& embedding,
                          std::int64_t vocab) {
  if (head == nullptr) {
    // The head's matrix is the table itself: both are [V, H] split over the vocabulary alike.
    return LmHeadLayer{
        .hidden = embedding.hidden, .vocab = embedding.vocab, .weight = embedding.table};
  }
  LmHeadLayer layer = LmHeadLayer::create(mesh, *head);
  NUMESH_CHECK(layer.hidden == config.hidden && layer.vocab == vocab, ShapeError,
               "training: the LM head is [{}, {}] (H, V) but the model is hidden {}, vocabulary {}",
               layer.hidden, layer.vocab, config.hidden, vocab);
  return layer;
}

// A norm's weight, checked to be [1, H], laid out replicated.
std::shared_ptr<ShardedTensor> training_norm(const runtime::DeviceMesh& mesh,
                                             const runtime::HostTensor& t, std::int64_t hidden,
                                             std::string_view what) {
  const PartitionSpec replicated({AxisRule(), AxisRule()});
  NUMESH_CHECK(t.shape == (std::vector<std::int64_t>{1, hidden}), ShapeError,
               "training: {} is {}, expected [1, {}]", what, detail::shape_text(t), hidden);
  return detail::laid_out(mesh, t, replicated);
}

// Appends a trainable parameter: its name, its value, its gradient and how it is stored.
void add_parameter(std::vector<TrainableParameter>& to, std::string name,
                   const std::shared_ptr<ShardedTensor>& value,
                   const std::shared_ptr<ShardedTensor>& grad, WeightLayout layout) {
  to.push_back(TrainableParameter{std::move(name), value, grad, layout});
}

// The program's two views of the activations: [B, T, H] split over the batch and sequence axes,
// and the rows [B x T, H] the embedding and the head read, split over both.
struct TrainingActivations {
  ProgramBuilder& pb;
  std::int64_t rows, h;
  std::vector<std::int64_t> shape;
  PartitionSpec spec, row_spec;

  // A new activation [B, T, H].
  ShardedTensor& activation(const std::string& name) const {
    return pb.tensor(name, TensorRole::kActivation, shape, spec);
  }
  // A new activation [B x T, H].
  ShardedTensor& rows_tensor(const std::string& name) const {
    return pb.tensor(name, TensorRole::kActivation, {rows, h}, row_spec);
  }
};

// The two views' shapes and layouts for batch sequences of `tokens`.
TrainingActivations training_activations(ProgramBuilder& pb, const sharding::Mesh& m,
                                         const ModelAxes& axes, std::int64_t batch,
                                         std::int64_t tokens, std::int64_t h) {
  const std::vector<std::string> sequence = sequence_axes(axes);
  std::vector<std::string> row_axes = axes.batch;
  row_axes.insert(row_axes.end(), sequence.begin(), sequence.end());
  return TrainingActivations{
      .pb = pb,
      .rows = batch * tokens,
      .h = h,
      .shape = {batch, tokens, h},
      .spec = PartitionSpec(
          {detail::entry_over(axes.batch, m), detail::entry_over(sequence, m), AxisRule()}),
      .row_spec = PartitionSpec({detail::entry_over(row_axes, m), AxisRule()}),
  };
}

// Which of the caller's positions each row holds: slot s's tile of the activations, read in
// its own order, lands in slot s's rows.
std::vector<std::int64_t> positions_of_rows(std::int64_t slots, const ShardedTensor& x,
                                            const ShardedTensor& x_rows, std::int64_t rows,
                                            std::int64_t tokens) {
  std::vector<std::int64_t> position_of_row(static_cast<std::size_t>(rows), -1);
  const std::vector<std::int64_t> local = x.layout().shard_shape();
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::vector<std::int64_t> at = x.layout().tile_offset(s);
    const std::int64_t first_row = x_rows.layout().tile_offset(s)[0];
    for (std::int64_t b = 0; b < local[0]; ++b) {
      for (std::int64_t t = 0; t < local[1]; ++t) {
        const std::int64_t row = first_row + b * local[1] + t,
                           position = (at[0] + b) * tokens + at[1] + t;
        std::int64_t& slot = position_of_row[static_cast<std::size_t>(row)];
        NUMESH_CHECK(slot == -1 || slot == position, ValueError,
                     "training: (internal) row {} holds positions {} and {} on different devices",
                     row, slot, position);
        slot = position;
      }
    }
  }
  return position_of_row;
}

// What a block's forward keeps for its backward.
struct BlockKept {
  ShardedTensor* block_in;  // the norm's input: the residual stream entering the block
  ShardedTensor* mid;       // block_in + attention's output, the MLP norm's input
  ShardedTensor* attn_norm;
  ShardedTensor* ffn_norm;
  AttentionSaved attention;
  MlpSaved mlp;
  MoeSaved moe;
  bool routed;  // a MoE block (moe is filled)
};

// The router's load-balancing loss: every MoE layer's choice counts and probability sums,
// counted by one device of each group sharing the same tokens, all-reduced over the mesh.
// `aux_rows` becomes the rows counted; none without MoE layers or with a zero coefficient.
std::optional<RouterAuxGradient> emit_router_aux(ProgramBuilder& pb,
                                                 const runtime::DeviceMesh& mesh,
                                                 const MoeConfig& config,
                                                 const std::vector<BlockKept>& kept, double coef,
                                                 std::int64_t rows, const runtime::Frontier& after,
                                                 std::int64_t& aux_rows) {
  std::int64_t moe_layers = 0;
  for (const BlockKept& k : kept) moe_layers += k.routed ? 1 : 0;
  aux_rows = 0;
  if (!(coef > 0.0 && moe_layers > 0)) return std::nullopt;
  const sharding::Mesh& m = mesh.mesh();
  const std::int64_t e = config.num_experts, k = config.top_k;
  const PartitionSpec replicated({AxisRule(), AxisRule()});
  ShardedTensor& counts =
      pb.tensor("router_aux.local", TensorRole::kActivation, {1, 2 * e}, replicated);
  ShardedTensor& stats = pb.tensor("router_aux.stats", TensorRole::kOutput, {1, 2 * e}, replicated);
  // The rows counted, over every slot of the mesh: from the layouts (a slot's probabilities are
  // [its tokens as routed, E]), so that every rank of a mesh over ranks counts them all.
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    for (const BlockKept& block : kept) {
      const MoeSaved& saved = block.moe;
      if (block.routed && detail::first_of_partial_sum(mesh, saved.partial_placed, s))
        aux_rows += saved.x->layout().elements_per_device() / saved.x->shape().back();
    }
  }
  const runtime::Frontier counted =
      pb.per_device("router_aux.count", {&after}, [&](std::int64_t s) {
        std::vector<std::pair<const RoutingTables*, const runtime::Tensor*>> layers;
        for (const BlockKept& block : kept) {
          const MoeSaved& saved = block.moe;
          if (!block.routed || !detail::first_of_partial_sum(mesh, saved.partial_placed, s))
            continue;
          layers.emplace_back(saved.tables[static_cast<std::size_t>(s)],
                              saved.probs[static_cast<std::size_t>(s)]);
        }
        runtime::Tensor& out = counts.shard(s);
        return [layers, &out, e, k] {
          const std::span<float> v = out.values();
          std::vector<double> sums(static_cast<std::size_t>(2 * e), 0.0);
          for (const auto& [tables, probs] : layers) {
            const std::int64_t routed = probs->shape()[0];
            for (std::int64_t a = 0; a < routed * k; ++a)
              sums[static_cast<std::size_t>(tables->choice[static_cast<std::size_t>(a)])] += 1.0;
            const ConstMatrixMap p(probs->values().data(), routed, e);
            for (std::int64_t ex = 0; ex < e; ++ex)
              sums[static_cast<std::size_t>(e + ex)] += p.col(ex).cast<double>().sum();
          }
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(sums[i]);
        };
      });
  const std::vector<sharding::Placement> all_partial(m.rank(), sharding::Placement::partial());
  const std::vector<sharding::Placement> all_replicated(m.rank(), sharding::Placement::replicate());
  const runtime::Frontier reduced =
      pb.reshard(counts, all_partial, stats, all_replicated, counted, "router_aux.stats");
  pb.output("router_aux.stats", stats, reduced);
  return RouterAuxGradient{
      .stats = &stats,
      .ready = reduced,
      .scale = coef * static_cast<double>(e) /
               (static_cast<double>(aux_rows) * static_cast<double>(moe_layers * rows))};
}

// One matrix used twice (the tied embedding and head): its gradient is the sum of both uses'.
void emit_tied_gradient_sum(ProgramBuilder& pb, ShardedTensor& table_grad, ShardedTensor& head_grad,
                            const runtime::Frontier& after,
                            const runtime::Frontier& head_grad_done) {
  pb.per_device("tied.grad", {&after, &head_grad_done}, [&](std::int64_t s) {
    runtime::Tensor& sum = table_grad.shard(s);
    runtime::Tensor& from_head = head_grad.shard(s);
    return [&sum, &from_head] {
      const std::span<float> to = sum.values();
      const std::span<const float> add = from_head.values();
      for (std::size_t i = 0; i < to.size(); ++i) to[i] += add[i];
    };
  });
}

}  // namespace

struct LmTrainingStep::Layers {
  struct Block {
    AttentionLayer attention;
    std::optional<MlpLayer> mlp;  // one of mlp and moe
    std::optional<MoeLayer> moe;
    std::shared_ptr<ShardedTensor> attn_norm, ffn_norm;
    AttentionGradients attention_grads;
    MlpGradients mlp_grads;
    MoeGradients moe_grads;
    std::shared_ptr<ShardedTensor> attn_norm_grad, ffn_norm_grad;

    // Block l's layers laid out from its weights (each checked to be fp32), with their
    // gradients.
    static Block create(const runtime::DeviceMesh& mesh, const TransformerConfig& config,
                        const ModelAxes& axes, const BlockWeights& w, std::int64_t l);
    // Appends the block's parameters, named `p` (ShardedTransformer::weights()' "layers.L.")
    // followed by the layer's own names.
    void add_parameters(std::vector<TrainableParameter>& to, const std::string& p) const;
    // The block's forward after `after`, named `p`: its input is *stream + *ffn_out (the
    // previous block's output, added by the attention norm; ffn_out null for the first), and
    // they become the block's own output mid + f. Keeps in k what the backward reads.
    runtime::Frontier emit_forward(const TrainingActivations& acts, RmsNormConstants norm,
                                   const runtime::Frontier& after, const std::string& p,
                                   BlockKept& k, ShardedTensor*& stream, ShardedTensor*& ffn_out);
    // The block's backward after `after`, every operator's in reverse: *d_stream, the
    // gradient of the block's output, becomes that of its input. Returns the frontier after
    // which it is complete.
    runtime::Frontier emit_backward(const TrainingActivations& acts, RmsNormConstants norm,
                                    const runtime::Frontier& after, const std::string& p,
                                    const BlockKept& k, const RouterAuxGradient* aux,
                                    ShardedTensor*& d_stream);
  };
  EmbeddingLayer embedding;
  LmHeadLayer head;
  bool tied = false;
  std::vector<Block> blocks;
  std::shared_ptr<ShardedTensor> final_norm;
  std::shared_ptr<ShardedTensor> table_grad, head_grad, final_norm_grad;
};

LmTrainingStep::Layers::Block LmTrainingStep::Layers::Block::create(const runtime::DeviceMesh& mesh,
                                                                    const TransformerConfig& config,
                                                                    const ModelAxes& axes,
                                                                    const BlockWeights& w,
                                                                    std::int64_t l) {
  check_fp32(w.attention.stored_as, fmt::format("block {}'s attention", l));
  Block b;
  b.attention = AttentionLayer::create(
      mesh, config.attention, w.attention,
      AttentionAxes{.batch = axes.batch, .sequence = sequence_axes(axes), .heads = axes.heads});
  if (config.is_moe(l)) {
    check_fp32(w.moe.stored_as, fmt::format("block {}'s experts", l));
    if (w.moe.has_shared_expert())
      check_fp32(w.moe.shared_expert.stored_as, fmt::format("block {}'s shared expert", l));
    b.moe = MoeLayer::create(
        mesh, config.moe, w.moe,
        MoeAxes{.batch = axes.batch, .expert = axes.expert, .tensor = axes.expert_tensor});
    b.moe_grads = MoeGradients::like(*b.moe);
  } else {
    check_fp32(w.mlp.stored_as, fmt::format("block {}'s MLP", l));
    b.mlp = MlpLayer::create(
        mesh, config.mlp_kind, w.mlp,
        MlpAxes{.batch = axes.batch, .sequence = {}, .weights = axes.weights, .tensor = axes.mlp});
    b.mlp_grads = MlpGradients::like(*b.mlp);
  }
  b.attn_norm =
      training_norm(mesh, w.attn_norm, config.hidden, fmt::format("block {} attn_norm", l));
  b.ffn_norm = training_norm(mesh, w.ffn_norm, config.hidden, fmt::format("block {} ffn_norm", l));
  b.attention_grads = AttentionGradients::like(b.attention);
  b.attn_norm_grad = gradient_like(*b.attn_norm);
  b.ffn_norm_grad = gradient_like(*b.ffn_norm);
  return b;
}

void LmTrainingStep::Layers::Block::add_parameters(std::vector<TrainableParameter>& to,
                                                   const std::string& p) const {
  constexpr WeightLayout kOutIn = WeightLayout::kOutIn, kInOut = WeightLayout::kInOut;
  add_parameter(to, p + "attn_norm", attn_norm, attn_norm_grad, kInOut);
  add_parameter(to, p + "attention.wq", attention.wq, attention_grads.wq, kOutIn);
  add_parameter(to, p + "attention.wk", attention.wk, attention_grads.wk, kOutIn);
  add_parameter(to, p + "attention.wv", attention.wv, attention_grads.wv, kOutIn);
  add_parameter(to, p + "attention.wo", attention.wo, attention_grads.wo, kOutIn);
  // Qwen2's biases and Qwen3's q/k norms, rows [1, n], where the model has them.
  for (const auto& [slot, value, grad] :
       {std::tuple{"bq", attention.bq, attention_grads.bq},
        std::tuple{"bk", attention.bk, attention_grads.bk},
        std::tuple{"bv", attention.bv, attention_grads.bv},
        std::tuple{"bo", attention.bo, attention_grads.bo},
        std::tuple{"q_norm", attention.q_norm, attention_grads.q_norm},
        std::tuple{"k_norm", attention.k_norm, attention_grads.k_norm}}) {
    if (value != nullptr) add_parameter(to, p + "attention." + slot, value, grad, kInOut);
  }
  add_parameter(to, p + "ffn_norm", ffn_norm, ffn_norm_grad, kInOut);
  if (moe) {
    add_parameter(to, p + "moe.router", moe->router, moe_grads.router, kInOut);
    add_parameter(to, p + "moe.gate", moe->gate, moe_grads.gate, kOutIn);
    add_parameter(to, p + "moe.up", moe->up, moe_grads.up, kOutIn);
    add_parameter(to, p + "moe.down", moe->down, moe_grads.down, kOutIn);
    if (moe->shared_expert) {  // Qwen2-MoE
      add_parameter(to, p + "moe.shared_expert.gate", moe->shared_expert->gate,
                    moe_grads.shared_gate, kOutIn);
      add_parameter(to, p + "moe.shared_expert.up", moe->shared_expert->up, moe_grads.shared_up,
                    kOutIn);
      add_parameter(to, p + "moe.shared_expert.down", moe->shared_expert->down,
                    moe_grads.shared_down, kOutIn);
      add_parameter(to, p + "moe.shared_expert_gate", moe->shared_expert_gate,
                    moe_grads.shared_expert_gate, kInOut);
    }
  } else {
    if (mlp->gate != nullptr)  // SwiGLU's; a GELU MLP has none
      add_parameter(to, p + "mlp.gate", mlp->gate, mlp_grads.gate, kOutIn);
    add_parameter(to, p + "mlp.up", mlp->up, mlp_grads.up, kOutIn);
    add_parameter(to, p + "mlp.down", mlp->down, mlp_grads.down, kOutIn);
    // Llama's mlp_bias, rows [1, n], where the model has them.
    for (const auto& [slot, value, grad] :
         {std::tuple{"gate_bias", mlp->gate_bias, mlp_grads.gate_bias},
          std::tuple{"up_bias", mlp->up_bias, mlp_grads.up_bias},
          std::tuple{"down_bias", mlp->down_bias, mlp_grads.down_bias}}) {
      if (value != nullptr) add_parameter(to, p + "mlp." + slot, value, grad, kInOut);
    }
  }
}

runtime::Frontier LmTrainingStep::Layers::Block::emit_forward(
    const TrainingActivations& acts, RmsNormConstants norm, const runtime::Frontier& after,
    const std::string& p, BlockKept& k, ShardedTensor*& stream, ShardedTensor*& ffn_out) {
  ProgramBuilder& pb = acts.pb;
  ShardedTensor& norm_w = pb.use(p + ".attn_norm", TensorRole::kWeight, attn_norm);
  k.attn_norm = &norm_w;
  ShardedTensor& n1 = acts.activation(p + ".attn_in");
  k.block_in = ffn_out != nullptr ? &acts.activation(p + ".x") : stream;
  runtime::Frontier front = emit_residual_rmsnorm(pb, *stream, ffn_out, &norm_w,
                                                  ffn_out != nullptr ? k.block_in : nullptr, n1,
                                                  norm, after, p + ".attn_norm");
  ShardedTensor& attn_out = acts.activation(p + ".attn_out");
  front = emit_attention(pb, attention, n1, front, attn_out, p + ".attn", AttentionStep{},
                         &k.attention);
  ShardedTensor& ffn_norm_w = pb.use(p + ".ffn_norm", TensorRole::kWeight, ffn_norm);
  k.ffn_norm = &ffn_norm_w;
  k.mid = &acts.activation(p + ".h");
  ShardedTensor& n2 = acts.activation(p + ".ffn_in");
  front = emit_residual_rmsnorm(pb, *k.block_in, &attn_out, &ffn_norm_w, k.mid, n2, norm, front,
                                p + ".ffn_norm");
  ShardedTensor& f = acts.activation(p + ".ffn_out");
  front = moe ? emit_moe(pb, *moe, n2, front, f, p + ".moe", nullptr, &k.moe)
              : emit_mlp(pb, *mlp, n2, front, f, p + ".mlp", &k.mlp);
  k.routed = moe.has_value();
  stream = k.mid;
  ffn_out = &f;
  return front;
}

runtime::Frontier LmTrainingStep::Layers::Block::emit_backward(
    const TrainingActivations& acts, RmsNormConstants norm, const runtime::Frontier& after,
    const std::string& p, const BlockKept& k, const RouterAuxGradient* aux,
    ShardedTensor*& d_stream) {
  ProgramBuilder& pb = acts.pb;
  runtime::Frontier dx_ready;
  // d_stream is the gradient of the block's output mid + f: f's, and mid's through the residual.
  ShardedTensor& dn2 = acts.activation(p + ".ffn_in.grad");
  if (moe) {
    emit_moe_backward(pb, *moe, k.moe, *d_stream, after, dn2, moe_grads, p + ".moe.bwd", aux,
                      &dx_ready);
  } else {
    emit_mlp_backward(pb, *mlp, k.mlp, *d_stream, after, dn2, mlp_grads, p + ".mlp.bwd", &dx_ready);
  }
  runtime::Frontier front = dx_ready;
  ShardedTensor& dmid = acts.activation(p + ".h.grad");
  emit_rmsnorm_backward(pb, *k.mid, *k.ffn_norm, dn2, d_stream, dmid,
                        pb.use(p + ".ffn_norm.grad", TensorRole::kOutput, ffn_norm_grad), norm,
                        front, p + ".ffn_norm.bwd", &dx_ready);
  front = dx_ready;
  ShardedTensor& dn1 = acts.activation(p + ".attn_in.grad");
  emit_attention_backward(pb, attention, k.attention, dmid, front, dn1, attention_grads,
                          p + ".attn.bwd", &dx_ready);
  front = dx_ready;
  ShardedTensor& d_in = acts.activation(p + ".x.grad");
  emit_rmsnorm_backward(pb, *k.block_in, *k.attn_norm, dn1, &dmid, d_in,
                        pb.use(p + ".attn_norm.grad", TensorRole::kOutput, attn_norm_grad), norm,
                        front, p + ".attn_norm.bwd", &dx_ready);
  d_stream = &d_in;
  return dx_ready;
}

LmTrainingStep::LmTrainingStep(runtime::DeviceMesh mesh, TransformerConfig config,
                               const EmbeddingWeights& embedding, const TransformerWeights& stack,
                               const LmHeadWeights* head, std::int64_t batch, std::int64_t tokens,
                               ModelAxes axes, MatmulPrecision precision,
                               double router_aux_loss_coef)
    : mesh_(std::move(mesh)),
      config_(std::move(config)),
      axes_(std::move(axes)),
      batch_(batch),
      tokens_(tokens),
      precision_(precision),
      router_aux_loss_coef_(router_aux_loss_coef) {
  config_.validate();
  check_training_arguments(mesh_.mesh(), config_, axes_, embedding, stack, head, batch, tokens,
                           router_aux_loss_coef);

  layers_ = std::make_unique<Layers>();
  Layers& L = *layers_;
  L.embedding = EmbeddingLayer::create(mesh_, embedding);
  vocab_ = L.embedding.vocab;
  NUMESH_CHECK(L.embedding.hidden == config_.hidden, ShapeError,
               "training: the embedding is [{}, {}] but the model's hidden size is {}",
               L.embedding.vocab, L.embedding.hidden, config_.hidden);
  L.tied = head == nullptr;
  L.head = training_head(mesh_, config_, head, L.embedding, vocab_);
  constexpr WeightLayout kOutIn = WeightLayout::kOutIn, kInOut = WeightLayout::kInOut;
  L.table_grad = gradient_like(*L.embedding.table);
  add_parameter(parameters_, "embedding.table", L.embedding.table, L.table_grad, kInOut);
  for (std::int64_t l = 0; l < config_.layers; ++l) {
    Layers::Block b =
        Layers::Block::create(mesh_, config_, axes_, stack.blocks[static_cast<std::size_t>(l)], l);
    b.add_parameters(parameters_,
                     fmt::format("layers.{}.", l));  // ShardedTransformer::weights()' names
    L.blocks.push_back(std::move(b));
  }
  L.final_norm = training_norm(mesh_, stack.final_norm, config_.hidden, "final_norm");
  L.final_norm_grad = gradient_like(*L.final_norm);
  add_parameter(parameters_, "final_norm", L.final_norm, L.final_norm_grad, kInOut);
  if (!L.tied) {
    L.head_grad = gradient_like(*L.head.weight);
    add_parameter(parameters_, "lm_head.weight", L.head.weight, L.head_grad, kOutIn);
  }
  compile();
}

LmTrainingStep::~LmTrainingStep() = default;
LmTrainingStep::LmTrainingStep(LmTrainingStep&&) noexcept = default;
LmTrainingStep& LmTrainingStep::operator=(LmTrainingStep&&) noexcept = default;

void LmTrainingStep::compile() {
  Layers& L = *layers_;
  ProgramBuilder pb(mesh_, fmt::format("training step (B={}, T={}, {} compute)", batch_, tokens_,
                                       to_string(precision_)));
  pb.set_matmul_precision(precision_);
  const TrainingActivations acts =
      training_activations(pb, mesh_.mesh(), axes_, batch_, tokens_, config_.hidden);
  const std::int64_t rows = acts.rows;
  ShardedTensor& x = acts.activation("x");
  ShardedTensor& x_rows = acts.rows_tensor("x.rows");
  position_of_row_ = positions_of_rows(mesh_.size(), x, x_rows, rows, tokens_);
  inputs_.assign(static_cast<std::size_t>(rows), 0);
  targets_.assign(static_cast<std::size_t>(rows), 0);

  // ---- forward ----
  runtime::Frontier front = emit_embedding(pb, L.embedding, &inputs_, {}, x_rows, "embedding");
  front = emit_same_shards(pb, x_rows, x, front, "embedding.to_activations");
  const RmsNormConstants norm = config_.norm_constants();
  std::vector<BlockKept> kept(L.blocks.size());
  ShardedTensor* stream = &x;
  ShardedTensor* ffn_out = nullptr;
  for (std::size_t l = 0; l < L.blocks.size(); ++l) {
    front = L.blocks[l].emit_forward(acts, norm, front, fmt::format("block{}", l), kept[l], stream,
                                     ffn_out);
  }
  const std::optional<RouterAuxGradient> aux = emit_router_aux(
      pb, mesh_, config_.moe, kept, router_aux_loss_coef_, rows, front, router_aux_rows_);
  ShardedTensor& final_w = pb.use("final_norm", TensorRole::kWeight, L.final_norm);
  ShardedTensor& z = acts.activation("final.x");
  ShardedTensor& y = acts.activation("final.y");
  front = emit_residual_rmsnorm(pb, *stream, ffn_out, &final_w, &z, y, norm, front, "final_norm");
  ShardedTensor& y_rows = acts.rows_tensor("final.y.rows");
  front = emit_same_shards(pb, y, y_rows, front, "final.to_rows");
  ShardedTensor& losses = pb.tensor("losses", TensorRole::kOutput, {rows, 1}, acts.row_spec);
  CrossEntropySaved ce;
  front = emit_lm_head_cross_entropy(pb, L.head, y_rows, &targets_, front, losses, "lm_head", &ce);
  pb.output("losses", losses, front);

  // ---- backward: the mean over the rows, every operator's backward in reverse ----
  ShardedTensor& dy_rows = acts.rows_tensor("final.y.rows.grad");
  ShardedTensor& head_grad = L.tied
                                 ? pb.tensor("lm_head.weight.grad", TensorRole::kActivation,
                                             L.head.weight->shape(), L.head.weight->spec())
                                 : pb.use("lm_head.weight.grad", TensorRole::kOutput, L.head_grad);
  // Each backward hands the next its dx as soon as dx is complete (dx_ready); its parameters'
  // gradients reduce meanwhile, overlapping the rest of the backward. The program's run waits
  // for every node, those reductions included.
  runtime::Frontier dx_ready;
  const runtime::Frontier head_grad_done = emit_lm_head_cross_entropy_backward(
      pb, ce, 1.0 / static_cast<double>(rows), front, dy_rows, head_grad, "lm_head.bwd", &dx_ready);
  front = dx_ready;
  ShardedTensor& dy = acts.activation("final.y.grad");
  front = emit_same_shards(pb, dy_rows, dy, front, "final.grad_to_activations");
  ShardedTensor* d_stream = &acts.activation("final.x.grad");
  emit_rmsnorm_backward(pb, z, final_w, dy, nullptr, *d_stream,
                        pb.use("final_norm.grad", TensorRole::kOutput, L.final_norm_grad), norm,
                        front, "final_norm.bwd", &dx_ready);
  front = dx_ready;
  for (std::size_t i = L.blocks.size(); i-- > 0;) {
    front = L.blocks[i].emit_backward(acts, norm, front, fmt::format("block{}", i), kept[i],
                                      aux ? &*aux : nullptr, d_stream);
  }
  ShardedTensor& dx_rows = acts.rows_tensor("x.rows.grad");
  front = emit_same_shards(pb, *d_stream, dx_rows, front, "embedding.grad_to_rows");
  ShardedTensor& table_grad = pb.use("embedding.table.grad", TensorRole::kOutput, L.table_grad);
  front = emit_embedding_backward(pb, L.embedding, &inputs_, dx_rows, front, table_grad,
                                  "embedding.bwd");
  if (L.tied) emit_tied_gradient_sum(pb, table_grad, head_grad, front, head_grad_done);
  program_ = std::make_unique<Program>(std::move(pb).compile());
}

double LmTrainingStep::run(std::span<const std::int32_t> inputs,
                           std::span<const std::int32_t> targets) {
  const std::int64_t rows = batch_ * tokens_;
  NUMESH_CHECK(
      static_cast<std::int64_t>(inputs.size()) == rows &&
          static_cast<std::int64_t>(targets.size()) == rows,
      ShapeError,
      "training: {} inputs and {} targets for {} sequences of {} tokens (expected {} each)",
      inputs.size(), targets.size(), batch_, tokens_, rows);
  for (const auto* ids : {&inputs, &targets}) {
    for (std::size_t i = 0; i < ids->size(); ++i) {
      const std::int32_t id = (*ids)[i];
      NUMESH_CHECK(
          id >= 0 && id < vocab_, IndexError,
          "training: {} id {} of sequence {} at position {} is outside the vocabulary [0, {})",
          ids == &inputs ? "input" : "target", id, static_cast<std::int64_t>(i) / tokens_,
          static_cast<std::int64_t>(i) % tokens_, vocab_);
    }
  }
  for (std::size_t r = 0; r < position_of_row_.size(); ++r) {
    const auto p = static_cast<std::size_t>(position_of_row_[r]);
    inputs_[r] = inputs[p];
    targets_[r] = targets[p];
  }
  program_->run();
  const runtime::HostTensor& losses = program_->output("losses");
  double sum = 0.0;
  for (const float l : losses.data) sum += static_cast<double>(l);
  double loss = sum / static_cast<double>(rows);
  router_aux_loss_ = 0.0;
  if (router_aux_rows_ > 0) {
    // E sum_e (C_e / N') (S_e / N'), N' the rows the counts counted (router_aux_loss).
    const std::vector<float>& stats = program_->output("router_aux.stats").data;
    const std::size_t e = stats.size() / 2;
    const auto n = static_cast<double>(router_aux_rows_);
    for (std::size_t i = 0; i < e; ++i) {
      router_aux_loss_ += static_cast<double>(e) * static_cast<double>(stats[i]) *
                          static_cast<double>(stats[e + i]) / (n * n);
    }
    loss += router_aux_loss_coef_ * router_aux_loss_;
  }
  return loss;
}

}  // namespace numesh::ops
