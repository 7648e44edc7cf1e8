#include "numesh/runtime/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "box_runs.hpp"
#include "copy_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::runtime {

using sharding::DimSlice;

std::int64_t num_elements(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) {
    NUMESH_CHECK(e >= 0, ShapeError, "shape ({}) has a negative extent", fmt::join(shape, ", "));
    n *= e;
  }
  return n;
}

HostTensor HostTensor::zeros(std::vector<std::int64_t> shape) {
  const auto n = static_cast<std::size_t>(num_elements(shape));
  return HostTensor{std::move(shape), std::vector<float>(n, 0.0f)};
}

Tensor::Tensor(Device& device, std::vector<std::int64_t> shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), size_(num_elements(shape_)) {
  if (size_ > 0) buffer_ = device.allocate(static_cast<std::size_t>(size_) * itemsize(dtype_));
}

std::span<float> Tensor::values() noexcept {
  return {reinterpret_cast<float*>(buffer_.data()), static_cast<std::size_t>(size_)};
}

std::span<const float> Tensor::values() const noexcept {
  return {reinterpret_cast<const float*>(buffer_.data()), static_cast<std::size_t>(size_)};
}

ShardedTensor::ShardedTensor(DeviceMesh mesh, std::vector<std::int64_t> shape,
                             sharding::PartitionSpec spec)
    : mesh_(std::move(mesh)), layout_(std::move(shape), std::move(spec), mesh_.mesh()) {
  shards_.reserve(static_cast<std::size_t>(mesh_.size()));
  for (std::int64_t slot = 0; slot < mesh_.size(); ++slot) {
    shards_.emplace_back(mesh_.device(slot), layout_.shard_shape());
  }
}

Tensor& ShardedTensor::shard(std::int64_t slot) {
  NUMESH_CHECK(slot >= 0 && slot < mesh_.size(), IndexError,
               "shard {} does not exist: the mesh has {} devices", slot, mesh_.size());
  return shards_[static_cast<std::size_t>(slot)];
}

const Tensor& ShardedTensor::shard(std::int64_t slot) const {
  return const_cast<ShardedTensor*>(this)->shard(slot);
}

std::optional<std::vector<DimSlice>> intersect_boxes(std::span<const DimSlice> a,
                                                     std::span<const DimSlice> b) {
  std::vector<DimSlice> out(a.size());
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::int64_t lo = std::max(a[d].offset, b[d].offset);
    const std::int64_t hi = std::min(a[d].limit(), b[d].limit());
    if (hi <= lo) return std::nullopt;
    out[d] = {lo, hi - lo};
  }
  return out;
}

void copy_box(std::span<const DimSlice> box, const float* src, std::span<const DimSlice> src_slices,
              float* dst, std::span<const DimSlice> dst_slices) {
  detail::for_each_run(box, src_slices, dst_slices,
                       [src, dst, nt = detail::streams(static_cast<std::size_t>(detail::volume(box)))](
                           std::int64_t s, std::int64_t t, std::int64_t run) {
                         detail::copy_floats(dst + t, src + s, static_cast<std::size_t>(run), nt);
                       });
}

namespace {

std::vector<DimSlice> whole(std::span<const std::int64_t> shape) {
  std::vector<DimSlice> out;
  for (std::int64_t e : shape) out.push_back({0, e});
  return out;
}

void check_host_shape(const HostTensor& host, const ShardedTensor& tensor) {
  NUMESH_CHECK(host.shape == tensor.shape(), ShapeError,
               "host tensor has shape ({}) but the sharded tensor has shape ({})",
               fmt::join(host.shape, ", "), fmt::join(tensor.shape(), ", "));
  NUMESH_CHECK(static_cast<std::int64_t>(host.data.size()) == num_elements(host.shape),
               ShapeError, "host tensor of shape ({}) holds {} values, expected {}",
               fmt::join(host.shape, ", "), host.data.size(), num_elements(host.shape));
}

}  // namespace

void scatter(const HostTensor& host, ShardedTensor& tensor) {
  check_host_shape(host, tensor);
  const auto global = whole(host.shape);
  GraphBuilder builder(tensor.mesh().device_set());
  for (std::int64_t slot = 0; slot < tensor.mesh().size(); ++slot) {
    const auto& slices = tensor.layout().device(slot).slices;
    Tensor& shard = tensor.shard(slot);
    if (shard.size() == 0) continue;
    builder.add(tensor.mesh().device(slot).index(), fmt::format("scatter[{}]", slot),
                [&host, &global, &slices, &shard] {
                  copy_box(slices, host.data.data(), global, shard.values().data(), slices);
                });
  }
  builder.compile().run();
}

HostTensor gather(const ShardedTensor& tensor) {
  HostTensor host = HostTensor::zeros(tensor.shape());
  if (host.data.empty()) return host;
  const auto global = whole(host.shape);
  GraphBuilder builder(tensor.mesh().device_set());
  for (std::int64_t slot = 0; slot < tensor.mesh().size(); ++slot) {
    const auto& shard_info = tensor.layout().device(slot);
    if (shard_info.replica_id != 0) continue;  // one copy of each slice
    const Tensor& shard = tensor.shard(slot);
    builder.add(tensor.mesh().device(slot).index(), fmt::format("gather[{}]", slot),
                [&host, &global, &shard_info, &shard] {
                  copy_box(shard_info.slices, shard.values().data(), shard_info.slices,
                           host.data.data(), global);
                });
  }
  builder.compile().run();
  return host;
}

ShardAndGatherFns make_shard_and_gather_fns(const DeviceMesh& mesh,
                                            const std::vector<std::int64_t>& shape,
                                            const sharding::PartitionSpec& spec) {
  sharding::PartitionSpec corrected = sharding::correct_spec(shape, spec, mesh.mesh()).spec;
  // Validate now, so a bad spec fails when the functions are made, not when they are used.
  const sharding::ShardLayout check(shape, corrected, mesh.mesh());
  (void)check;
  ShardAndGatherFns fns;
  fns.spec = corrected;
  fns.shard = [mesh, shape, corrected](const HostTensor& host) {
    ShardedTensor tensor(mesh, shape, corrected);
    scatter(host, tensor);
    return tensor;
  };
  fns.gather = [](const ShardedTensor& tensor) { return gather(tensor); };
  return fns;
}

}  // namespace numesh::runtime
