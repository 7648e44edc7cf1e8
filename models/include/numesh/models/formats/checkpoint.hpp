#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"

// A model's weights on disk as the loaders see them: tensors found by their Hugging Face names
// ("model.layers.0.self_attn.q_proj.weight"), each with a shape in NumPy order (outermost
// first) and read, whole or as a rectangular box, straight into the caller's buffer in the
// dtype it asks for. A safetensors folder is one (SafetensorsCheckpoint); a GGUF file, whose
// own names and layouts are translated to these, is another. CausalLmWeights, the shard reader
// and the engine read only through this interface.

namespace numesh::models {

/// The tensors of a model on disk, by Hugging Face name. Implementations are move-only; const
/// member functions may be called from any number of threads at once.
class Checkpoint {
 public:
  virtual ~Checkpoint() = default;

  /// What the checkpoint was opened from (a folder or a file): errors name it.
  [[nodiscard]] virtual const std::filesystem::path& location() const noexcept = 0;

  /// The files holding the weights, in the checkpoint's order (a plain read of them is the
  /// load's baseline).
  [[nodiscard]] virtual std::vector<std::filesystem::path> weight_files() const = 0;

  /// Every tensor's name, in the checkpoint's order.
  [[nodiscard]] virtual std::vector<std::string> names() const = 0;

  /// Whether the checkpoint has a tensor called `name`.
  [[nodiscard]] virtual bool contains(std::string_view name) const noexcept = 0;

  /// Tensor `name`'s shape, outermost first (empty for a scalar).
  /// Throws: KeyError (key() == name) naming the checkpoint and up to three of the closest names.
  [[nodiscard]] virtual std::vector<std::int64_t> shape(std::string_view name) const = 0;

  /// The bytes tensor `name` takes on disk (what reading it costs).
  /// Throws: KeyError as shape().
  [[nodiscard]] virtual std::uint64_t stored_bytes(std::string_view name) const = 0;

  /// The format tensor `name` is stored in when it is one numesh keeps weights in (f32, f16,
  /// bf16, q8_0, q4_0, q4_k, q6_k: read_box() into it copies the bytes as they are); nullopt
  /// for other types (safetensors' F64 or integers, GGUF's Q5_K...).
  /// Throws: KeyError as shape().
  [[nodiscard]] virtual std::optional<DType> stored_format(std::string_view name) const = 0;

  /// Reads the box [offsets[d], offsets[d] + sizes[d]) in every dim d of tensor `name` into
  /// `out`, densely, row-major, as `target` elements: the same format is copied as it is,
  /// others converted (bf16 and f16 widen exactly; narrowing rounds to nearest even; a block
  /// format quantizes each row by GGML's reference quantizers). A box with a zero size reads
  /// nothing.
  /// REQUIRES: offsets and sizes have one entry per dim of the tensor and lie inside it; the
  /// box's rows are whole blocks of `target`; out.size() == runtime::storage_bytes(target,
  /// sizes).
  /// Throws: KeyError as shape(); ShapeError when a requirement on the box or on `out` does not
  /// hold (naming the tensor, its shape and the box); ValueError for a stored type numesh cannot
  /// read, or a value `target` cannot hold (a non-finite weight quantized), naming the tensor;
  /// IoError when the file cannot be read, or ends before the box (changed since it was
  /// opened; the files' readers say which reads find that out: GgufFile, SafetensorsFile).
  virtual void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                        std::span<const std::int64_t> sizes, DType target,
                        std::span<std::byte> out) const = 0;

  /// The box of tensor `name` that read_box() would write, as `target` elements, in place: a
  /// pointer to its first byte in the checkpoint's file mapping, keeping the mapping alive for as
  /// long as it lives (after the checkpoint is gone too), when the bytes read_box() would copy
  /// are already one run of the file (the tensor stored as `target`, the box whole rows, nothing
  /// to permute or add); nullptr when the box must be read. The bytes are read-only. A
  /// checkpoint that does not map its files gives nullptr (this default).
  /// Throws: KeyError as shape().
  [[nodiscard]] virtual std::shared_ptr<const std::byte> box_in_place(
      std::string_view name, std::span<const std::int64_t> offsets,
      std::span<const std::int64_t> sizes, DType target) const;

  /// The rows of tensor `name` (its first dim) that read_box() reads together: a box whose rows
  /// start and end on multiples of it reads its own rows, one that cuts a group reads the whole
  /// group (GGUF's permuted q and k rows, a head). At least 1; 1 (this default) when every row
  /// is read alone. A reader of a large box in blocks makes the blocks multiples of it (blocks
  /// counted from the box's first row, so a box that does not start on a group reads the
  /// groups it cuts twice).
  /// Throws: KeyError as shape().
  [[nodiscard]] virtual std::int64_t rows_read_together(std::string_view name) const;

  /// Reads all of tensor `name` into `out`: read_box() over its whole shape.
  /// Throws: as read_box().
  void read(std::string_view name, DType target, std::span<std::byte> out) const;

 protected:
  Checkpoint() = default;
  Checkpoint(const Checkpoint&) = default;
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(const Checkpoint&) = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
};

}  // namespace numesh::models
