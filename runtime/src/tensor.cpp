#include "numesh/runtime/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <span>
#include <vector>

#include "box_runs.hpp"
#include "copy_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/transport.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "size_text.hpp"

namespace numesh::runtime {

using sharding::DimSlice;

std::int64_t num_elements(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) {
    NUMESH_CHECK(e >= 0, ShapeError, "shape ({}) has a negative extent", fmt::join(shape, ", "));
  }
  for (std::int64_t e : shape) {
    // A file's header may declare any extents (gguf_fuzz found a tensor whose elements, 2^61,
    // overflowed in bytes): a count past int64 is refused, not wrapped.
    NUMESH_CHECK(!__builtin_mul_overflow(n, e, &n), ShapeError,
                 "shape ({}) has more than 2^63 elements", fmt::join(shape, ", "));
  }
  return n;
}

std::int64_t storage_bytes(DType dtype, std::span<const std::int64_t> shape) {
  const std::int64_t n = num_elements(shape);
  if (shape.empty()) return row_bytes(dtype, 1);
  const std::int64_t row = shape.back();
  if (row == 0) return 0;
  const DTypeTraits& format = traits(dtype);
  (void)row_bytes(dtype, row);  // refuses rows that are not whole blocks, naming them
  std::int64_t bytes = 0;
  NUMESH_CHECK(!__builtin_mul_overflow(n / format.block_elements, format.block_bytes, &bytes),
               ShapeError, "shape ({}) as {} takes more than 2^63 bytes", fmt::join(shape, ", "),
               format.name);
  return bytes;
}

namespace {

// The machine's physical memory in bytes (0: unknown).
std::uint64_t physical_memory_bytes() {
  static const std::uint64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0
               ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
               : 0;
  }();
  return bytes;
}

}  // namespace

HostTensor HostTensor::zeros(std::vector<std::int64_t> shape) {
  const auto n = static_cast<std::size_t>(num_elements(shape));
  // A size that follows from a user's options is refused, named, when the machine could not
  // hold it at all, rather than left to the allocator (std::bad_alloc, or paging for minutes).
  const std::uint64_t memory = physical_memory_bytes();
  const auto bytes = static_cast<std::uint64_t>(n) * sizeof(float);
  NUMESH_CHECK(
      memory == 0 || (n <= memory / sizeof(float) && bytes <= memory), ValueError,
      "host memory: cannot allocate a [{}] tensor of {}, more than the {} this machine has",
      fmt::join(shape, ", "), detail::size_text(bytes), detail::size_text(memory));
  return HostTensor{std::move(shape), std::vector<float>(n, 0.0f)};
}

HostTensor HostTensor::shape_only(std::vector<std::int64_t> shape) {
  NUMESH_CHECK(num_elements(shape) > 0, ShapeError,
               "a shape-only tensor needs elements, not shape [{}]", fmt::join(shape, ", "));
  return HostTensor{.shape = std::move(shape), .data = {}, .values_elsewhere = true};
}

bool HostTensor::is_shape_only() const noexcept {
  return values_elsewhere && data.empty() && num_elements(shape) > 0;
}

HostTensor rounded_to(const HostTensor& t, DType dtype) {
  HostTensor out = t;
  if (!is_element_dtype(dtype)) {
    // Row by row (the last dim), through the format's blocks and back.
    const std::int64_t row = t.shape.empty() ? 1 : t.shape.back();
    std::vector<std::byte> blocks(static_cast<std::size_t>(row_bytes(dtype, row)));
    for (std::size_t at = 0; row > 0 && at < out.data.size(); at += static_cast<std::size_t>(row)) {
      float* values = out.data.data() + at;
      convert_elements(values, DType::kF32, blocks.data(), dtype, static_cast<std::size_t>(row));
      convert_elements(blocks.data(), dtype, values, DType::kF32, static_cast<std::size_t>(row));
    }
    return out;
  }
  switch (element_type(dtype)) {
    case ElementType::kF32:
      break;
    case ElementType::kBF16:
      for (float& v : out.data) v = f32_from_bf16(bf16_from_f32(v));
      break;
    case ElementType::kF16:
      for (float& v : out.data) v = f32_from_f16(f16_from_f32(v));
      break;
  }
  return out;
}

