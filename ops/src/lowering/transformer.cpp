#include "numesh/ops/lowering/transformer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/rmsnorm.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/presets.hpp"

namespace numesh::ops {

namespace {

using detail::shape_text;
using sharding::AxisRule;
using sharding::PartitionSpec;

}  // namespace

// ---------------------------------------------------------------------------------------------
// The sharded model.

struct ShardedTransformer::Layer {
  AttentionLayer attention;
  KvCache cache;       // dense caches (batch, max_len)
  PagedKvCache paged;  // or paged ones (ragged steps)
  std::shared_ptr<runtime::ShardedTensor> attn_norm, ffn_norm;
  std::optional<MlpLayer> mlp;
  std::optional<MoeLayer> moe;
};

ShardedTransformer::ShardedTransformer(runtime::DeviceMesh mesh, TransformerConfig config,
                                       const TransformerWeights& w, std::int64_t batch,
                                       std::int64_t max_len, ModelAxes axes, KvLayout layout,
                                       DType kv_dtype)
    : mesh_(std::move(mesh)),
      config_(std::move(config)),
      axes_(std::move(axes)),
      batch_(batch),
      max_len_(max_len) {
  config_.validate();
  NUMESH_CHECK(batch > 0 && max_len > 0, ShapeError,
               "transformer: batch {} and max_len {} must be positive", batch, max_len);
  positions_.assign(static_cast<std::size_t>(batch),
                    0);  // a program run straight from program() starts at 0
  lay_out(w);
  const AxisRule batch_entry = detail::entry(activation_spec(1), 0);
  for (const auto& layer : layers_) {
    layer->cache =
        KvCache::create(mesh_, layer->attention, batch, max_len, layout, batch_entry, kv_dtype);
  }
}

ShardedTransformer::ShardedTransformer(runtime::DeviceMesh mesh, TransformerConfig config,
                                       const TransformerWeights& w, const PagedCacheOptions& paged,
                                       ModelAxes axes)
    : mesh_(std::move(mesh)),
      config_(std::move(config)),
      axes_(std::move(axes)),
      batch_(1),
      max_len_(paged.max_context),
      paged_(paged) {
  config_.validate();
  NUMESH_CHECK(paged.blocks >= 2 && paged.block_size >= 1 && paged.max_context >= 1, ShapeError,
               "transformer: paged caches of {} blocks of {} positions for contexts of {}; they "
               "need at least 2 blocks (block 0 takes the padding), and positive sizes",
               paged.blocks, paged.block_size, paged.max_context);
  ragged_.max_context = paged.max_context;
  lay_out(w);
  for (const auto& layer : layers_) {
    layer->paged = PagedKvCache::create(mesh_, layer->attention, paged.blocks, paged.block_size,
                                        paged.kv_dtype);
  }
}

void ShardedTransformer::lay_out(const TransformerWeights& w) {
  NUMESH_CHECK(static_cast<std::int64_t>(w.blocks.size()) == config_.layers, ShapeError,
               "transformer: {} blocks of weights for {} layers", w.blocks.size(), config_.layers);
  // The layers' norms, biases and routers written together, in one graph, at the end.
  detail::DeferredScatters small_weights;
  const std::int64_t h = config_.hidden;
  const PartitionSpec replicated({AxisRule(), AxisRule()});
  auto norm = [&](const runtime::HostTensor& t, std::string_view what) {
    NUMESH_CHECK(t.shape == (std::vector<std::int64_t>{1, h}), ShapeError,
                 "transformer: {} is {}, expected [1, {}]", what, shape_text(t), h);
    return detail::laid_out(mesh_, t, replicated);
  };
  for (std::int64_t l = 0; l < config_.layers; ++l) {
    const BlockWeights& b = w.blocks[static_cast<std::size_t>(l)];
    auto layer = std::make_unique<Layer>();
    layer->attention = AttentionLayer::create(
        mesh_, config_.attention, b.attention,
        AttentionAxes{.batch = axes_.batch, .sequence = {}, .heads = axes_.heads});
    NUMESH_CHECK(layer->attention.hidden == h, ShapeError,
                 "transformer: block {} attention has hidden {}, expected {}", l,
                 layer->attention.hidden, h);
    layer->attn_norm = norm(b.attn_norm, fmt::format("block {} attn_norm", l));
    layer->ffn_norm = norm(b.ffn_norm, fmt::format("block {} ffn_norm", l));
    if (config_.is_moe(l)) {
      layer->moe = MoeLayer::create(
          mesh_, config_.moe, b.moe,
          MoeAxes{.batch = axes_.batch, .expert = axes_.expert, .tensor = axes_.expert_tensor});
      const std::int64_t shared =
          layer->moe->shared_expert ? layer->moe->shared_expert->intermediate : 0;
      NUMESH_CHECK(shared == config_.shared_expert_ffn, ShapeError,
                   "transformer: block {} has a shared expert of intermediate size {} (0: none), "
                   "the config says {}",
                   l, shared, config_.shared_expert_ffn);
    } else {
      layer->mlp = MlpLayer::create(
          mesh_, config_.mlp_kind, b.mlp,
          MlpAxes{
              .batch = axes_.batch, .sequence = {}, .weights = axes_.weights, .tensor = axes_.mlp});
    }
    layers_.push_back(std::move(layer));
  }
  if (!w.final_norm.shape.empty()) final_norm_ = norm(w.final_norm, "final_norm");
  small_weights.flush();
}

std::vector<ShardedTransformer::NamedWeight> ShardedTransformer::weights() const {
  std::vector<NamedWeight> all;
  const auto add = [&](const std::string& name, const std::shared_ptr<runtime::ShardedTensor>& t,
                       WeightLayout layout = WeightLayout::kInOut) {
    if (t) all.push_back(NamedWeight{name, t, layout});
  };
  constexpr WeightLayout kOutIn = WeightLayout::kOutIn;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = *layers_[l];
    const std::string p = fmt::format("layers.{}.", l);
    add(p + "attn_norm", layer.attn_norm);
    add(p + "attention.wq", layer.attention.wq, kOutIn);
    add(p + "attention.wk", layer.attention.wk, kOutIn);
    add(p + "attention.wv", layer.attention.wv, kOutIn);
    add(p + "attention.wo", layer.attention.wo, kOutIn);
    add(p + "attention.bq", layer.attention.bq);
    add(p + "attention.bk", layer.attention.bk);
    add(p + "attention.bv", layer.attention.bv);
    add(p + "attention.bo", layer.attention.bo);
    add(p + "attention.q_norm", layer.attention.q_norm);
    add(p + "attention.k_norm", layer.attention.k_norm);
    add(p + "ffn_norm", layer.ffn_norm);
    if (layer.mlp) {
      add(p + "mlp.gate", layer.mlp->gate, kOutIn);
      add(p + "mlp.up", layer.mlp->up, kOutIn);
      add(p + "mlp.down", layer.mlp->down, kOutIn);
      add(p + "mlp.gate_bias", layer.mlp->gate_bias);
      add(p + "mlp.up_bias", layer.mlp->up_bias);
      add(p + "mlp.down_bias", layer.mlp->down_bias);
    }
    if (layer.moe) {
      add(p + "moe.router", layer.moe->router);
      add(p + "moe.gate", layer.moe->gate, kOutIn);
      add(p + "moe.up", layer.moe->up, kOutIn);
      add(p + "moe.down", layer.moe->down, kOutIn);
      if (layer.moe->shared_expert) {
        add(p + "moe.shared_expert.gate", layer.moe->shared_expert->gate, kOutIn);
        add(p + "moe.shared_expert.up", layer.moe->shared_expert->up, kOutIn);
        add(p + "moe.shared_expert.down", layer.moe->shared_expert->down, kOutIn);
      }
      add(p + "moe.shared_expert_gate", layer.moe->shared_expert_gate);
    }
  }
  add("final_norm", final_norm_);
  return all;
}

