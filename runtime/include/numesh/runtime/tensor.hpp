#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/device_buffer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/shard_layout.hpp"

namespace numesh::runtime {

/// Number of elements of `shape` (1 for rank 0). Throws: ShapeError for a negative extent or a
/// count past 2^63.
std::int64_t num_elements(std::span<const std::int64_t> shape);

/// Bytes a dense row-major tensor of `shape` takes stored as `dtype`: its rows (the last dim;
/// rank 0 is one row of one element) each row_bytes(dtype, row length) long, so that a block
/// format's blocks run along rows and never straddle two.
/// Throws: ShapeError for a negative extent or a size past 2^63; ValueError (row_bytes) when the
/// rows are not whole blocks of the format.
std::int64_t storage_bytes(DType dtype, std::span<const std::int64_t> shape);

/// A dense row-major tensor in ordinary (host) memory: the form data has before it is
/// sharded and after it is gathered. A regular value type.
struct HostTensor {
  /// Extents, outermost first.
  std::vector<std::int64_t> shape;
  /// num_elements(shape) values in row-major order.
  std::vector<float> data;
  /// Set by shape_only() alone: the values are not in host memory, on purpose. A tensor with a
  /// shape and no data that did not come from shape_only() is refused where its values are
  /// needed (scatter), never laid out unfilled by mistake. (Last, with braces: designated
  /// initializers may leave it out without GCC's warning.)
  bool values_elsewhere{};

  /// A zero tensor of `shape`. Throws: ShapeError for a negative extent; ValueError naming
  /// the shape, its size and the machine's memory when it is larger than all of that memory.
  static HostTensor zeros(std::vector<std::int64_t> shape);
  /// A tensor with a shape and no values (data empty; the shape must hold elements): a weight
  /// whose values are not in host memory. The operators' layers lay it out unfilled, and the
  /// caller writes each device's shard itself (fill_shards): how a checkpoint is read straight
  /// into the devices' nodes. Only the layers' create functions accept one.
  static HostTensor shape_only(std::vector<std::int64_t> shape);
  /// True for a shape_only() tensor (values_elsewhere): no values, though its shape holds
  /// elements.
  bool is_shape_only() const noexcept;
  friend bool operator==(const HostTensor&, const HostTensor&) = default;
};

/// `t` with every value stored as `dtype` and widened back exactly: the values a tensor of that
/// dtype holds after scatter(t) (bf16 / f16 rounded to nearest even; a block format quantized
/// along each row, the last dim, and dequantized). fp32 returns a copy of t.
/// Throws: ValueError for a block format when the rows are not whole blocks, or for a
/// non-finite value it cannot hold.
HostTensor rounded_to(const HostTensor& t, DType dtype);

/// How a tensor of weights lays out its matrices (each [n, k] of its last two dims).
enum class StoredOrder {
  kRows,    ///< row-major: each of the n rows after the other
  kPanels,  ///< Q8_0 and Q4_0 only: the first n - n mod 16 rows in panels of 16 outputs
            ///< (runtime/weight_panels.hpp), the rest rows; the same bytes, reordered
};

/// A dense row-major tensor whose storage lives on one device's NUMA node, of element type
/// DType (fp32, or bf16 / f16 for stored weights: half the bytes a memory-bound kernel reads),
/// or, for stored weights only, a block format (its rows storage_bytes() lays out). Move-only.
class Tensor {
 public:
  /// An empty tensor (no device, rank 0, no storage).
  Tensor() = default;
  /// A zero tensor of `shape` on `device` (allocated for its node and zero-filled by its
  /// threads; not filled with BufferContents::kUnspecified, Device::allocate). Throws:
  /// ShapeError for a negative extent; ValueError when `dtype` is a block format and the last
  /// dim is not a whole number of its blocks.
  /// `order` kPanels: each matrix of the last two dims is stored in panels (StoredOrder).
  /// Throws: also TypeError for kPanels with a dtype that has none (has_panels), ShapeError for
  /// kPanels below rank 2.
  Tensor(Device& device, std::vector<std::int64_t> shape, DType dtype = DType::kF32,
         BufferContents contents = BufferContents::kZeros, StoredOrder order = StoredOrder::kRows);