Tensor::Tensor(Device& device, std::vector<std::int64_t> shape, DType dtype,
               BufferContents contents, StoredOrder order)
    : shape_(std::move(shape)), dtype_(dtype), order_(order), size_(num_elements(shape_)) {
  if (order_ == StoredOrder::kPanels) {
    NUMESH_CHECK(has_panels(dtype_), TypeError,
                 "a tensor of {} stored in panels: only q8_0 and q4_0 weights have panels",
                 to_string(dtype_));
    NUMESH_CHECK(shape_.size() >= 2, ShapeError,
                 "a tensor of shape ({}) stored in panels: panels are of matrices (rank 2 or more)",
                 fmt::join(shape_, ", "));
  }
  const std::int64_t bytes = storage_bytes(dtype_, shape_);
  if (size_ > 0) buffer_ = device.allocate(static_cast<std::size_t>(bytes), contents);
}

void Tensor::use_mapped(std::shared_ptr<const std::byte> bytes) {
  NUMESH_CHECK(size_ > 0 && buffer_.device() != nullptr, ValueError,
               "tensor of shape ({}) has no elements to read in place", fmt::join(shape_, ", "));
  NUMESH_CHECK(order_ == StoredOrder::kRows, TypeError,
               "tensor of shape ({}) of {} is stored in panels: it cannot read a file's rows in "
               "place",
               fmt::join(shape_, ", "), to_string(dtype_));
  NUMESH_CHECK(bytes != nullptr, ValueError, "tensor of shape ({}): no bytes to read in place",
               fmt::join(shape_, ", "));
  buffer_ = buffer_.device()->use_mapped(std::move(bytes), buffer_.size_bytes());
}

std::span<float> Tensor::values() {
  NUMESH_CHECK(dtype_ == DType::kF32, TypeError, "tensor of shape ({}) holds {} values, not f32",
               fmt::join(shape_, ", "), to_string(dtype_));
  return {reinterpret_cast<float*>(buffer_.data()), static_cast<std::size_t>(size_)};
}

std::span<const float> Tensor::values() const { return const_cast<Tensor*>(this)->values(); }

std::span<std::uint16_t> Tensor::bits16() {
  NUMESH_CHECK(dtype_ == DType::kBF16 || dtype_ == DType::kF16, TypeError,
               "tensor of shape ({}) holds {} values, not 16-bit ones", fmt::join(shape_, ", "),
               to_string(dtype_));
  return {reinterpret_cast<std::uint16_t*>(buffer_.data()), static_cast<std::size_t>(size_)};
}

std::span<const std::uint16_t> Tensor::bits16() const {
  return const_cast<Tensor*>(this)->bits16();
}

ShardedTensor::ShardedTensor(DeviceMesh mesh, std::vector<std::int64_t> shape,
                             sharding::PartitionSpec spec, DType dtype, BufferContents contents,
                             StoredOrder order)
    : mesh_(std::move(mesh)),
      layout_(std::move(shape), std::move(spec), mesh_.mesh()),
      dtype_(dtype),
      order_(order) {
  shards_.reserve(mesh_.local_slots().size());
  for (std::int64_t slot : mesh_.local_slots()) {
    shards_.emplace_back(mesh_.device(slot), layout_.shard_shape(), dtype_, contents, order_);
  }
}

namespace {

// The matrices of a tensor's last two dims: how many, and each one's rows, row length and bytes.
struct Matrices {
  std::int64_t count, n, k, bytes;
};

Matrices matrices_of(const Tensor& t) {
  const std::size_t rank = t.shape().size();
  const std::int64_t n = t.shape()[rank - 2], k = t.shape()[rank - 1];
  const std::int64_t count = n * k == 0 ? 0 : t.size() / (n * k);
  return {count, n, k, n * row_bytes(t.dtype(), k)};
}

}  // namespace

void arrange_in_panels(Tensor& t) {
  NUMESH_CHECK(t.order() == StoredOrder::kPanels, TypeError,
               "arrange_in_panels: a tensor of shape ({}) whose order is not panels",
               fmt::join(t.shape(), ", "));
  const Matrices m = matrices_of(t);
  auto* data = static_cast<std::byte*>(t.data());
  // Panels are independent: a task rearranges a run of them (whole panels, so each run is a
  // matrix of its own to rows_to_panels_in_place), the tail of rows left as it is.
  const std::int64_t panels = panel_outputs(m.n) / kPanelWidth;
  const std::int64_t panel_bytes = kPanelWidth * row_bytes(t.dtype(), m.k);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, m.count * panels, 16),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      for (std::int64_t i = r.begin(); i < r.end();) {
                        const std::int64_t matrix = i / panels, first = i % panels;
                        const std::int64_t count = std::min(panels - first, r.end() - i);
                        std::byte* at = data + matrix * m.bytes + first * panel_bytes;
                        rows_to_panels_in_place(
                            t.dtype(), count * kPanelWidth, m.k,
                            std::span(at, static_cast<std::size_t>(count * panel_bytes)));
                        i += count;
                      }
                    });
}

