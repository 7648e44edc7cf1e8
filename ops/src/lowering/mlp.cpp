#include "numesh/ops/lowering/mlp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

namespace {

using detail::add_bias_rows;
using detail::shape_text;
using sharding::AxisRule;
using sharding::PartitionSpec;

}  // namespace

MlpLayer MlpLayer::create(const runtime::DeviceMesh& mesh, MlpKind kind, const MlpWeights& w,
                          const MlpAxes& axes) {
  const MlpKindTraits traits = mlp_traits(kind);
  const std::string what = fmt::format("mlp ({})", traits.name);
  NUMESH_CHECK(w.up.shape.size() == 2 && w.down.shape.size() == 2, ShapeError,
               "{}: up {} and down {} must be matrices", what, shape_text(w.up),
               shape_text(w.down));
  MlpLayer layer;
  layer.kind = kind;
  layer.hidden = w.up.shape[0];
  layer.intermediate = w.up.shape[1];
  NUMESH_CHECK(layer.hidden > 0 && layer.intermediate > 0, ShapeError,
               "{}: up {} has an empty dim; the hidden and intermediate sizes must be positive",
               what, shape_text(w.up));
  NUMESH_CHECK(w.down.shape == (std::vector<std::int64_t>{layer.intermediate, layer.hidden}),
               ShapeError, "{}: up {} and down {} do not chain (expected down [{}, {}])", what,
               shape_text(w.up), shape_text(w.down), layer.intermediate, layer.hidden);
  NUMESH_CHECK(!traits.gated || w.gate.shape == w.up.shape, ShapeError,
               "{}: gate {} and up {} differ", what, shape_text(w.gate), shape_text(w.up));
  check_biases(w, kind, layer.hidden, layer.intermediate);
  const AxisRule tp = mesh.mesh().has_axis(axes.tensor) ? AxisRule(axes.tensor) : AxisRule();
  // Each bias a row [1, n] split as the outputs it is added to (F's over the tensor axis).
  layer.gate_bias = detail::laid_out_row(mesh, w.gate_bias, tp);
  layer.up_bias = detail::laid_out_row(mesh, w.up_bias, tp);
  layer.down_bias = detail::laid_out_row(mesh, w.down_bias, AxisRule());
  const AxisRule zero = detail::entry_over(axes.weights, mesh.mesh());
  // The weight axes (FSDP) gather the weights before each use; the collectives move element
  // types only, so far.
  std::int64_t gathered = 1;  // devices a weight shard is gathered from (size-1 axes: none)
  for (const std::string& a : axes.weights)
    gathered *= mesh.mesh().has_axis(a) ? mesh.mesh().axis_size(a) : 1;
  // Stored out-in (up and gate [F, H], down [H, F]): decode reads each output's weights in one run.
  const auto stored = [&](const char* name, const runtime::HostTensor& m, const PartitionSpec& spec,
                          DType as) {
    NUMESH_CHECK(is_element_dtype(as) || gathered == 1, NotImplementedError,
                 "{}: {} stored as {} and sharded over the weight axes ({}): gathering block "
                 "formats is not yet supported; drop those axes from the mesh or store f32, bf16 "
                 "or f16",
                 what, name, to_string(as), fmt::join(axes.weights, ", "));
    return detail::laid_out_out_in(mesh, m, spec, as);
  };
  layer.up = stored("up", w.up, PartitionSpec({zero, tp}), w.stored_as.up);
  layer.down = stored("down", w.down, PartitionSpec({tp, zero}), w.stored_as.down);
  if (traits.gated)
    layer.gate = stored("gate", w.gate, PartitionSpec({zero, tp}), w.stored_as.gate);
  return layer;
}