ShardedTransformer::~ShardedTransformer() = default;
ShardedTransformer::ShardedTransformer(ShardedTransformer&&) noexcept = default;
ShardedTransformer& ShardedTransformer::operator=(ShardedTransformer&&) noexcept = default;

PartitionSpec ShardedTransformer::activation_spec(std::int64_t tokens) const {
  const std::vector<std::int64_t> shape{batch_, tokens, config_.hidden};
  // A ragged step's tokens are whole on every device (its attention reads any sequence's).
  if (paged()) return PartitionSpec({AxisRule(), AxisRule(), AxisRule()});
  const std::vector<std::string> sequence = axes_.sequence.empty()
                                                ? std::vector<std::string>{}
                                                : std::vector<std::string>{axes_.sequence};
  return sharding::correct_spec(
             shape,
             PartitionSpec({detail::entry_over(axes_.batch, mesh_.mesh()),
                            detail::entry_over(sequence, mesh_.mesh()), AxisRule()}),
             mesh_.mesh())
      .spec;
}

ShardedTransformer::Programs::Entry& ShardedTransformer::compiled_for(std::int64_t tokens) {
  return programs_.get(tokens, [&](std::int64_t, std::vector<MoeRouting*>& routings) {
    return compile(tokens, routings);
  });
}

