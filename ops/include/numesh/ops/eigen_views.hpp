#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/runtime/weight_panels.hpp"

// Eigen is numesh's kernel layer, not its tensor type: storage is owned by the runtime
// (HostTensor, Tensor, DeviceBuffer) and kernels see it through these row-major maps, so that
// Eigen's strides match the dimension order of PartitionSpecs.

namespace numesh::ops {

/// A row-major fp32 matrix (owning; for references and tests).
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A writable row-major view of someone else's storage.
using MatrixMap = Eigen::Map<RowMatrix>;
/// A read-only row-major view of someone else's storage.
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

/// `t` as a [rows, cols] matrix: rank 2 as it is, rank 1 as one column, higher ranks with
/// every dim but the last folded into rows. REQUIRES: t has at least one dim.
inline MatrixMap as_matrix(runtime::Tensor& t) {
  const Eigen::Index cols = t.shape().back();
  return {t.values().data(), cols == 0 ? 0 : t.size() / cols, cols};
}
/// `t` as a read-only [rows, cols] matrix (see the writable overload).
inline ConstMatrixMap as_matrix(const runtime::Tensor& t) {
  const Eigen::Index cols = t.shape().back();
  return {t.values().data(), cols == 0 ? 0 : t.size() / cols, cols};
}

/// How a weight matrix [in, out] (k inputs by n outputs) lies in memory.
enum class WeightLayout {
  kInOut,  ///< row-major [in, out]: row r holds input r's weight for every output
  kOutIn,  ///< row-major [out, in], nn.Linear's layout: each output's k weights together, the
           ///< order decode streams fastest (ops/kernels/dot_gemm.hpp)
};

/// A read-only weight matrix of any format (core/dtype.hpp: fp32, bf16, f16, block formats):
/// the one currency of the weight kernels. `rows` is always k (inputs) and `cols` n (outputs),
/// whatever the layout; the stored rows (k of them in-out, n out-in) lie `ld` elements apart
/// (0: packed, one right after the other), each row_bytes() of the format. A block format's
/// blocks run along the stored rows. A view; the storage is someone else's.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  WeightLayout layout = WeightLayout::kInOut;
  std::int64_t ld = 0;  ///< elements from one stored row to the next; 0: the row's length
  /// Out-in Q8_0 or Q4_0 only: outputs [0, panel_outputs) are stored in panels of 16
  /// (runtime/weight_panels.hpp: a multiple of 16, with ld = k), the rest as rows; 0: all rows.
  std::int64_t panel_outputs = 0;

  /// Elements of a stored row: n in-out, k out-in.
  std::int64_t row_length() const noexcept { return layout == WeightLayout::kInOut ? cols : rows; }
  /// Elements from one stored row to the next.
  std::int64_t stride() const noexcept { return ld > 0 ? ld : row_length(); }
  /// Bytes from one stored row to the next. Throws: as row_bytes().
  std::int64_t stride_bytes() const { return row_bytes(dtype, stride()); }
  /// Stored row `r` (an input in-out, an output out-in). Throws: as row_bytes().
  const void* stored_row(std::int64_t r) const {
    return static_cast<const char*>(data) + r * stride_bytes();
  }
  /// Outputs [j0, j0 + count) (columns j0.. of c), a view of the same storage.
  /// Throws: as row_bytes() (in-out: j0 must start a block); ShapeError when the view would cut
  /// a panel (j0 inside the panels and not a multiple of 16, or the view ending inside one).
  WeightMatrix outputs(std::int64_t j0, std::int64_t count) const {
    const bool in_out = layout == WeightLayout::kInOut;
    std::int64_t panels = 0;
    if (panel_outputs > j0) {
      constexpr std::int64_t kWidth = runtime::kPanelWidth;
      NUMESH_CHECK(j0 % kWidth == 0 && (count % kWidth == 0 || j0 + count >= panel_outputs),
                   ShapeError,
                   "outputs [{}, {}) of a weight matrix whose first {} outputs are panels of 16: "
                   "a view of them takes whole panels",
                   j0, j0 + count, panel_outputs);
      panels = std::min(count - count % kWidth, panel_outputs - j0);
    }
    return {in_out ? static_cast<const char*>(data) + row_bytes(dtype, j0) : stored_row(j0),
            dtype,
            rows,
            count,
            layout,
            stride(),
            panels};
  }
  /// Inputs [r0, r0 + count) (columns r0.. of a), a view of the same storage.
  /// Throws: as row_bytes() (out-in: r0 must start a block); ShapeError for a matrix with panels
  /// (their blocks interleave outputs over the whole k).
  WeightMatrix inputs(std::int64_t r0, std::int64_t count) const {
    NUMESH_CHECK(panel_outputs == 0, ShapeError,
                 "inputs [{}, {}) of a weight matrix stored in panels: panels cannot be cut by "
                 "inputs",
                 r0, r0 + count);
    const bool in_out = layout == WeightLayout::kInOut;
    return {in_out ? stored_row(r0) : static_cast<const char*>(data) + row_bytes(dtype, r0),
            dtype,
            count,
            cols,
            layout,
            stride()};
  }
};