namespace {

// Refuses an x or y that does not fit the layer (H last and whole on every device).
void check_mlp_io_shapes(const MlpLayer& layer, const runtime::ShardedTensor& x,
                         const runtime::ShardedTensor& y, const std::string& name) {
  const std::size_t rank = x.shape().size();
  NUMESH_CHECK(rank >= 2 && x.shape().back() == layer.hidden &&
                   x.layout().shard_shape().back() == layer.hidden && y.shape() == x.shape(),
               ShapeError,
               "{}: x {} {} and y {} do not fit hidden {} (H must be last and not split)", name,
               fmt::join(x.shape(), "x"), x.spec().repr(), fmt::join(y.shape(), "x"), layer.hidden);
}

// The MLP's weights as the run multiplies them (gate null without a gate).
struct MlpRunWeights {
  runtime::ShardedTensor& up;    // [F, H]
  runtime::ShardedTensor& down;  // [H, F]
  runtime::ShardedTensor* gate;
};

// FSDP: weights stored split along H are gathered for the run (each into its own buffer;
// the gathers start at once, overlapping whatever runs before the MLP). Each gather's frontier
// goes to `ready`.
MlpRunWeights gather_mlp_weights(ProgramBuilder& pb, const MlpLayer& layer, const std::string& name,
                                 std::vector<runtime::Frontier>& ready) {
  auto gather_weight = [&](const std::shared_ptr<runtime::ShardedTensor>& stored,
                           const std::string& wname, std::size_t h_dim) -> runtime::ShardedTensor& {
    runtime::ShardedTensor& t = pb.use(name + "." + wname, TensorRole::kWeight, stored);
    runtime::Frontier f;
    runtime::ShardedTensor& g =
        pb.gather_over(t, detail::axes_of(t.spec(), h_dim), TensorRole::kActivation,
                       name + "." + wname + ".gathered", f);
    if (!f.empty()) ready.push_back(std::move(f));
    return g;
  };
  runtime::ShardedTensor& up = gather_weight(layer.up, "w_up", 1);        // [F, H]
  runtime::ShardedTensor& down = gather_weight(layer.down, "w_down", 0);  // [H, F]
  runtime::ShardedTensor* gate = layer.gate ? &gather_weight(layer.gate, "w_gate", 1) : nullptr;
  return MlpRunWeights{.up = up, .down = down, .gate = gate};
}

// Placements of the partial output: the gathered x's, plus Partial(sum) on the axes that
// split F.
std::vector<sharding::Placement> mlp_partial_placements(const runtime::ShardedTensor& xc,
                                                        const runtime::ShardedTensor& up,
                                                        const sharding::Mesh& m, std::size_t rank) {
  std::vector<sharding::Placement> y_placed = sharding::to_placements(xc.spec(), m, rank);
  const std::vector<sharding::Placement> up_placed = sharding::to_placements(up.spec(), m, 2);
  for (std::size_t a = 0; a < up_placed.size(); ++a) {
    if (up_placed[a].is_shard()) y_placed[a] = sharding::Placement::partial();
  }
  return y_placed;
}

// Per device: h = act(x w_up + b_up) (gated: act(x w_gate + b_gate) .* (x w_up + b_up)) into
// scratch. A forward kept for the backward keeps the pre-activations too: the activation
// then reads a copy. Fills hidden (and saved's per-slot buffers).
runtime::Frontier emit_mlp_up(ProgramBuilder& pb, const MlpRunWeights& w, Activation act,
                              runtime::ShardedTensor& xc, runtime::ShardedTensor* gate_bias,
                              runtime::ShardedTensor* up_bias,
                              const std::vector<const runtime::Frontier*>& inputs,
                              std::int64_t rows, std::int64_t h, const std::string& name,
                              MlpSaved* saved, std::vector<runtime::Tensor*>& hidden) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  runtime::ShardedTensor* gate = w.gate;
  const std::int64_t f_local = w.up.layout().shard_shape()[0];
  const double flops =
      2.0 * static_cast<double>(rows * h * f_local) * (gate != nullptr ? 3.0 : 2.0);
  return pb.per_device(name + ".up", inputs, [&](std::int64_t s) {
    const auto i = static_cast<std::size_t>(s);
    runtime::Tensor& xs = xc.shard(s);
    runtime::Tensor& hs = pb.scratch(s, {rows, f_local});
    hidden[i] = &hs;
    runtime::Tensor* us =
        gate != nullptr || saved != nullptr ? &pb.scratch(s, {rows, f_local}) : nullptr;
    runtime::Tensor* gs =
        gate != nullptr && saved != nullptr ? &pb.scratch(s, {rows, f_local}) : nullptr;
    if (saved != nullptr) {
      saved->up_pre[i] = us;
      saved->gate_pre[i] = gs;
      saved->hidden[i] = &hs;
    }
    runtime::Tensor& wu = w.up.shard(s);
    runtime::Tensor* wg = gate != nullptr ? &gate->shard(s) : nullptr;
    const std::span<const float> bg = detail::row_of(gate_bias, s), bu = detail::row_of(up_bias, s);
    pb.add_flops(s, flops);
    return [prec, act, &xs, &hs, us, gs, &wu, wg, rows, h, bg, bu] {
      const ConstMatrixMap xm(xs.values().data(), rows, h);
      if (wg == nullptr) {  // no gate
        MatrixMap pre = as_matrix(us != nullptr ? *us : hs);
        device_gemm(xm, as_out_in_weight(wu), pre, prec);
        add_bias_rows(pre, bu);
        if (us != nullptr) as_matrix(hs) = pre;
        activation_inplace(act, as_matrix(hs));
        return;
      }
      MatrixMap gate_pre = as_matrix(gs != nullptr ? *gs : hs);
      const SharedInputProduct gate_up[] = {{as_out_in_weight(*wg), gate_pre},
                                            {as_out_in_weight(wu), as_matrix(*us)}};
      device_gemms(xm, gate_up, prec);
      add_bias_rows(gate_pre, bg);
      add_bias_rows(as_matrix(*us), bu);
      if (gs != nullptr) as_matrix(hs) = gate_pre;
      gated_inplace(act, as_matrix(hs), as_matrix(std::as_const(*us)));
    };
  });
}

