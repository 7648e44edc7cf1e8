#pragma once

// PRIVATE to ops/src: the arithmetic of the dense references, in float64 and written on its
// own. The sharded operators run fp32 kernels (gemm(), the Eigen activations, rope_inplace,
// attention_core); the references share none of that code, so an error in a kernel cannot hide
// by appearing on both sides of a check. Inputs are fp32 and are widened exactly; the results
// are rounded to fp32 once, by the public functions (reference.hpp, TransformerReference).
//
// Matrices are row-major [rows, cols]; a [B, T, heads, head_dim] activation is the matrix
// [B * T, heads * head_dim] (the same bytes in bthd order).

#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/mlp_config.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/ops/rope_scaling.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops::oracle {

/// A row-major float64 matrix.
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// `rows` x `cols` fp32 values at `data`, widened.
MatrixD widen(const float* data, std::int64_t rows, std::int64_t cols);
/// A host tensor's values as [rows, cols]. REQUIRES: rows * cols == t.size().
MatrixD widen(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols);
/// `m` rounded to fp32 as a host tensor of `shape`. REQUIRES: the sizes agree.
runtime::HostTensor narrow(const MatrixD& m, std::vector<std::int64_t> shape);
/// `m` rounded to fp32 as a matrix.
RowMatrix narrow(const MatrixD& m);
/// A weight tensor's values as [rows, cols] (inputs by outputs) as a tensor of `dtype` stores
/// them: rounded to nearest even into bf16 / f16 (runtime::rounded_to), or a block format's blocks
/// along each output's inputs (the layers store such weights out-in), widened.
MatrixD stored(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols, DType dtype);
/// `rows` x `cols` weights at `data` as stored in `dtype` (one expert of a stacked weight). A
/// block format quantizes along `rows` (the inputs: such weights are stored out-in).
MatrixD stored(const float* data, std::int64_t rows, std::int64_t cols, DType dtype);
/// The input of a projection by weights stored as `dtype`, as the kernels use it: bf16 weights
/// multiply bf16 activations (each value rounded through fp32 to bf16, as PyTorch's bf16 linear
/// and ggml's bf16 dot product do; products exact, sums in fp32); block formats (q8_0, q4_0)
/// multiply activations quantized to 8 bits a 32-element block, as llama.cpp's do; f32 and f16
/// keep the fp32 activations.
MatrixD projection_input(const MatrixD& x, DType weights);
/// x m for a weight m [in, out] stored as `format`: x rounded as projection_input() says and
/// m as stored() holds it.
MatrixD project(const MatrixD& x, const runtime::HostTensor& m, DType format);
/// An fp32 matrix widened.
inline MatrixD wide(const RowMatrix& m) { return m.cast<double>(); }

/// 0.5 x (1 + erf(x / sqrt(2))).
double gelu(double x) noexcept;
/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), PyTorch's gelu(approximate="tanh").
double gelu_tanh(double x) noexcept;
/// 1 / (1 + e^-x), in a form that overflows for no x.
double sigmoid(double x) noexcept;
/// x * sigmoid(x).
double silu(double x) noexcept;
/// act(x), in float64.
double activation(Activation act, double x) noexcept;
/// act'(x), in float64.
double activation_slope(Activation act, double x) noexcept;

/// gelu(x w1) w2, w1 stored as `weights.up` and w2 as `weights.down` (already rounded by the
/// caller; each projection's input is rounded here for its own format, projection_input()).
MatrixD gelu_mlp(const MatrixD& x, const MatrixD& w1, const MatrixD& w2,
                 const MlpFormats& weights = {});
/// (silu(x w_gate) .* (x w_up)) w_down, as gelu_mlp for `weights`.
MatrixD swiglu_mlp(const MatrixD& x, const MatrixD& w_gate, const MatrixD& w_up,
                   const MatrixD& w_down, const MlpFormats& weights = {});
/// The MLP of `w` on x [T, H]: its matrices as stored in w.stored_as (stored()), the
/// projections' inputs rounded as gelu_mlp says, each bias (when not empty) added to its
/// projection's output. Weights validated by the caller.
MatrixD mlp(const MatrixD& x, MlpKind kind, const MlpWeights& w);
/// x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight, weight a [1, H] row.
MatrixD rmsnorm(const MatrixD& x, const MatrixD& weight, double eps);
/// (x[t, :] - mean) / sqrt(var + eps) .* weight + bias (biased variance), weight and bias [1, H]
/// rows (bias empty: none).
MatrixD layernorm(const MatrixD& x, const MatrixD& weight, const MatrixD& bias, double eps);

/// Adds `bias` (a vector of x.cols() values; nothing when it is empty) to every row of x.
void add_bias(MatrixD& x, const runtime::HostTensor& bias);
/// RMSNorm in place over each head of x [rows, heads * d]: every d-wide slice of a row divided by
/// its root mean square (plus eps) and multiplied by `weight` [d]; nothing when weight is empty.
void head_rmsnorm(MatrixD& x, std::int64_t d, const runtime::HostTensor& weight, double eps);

/// Rotate-half RoPE in place on x [batch * tokens, heads * d] whose token t sits at position
/// first_position + t: pairs (i, i + d/2) turned by (first_position + t) * f_i, f_i =
/// theta^(-2i/d) scaled as `scaling` says (Hugging Face's rope_scaling formulas).
void rope(MatrixD& x, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t d,
          std::int64_t first_position, double theta, const RopeScaling& scaling);

/// Shapes of one attention call.
struct AttentionShape {
  std::int64_t batch = 1, q_len = 1, kv_len = 1, heads = 1, kv_heads = 1, head_dim = 1;
  std::int64_t q_offset = 0;  ///< position of query 0; query t sees keys 0..q_offset + t
  bool causal = true;
};

/// softmax(q k^T / sqrt(d) + mask) v per sequence and head (query head h reads kv head
/// h / (heads / kv_heads)): q [batch * q_len, heads * d], k and v [batch * kv_len, kv_heads * d];
/// returns [batch * q_len, heads * d]. No RoPE.
MatrixD attention(const MatrixD& q, const MatrixD& k, const MatrixD& v,
                  const AttentionShape& shape);

/// A MoE router's decisions on x [T, H] (moe_reference's: stable softmax, top-k with ties to
/// the lower index, weights renormalised when asked, capacity in GShard's priority order).
struct Routing {
  MatrixD probs;                                  ///< [T, E] softmax of x router
  std::vector<std::vector<std::int64_t>> chosen;  ///< [T][k] experts, best first
  std::vector<std::vector<double>> weight;        ///< [T][k] routing weights
  std::vector<std::vector<bool>> kept;            ///< [T][k] within capacity
  std::vector<std::int64_t> load;                 ///< [E] kept assignments
  std::int64_t dropped = 0;
  std::int64_t capacity = 0;  ///< 0: dropless
};
/// Routes x's tokens with `router` [H, E] as `config` says (validated by the caller).
Routing route(const MatrixD& x, const runtime::HostTensor& router, const MoeConfig& config);

/// The MoE layer of moe_reference on x [T, H], its shared expert included (weights validated by
/// the caller).
MatrixD moe(const MatrixD& x, const MoeWeights& weights, const MoeConfig& config, MoeStats* stats);

}  // namespace numesh::ops::oracle
