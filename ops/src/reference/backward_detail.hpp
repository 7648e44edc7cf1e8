#pragma once

// What the reference backward passes share (their files are one per operator, as the
// lowerings' are): shape-checked float64 views of host tensors, the gated MLPs' gradients
// (the dense MLP's and every expert's) and RMSNorm's row backward (the norms' and attention's
// q/k norms). Private to the references.

#include <Eigen/Core>
#include <cstdint>

#include "numesh/runtime/tensor.hpp"
#include "oracle.hpp"

namespace numesh::ops::oracle {

/// t as a [rows, cols] matrix, after checking it has that shape (2-D, or [cols] for rows 1).
/// Throws: ShapeError naming `what` and both shapes.
MatrixD checked_matrix(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols,
                       const char* what);

/// Dim i of the matrix t. Throws: ShapeError naming `what` when t is not 2-D.
std::int64_t matrix_dim(const runtime::HostTensor& t, std::size_t i, const char* what);

/// A gated MLP's gradients in float64 (act(x w_gate) .* (x w_up)) w_down.
struct GatedGradsD {
  MatrixD dx, dgate, dup, ddown;
  MatrixD dgate_bias, dup_bias;  ///< [1, F]: the pre-activations' gradients summed over the rows
};

/// x [rows, H], w_gate and w_up [H, F], w_down [F, H], g = dy [rows, H]; `gate_bias` and
/// `up_bias`: [1, F] rows added to the pre-activations (empty: none).
GatedGradsD gated_gradients(Activation act, const MatrixD& xm, const MatrixD& wg, const MatrixD& wu,
                            const MatrixD& wd, const MatrixD& g, const MatrixD& gate_bias = {},
                            const MatrixD& up_bias = {});

using RowRef = Eigen::Ref<Eigen::RowVectorXd, 0, Eigen::InnerStride<>>;
using ConstRowRef = Eigen::Ref<const Eigen::RowVectorXd, 0, Eigen::InnerStride<>>;

/// RMSNorm's backward for one row z of n values: y = z s w with s = (mean(z^2) + eps)^(-1/2)
/// and ds/dz_j = -s^3 z_j / n. `g` holds dy and becomes dz; the row's term is added to dw.
void rmsnorm_row_backward(ConstRowRef z, ConstRowRef w, double eps, RowRef g, RowRef dw);

}  // namespace numesh::ops::oracle
