#include "numesh/ops/lowering/lm_training.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
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

// Refuses a weight the trainer cannot update in place as fp32 master weights.
void check_fp32(DType stored_as, std::string_view what) {
  NUMESH_CHECK(stored_as == DType::kF32, ValueError,
               "training: {} is stored as {}; training keeps fp32 master weights (load it as f32)",
               what, to_string(stored_as));
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
  };
  EmbeddingLayer embedding;
  LmHeadLayer head;
  bool tied = false;
  std::vector<Block> blocks;
  std::shared_ptr<ShardedTensor> final_norm;
  std::shared_ptr<ShardedTensor> table_grad, head_grad, final_norm_grad;
};

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
  NUMESH_CHECK(router_aux_loss_coef >= 0.0 && std::isfinite(router_aux_loss_coef), ValueError,
               "training: the router's aux loss coefficient {} must be finite and not negative",
               router_aux_loss_coef);
  const sharding::Mesh& m = mesh_.mesh();
  NUMESH_CHECK(batch > 0 && tokens > 0, ShapeError,
               "training: batch {} and tokens {} must be positive", batch, tokens);
  const std::int64_t batch_ways = size_over(axes_.batch, m);
  NUMESH_CHECK(batch % batch_ways == 0, ShapeError,
               "training: a batch of {} sequences does not split over the data-parallel axes ({}) "
               "of size {}; use a "
               "batch that is a multiple of {}",
               batch, fmt::join(axes_.batch, ", "), batch_ways, batch_ways);
  const std::vector<std::string> sequence = sequence_axes(axes_);
  const std::int64_t sequence_ways = size_over(sequence, m);
  NUMESH_CHECK(tokens % sequence_ways == 0, ShapeError,
               "training: {} tokens per sequence do not split over the sequence axis {} of size {}",
               tokens, axes_.sequence, sequence_ways);
  NUMESH_CHECK(static_cast<std::int64_t>(stack.blocks.size()) == config_.layers, ShapeError,
               "training: {} blocks of weights for {} layers", stack.blocks.size(), config_.layers);
  NUMESH_CHECK(!stack.final_norm.shape.empty(), ShapeError,
               "training: the model has no final norm");
  check_fp32(embedding.stored_as, "the embedding");
  if (head != nullptr) check_fp32(head->stored_as, "the LM head");

  layers_ = std::make_unique<Layers>();
  Layers& L = *layers_;
  L.embedding = EmbeddingLayer::create(mesh_, embedding);
  vocab_ = L.embedding.vocab;
  NUMESH_CHECK(L.embedding.hidden == config_.hidden, ShapeError,
               "training: the embedding is [{}, {}] but the model's hidden size is {}",
               L.embedding.vocab, L.embedding.hidden, config_.hidden);
  L.tied = head == nullptr;
  if (L.tied) {
    // The head's matrix is the table itself: both are [V, H] split over the vocabulary alike.
    L.head = LmHeadLayer{
        .hidden = L.embedding.hidden, .vocab = L.embedding.vocab, .weight = L.embedding.table};
  } else {
    L.head = LmHeadLayer::create(mesh_, *head);
    NUMESH_CHECK(
        L.head.hidden == config_.hidden && L.head.vocab == vocab_, ShapeError,
        "training: the LM head is [{}, {}] (H, V) but the model is hidden {}, vocabulary {}",
        L.head.hidden, L.head.vocab, config_.hidden, vocab_);
  }
  const PartitionSpec replicated({AxisRule(), AxisRule()});
  auto norm = [&](const runtime::HostTensor& t, std::string_view what) {
    NUMESH_CHECK(t.shape == (std::vector<std::int64_t>{1, config_.hidden}), ShapeError,
                 "training: {} is {}, expected [1, {}]", what, detail::shape_text(t),
                 config_.hidden);
    return detail::laid_out(mesh_, t, replicated);
  };
  const auto add = [&](std::string name, const std::shared_ptr<ShardedTensor>& value,
                       const std::shared_ptr<ShardedTensor>& grad, WeightLayout layout) {
    parameters_.push_back(TrainableParameter{std::move(name), value, grad, layout});
  };
  constexpr WeightLayout kOutIn = WeightLayout::kOutIn, kInOut = WeightLayout::kInOut;
  L.table_grad = gradient_like(*L.embedding.table);
  add("embedding.table", L.embedding.table, L.table_grad, kInOut);
  for (std::int64_t l = 0; l < config_.layers; ++l) {
    const BlockWeights& w = stack.blocks[static_cast<std::size_t>(l)];
    check_fp32(w.attention.stored_as, fmt::format("block {}'s attention", l));
    Layers::Block b;
    b.attention = AttentionLayer::create(
        mesh_, config_.attention, w.attention,
        AttentionAxes{.batch = axes_.batch, .sequence = sequence, .heads = axes_.heads});
    if (config_.is_moe(l)) {
      check_fp32(w.moe.stored_as, fmt::format("block {}'s experts", l));
      if (w.moe.has_shared_expert())
        check_fp32(w.moe.shared_expert.stored_as, fmt::format("block {}'s shared expert", l));
      b.moe = MoeLayer::create(
          mesh_, config_.moe, w.moe,
          MoeAxes{.batch = axes_.batch, .expert = axes_.expert, .tensor = axes_.expert_tensor});
      b.moe_grads = MoeGradients::like(*b.moe);
    } else {
      check_fp32(w.mlp.stored_as, fmt::format("block {}'s MLP", l));
      b.mlp = MlpLayer::create(
          mesh_, MlpKind::kSwiGLU, w.mlp,
          MlpAxes{
              .batch = axes_.batch, .sequence = {}, .weights = axes_.weights, .tensor = axes_.mlp});
      b.mlp_grads = MlpGradients::like(*b.mlp);
    }
    b.attn_norm = norm(w.attn_norm, fmt::format("block {} attn_norm", l));
    b.ffn_norm = norm(w.ffn_norm, fmt::format("block {} ffn_norm", l));
    b.attention_grads = AttentionGradients::like(b.attention);
    b.attn_norm_grad = gradient_like(*b.attn_norm);
    b.ffn_norm_grad = gradient_like(*b.ffn_norm);
    const std::string p = fmt::format("layers.{}.", l);  // ShardedTransformer::weights()' names
    add(p + "attn_norm", b.attn_norm, b.attn_norm_grad, kInOut);
    add(p + "attention.wq", b.attention.wq, b.attention_grads.wq, kOutIn);
    add(p + "attention.wk", b.attention.wk, b.attention_grads.wk, kOutIn);
    add(p + "attention.wv", b.attention.wv, b.attention_grads.wv, kOutIn);
    add(p + "attention.wo", b.attention.wo, b.attention_grads.wo, kOutIn);
    // Qwen2's biases and Qwen3's q/k norms, rows [1, n], where the model has them.
    for (const auto& [slot, value, grad] :
         {std::tuple{"bq", b.attention.bq, b.attention_grads.bq},
          std::tuple{"bk", b.attention.bk, b.attention_grads.bk},
          std::tuple{"bv", b.attention.bv, b.attention_grads.bv},
          std::tuple{"bo", b.attention.bo, b.attention_grads.bo},
          std::tuple{"q_norm", b.attention.q_norm, b.attention_grads.q_norm},
          std::tuple{"k_norm", b.attention.k_norm, b.attention_grads.k_norm}}) {
      if (value != nullptr) add(p + "attention." + slot, value, grad, kInOut);
    }
    add(p + "ffn_norm", b.ffn_norm, b.ffn_norm_grad, kInOut);
    if (b.moe) {
      add(p + "moe.router", b.moe->router, b.moe_grads.router, kInOut);
      add(p + "moe.gate", b.moe->gate, b.moe_grads.gate, kInOut);
      add(p + "moe.up", b.moe->up, b.moe_grads.up, kInOut);
      add(p + "moe.down", b.moe->down, b.moe_grads.down, kInOut);
      if (b.moe->shared_expert) {  // Qwen2-MoE
        add(p + "moe.shared_expert.gate", b.moe->shared_expert->gate, b.moe_grads.shared_gate,
            kOutIn);
        add(p + "moe.shared_expert.up", b.moe->shared_expert->up, b.moe_grads.shared_up, kOutIn);
        add(p + "moe.shared_expert.down", b.moe->shared_expert->down, b.moe_grads.shared_down,
            kOutIn);
        add(p + "moe.shared_expert_gate", b.moe->shared_expert_gate, b.moe_grads.shared_expert_gate,
            kInOut);
      }
    } else {
      add(p + "mlp.gate", b.mlp->gate, b.mlp_grads.gate, kOutIn);
      add(p + "mlp.up", b.mlp->up, b.mlp_grads.up, kOutIn);
      add(p + "mlp.down", b.mlp->down, b.mlp_grads.down, kOutIn);
      // Llama's mlp_bias, rows [1, n], where the model has them.
      for (const auto& [slot, value, grad] :
           {std::tuple{"gate_bias", b.mlp->gate_bias, b.mlp_grads.gate_bias},
            std::tuple{"up_bias", b.mlp->up_bias, b.mlp_grads.up_bias},
            std::tuple{"down_bias", b.mlp->down_bias, b.mlp_grads.down_bias}}) {
        if (value != nullptr) add(p + "mlp." + slot, value, grad, kInOut);
      }
    }
    L.blocks.push_back(std::move(b));
  }
  L.final_norm = norm(stack.final_norm, "final_norm");
  L.final_norm_grad = gradient_like(*L.final_norm);
  add("final_norm", L.final_norm, L.final_norm_grad, kInOut);
  if (!L.tied) {
    L.head_grad = gradient_like(*L.head.weight);
    add("lm_head.weight", L.head.weight, L.head_grad, kOutIn);
  }
  compile();
}