  /// Extents.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// How its matrices are laid out (kRows but for weights stored in panels).
  StoredOrder order() const noexcept { return order_; }
  /// Number of elements.
  std::int64_t size() const noexcept { return size_; }
  /// The elements of an fp32 tensor. Empty for a tensor with no elements.
  /// Throws: TypeError when the tensor is not fp32 (naming its dtype).
  std::span<float> values();
  /// The elements of an fp32 tensor. Throws: TypeError when the tensor is not fp32.
  std::span<const float> values() const;
  /// The elements of a bf16 or f16 tensor, as their bits.
  /// Throws: TypeError when the tensor is fp32.
  std::span<std::uint16_t> bits16();
  /// The elements of a bf16 or f16 tensor, as their bits. Throws: TypeError when it is fp32.
  std::span<const std::uint16_t> bits16() const;
  /// The first element, of any dtype (nullptr when empty): for kernels that dispatch on dtype().
  const void* data() const noexcept { return buffer_.data(); }
  /// The first element, writable (nullptr when empty).
  void* data() noexcept { return buffer_.data(); }
  /// Bytes of the elements (storage_bytes(dtype(), shape())).
  std::size_t size_bytes() const noexcept { return buffer_.size_bytes(); }
  /// The owning device, or nullptr for an empty tensor.
  Device* device() const noexcept { return buffer_.device(); }
  /// The storage.
  const DeviceBuffer& buffer() const noexcept { return buffer_; }

  /// Makes the tensor read its elements from `bytes` in place, size_bytes() of them laid out
  /// as the tensor's dtype, shape and kRows order say (a model file's mapping: no copy), instead
  /// of the storage it has, which is freed; Device::use_mapped on its device. The tensor keeps
  /// `bytes` alive and must not be written from then on (the bytes are read-only: a write faults).
  /// A weight's shard takes its checkpoint's bytes this way before any program runs on it.
  /// REQUIRES: `bytes` holds size_bytes() bytes.
  /// Throws: ValueError for a tensor without elements or a null `bytes`; TypeError for a tensor
  /// stored in panels (its bytes are reordered from the file's rows).
  void use_mapped(std::shared_ptr<const std::byte> bytes);

 private:
  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::kF32;
  StoredOrder order_ = StoredOrder::kRows;
  std::int64_t size_ = 0;
  DeviceBuffer buffer_;
};

/// `t`'s matrices (each [n, k] of its last two dims), stored as rows, rearranged in place into
/// panels by the calling thread's arena (StoredOrder::kPanels). For whoever fills a tensor of
/// that order: fill_shards calls it once fill has written a shard's rows (FillWrites::kRows).
/// Throws: TypeError when t's order is not kPanels.
void arrange_in_panels(Tensor& t);

/// A global tensor split over a DeviceMesh by a PartitionSpec, with one shard per mesh slot on
/// that slot's device, laid out by sharding::ShardLayout (JAX's NamedSharding semantics).
/// Replicated shards are real copies, one on each holder's node. On a mesh over ranks, this
/// process holds the shards of its local slots only (all of them in one process). Move-only.
class ShardedTensor {
 public:
  /// Allocates zero shards of `dtype` for `shape` sharded by `spec` over `mesh` (each shard
  /// allocated and zero-filled by its own device; with BufferContents::kUnspecified not filled:
  /// the owner writes every shard whole, scatter() or fill_shards(), before reading it). The spec
  /// is used as given; pass it through sharding::correct_spec first to get eformer's correction.
  /// Throws: what ShardLayout throws (ShapeError for indivisible dims, KeyError/ValueError
  /// for bad specs).
  /// `order` kPanels: every shard's matrices stored in panels (StoredOrder; each device's
  /// matrices are its shard's last two dims). Throws: also as Tensor for kPanels.
  ShardedTensor(DeviceMesh mesh, std::vector<std::int64_t> shape, sharding::PartitionSpec spec,
                DType dtype = DType::kF32, BufferContents contents = BufferContents::kZeros,
                StoredOrder order = StoredOrder::kRows);