/// The fp32 matrix `b` [k, n] (row-major, rows b.cols() apart) as a weight matrix stored in-out.
inline WeightMatrix as_weight(ConstMatrixMap b) {
  return {b.data(), DType::kF32, b.rows(), b.cols(), WeightLayout::kInOut};
}

/// `spec` with its entries for the last two of `rank` dims swapped (None past its end): the spec
/// of an [..., in, out] matrix stored out-in as [..., out, in], and back. P() (replicated, as
/// eformer's correction may leave a spec) stays P().
inline sharding::PartitionSpec swap_last_two(const sharding::PartitionSpec& spec,
                                             std::size_t rank) {
  if (spec.size() == 0) return spec;
  std::vector<sharding::AxisRule> entries;
  for (std::size_t i = 0; i < rank; ++i)
    entries.push_back(i < spec.size() ? spec[i] : sharding::AxisRule());
  if (rank >= 2) std::swap(entries[rank - 2], entries[rank - 1]);
  return sharding::PartitionSpec(std::move(entries));
}

/// `t` as a [rows, cols] weight matrix of its dtype, folded as as_matrix() folds.
/// REQUIRES: t has at least one dim. Throws: ShapeError for a tensor stored in panels (whose
/// bytes are not rows: only the out-in views read them).
inline WeightMatrix as_weight(const runtime::Tensor& t) {
  NUMESH_CHECK(t.order() == runtime::StoredOrder::kRows, ShapeError,
               "a weight of shape ({}) stored in panels read as rows: panels are read out-in only",
               fmt::join(t.shape(), ", "));
  const std::int64_t cols = t.shape().back();
  return {t.data(), t.dtype(), cols == 0 ? 0 : t.size() / cols, cols};
}

/// `t`, a weight stored out-in as [out, in] (folded as as_matrix() folds), as the [in, out]
/// weight matrix it holds; a tensor stored in panels gives a matrix that reads them.
/// REQUIRES: t has at least one dim. Throws: ShapeError for a tensor in panels that folds more
/// than one matrix (its panels are per matrix: as_weight with an offset takes each).
inline WeightMatrix as_out_in_weight(const runtime::Tensor& t) {
  const std::int64_t in = t.shape().back();
  const std::int64_t out = in == 0 ? 0 : t.size() / in;
  std::int64_t panels = 0;
  if (t.order() == runtime::StoredOrder::kPanels) {
    const std::int64_t matrix_rows = t.shape()[t.shape().size() - 2];
    NUMESH_CHECK(out == matrix_rows, ShapeError,
                 "a weight of shape ({}) stored in panels read as one [{}, {}] matrix: its "
                 "panels are per [{}, {}] matrix",
                 fmt::join(t.shape(), ", "), out, in, matrix_rows, in);
    panels = runtime::panel_outputs(out);
  }
  return {t.data(), t.dtype(), in, out, WeightLayout::kOutIn, 0, panels};
}

/// The [rows, cols] matrix that starts `offset` elements into `t` (one expert of a stacked
/// [E, rows, cols] weight: whole rows of t, so row_bytes() counts its bytes in any format).
/// REQUIRES: it lies inside t, and for a tensor stored in panels it is one of its matrices.
/// `layout` says how it is stored (kOutIn: as [cols, rows]).
/// Throws: ShapeError for a tensor stored in panels read in-out (panels are read out-in only).
inline WeightMatrix as_weight(const runtime::Tensor& t, std::int64_t offset, std::int64_t rows,
                              std::int64_t cols, WeightLayout layout = WeightLayout::kInOut) {
  const bool panels = t.order() == runtime::StoredOrder::kPanels;
  NUMESH_CHECK(!panels || layout == WeightLayout::kOutIn, ShapeError,
               "a weight of shape ({}) stored in panels read as rows: panels are read out-in only",
               fmt::join(t.shape(), ", "));
  return {static_cast<const char*>(t.data()) + row_bytes(t.dtype(), offset),
          t.dtype(),
          rows,
          cols,
          layout,
          0,
          panels ? runtime::panel_outputs(cols) : 0};
}

/// The transpose [cols, rows] of a [rows, cols] host tensor, or of each matrix of a stack
/// [..., rows, cols] (the last two dims swapped): a stored out-in matrix (or stack of experts)
/// as the [in, out] one the weight structs and references take, and back.
/// Throws: ShapeError when m has rank < 2.
runtime::HostTensor transposed(const runtime::HostTensor& m);

/// Tokens [from, from + n) of x [B, T, ...]: [B, n, ...].
/// Throws: ShapeError when x has rank < 2 or the range leaves [0, T).
runtime::HostTensor slice_tokens(const runtime::HostTensor& x, std::int64_t from, std::int64_t n);

}  // namespace numesh::ops