LmTrainingStep::~LmTrainingStep() = default;
LmTrainingStep::LmTrainingStep(LmTrainingStep&&) noexcept = default;
LmTrainingStep& LmTrainingStep::operator=(LmTrainingStep&&) noexcept = default;

void LmTrainingStep::compile() {
  Layers& L = *layers_;
  const sharding::Mesh& m = mesh_.mesh();
  const std::int64_t h = config_.hidden, rows = batch_ * tokens_;
  const std::vector<std::string> sequence = sequence_axes(axes_);
  std::vector<std::string> row_axes = axes_.batch;
  row_axes.insert(row_axes.end(), sequence.begin(), sequence.end());
  const std::vector<std::int64_t> shape{batch_, tokens_, h};
  const PartitionSpec spec(
      {detail::entry_over(axes_.batch, m), detail::entry_over(sequence, m), AxisRule()});
  const PartitionSpec row_spec({detail::entry_over(row_axes, m), AxisRule()});

  ProgramBuilder pb(mesh_, fmt::format("training step (B={}, T={}, {} compute)", batch_, tokens_,
                                       to_string(precision_)));
  pb.set_matmul_precision(precision_);
  auto activation = [&](const std::string& name) -> ShardedTensor& {
    return pb.tensor(name, TensorRole::kActivation, shape, spec);
  };
  auto rows_tensor = [&](const std::string& name) -> ShardedTensor& {
    return pb.tensor(name, TensorRole::kActivation, {rows, h}, row_spec);
  };

  // Which of the caller's positions each row holds: slot s's tile of the activations, read in
  // its own order, lands in slot s's rows.
  ShardedTensor& x = activation("x");
  ShardedTensor& x_rows = rows_tensor("x.rows");
  position_of_row_.assign(static_cast<std::size_t>(rows), -1);
  const std::vector<std::int64_t> local = x.layout().shard_shape();
  for (std::int64_t s = 0; s < mesh_.size(); ++s) {
    const std::vector<std::int64_t> at = x.layout().tile_offset(s);
    const std::int64_t first_row = x_rows.layout().tile_offset(s)[0];
    for (std::int64_t b = 0; b < local[0]; ++b) {
      for (std::int64_t t = 0; t < local[1]; ++t) {
        const std::int64_t row = first_row + b * local[1] + t,
                           position = (at[0] + b) * tokens_ + at[1] + t;
        std::int64_t& slot = position_of_row_[static_cast<std::size_t>(row)];
        NUMESH_CHECK(slot == -1 || slot == position, ValueError,
                     "training: (internal) row {} holds positions {} and {} on different devices",
                     row, slot, position);
        slot = position;
      }
    }
  }
  inputs_.assign(static_cast<std::size_t>(rows), 0);
  targets_.assign(static_cast<std::size_t>(rows), 0);

  // ---- forward ----
  runtime::Frontier front = emit_embedding(pb, L.embedding, &inputs_, {}, x_rows, "embedding");
  front = emit_same_shards(pb, x_rows, x, front, "embedding.to_activations");
  const float eps = config_.norm_eps;
  struct Kept {
    ShardedTensor* block_in;  // the norm's input: the residual stream entering the block
    ShardedTensor* mid;       // block_in + attention's output, the MLP norm's input
    ShardedTensor* attn_norm;
    ShardedTensor* ffn_norm;
    AttentionSaved attention;
    MlpSaved mlp;
    MoeSaved moe;
  };
  std::vector<Kept> kept(L.blocks.size());
  ShardedTensor* stream = &x;
  ShardedTensor* ffn_out = nullptr;
  for (std::size_t l = 0; l < L.blocks.size(); ++l) {
    Layers::Block& b = L.blocks[l];
    Kept& k = kept[l];
    const std::string p = fmt::format("block{}", l);
    ShardedTensor& norm_w = pb.use(p + ".attn_norm", TensorRole::kWeight, b.attn_norm);
    k.attn_norm = &norm_w;
    ShardedTensor& n1 = activation(p + ".attn_in");
    k.block_in = ffn_out != nullptr ? &activation(p + ".x") : stream;
    front = emit_residual_rmsnorm(pb, *stream, ffn_out, &norm_w,
                                  ffn_out != nullptr ? k.block_in : nullptr, n1, eps, front,
                                  p + ".attn_norm");
    ShardedTensor& attn_out = activation(p + ".attn_out");
    front = emit_attention(pb, b.attention, n1, front, attn_out, p + ".attn", AttentionStep{},
                           &k.attention);
    ShardedTensor& ffn_norm_w = pb.use(p + ".ffn_norm", TensorRole::kWeight, b.ffn_norm);
    k.ffn_norm = &ffn_norm_w;
    k.mid = &activation(p + ".h");
    ShardedTensor& n2 = activation(p + ".ffn_in");
    front = emit_residual_rmsnorm(pb, *k.block_in, &attn_out, &ffn_norm_w, k.mid, n2, eps, front,
                                  p + ".ffn_norm");
    ShardedTensor& f = activation(p + ".ffn_out");
    front = b.moe ? emit_moe(pb, *b.moe, n2, front, f, p + ".moe", nullptr, &k.moe)
                  : emit_mlp(pb, *b.mlp, n2, front, f, p + ".mlp", &k.mlp);
    stream = k.mid;
    ffn_out = &f;
  }
  // The router's load-balancing loss: every MoE layer's choice counts and probability sums,
  // counted by one device of each group sharing the same tokens, all-reduced over the mesh.
  std::optional<RouterAuxGradient> aux;
  std::int64_t moe_layers = 0;
  for (const Layers::Block& b : L.blocks) moe_layers += b.moe ? 1 : 0;
  router_aux_rows_ = 0;
  if (router_aux_loss_coef_ > 0.0 && moe_layers > 0) {
    const std::int64_t e = config_.moe.num_experts, k = config_.moe.top_k;
    const PartitionSpec replicated({AxisRule(), AxisRule()});
    ShardedTensor& counts =
        pb.tensor("router_aux.local", TensorRole::kActivation, {1, 2 * e}, replicated);
    ShardedTensor& stats =
        pb.tensor("router_aux.stats", TensorRole::kOutput, {1, 2 * e}, replicated);
    const runtime::Frontier counted =
        pb.per_device("router_aux.count", {&front}, [&](std::int64_t s) {
          std::vector<std::pair<const RoutingTables*, const runtime::Tensor*>> layers;
          for (std::size_t l = 0; l < L.blocks.size(); ++l) {
            const MoeSaved& saved = kept[l].moe;
            if (!L.blocks[l].moe || !detail::first_of_partial_sum(mesh_, saved.partial_placed, s))
              continue;
            layers.emplace_back(saved.tables[static_cast<std::size_t>(s)],
                                saved.probs[static_cast<std::size_t>(s)]);
            router_aux_rows_ += saved.probs[static_cast<std::size_t>(s)]->shape()[0];
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
    const std::vector<sharding::Placement> all_replicated(m.rank(),
                                                          sharding::Placement::replicate());
    const runtime::Frontier reduced =
        pb.reshard(counts, all_partial, stats, all_replicated, counted, "router_aux.stats");
    pb.output("router_aux.stats", stats, reduced);
    aux = RouterAuxGradient{
        .stats = &stats,
        .ready = reduced,
        .scale = router_aux_loss_coef_ * static_cast<double>(e) /
                 (static_cast<double>(router_aux_rows_) * static_cast<double>(moe_layers * rows))};
  }
  ShardedTensor& final_w = pb.use("final_norm", TensorRole::kWeight, L.final_norm);
  ShardedTensor& z = activation("final.x");
  ShardedTensor& y = activation("final.y");
  front = emit_residual_rmsnorm(pb, *stream, ffn_out, &final_w, &z, y, eps, front, "final_norm");
  ShardedTensor& y_rows = rows_tensor("final.y.rows");
  front = emit_same_shards(pb, y, y_rows, front, "final.to_rows");
  ShardedTensor& losses = pb.tensor("losses", TensorRole::kOutput, {rows, 1}, row_spec);
  CrossEntropySaved ce;
  front = emit_lm_head_cross_entropy(pb, L.head, y_rows, &targets_, front, losses, "lm_head", &ce);
  pb.output("losses", losses, front);

  // ---- backward: the mean over the rows, every operator's backward in reverse ----
  ShardedTensor& dy_rows = rows_tensor("final.y.rows.grad");
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
  ShardedTensor& dy = activation("final.y.grad");
  front = emit_same_shards(pb, dy_rows, dy, front, "final.grad_to_activations");
  ShardedTensor* d_stream = &activation("final.x.grad");
  emit_rmsnorm_backward(pb, z, final_w, dy, nullptr, *d_stream,
                        pb.use("final_norm.grad", TensorRole::kOutput, L.final_norm_grad), eps,
                        front, "final_norm.bwd", &dx_ready);
  front = dx_ready;
  for (std::size_t i = L.blocks.size(); i-- > 0;) {
    Layers::Block& b = L.blocks[i];
    const Kept& k = kept[i];
    const std::string p = fmt::format("block{}", i);
    // d_stream is the gradient of the block's output mid + f: f's, and mid's through the residual.
    ShardedTensor& dn2 = activation(p + ".ffn_in.grad");
    if (b.moe) {
      emit_moe_backward(pb, *b.moe, k.moe, *d_stream, front, dn2, b.moe_grads, p + ".moe.bwd",
                        aux ? &*aux : nullptr, &dx_ready);
    } else {
      emit_mlp_backward(pb, *b.mlp, k.mlp, *d_stream, front, dn2, b.mlp_grads, p + ".mlp.bwd",
                        &dx_ready);
    }
    front = dx_ready;
    ShardedTensor& dmid = activation(p + ".h.grad");
    emit_rmsnorm_backward(pb, *k.mid, *k.ffn_norm, dn2, d_stream, dmid,
                          pb.use(p + ".ffn_norm.grad", TensorRole::kOutput, b.ffn_norm_grad), eps,
                          front, p + ".ffn_norm.bwd", &dx_ready);
    front = dx_ready;
    ShardedTensor& dn1 = activation(p + ".attn_in.grad");
    emit_attention_backward(pb, b.attention, k.attention, dmid, front, dn1, b.attention_grads,
                            p + ".attn.bwd", &dx_ready);
    front = dx_ready;
    ShardedTensor& d_in = activation(p + ".x.grad");
    emit_rmsnorm_backward(pb, *k.block_in, *k.attn_norm, dn1, &dmid, d_in,
                          pb.use(p + ".attn_norm.grad", TensorRole::kOutput, b.attn_norm_grad), eps,
                          front, p + ".attn_norm.bwd", &dx_ready);
    front = dx_ready;
    d_stream = &d_in;
  }
  ShardedTensor& dx_rows = rows_tensor("x.rows.grad");
  front = emit_same_shards(pb, *d_stream, dx_rows, front, "embedding.grad_to_rows");
  ShardedTensor& table_grad = pb.use("embedding.table.grad", TensorRole::kOutput, L.table_grad);
  front = emit_embedding_backward(pb, L.embedding, &inputs_, dx_rows, front, table_grad,
                                  "embedding.bwd");
  if (L.tied) {
    // One matrix used twice: its gradient is the sum of both uses'.
    pb.per_device("tied.grad", {&front, &head_grad_done}, [&](std::int64_t s) {
      runtime::Tensor& sum = table_grad.shard(s);
      runtime::Tensor& from_head = head_grad.shard(s);
      return [&sum, &from_head] {
        const std::span<float> to = sum.values();
        const std::span<const float> add = from_head.values();
        for (std::size_t i = 0; i < to.size(); ++i) to[i] += add[i];
      };
    });
  }
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
