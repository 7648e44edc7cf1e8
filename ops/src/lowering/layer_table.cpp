#include "numesh/ops/lowering/layer_table.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "numesh/ops/reference/transformer.hpp"

namespace numesh::ops {

namespace {

using runtime::HostTensor;

// A norm weight given as [H] or [1, H].
HostTensor as_row(HostTensor t) {
  if (t.shape.size() == 1) t.shape = {1, t.shape[0]};
  return t;
}

AttentionConfig attention_config(const LayerOptions& o, const LayerInputs& in,
                                 const HostTensor& wq) {
  const std::string heads = option_text(in.option_style(), "heads", o.heads);
  NUMESH_CHECK(o.heads > 0, ValueError, "{}: attention needs the number of query heads ({})", heads,
               option_text(in.option_style(), "heads", "N"));
  NUMESH_CHECK(o.kv_heads >= 0, ValueError, "{} is negative (0: as many as the query heads)",
               option_text(in.option_style(), "kv_heads", o.kv_heads));
  const std::int64_t kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
  NUMESH_CHECK(wq.shape.size() == 2 && wq.shape[1] % o.heads == 0, ShapeError,
               "{} is [{}]; its columns must be {} times head_dim", in.label("wq"),
               fmt::join(wq.shape, ", "), heads);
  return AttentionConfig{.num_heads = o.heads,
                         .num_kv_heads = kv,
                         .head_dim = wq.shape[1] / o.heads,
                         .causal = true,
                         .q_offset = 0,
                         .rope_theta = static_cast<float>(o.rope_theta)};
}

AttentionWeights attention_weights(const LayerInputs& in, DType stored_as) {
  return AttentionWeights{.wq = in.load("wq"),
                          .wk = in.load("wk"),
                          .wv = in.load("wv"),
                          .wo = in.load("wo"),
                          .stored_as = AttentionFormats::all(stored_as)};
}

MoeWeights moe_weights(const LayerInputs& in, DType stored_as) {
  return MoeWeights{.router = in.load("router"),
                    .gate = in.load("w_gate"),
                    .up = in.load("w_up"),
                    .down = in.load("w_down"),
                    .stored_as = MlpFormats::all(stored_as)};
}

MoeConfig moe_config(const LayerOptions& o, const LayerInputs& in, const HostTensor& router) {
  NUMESH_CHECK(router.shape.size() == 2, ShapeError, "{} is [{}]; expected [H, E]",
               in.label("router"), fmt::join(router.shape, ", "));
  return MoeConfig{.num_experts = router.shape[1],
                   .top_k = o.top_k,
                   .capacity_factor = static_cast<float>(o.capacity),
                   .renormalize = !o.raw_weights};
}

// Times `call` (the median of o.repeats) into r, then, with timing or a trace asked for, runs
// it once more with per-node timing on (two clock reads per node, so the median is taken
// without it); keeps the plan of `program`, which the calls ran (asked for after them: the
// first call compiles it).
void time_calls(const LayerOptions& o, const std::function<HostTensor()>& call,
                const std::function<Program&()>& program, LayerResult& r) {
  r.seconds = median_seconds([&] { r.y = call(); }, o.repeats, 0.0);
  Program& ran = program();
  r.plan = ran.plan();
  if (!o.timing && o.trace.empty()) return;
  ran.graph().set_timing(true);
  call();
  ran.graph().set_timing(false);
  if (o.timing) r.timing_table = ran.graph().timing_table();
  if (!o.trace.empty()) {
    std::ofstream file(o.trace);
    NUMESH_CHECK(file.is_open(), IoError, "cannot write --trace file '{}'", o.trace);
    file << ran.graph().chrome_trace() << "\n";
  }
}

// The dense reference times a row-major [rows, cols] tensor as an Eigen matrix.
RowMatrix matrix(const HostTensor& t) {
  return RowMatrix(Eigen::Map<const RowMatrix>(t.data.data(), t.shape[0], t.shape[1]));
}

// mlp: GELU (w1, w2) or, when w_gate is given, SwiGLU; F over the mlp axis.
LayerResult run_mlp(const LayerContext& ctx) {
  const LayerOptions& o = ctx.options;
  const HostTensor& x = ctx.x;
  const bool swiglu = ctx.inputs.has("w_gate");
  const MlpWeights w = swiglu ? MlpWeights{.gate = ctx.inputs.load("w_gate"),
                                           .up = ctx.inputs.load("w_up"),
                                           .down = ctx.inputs.load("w_down"),
                                           .stored_as = MlpFormats::all(ctx.weights)}
                              : MlpWeights{.gate = {},
                                           .up = ctx.inputs.load("w1"),
                                           .down = ctx.inputs.load("w2"),
                                           .stored_as = MlpFormats::all(ctx.weights)};
  ShardedMlp mlp(ctx.mesh, swiglu ? MlpKind::kSwiGLU : MlpKind::kGelu, w, x.shape[0],
                 MlpAxes{.batch = ctx.axes.batch, .tensor = ctx.axes.mlp});
  LayerResult r;
  time_calls(
      o, [&] { return mlp.forward(x); }, [&]() -> Program& { return mlp.program(); }, r);
  if (!o.no_check) {
    const RowMatrix want =
        swiglu ? mlp_swiglu_reference(matrix(x), matrix(w.gate), matrix(w.up), matrix(w.down),
                                      ctx.weights)
               : mlp_gelu_reference(matrix(x), matrix(w.up), matrix(w.down), ctx.weights);
    r.want = HostTensor{.shape = x.shape,
                        .data = std::vector<float>(want.data(), want.data() + want.size())};
  }
  return r;
}

// moe: top-k routing, experts over the expert axis, their F over the expert tensor axis.
LayerResult run_moe(const LayerContext& ctx) {
  const LayerOptions& o = ctx.options;
  const HostTensor& x = ctx.x;
  const MoeWeights w = moe_weights(ctx.inputs, ctx.weights);
  const MoeConfig c = moe_config(o, ctx.inputs, w.router);
  ShardedMoe moe(
      ctx.mesh, c, w, x.shape[0],
      MoeAxes{
          .batch = ctx.axes.batch, .expert = ctx.axes.expert, .tensor = ctx.axes.expert_tensor});
  LayerResult r;
  time_calls(
      o, [&] { return moe.forward(x); }, [&]() -> Program& { return moe.program(); }, r);
  r.stats = moe.stats();
  if (!o.no_check) {
    // One routing group per split of the tokens over the batch axes (from the mesh, not the layer).
    const std::int64_t groups = split_count(ctx.mesh.mesh(), ctx.axes.batch, x.shape[0]),
                       per = x.shape[0] / groups, h = x.shape[1];
    HostTensor want = HostTensor::zeros(x.shape);
    for (std::int64_t g = 0; g < groups; ++g) {
      const RowMatrix yg =
          moe_reference(Eigen::Map<const RowMatrix>(x.data.data() + g * per * h, per, h), w, c);
      std::copy(yg.data(), yg.data() + yg.size(), want.data.begin() + g * per * h);
    }
    r.want = std::move(want);
  }
  return r;
}

// attention: heads over the heads axis, with a KV cache outside train mode.
LayerResult run_attention(const LayerContext& ctx) {
  const LayerOptions& o = ctx.options;
  const HostTensor& x = ctx.x;
  const TokenPlan& tp = ctx.tokens;
  const AttentionWeights w = attention_weights(ctx.inputs, ctx.weights);
  const AttentionConfig c = attention_config(o, ctx.inputs, w.wq);
  const std::int64_t cache = ctx.mode == sharding::Mode::kTrain ? 0 : x.shape[1];
  ShardedAttention layer(ctx.mesh, c, w, x.shape[0], cache,
                         AttentionAxes{.batch = ctx.axes.batch, .heads = ctx.axes.heads},
                         ctx.kv_layout);
  if (tp.prefix > 0) layer.forward(slice_tokens(x, 0, tp.prefix), 0);
  const HostTensor chunk = slice_tokens(x, tp.prefix, tp.count);
  LayerResult r;
  time_calls(
      o, [&] { return layer.forward(chunk, tp.prefix); },
      [&]() -> Program& { return layer.program(tp.count); }, r);
  if (!o.no_check) r.want = slice_tokens(attention_layer_reference(x, w, c), tp.prefix, tp.count);
  return r;
}

// block: RMSNorm, attention, RMSNorm, then the SwiGLU MLP or, when router is given, the MoE;
// one bare block (no final norm) of a ShardedTransformer.
LayerResult run_block(const LayerContext& ctx) {
  const LayerOptions& o = ctx.options;
  const LayerInputs& in = ctx.inputs;
  const HostTensor& x = ctx.x;
  const TokenPlan& tp = ctx.tokens;
  TransformerConfig c;
  c.layers = 1;
  c.hidden = x.shape[2];
  TransformerWeights w;
  BlockWeights b;
  b.attn_norm = as_row(in.load("attn_norm"));
  b.ffn_norm = as_row(in.load("ffn_norm"));
  b.attention = attention_weights(in, ctx.weights);
  c.attention = attention_config(o, in, b.attention.wq);
  c.norm_eps = static_cast<float>(o.norm_eps);
  if (in.has("router")) {
    b.moe = moe_weights(in, ctx.weights);
    c.moe = moe_config(o, in, b.moe.router);
    NUMESH_CHECK(b.moe.gate.shape.size() == 3, ShapeError, "{} is [{}]; expected [E, H, F]",
                 in.label("w_gate"), fmt::join(b.moe.gate.shape, ", "));
    c.moe_ffn = b.moe.gate.shape[2];
    // Every layer is a MoE, so no dense FFN runs; its size is the experts' rather than a
    // default the caller never gave (it shows in the config's errors).
    c.ffn = c.moe_ffn;
    c.moe_every = 1;
  } else {
    b.mlp = MlpWeights{.gate = in.load("w_gate"),
                       .up = in.load("w_up"),
                       .down = in.load("w_down"),
                       .stored_as = MlpFormats::all(ctx.weights)};
    NUMESH_CHECK(b.mlp.up.shape.size() == 2, ShapeError, "{} is [{}]; expected [H, F]",
                 in.label("w_up"), fmt::join(b.mlp.up.shape, ", "));
    c.ffn = b.mlp.up.shape[1];
    c.moe_every = 0;
  }
  w.blocks.push_back(std::move(b));  // no final norm: a bare block
  ShardedTransformer model(ctx.mesh, c, w, x.shape[0], x.shape[1], ctx.axes, ctx.kv_layout);
  if (tp.prefix > 0) model.forward(slice_tokens(x, 0, tp.prefix), 0);
  const HostTensor chunk = slice_tokens(x, tp.prefix, tp.count);
  LayerResult r;
  time_calls(
      o, [&] { return model.forward(chunk, tp.prefix); },
      [&]() -> Program& { return model.program(tp.count); }, r);
  if (c.moe_every > 0) r.stats = model.moe_stats();
  if (!o.no_check) {
    TransformerReference reference(c, w, x.shape[0], x.shape[1],
                                   split_count(ctx.mesh.mesh(), ctx.axes.batch, x.shape[0]),
                                   sequence_groups(ctx.mesh.mesh(), ctx.axes.sequence));
    if (tp.prefix > 0) reference.forward(slice_tokens(x, 0, tp.prefix), 0);
    r.want = reference.forward(chunk, tp.prefix);
  }
  return r;
}

}  // namespace

std::span<const LayerEntry> layer_table() {
  static const std::vector<LayerEntry> table{
      {.name = "mlp",
       .inputs_help = "x [T, H]; GELU: w1 [H, F], w2 [F, H]; SwiGLU (when w_gate.npy exists): "
                      "w_gate, w_up [H, F], "
                      "w_down [F, H]",
       .sequence = false,
       .inputs = {.required = {},
                  .switch_input = "w_gate",
                  .when_present = {"w_gate", "w_up", "w_down"},
                  .when_absent = {"w1", "w2"}},
       .run = run_mlp},
      {.name = "attention",
       .inputs_help =
           "x [B, T, H], wq [H, heads*d], wk, wv [H, kv_heads*d], wo [heads*d, H]; needs --heads",
       .sequence = true,
       .inputs = {.required = {"wq", "wk", "wv", "wo"},
                  .switch_input = {},
                  .when_present = {},
                  .when_absent = {}},
       .run = run_attention},
      {.name = "moe",
       .inputs_help = "x [T, H], router [H, E], w_gate, w_up [E, H, F], w_down [E, F, H]",
       .sequence = false,
       .inputs = {.required = {"router", "w_gate", "w_up", "w_down"},
                  .switch_input = {},
                  .when_present = {},
                  .when_absent = {}},
       .run = run_moe},
      {.name = "block",
       .inputs_help = "x [B, T, H], attn_norm [H], wq, wk, wv, wo, ffn_norm [H], then the MLP's\n"
                      "w_gate, w_up, w_down [H, F] or, when router.npy exists, the MoE's files",
       .sequence = true,
       .inputs = {.required = {"attn_norm", "ffn_norm", "wq", "wk", "wv", "wo"},
                  .switch_input = "router",
                  .when_present = {"router", "w_gate", "w_up", "w_down"},
                  .when_absent = {"w_gate", "w_up", "w_down"}},
       .run = run_block},
  };
  return table;
}

const LayerEntry* find_layer(std::string_view name) {
  for (const LayerEntry& e : layer_table()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string layer_names_text() {
  const std::span<const LayerEntry> table = layer_table();
  std::string out;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (i > 0) out += i + 1 == table.size() ? " or " : ", ";
    out += table[i].name;
  }
  return out;
}

std::vector<std::string> needed_inputs(const LayerEntry& entry, const LayerInputs& inputs) {
  const LayerInputNames& f = entry.inputs;
  std::vector<std::string> out{"x"};
  out.insert(out.end(), f.required.begin(), f.required.end());
  if (!f.switch_input.empty()) {
    const std::vector<std::string>& variant =
        inputs.has(f.switch_input) ? f.when_present : f.when_absent;
    out.insert(out.end(), variant.begin(), variant.end());
  }
  return out;
}

void check_x(const LayerEntry& entry, const HostTensor& x, const LayerInputs& inputs) {
  const std::size_t rank = entry.sequence ? 3 : 2;
  NUMESH_CHECK(x.shape.size() == rank, ShapeError, "{} is [{}]; {} takes x [{}]", inputs.label("x"),
               fmt::join(x.shape, ", "), entry.name, entry.sequence ? "B, T, H" : "T, H");
}

TokenPlan token_plan(const LayerEntry& entry, const HostTensor& x, sharding::Mode mode,
                     std::int64_t position, const LayerInputs& inputs) {
  if (!entry.sequence) return {0, x.shape[0]};
  const std::int64_t t = x.shape[1];
  switch (mode) {
    case sharding::Mode::kDecode:
      return {t - 1, 1};
    case sharding::Mode::kInsert: {
      const std::int64_t p = position < 0 ? t / 2 : position;
      NUMESH_CHECK(p < t, ValueError,
                   "{}: x has {} tokens, insert needs at least one at or after it",
                   option_text(inputs.option_style(), "position", p), t);
      return {p, t - p};
    }
    default:
      NUMESH_CHECK(position <= 0, ValueError, "{} applies to {} only",
                   option_text(inputs.option_style(), "position", position),
                   option_text(inputs.option_style(), "mode", "insert"));
      return {0, t};
  }
}

}  // namespace numesh::ops