Tensor& ShardedTensor::shard(std::int64_t slot) {
  NUMESH_CHECK(slot >= 0 && slot < mesh_.size(), IndexError,
               "shard {} does not exist: the mesh has {} devices", slot, mesh_.size());
  const std::vector<std::int64_t>& local = mesh_.local_slots();
  NUMESH_CHECK(mesh_.is_local(slot), ValueError,
               "shard {} is held by rank {}: this process (rank {}) holds shards {}-{}", slot,
               mesh_.rank_of(slot), mesh_.this_rank(), local.front(), local.back());
  return shards_[static_cast<std::size_t>(slot - local.front())];
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
  detail::for_each_run(
      box, src_slices, dst_slices,
      [src, dst, nt = detail::streams(static_cast<std::size_t>(detail::volume(box)))](
          std::int64_t s, std::int64_t t, std::int64_t run) {
        detail::copy_floats(dst + t, src + s, static_cast<std::size_t>(run), nt);
      });
}

void copy_box(std::span<const DimSlice> box, const void* src, std::span<const DimSlice> src_slices,
              void* dst, std::span<const DimSlice> dst_slices, DType dtype) {
  NUMESH_CHECK(is_element_dtype(dtype), TypeError, "copy_box: {} is not an element type",
               to_string(dtype));
  const std::size_t item = dtype_size(dtype);
  detail::for_each_run(
      box, src_slices, dst_slices,
      [src = static_cast<const std::byte*>(src), dst = static_cast<std::byte*>(dst), item,
       nt = detail::streams_bytes(static_cast<std::size_t>(detail::volume(box)) * item)](
          std::int64_t s, std::int64_t t, std::int64_t run) {
        detail::copy_bytes(dst + static_cast<std::size_t>(t) * item,
                           src + static_cast<std::size_t>(s) * item,
                           static_cast<std::size_t>(run) * item, nt);
      });
}

namespace {}  // namespace

void copy_box(std::span<const DimSlice> box, const void* src, DType src_type,
              std::span<const DimSlice> src_slices, void* dst, DType dst_type,
              std::span<const DimSlice> dst_slices) {
  if (src_type == dst_type) {
    copy_box(box, src, src_slices, dst, dst_slices, src_type);
    return;
  }
  // Offsets in bytes of each format (row_bytes: a block format's runs start on its blocks, or
  // the copy is refused naming the format rather than cutting a block).
  detail::for_each_run(
      box, src_slices, dst_slices, [&](std::int64_t s, std::int64_t t, std::int64_t run) {
        convert_elements(static_cast<const std::byte*>(src) + row_bytes(src_type, s), src_type,
                         static_cast<std::byte*>(dst) + row_bytes(dst_type, t), dst_type,
                         static_cast<std::size_t>(run));
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
  NUMESH_CHECK(static_cast<std::int64_t>(host.data.size()) == num_elements(host.shape), ShapeError,
               "host tensor of shape ({}) holds {} values, expected {}",
               fmt::join(host.shape, ", "), host.data.size(), num_elements(host.shape));
}

}  // namespace

void fill_shards(ShardedTensor& tensor,
                 const std::function<void(std::int64_t slot, Tensor& shard)>& fill) {
  ShardedTensor* const one[] = {&tensor};
  fill_shards(one, [&fill](std::size_t, std::int64_t slot, Tensor& shard) { fill(slot, shard); });
}

void fill_shards(std::span<ShardedTensor* const> tensors,
                 const std::function<void(std::size_t i, std::int64_t slot, Tensor& shard)>& fill,
                 FillWrites writes) {
  if (tensors.empty()) return;
  const DeviceMesh& mesh = tensors.front()->mesh();
  // Each device writes its slot's shard of every tensor: the slots must be the same devices.
  const auto same_devices = [&mesh](const DeviceMesh& other) {
    if (other.size() != mesh.size() || other.local_slots() != mesh.local_slots()) return false;
    for (std::int64_t slot : mesh.local_slots()) {
      if (&other.device(slot) != &mesh.device(slot)) return false;
    }
    return true;
  };
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    NUMESH_CHECK(same_devices(tensors[i]->mesh()), ValueError,
                 "fill_shards: tensor {} [{}] is on mesh {}, tensor 0 on mesh {}: their slots "
                 "must be the same devices",
                 i, fmt::join(tensors[i]->shape(), ", "), tensors[i]->mesh().mesh().repr(),
                 mesh.mesh().repr());
  }
  std::atomic<bool> failed{false};
  GraphBuilder builder(mesh.device_set());
  for (std::int64_t slot : mesh.local_slots()) {
    builder.add(mesh.device(slot).index(), fmt::format("fill[{}]", slot),
                [&fill, &failed, tensors, slot, writes] {
                  try {
                    for (std::size_t i = 0; i < tensors.size() && !failed.load(); ++i) {
                      Tensor& shard = tensors[i]->shard(slot);
                      if (shard.size() == 0) continue;
                      fill(i, slot, shard);
                      if (shard.order() == StoredOrder::kPanels && writes == FillWrites::kRows) {
                        arrange_in_panels(shard);
                      }
                    }
                  } catch (...) {
                    failed = true;
                    throw;
                  }
                });
  }
  builder.compile().run();
}