  /// The mesh.
  const DeviceMesh& mesh() const noexcept { return mesh_; }
  /// The layout (global shape, spec, per-slot slices, replica groups).
  const sharding::ShardLayout& layout() const noexcept { return layout_; }
  /// The global shape.
  const std::vector<std::int64_t>& shape() const noexcept { return layout_.shape(); }
  /// The spec.
  const sharding::PartitionSpec& spec() const noexcept { return layout_.spec(); }
  /// The element type of every shard.
  DType dtype() const noexcept { return dtype_; }
  /// How every shard lays out its matrices.
  StoredOrder order() const noexcept { return order_; }
  /// Bytes each device holds: storage_bytes() of the shard shape (a replica counts in full).
  std::int64_t shard_bytes() const { return storage_bytes(dtype_, layout_.shard_shape()); }
  /// The shard of mesh slot `slot`, which must be local.
  /// Throws: IndexError for a slot outside the mesh; ValueError naming the slot, its rank and
  /// this rank's slots when another rank holds it.
  Tensor& shard(std::int64_t slot);
  /// The shard of mesh slot `slot` (as the non-const overload).
  const Tensor& shard(std::int64_t slot) const;
  /// True when this process holds the shard of `slot` (always in one process).
  /// Throws: IndexError for a slot outside the mesh.
  bool has_shard(std::int64_t slot) const { return mesh_.is_local(slot); }