Program ShardedTransformer::compile(std::int64_t tokens, std::vector<MoeRouting*>& routings) {
  ProgramBuilder pb(mesh_, fmt::format("transformer (T={})", tokens));
  // A ragged step's rows are tokens of any sequences: each must get the same bits whatever
  // step it runs in (a request's tokens must not depend on its batch).
  if (paged()) pb.set_matmul_precision(MatmulPrecision::kRowInvariant);
  const std::vector<std::int64_t> shape{batch_, tokens, config_.hidden};
  const PartitionSpec spec = activation_spec(tokens);
  auto activation = [&](const std::string& name) -> runtime::ShardedTensor& {
    return pb.tensor(name, TensorRole::kActivation, shape, spec);
  };
  runtime::Frontier front;
  runtime::ShardedTensor& x = pb.input("x", shape, spec, front);
  runtime::ShardedTensor& y = pb.tensor("y", TensorRole::kOutput, shape, spec);
  const RmsNormConstants norm = config_.norm_constants();
  // Block l starts from its normalised input; the previous block's residual add and this
  // norm are one node per device.
  runtime::ShardedTensor* stream = &x;  // the residual stream entering the block
  runtime::ShardedTensor* ffn_out = nullptr;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = *layers_[l];
    const std::string p = fmt::format("block{}", l);
    // A block reads the one before it and nothing older, and writes its intermediates whole:
    // blocks three apart share memory (begin_stage).
    pb.begin_stage(p + ".");
    runtime::ShardedTensor& norm_w = pb.use(p + ".attn_norm", TensorRole::kWeight, layer.attn_norm);
    runtime::ShardedTensor& n1 = activation(p + ".attn_in");
    runtime::ShardedTensor* block_in = stream;
    if (ffn_out != nullptr) {
      block_in = &activation(p + ".x");
      front = emit_residual_rmsnorm(pb, *stream, ffn_out, &norm_w, block_in, n1, norm, front,
                                    p + ".attn_norm");
    } else {
      front = emit_residual_rmsnorm(pb, *stream, nullptr, &norm_w, nullptr, n1, norm, front,
                                    p + ".attn_norm");
    }
    runtime::ShardedTensor& attn_out = activation(p + ".attn_out");
    const AttentionStep step = paged()
                                   ? AttentionStep{.paged = &layer.paged, .ragged = &ragged_}
                                   : AttentionStep{.cache = &layer.cache, .positions = &positions_};
    front = emit_attention(pb, layer.attention, n1, front, attn_out, p + ".attn", step);
    runtime::ShardedTensor& ffn_norm_w =
        pb.use(p + ".ffn_norm", TensorRole::kWeight, layer.ffn_norm);
    runtime::ShardedTensor& mid = activation(p + ".h");
    runtime::ShardedTensor& n2 = activation(p + ".ffn_in");
    front = emit_residual_rmsnorm(pb, *block_in, &attn_out, &ffn_norm_w, &mid, n2, norm, front,
                                  p + ".ffn_norm");
    runtime::ShardedTensor& f = activation(p + ".ffn_out");
    if (layer.moe) {
      MoeRouting* routing = nullptr;
      front = emit_moe(pb, *layer.moe, n2, front, f, p + ".moe", &routing);
      routings.push_back(routing);
    } else {
      front = emit_mlp(pb, *layer.mlp, n2, front, f, p + ".mlp");
    }
    stream = &mid;
    ffn_out = &f;
  }
  // The last residual add, with the final norm when the model has one.
  runtime::ShardedTensor* final_w =
      final_norm_ ? &pb.use("final_norm", TensorRole::kWeight, final_norm_) : nullptr;
  pb.output("y", y,
            emit_residual_rmsnorm(pb, *stream, ffn_out, final_w, nullptr, y, norm, front,
                                  final_w ? "final_norm" : "residual"));
  return std::move(pb).compile();
}

