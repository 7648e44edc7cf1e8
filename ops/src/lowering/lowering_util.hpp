#pragma once

// PRIVATE to ops/src: small pieces every operator lowering and reference needs.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../shape_text.hpp"
#include "deferred_scatters.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/weight_order.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/placement.hpp"

namespace numesh::ops::detail {

/// The spec entry splitting one dim over `axes`, keeping only the axes `mesh` has: None, a
/// name, or a tuple. Filtering first matters: eformer's correction drops a whole tuple entry
/// when one member is missing, which would replicate a dim the remaining axes could split.
inline sharding::AxisRule entry_over(const std::vector<std::string>& axes,
                                     const sharding::Mesh& mesh) {
  std::vector<sharding::AxisRule> present;
  for (const std::string& a : axes) {
    if (mesh.has_axis(a)) present.emplace_back(a);
  }
  if (present.empty()) return {};
  if (present.size() == 1) return present.front();
  return sharding::AxisRule::tuple(std::move(present));
}

/// Entry `i` of `spec`, None past its end (eformer's correction may collapse a spec to P()).
inline sharding::AxisRule entry(const sharding::PartitionSpec& spec, std::size_t i) {
  return i < spec.size() ? spec[i] : sharding::AxisRule();
}

/// `host` laid out on the mesh by `spec` after eformer's correction for its shape, stored as
/// `dtype` (rounded to nearest even), each shard written by its own device: how every layer
/// places its weights. Within a DeferredScatters scope, a small host's values are written at
/// the scope's flush().
inline std::shared_ptr<runtime::ShardedTensor> laid_out(
    const runtime::DeviceMesh& mesh, const runtime::HostTensor& host,
    const sharding::PartitionSpec& spec, DType dtype = DType::kF32,
    runtime::StoredOrder order = runtime::StoredOrder::kRows) {
  const sharding::PartitionSpec corrected =
      sharding::correct_spec(host.shape, spec, mesh.mesh()).spec;
  std::shared_ptr<runtime::ShardedTensor> t;
  try {
    // Every shard is written whole below (scatter) or by its owner (fill_shards): no zero fill.
    t = std::make_shared<runtime::ShardedTensor>(mesh, host.shape, corrected, dtype,
                                                 runtime::BufferContents::kUnspecified, order);
  } catch (const ValueError& e) {
    // A block format whose shards' rows are not whole blocks: say which matrix and how split.
    throw ValueError(fmt::format("a weight [{}] stored as {} and split by {}: {}",
                                 fmt::join(host.shape, ", "), to_string(dtype), corrected.repr(),
                                 e.what()));
  }
  // A shape-only weight is laid out unfilled: its owner writes the shards (fill_shards). A small
  // one laid out in a DeferredScatters scope is written with the others at its flush().
  if (host.is_shape_only()) return t;
  if (DeferredScatters* const deferred = DeferredScatters::active();
      deferred != nullptr && DeferredScatters::defers(host)) {
    deferred->add(host, t);
  } else {
    runtime::scatter(host, *t);
  }
  return t;
}

/// `host` [..., in, out] laid out as laid_out() lays it out, but stored out-in: the last two dims
/// swapped ([..., out, in]), and `spec`, given for [..., in, out], with them. How the layers
/// store the matrices they multiply (WeightLayout::kOutIn): a decode step then reads each
/// output's weights as one run; Q8_0 and Q4_0 in panels of 16 outputs where out_in_order says
/// (ops/kernels/weight_order.hpp). A shape-only host gives a shape-only tensor.
inline std::shared_ptr<runtime::ShardedTensor> laid_out_out_in(const runtime::DeviceMesh& mesh,
                                                               const runtime::HostTensor& host,
                                                               const sharding::PartitionSpec& spec,
                                                               DType dtype = DType::kF32) {
  const std::size_t rank = host.shape.size();
  std::vector<std::int64_t> shape = host.shape;
  std::swap(shape[rank - 2], shape[rank - 1]);
  const sharding::PartitionSpec stored_spec = swap_last_two(spec, rank);
  const runtime::StoredOrder order = out_in_order(dtype);
  if (host.is_shape_only()) {
    return laid_out(mesh, runtime::HostTensor::shape_only(std::move(shape)), stored_spec, dtype,
                    order);
  }
  return laid_out(mesh, transposed(host), stored_spec, dtype, order);
}

/// `spec` with every use of `axes` removed (a tuple keeps its other members; an emptied entry
/// becomes None): the layout of the tensor after an all-gather over those axes.
inline sharding::PartitionSpec without_axes(const sharding::PartitionSpec& spec,
                                            const std::vector<std::string>& axes,
                                            std::size_t rank) {
  std::vector<sharding::AxisRule> entries;
  for (std::size_t i = 0; i < rank; ++i) {
    std::vector<sharding::AxisRule> kept;
    if (i < spec.size()) {
      for (const std::string& n : spec.entry_names(i)) {
        if (std::find(axes.begin(), axes.end(), n) == axes.end()) kept.emplace_back(n);
      }
    }
    if (kept.empty()) {
      entries.emplace_back();
    } else if (kept.size() == 1) {
      entries.push_back(kept.front());
    } else {
      entries.push_back(sharding::AxisRule::tuple(std::move(kept)));
    }
  }
  return sharding::PartitionSpec(std::move(entries));
}

/// The mesh axes splitting dim `dim` of `spec` (none past its end).
inline std::vector<std::string> axes_of(const sharding::PartitionSpec& spec, std::size_t dim) {
  return dim < spec.size() ? spec.entry_names(dim) : std::vector<std::string>{};
}

/// Adds bias[first, first + m.cols()) to every row of m (a device's slice of a bias split like
/// its columns); nothing when the bias is empty.
inline void add_bias_rows(MatrixMap m, const runtime::HostTensor& bias, std::int64_t first) {
  if (bias.shape.empty()) return;
  const Eigen::Map<const Eigen::RowVectorXf> b(bias.data.data() + first, m.cols());
  m.rowwise() += b;
}

/// An optional vector (a bias, a norm weight; [n], or absent: no shape) laid out as a row
/// [1, n] split by `rule` as the outputs it is added to; null when absent.
inline std::shared_ptr<runtime::ShardedTensor> laid_out_row(const runtime::DeviceMesh& mesh,
                                                            const runtime::HostTensor& values,
                                                            const sharding::AxisRule& rule) {
  if (values.shape.empty()) return nullptr;
  runtime::HostTensor row = values;
  row.shape = {1, static_cast<std::int64_t>(values.data.size())};
  return laid_out(mesh, row, sharding::PartitionSpec({sharding::AxisRule(), rule}));
}

/// Adds `bias` (m.cols() values, or none) to every row of m.
inline void add_bias_rows(MatrixMap m, std::span<const float> bias) {
  if (bias.empty()) return;
  m.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias.data(), m.cols());
}