// Per device: y_partial = h w_down (+ b_down once per partial sum).
runtime::Frontier emit_mlp_down(ProgramBuilder& pb, runtime::ShardedTensor& down,
                                const std::vector<runtime::Tensor*>& hidden,
                                runtime::ShardedTensor& y_partial,
                                const std::vector<sharding::Placement>& y_placed,
                                runtime::ShardedTensor* down_bias, std::int64_t rows,
                                std::int64_t h, const runtime::Frontier& projected,
                                const std::string& name) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  const runtime::DeviceMesh& mesh = pb.mesh();
  return pb.per_device(name + ".down", {&projected}, [&](std::int64_t s) {
    runtime::Tensor& hs = *hidden[static_cast<std::size_t>(s)];
    runtime::Tensor& wd = down.shard(s);
    runtime::Tensor& yp = y_partial.shard(s);
    // The down bias is added once: by every device when F is not split, else by the first of
    // the devices whose partial sums the reduction adds.
    const bool adds_bias = detail::first_of_partial_sum(mesh, y_placed, s);
    const std::span<const float> bd = detail::row_of(down_bias, s);
    return [prec, &hs, &wd, &yp, rows, h, bd, adds_bias] {
      const MatrixMap ym(yp.values().data(), rows, h);
      device_gemm(as_matrix(std::as_const(hs)), as_out_in_weight(wd), ym, prec);
      if (adds_bias) add_bias_rows(ym, bd);
    };
  });
}

}  // namespace

