#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numesh/ops/reshard.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops {

/// Which MLP.
enum class MlpKind {
  kGelu,    ///< y = gelu(x w1) w2; weights "w1" [H, F], "w2" [F, H]
  kSwiGLU,  ///< y = (silu(x w_gate) .* (x w_up)) w_down; "w_gate", "w_up" [H, F], "w_down" [F, H]
};

/// "gelu" or "swiglu".
std::string_view to_string(MlpKind kind) noexcept;

/// The weights of an MLP, in host memory (as loaded from .npy). For kGelu, `up` is w1 and
/// `down` w2 and `gate` is unused (empty); for kSwiGLU all three are used.
struct MlpWeights {
  runtime::HostTensor gate;  ///< [H, F], SwiGLU only
  runtime::HostTensor up;    ///< [H, F]
  runtime::HostTensor down;  ///< [F, H]
};

/// Mesh axes the MLP is split over. Every field has a default (eformer's axis names).
struct MlpAxes {
  /// Tokens (rows of x) are split over these axes (data parallel); replicated when the token
  /// count does not divide (eformer's correction).
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// The intermediate dim F is split over this axis (tensor parallel): up and gate are
  /// column-parallel, down is row-parallel, and the partial sums of the down projection are
  /// all-reduced over it. Replicated (no collective) when F does not divide.
  std::string tensor = "tp";
};

/// The MLP lowered onto a device mesh, compiled once, run many times:
///  - x [T, H] is sharded P(batch, None) (each device holds its rows, replicated over tp);
///  - the up/gate weights P(None, tp) and the down weight P(tp, None), each shard on its
///    device's node;
///  - per device: h = act(x_local w_up_local) (SwiGLU: silu(x w_gate) .* (x w_up)), then
///    y_partial = h w_down_local, a Partial(sum) over tp;
///  - the partial sums go through reshard() to y P(batch, None): one all-reduce over tp.
/// Specs pass through eformer's correction, so axes the mesh lacks or that do not divide are
/// replicated instead (and the all-reduce disappears when F is not split).
/// GEMMs run on the device's threads (rows split over them), single-threaded OpenBLAS each.
/// Not thread-safe: one thread drives an instance.
class ShardedMlp {
 public:
  /// Lays out the weights on the mesh (each shard written by its own device) and compiles the
  /// graph for `tokens` rows.
  /// Throws: ShapeError naming the shapes when the weights do not fit one another or `tokens`
  /// is not positive; what the layout and correction throw for bad axes.
  ShardedMlp(runtime::DeviceMesh mesh, MlpKind kind, const MlpWeights& weights,
             std::int64_t tokens, MlpAxes axes = {});

  /// Runs the MLP on x [T, H] and returns y [T, H].
  /// Throws: ShapeError when x's shape is not [tokens, H]; what a node throws.
  runtime::HostTensor forward(const runtime::HostTensor& x);

  /// The specs chosen (after correction): x/y, up/gate, down.
  const sharding::PartitionSpec& activation_spec() const noexcept { return x_->spec(); }
  const sharding::PartitionSpec& up_spec() const noexcept { return up_->spec(); }
  const sharding::PartitionSpec& down_spec() const noexcept { return down_->spec(); }
  /// The collectives of the output reshard (empty: none needed).
  const std::vector<sharding::ReshardStep>& collectives() const noexcept { return reshard_.plan; }
  /// The compiled graph (DOT, timing).
  runtime::CompiledGraph& graph() noexcept { return *graph_; }

 private:
  MlpKind kind_;
  std::int64_t tokens_, hidden_, intermediate_;
  std::unique_ptr<runtime::ShardedTensor> x_, gate_, up_, down_, y_partial_, y_;
  std::vector<runtime::Tensor> h_, u_;  // per slot: [rows, F_local] scratch
  ReshardResult reshard_;
  std::unique_ptr<runtime::CompiledGraph> graph_;
};

}  // namespace numesh::ops