Program& ShardedTransformer::program(std::int64_t tokens) {
  NUMESH_CHECK(tokens > 0 && tokens <= max_len_, ShapeError,
               "transformer: {} tokens; the caches hold {} positions", tokens, max_len_);
  return *compiled_for(tokens).program;
}

runtime::HostTensor ShardedTransformer::forward(const runtime::HostTensor& x,
                                                std::int64_t position) {
  const std::vector<std::int64_t> level(static_cast<std::size_t>(batch_), position);
  return forward(x, level);
}

const runtime::HostTensor& ShardedTransformer::forward_ragged(const runtime::HostTensor& x,
                                                              const RaggedBatch& batch) {
  NUMESH_CHECK(paged(), ValueError,
               "transformer: ragged steps need paged caches (the constructor with "
               "PagedCacheOptions)");
  NUMESH_CHECK(
      x.shape.size() == 3 && x.shape[0] == 1 && x.shape[1] > 0 && x.shape[2] == config_.hidden,
      ShapeError, "transformer: a ragged step's input is {}; it takes [1, N, {}]", shape_text(x),
      config_.hidden);
  NUMESH_CHECK(batch.max_context == paged_.max_context, ShapeError,
               "transformer: a ragged batch for contexts of {}; the caches were built for {}",
               batch.max_context, paged_.max_context);
  Programs::Entry& e = compiled_for(x.shape[1]);
  // Copied into the programs' own batch, its vectors sized once for the most a step of N
  // tokens can bring (a block table for each of its sequences, and the padding's), so that a
  // step allocates nothing.
  const std::int64_t n = x.shape[1];
  const std::int64_t sequences = paged_.max_sequences > 0 ? std::min(paged_.max_sequences, n) : n;
  const std::int64_t table =
      std::min((paged_.max_context + paged_.block_size - 1) / paged_.block_size, paged_.blocks - 1);
  ragged_.tables.reserve(static_cast<std::size_t>(sequences * table + 1));
  ragged_.positions.assign(batch.positions.begin(), batch.positions.end());
  ragged_.slots.assign(batch.slots.begin(), batch.slots.end());
  ragged_.context.assign(batch.context.begin(), batch.context.end());
  ragged_.table_of.assign(batch.table_of.begin(), batch.table_of.end());
  ragged_.tables.assign(batch.tables.begin(), batch.tables.end());
  e.program->set_input("x", x);
  e.program->run();
  last_ = &e;
  return e.program->output("y");
}