 private:
  DeviceMesh mesh_;
  sharding::ShardLayout layout_;
  DType dtype_ = DType::kF32;
  StoredOrder order_ = StoredOrder::kRows;
  std::vector<Tensor> shards_;  // the local slots' shards, in slot order
};

/// Copies `host` into every shard of `tensor`: each slot's device copies its own slice, in its
/// own arena, all devices in parallel (so each shard's pages are written on its node). A bf16 or
/// f16 tensor receives the values rounded to nearest even, a block format's the blocks of each
/// row (runtime/convert.hpp's convert_elements).
/// Throws: ShapeError when the shapes differ (naming both).
void scatter(const HostTensor& host, ShardedTensor& tensor);
/// scatter() of hosts[i] into *tensors[i] for every i, in one fill_shards graph: each device
/// pays one synchronization for all of them, not one each. The shapes are checked before
/// anything is written.
/// Throws: ShapeError when the spans' sizes or a pair's shapes differ (naming both); ValueError
/// when the tensors are not all on one mesh (fill_shards).
void scatter(std::span<const HostTensor* const> hosts, std::span<ShardedTensor* const> tensors);
/// Calls fill(slot, shard) for every slot whose shard holds elements, on that slot's device (in
/// its arena: the pages it writes are its node's, and tbb algorithms inside use its threads),
/// all devices in parallel. The shard's global box is tensor.layout().device(slot).slices.
/// fill writes rows: a tensor stored in panels is rearranged after it (arrange_in_panels).
/// Throws: what fill throws (rethrown once every device has stopped).
void fill_shards(ShardedTensor& tensor,
                 const std::function<void(std::int64_t slot, Tensor& shard)>& fill);
/// What a fill_shards callback writes into a shard stored in panels (StoredOrder::kPanels).
enum class FillWrites {
  kRows,         ///< rows, which fill_shards then rearranges in place (arrange_in_panels)
  kStoredOrder,  ///< the shard's own order: panels already (runtime/weight_panels.hpp), so the
                 ///< bytes are written once, and no second pass reads them back
};

/// fill_shards over many tensors on one mesh: every device goes through `tensors` in order,
/// calling fill(i, slot, shard) for its slot's shard of tensor i when it holds elements, all
/// devices in parallel and in one graph, so that no device waits for the others between
/// tensors (a model's load of hundreds of matrices pays one synchronization, not one each).
/// `writes` says whether fill writes a panel-stored shard's rows or its panels.
/// After a fill throws, the other devices stop at their next tensor.
/// Throws: ValueError when the tensors are not all on one mesh (naming the first that is
/// not); what fill throws (the first, once every device has stopped).
void fill_shards(std::span<ShardedTensor* const> tensors,
                 const std::function<void(std::size_t i, std::int64_t slot, Tensor& shard)>& fill,
                 FillWrites writes = FillWrites::kRows);
/// Assembles the global tensor from the shards: each distinct slice is copied once, by the
/// first device of its replica group, all devices in parallel. 16-bit values widen exactly,
/// blocks dequantize. On a mesh over ranks, a collective that gives every rank the whole tensor:
/// each slice comes from the rank of its first copy, through the transport (every rank's host
/// copy is all-gathered: ranks times the tensor's f32 bytes cross, a price for checkpoints and
/// checks, not for a step's path). Throws: what the transport throws.
HostTensor gather(const ShardedTensor& tensor);

/// eformer's make_shard_and_gather_fns for one array: `shard` takes a host tensor of `shape`
/// to a ShardedTensor laid out by the spec eformer's correction makes of `spec` for that shape
/// and mesh (axes the mesh lacks or that do not divide a dim are dropped), and `gather` takes
/// it back.
struct ShardAndGatherFns {
  /// The corrected spec the functions use.
  sharding::PartitionSpec spec;
  /// Host tensor -> sharded tensor. Throws: ShapeError when the host shape differs.
  std::function<ShardedTensor(const HostTensor&)> shard;
  /// Sharded tensor -> host tensor.
  std::function<HostTensor(const ShardedTensor&)> gather;
};

/// Builds the pair for an array of `shape` sharded by `spec` over `mesh`.
/// Throws: what correct_spec and ShardLayout throw for bad specs.
ShardAndGatherFns make_shard_and_gather_fns(const DeviceMesh& mesh,
                                            const std::vector<std::int64_t>& shape,
                                            const sharding::PartitionSpec& spec);

/// Copies the box `box` (per-dim [offset, offset+extent) in global coordinates) from `src`,
/// which holds the global slice `src_slices`, into `dst`, which holds `dst_slices`. Both are
/// row-major with the slices' extents as shapes. Contiguous runs are copied with memcpy.
/// REQUIRES: the box lies inside both slices.
void copy_box(std::span<const sharding::DimSlice> box, const float* src,
              std::span<const sharding::DimSlice> src_slices, float* dst,
              std::span<const sharding::DimSlice> dst_slices);
/// copy_box for elements of any dtype: `src` and `dst` hold elements of `dtype`.
void copy_box(std::span<const sharding::DimSlice> box, const void* src,
              std::span<const sharding::DimSlice> src_slices, void* dst,
              std::span<const sharding::DimSlice> dst_slices, DType dtype);
/// copy_box converting: `src` holds elements of `src_type`, `dst` of `dst_type`, converted by
/// convert_elements (fp32 to 16-bit rounds to nearest even, 16-bit to fp32 is exact, a block
/// format quantizes or dequantizes whole blocks). Throws: ValueError when a run of the box does
/// not start and end on a block format's blocks, or for a value a block cannot hold.
void copy_box(std::span<const sharding::DimSlice> box, const void* src, DType src_type,
              std::span<const sharding::DimSlice> src_slices, void* dst, DType dst_type,
              std::span<const sharding::DimSlice> dst_slices);

/// The intersection of two boxes, or nullopt when it is empty.
std::optional<std::vector<sharding::DimSlice>> intersect_boxes(
    std::span<const sharding::DimSlice> a, std::span<const sharding::DimSlice> b);

}  // namespace numesh::runtime