/// Slot `slot`'s shard of an optional row tensor (a bias, a norm weight) as values; empty for
/// null.
inline std::span<const float> row_of(runtime::ShardedTensor* t, std::int64_t slot) {
  if (t == nullptr) return {};
  return std::as_const(t->shard(slot)).values();
}

/// True when `slot` is the first device (coordinate 0) on every mesh axis whose placement in
/// `placed` is Partial: the one device of its reduction group that adds a term which must be
/// counted once in the sum (an output bias).
inline bool first_of_partial_sum(const runtime::DeviceMesh& mesh,
                                 const std::vector<sharding::Placement>& placed,
                                 std::int64_t slot) {
  const std::vector<std::int64_t> coords = mesh.coords(slot);
  for (std::size_t a = 0; a < placed.size(); ++a) {
    if (placed[a].is_partial() && coords[a] != 0) return false;
  }
  return true;
}

/// Checks that `a` and `b` are laid out as x ([..., H], shape and spec) with H whole on every
/// device: the operands of a row-wise operator (a norm and its gradients).
/// Throws: ShapeError "NAME: x [shape] spec, [shape] spec and [shape] spec must be laid out alike,
/// H whole".
inline void check_rows_alike(const runtime::ShardedTensor& x, const runtime::ShardedTensor& a,
                             const runtime::ShardedTensor& b, const std::string& name) {
  const std::int64_t h = x.shape().back();
  const auto alike = [&](const runtime::ShardedTensor& t) {
    return t.shape() == x.shape() && t.spec() == x.spec();
  };
  NUMESH_CHECK(alike(a) && alike(b) && x.layout().shard_shape().back() == h, ShapeError,
               "{}: x {} {}, {} {} and {} {} must be laid out alike, H whole", name,
               fmt::join(x.shape(), "x"), x.spec().repr(), fmt::join(a.shape(), "x"),
               a.spec().repr(), fmt::join(b.shape(), "x"), b.spec().repr());
}

/// Checks that `row` (a norm's weight or bias; null: none) is a replicated [1, h].
/// Throws: ShapeError "NAME: the WHAT is [shape] spec, expected a replicated [1, h]".
inline void check_replicated_row(const runtime::ShardedTensor* row, std::int64_t h,
                                 const std::string& what, const std::string& name) {
  if (row == nullptr) return;
  NUMESH_CHECK(row->shape() == (std::vector<std::int64_t>{1, h}) &&
                   row->layout().shard_shape() == row->shape(),
               ShapeError, "{}: the {} is {} {}, expected a replicated [1, {}]", name, what,
               fmt::join(row->shape(), "x"), row->spec().repr(), h);
}

}  // namespace numesh::ops::detail