void scatter(const HostTensor& host, ShardedTensor& tensor) {
  const HostTensor* const hosts[] = {&host};
  ShardedTensor* const tensors[] = {&tensor};
  scatter(hosts, tensors);
}

void scatter(std::span<const HostTensor* const> hosts, std::span<ShardedTensor* const> tensors) {
  NUMESH_CHECK(hosts.size() == tensors.size(), ShapeError,
               "scatter: {} host tensors for {} sharded tensors", hosts.size(), tensors.size());
  for (std::size_t i = 0; i < hosts.size(); ++i) check_host_shape(*hosts[i], *tensors[i]);
  fill_shards(tensors, [&](std::size_t i, std::int64_t slot, Tensor& shard) {
    const auto& slices = tensors[i]->layout().device(slot).slices;
    copy_box(slices, hosts[i]->data.data(), DType::kF32, whole(hosts[i]->shape), shard.data(),
             shard.dtype(), slices);
  });
}

HostTensor gather(const ShardedTensor& tensor) {
  const DeviceMesh& mesh = tensor.mesh();
  HostTensor host = HostTensor::zeros(tensor.shape());
  if (host.data.empty()) return host;
  const auto global = whole(host.shape);
  GraphBuilder builder(mesh.device_set());
  for (const std::int64_t slot : mesh.local_slots()) {
    const auto& shard_info = tensor.layout().device(slot);
    if (shard_info.replica_id != 0) continue;  // one copy of each slice
    const Tensor& shard = tensor.shard(slot);
    builder.add(tensor.mesh().device(slot).index(), fmt::format("gather[{}]", slot),
                [&host, &global, &shard_info, &shard] {
                  const void* rows = shard.data();
                  std::vector<std::byte> restored;
                  if (shard.order() == StoredOrder::kPanels) {
                    // The shard's rows, restored from its panels matrix by matrix.
                    const Matrices m = matrices_of(shard);
                    restored.resize(shard.size_bytes());
                    const auto* from = static_cast<const std::byte*>(shard.data());
                    for (std::int64_t i = 0; i < m.count; ++i) {
                      const auto bytes = static_cast<std::size_t>(m.bytes);
                      panels_to_rows(shard.dtype(), m.n, m.k, std::span(from + i * m.bytes, bytes),
                                     std::span(restored.data() + i * m.bytes, bytes));
                    }
                    rows = restored.data();
                  }
                  copy_box(shard_info.slices, rows, shard.dtype(), shard_info.slices,
                           host.data.data(), DType::kF32, global);
                });
  }
  builder.compile().run();
  if (mesh.ranks() == 1) return host;
  // Across ranks: every rank's host copy (each holding the slices its rank's first copies
  // hold), then each slice from its rank's.
  const std::size_t n = host.data.size();
  std::vector<float> all(n * static_cast<std::size_t>(mesh.ranks()));
  mesh.transport()->all_gather(std::as_bytes(std::span<const float>(host.data)),
                               std::as_writable_bytes(std::span<float>(all)));
  for (std::int64_t slot = 0; slot < mesh.size(); ++slot) {
    const auto& shard_info = tensor.layout().device(slot);
    if (shard_info.replica_id != 0 || mesh.is_local(slot)) continue;
    const float* theirs = all.data() + static_cast<std::size_t>(mesh.rank_of(slot)) * n;
    copy_box(shard_info.slices, theirs, DType::kF32, global, host.data.data(), DType::kF32, global);
  }
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
