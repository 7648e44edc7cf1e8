#include "numesh/sharding/shard_layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/sharding/named_sharding.hpp"

namespace numesh::sharding {

namespace {

std::string axes_phrase(const Mesh& mesh, const std::vector<std::size_t>& axes) {
  if (axes.size() == 1) {
    return fmt::format("mesh axis {} (size {})", python_repr(mesh.names()[axes[0]]),
                       mesh.sizes()[axes[0]]);
  }
  std::vector<std::string> names;
  for (std::size_t a : axes) names.push_back(python_repr(mesh.names()[a]));
  std::int64_t product = 1;
  for (std::size_t a : axes) product *= mesh.sizes()[a];
  return fmt::format("mesh axes ({}) (product {})", fmt::join(names, ", "), product);
}

}  // namespace

ShardLayout::ShardLayout(std::vector<std::int64_t> shape, PartitionSpec spec, Mesh mesh)
    : shape_(std::move(shape)), spec_(std::move(spec)), mesh_(std::move(mesh)) {
  for (std::size_t d = 0; d < shape_.size(); ++d) {
    if (shape_[d] < 0) {
      throw ShapeError(fmt::format("sharding: dim {} has negative size {} in shape [{}]", d,
                                   shape_[d], fmt::join(shape_, ", ")));
    }
  }
  if (mesh_.empty()) {
    throw NoMeshError(
        fmt::format("sharding: cannot lay out an array over the empty mesh {}", mesh_.repr()));
  }
  if (spec_.size() > shape_.size()) {
    throw ShapeError(
        fmt::format("sharding: {} has {} entries but the array has rank {} (shape [{}])",
                    spec_.repr(), spec_.size(), shape_.size(), fmt::join(shape_, ", ")));
  }
  // Duplicates and unknown axes, with NamedSharding's own errors and messages.
  check_partition_spec(mesh_, spec_);

  const std::size_t rank = shape_.size();
  dim_axes_.assign(rank, {});
  blocks_per_dim_.assign(rank, 1);
  shard_shape_ = shape_;
  for (std::size_t d = 0; d < spec_.size(); ++d) {
    const AxisRule& entry = spec_[d];
    if (entry.is_unconstrained()) {
      throw ValueError(fmt::format(
          "sharding: dim {} of {} is UNCONSTRAINED, which has no fixed layout", d, spec_.repr()));
    }
    // check_partition_spec guarantees every member is a mesh axis name.
    for (const std::string& name : spec_.entry_names(d)) {
      const std::size_t a = *mesh_.find_axis(name);
      dim_axes_[d].push_back(a);
      blocks_per_dim_[d] *= mesh_.sizes()[a];
    }
    const std::int64_t blocks = blocks_per_dim_[d];
    if (shape_[d] % blocks != 0) {
      const std::int64_t padded = (shape_[d] / blocks + 1) * blocks;
      throw ShapeError(fmt::format(
          "sharding: dim {} (size {}) is not divisible by {} in {}; use correct_spec() or pad "
          "to {}",
          d, shape_[d], axes_phrase(mesh_, dim_axes_[d]), spec_.repr(), padded));
    }
    shard_shape_[d] = shape_[d] / blocks;
  }

  // Each device's block per dim: its coordinates on the dim's axes read as a mixed-radix
  // number, the first axis most significant (JAX's tuple order).
  const std::int64_t n = mesh_.size();
  devices_.reserve(static_cast<std::size_t>(n));
  std::map<std::vector<std::int64_t>, std::size_t> group_of_block;
  for (std::int64_t dev = 0; dev < n; ++dev) {
    DeviceShard s;
    s.device = dev;
    s.coords = mesh_.coords_of(dev);
    s.block.assign(rank, 0);
    s.slices.resize(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      std::int64_t b = 0;
      for (std::size_t a : dim_axes_[d]) b = b * mesh_.sizes()[a] + s.coords[a];
      s.block[d] = b;
      s.slices[d] = DimSlice{b * shard_shape_[d], shard_shape_[d]};
    }
    auto [it, inserted] = group_of_block.try_emplace(s.block, replica_groups_.size());
    if (inserted) replica_groups_.emplace_back();
    s.replica_group = it->second;
    s.replica_id = replica_groups_[it->second].size();
    replica_groups_[it->second].push_back(dev);
    devices_.push_back(std::move(s));
  }
}

std::int64_t ShardLayout::num_shards() const noexcept {
  std::int64_t p = 1;
  for (std::int64_t b : blocks_per_dim_) p *= b;
  return p;
}

std::vector<std::int64_t> ShardLayout::tile_offset(std::int64_t device) const {
  std::vector<std::int64_t> out;
  for (const DimSlice& s : devices_[static_cast<std::size_t>(device)].slices) {
    out.push_back(s.offset);
  }
  return out;
}

std::vector<std::int64_t> ShardLayout::tile_limit(std::int64_t device) const {
  std::vector<std::int64_t> out;
  for (const DimSlice& s : devices_[static_cast<std::size_t>(device)].slices) {
    out.push_back(s.limit());
  }
  return out;
}

std::int64_t ShardLayout::elements_per_device() const noexcept {
  std::int64_t p = 1;
  for (std::int64_t e : shard_shape_) p *= e;
  return p;
}

std::int64_t ShardLayout::bytes_per_device(std::int64_t itemsize) const {
  if (itemsize <= 0) {
    throw ValueError(fmt::format("sharding: itemsize must be positive, got {}", itemsize));
  }
  return elements_per_device() * itemsize;
}

std::string ShardLayout::to_string() const {
  std::vector<std::string> axes;
  for (std::size_t a = 0; a < mesh_.rank(); ++a) {
    axes.push_back(fmt::format("{}={}", mesh_.names()[a], mesh_.sizes()[a]));
  }
  return fmt::format("shape=[{}] spec={} mesh=[{}] blocks=[{}] shard=[{}] shards={} replication={}",
                     fmt::join(shape_, ","), spec_.repr(), fmt::join(axes, ","),
                     fmt::join(blocks_per_dim_, ","), fmt::join(shard_shape_, ","), num_shards(),
                     replication());
}

}  // namespace numesh::sharding