runtime::Frontier emit_mlp(ProgramBuilder& pb, const MlpLayer& layer, runtime::ShardedTensor& x,
                           const runtime::Frontier& after, runtime::ShardedTensor& y,
                           const std::string& name, MlpSaved* saved) {
  const runtime::DeviceMesh& mesh = pb.mesh();
  const auto& m = mesh.mesh();
  const std::size_t rank = x.shape().size();
  check_mlp_io_shapes(layer, x, y, name);
  std::vector<runtime::Frontier> ready;
  const MlpRunWeights w = gather_mlp_weights(pb, layer, name, ready);
  // Sequence parallelism over the F axis: gather the tokens first.
  const std::vector<std::string> f_axes = detail::axes_of(w.up.spec(), 0);
  runtime::Frontier x_ready = after;
  runtime::ShardedTensor& xc =
      pb.gather_over(x, f_axes, TensorRole::kActivation, name + ".x_gathered", x_ready);
  ready.push_back(x_ready);
  runtime::ShardedTensor& y_partial =
      pb.tensor(name + ".partial", TensorRole::kActivation, xc.shape(), xc.spec());
  const std::vector<sharding::Placement> y_placed = mlp_partial_placements(xc, w.up, m, rank);
  const std::int64_t rows = xc.layout().elements_per_device() / layer.hidden;

  // The biases, registered once; a device reads its shard (its slice of F for gate and up).
  runtime::ShardedTensor* const gate_bias =
      pb.use_if_present(name + ".gate_bias", TensorRole::kWeight, layer.gate_bias);
  runtime::ShardedTensor* const up_bias =
      pb.use_if_present(name + ".up_bias", TensorRole::kWeight, layer.up_bias);
  runtime::ShardedTensor* const down_bias =
      pb.use_if_present(name + ".down_bias", TensorRole::kWeight, layer.down_bias);
  const auto slots = static_cast<std::size_t>(mesh.size());
  if (saved != nullptr) {
    *saved = MlpSaved{.x = &xc,
                      .up = &w.up,
                      .gate = w.gate,
                      .down = &w.down,
                      .up_pre = std::vector<runtime::Tensor*>(slots),
                      .gate_pre = std::vector<runtime::Tensor*>(slots),
                      .hidden = std::vector<runtime::Tensor*>(slots),
                      .x_placed = sharding::to_placements(x.spec(), m, rank),
                      .partial_placed = y_placed,
                      .y_placed = sharding::to_placements(y.spec(), m, rank)};
  }
  // Per device: the up projection and activation into scratch, then the down projection into
  // y_partial.
  std::vector<runtime::Tensor*> hidden(slots);
  std::vector<const runtime::Frontier*> inputs;
  for (const runtime::Frontier& f : ready) inputs.push_back(&f);
  const runtime::Frontier projected =
      emit_mlp_up(pb, w, mlp_traits(layer.kind).activation, xc, gate_bias, up_bias, inputs, rows,
                  layer.hidden, name, saved, hidden);
  const runtime::Frontier done = emit_mlp_down(pb, w.down, hidden, y_partial, y_placed, down_bias,
                                               rows, layer.hidden, projected, name);
  return pb.reshard(y_partial, y_placed, y, sharding::to_placements(y.spec(), m, rank), done,
                    name + ".out");
}

MlpGradients MlpGradients::like(const MlpLayer& layer) {
  return MlpGradients{.gate = optional_gradient_like(layer.gate),
                      .up = gradient_like(*layer.up),
                      .down = gradient_like(*layer.down),
                      .gate_bias = optional_gradient_like(layer.gate_bias),
                      .up_bias = optional_gradient_like(layer.up_bias),
                      .down_bias = optional_gradient_like(layer.down_bias)};
}

ShardedMlp::ShardedMlp(runtime::DeviceMesh mesh, MlpKind kind, const MlpWeights& w,
                       std::int64_t tokens, MlpAxes axes)
    : layer_(MlpLayer::create(mesh, kind, w, axes)), tokens_(tokens) {
  NUMESH_CHECK(tokens > 0, ShapeError, "mlp ({}): {} tokens; need at least one", to_string(kind),
               tokens);
  ProgramBuilder pb(mesh, fmt::format("mlp ({})", to_string(kind)));
  const std::vector<std::int64_t> shape{tokens, layer_.hidden};
  std::vector<std::string> token_axes = axes.batch;
  token_axes.insert(token_axes.end(), axes.sequence.begin(), axes.sequence.end());
  const PartitionSpec spec =
      sharding::correct_spec(
          shape, PartitionSpec({detail::entry_over(token_axes, mesh.mesh()), AxisRule()}),
          mesh.mesh())
          .spec;
  runtime::Frontier loaded;
  runtime::ShardedTensor& x = pb.input("x", shape, spec, loaded);
  runtime::ShardedTensor& y = pb.tensor("y", TensorRole::kOutput, shape, spec);
  pb.output("y", y, emit_mlp(pb, layer_, x, loaded, y, "mlp"));
  activation_spec_ = spec;
  program_ = std::make_unique<Program>(std::move(pb).compile());
}

runtime::HostTensor ShardedMlp::forward(const runtime::HostTensor& x) {
  NUMESH_CHECK(x.shape == (std::vector<std::int64_t>{tokens_, layer_.hidden}), ShapeError,
               "mlp: input is {} but the MLP was compiled for [{}, {}]", shape_text(x), tokens_,
               layer_.hidden);
  return program_->run("x", x, "y");
}

}  // namespace numesh::ops