runtime::HostTensor ShardedTransformer::forward(const runtime::HostTensor& x,
                                                std::span<const std::int64_t> positions) {
  NUMESH_CHECK(!paged(), ValueError,
               "transformer: a stack with paged caches runs ragged steps (forward_ragged)");
  NUMESH_CHECK(
      x.shape.size() == 3 && x.shape[0] == batch_ && x.shape[1] > 0 && x.shape[2] == config_.hidden,
      ShapeError, "transformer: input is {} but the model takes [{}, T, {}] with T >= 1",
      shape_text(x), batch_, config_.hidden);
  const std::int64_t tokens = x.shape[1];
  check_fits(tokens, positions);
  Programs::Entry& e = compiled_for(tokens);
  positions_.assign(positions.begin(), positions.end());
  e.program->set_input("x", x);
  e.program->run();
  last_ = &e;
  return e.program->output("y");
}

void ShardedTransformer::check_fits(std::int64_t tokens,
                                    std::span<const std::int64_t> positions) const {
  NUMESH_CHECK(static_cast<std::int64_t>(positions.size()) == batch_, ShapeError,
               "transformer: {} positions for {} sequences", positions.size(), batch_);
  for (std::size_t b = 0; b < positions.size(); ++b) {
    const std::int64_t position = positions[b];
    NUMESH_CHECK(position >= 0 && position + tokens <= max_len_, IndexError,
                 "transformer: {} tokens at position {} (sequence {}) do not fit the KV cache of "
                 "{} positions",
                 tokens, position, b, max_len_);
  }
}

MoeStats ShardedTransformer::moe_stats() const {
  MoeStats sum;
  if (last_ == nullptr) return sum;
  for (const MoeRouting* r : last_->extra) {
    const MoeStats s = r->total();
    if (sum.tokens_per_expert.empty()) sum.tokens_per_expert.assign(s.tokens_per_expert.size(), 0);
    for (std::size_t e = 0; e < s.tokens_per_expert.size(); ++e)
      sum.tokens_per_expert[e] += s.tokens_per_expert[e];
    sum.dropped += s.dropped;
    sum.capacity = s.capacity;
  }
  return sum;
}

std::int64_t ShardedTransformer::routing_groups() const noexcept {
  const PartitionSpec spec = activation_spec(1);
  std::int64_t groups = 1;
  if (!spec.empty()) {
    for (const std::string& a : spec.entry_names(0)) groups *= mesh_.mesh().axis_size(a);
  }
  return groups;
}

std::int64_t ShardedTransformer::sequence_groups() const noexcept {
  const sharding::Mesh& m = mesh_.mesh();
  return !axes_.sequence.empty() && m.has_axis(axes_.sequence) ? m.axis_size(axes_.sequence) : 1;
}

std::int64_t ShardedTransformer::decode_bytes_per_device(std::int64_t position) const {
  auto bytes = [](const std::shared_ptr<runtime::ShardedTensor>& t) {
    return t ? t->shard_bytes() : std::int64_t{0};
  };
  std::int64_t total = bytes(final_norm_);
  for (const auto& layer : layers_) {
    const AttentionLayer& a = layer->attention;
    total += bytes(a.wq) + bytes(a.wk) + bytes(a.wv) + bytes(a.wo) + bytes(layer->attn_norm) +
             bytes(layer->ffn_norm);
    if (layer->mlp)
      total += bytes(layer->mlp->gate) + bytes(layer->mlp->up) + bytes(layer->mlp->down);
    if (layer->moe) {
      const MoeLayer& moe = *layer->moe;
      total += bytes(moe.router) + bytes(moe.gate) + bytes(moe.up) + bytes(moe.down);
      if (moe.shared_expert) {
        total += bytes(moe.shared_expert->gate) + bytes(moe.shared_expert->up) +
                 bytes(moe.shared_expert->down) + bytes(moe.shared_expert_gate);
      }
    }
    // The valid part of both caches: local sequences x (position + 1) x local kv heads x d.
    const runtime::ShardedTensor& cache_k = paged() ? *layer->paged.k : *layer->cache.k;
    const std::int64_t positions =
        paged() ? layer->paged.blocks * layer->paged.block_size : layer->cache.max_len;
    const std::int64_t cache_per_position = cache_k.shard_bytes() / positions;
    total += 2 * cache_per_position * (position + 1);
  }
  return total;
}

}  // namespace numesh::ops
