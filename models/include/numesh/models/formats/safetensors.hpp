#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"

// Safetensors files, the format Hugging Face checkpoints are stored in: an 8-byte little-endian
// header length N, N bytes of JSON describing each tensor (dtype, shape, byte offsets), then one
// byte buffer holding every tensor, little-endian and row-major. A file is memory-mapped and its
// header validated once, by the rules of the official Rust reader (huggingface/safetensors,
// safetensors/src/tensor.rs); tensors are then read, whole or as a rectangular box (the shard
// one device owns), straight from the mapping into the caller's buffer, converted to the dtype
// the caller asks for. docs/models.md has the format and every rule checked.

namespace numesh::models {

namespace detail {
class ReadableFile;
}  // namespace detail

/// The element types a safetensors header may name, spelled as the Rust crate spells them
/// (to_string). numesh reads the values of F32, BF16 and F16 tensors only; the rest are
/// parsed and validated so that a checkpoint holding them opens, and fail when read.
enum class SafetensorsDType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kC64,         ///< complex, two F32 parts
  kF8E4M3,      ///< "F8_E4M3"
  kF8E5M2,      ///< "F8_E5M2"
  kF8E8M0,      ///< "F8_E8M0" (OCP microscaling scale)
  kF8E4M3Fnuz,  ///< "F8_E4M3FNUZ"
  kF8E5M2Fnuz,  ///< "F8_E5M2FNUZ"
  kF4,          ///< "F4": 4 bits (OCP MXFP4)
  kF6E2M3,      ///< "F6_E2M3": 6 bits
  kF6E3M2,      ///< "F6_E3M2": 6 bits
};

/// The header's spelling: "F32", "BF16", "F8_E4M3", ...
[[nodiscard]] std::string_view to_string(SafetensorsDType dtype) noexcept;

/// The dtype a header names, or nullopt when the format defines none of that name (the match
/// is exact and case-sensitive, as in the Rust crate).
[[nodiscard]] std::optional<SafetensorsDType> find_safetensors_dtype(
    std::string_view name) noexcept;

/// Bits per element: 4 (F4), 6 (F6_*), 8, 16, 32 or 64.
[[nodiscard]] int bit_size(SafetensorsDType dtype) noexcept;

/// The numesh dtype with the same element encoding (F32, BF16, F16 -> kF32, kBF16, kF16), or
/// nullopt for the dtypes numesh cannot read values of.
[[nodiscard]] std::optional<DType> to_numesh_dtype(SafetensorsDType dtype) noexcept;

/// One tensor of a safetensors header. A regular value type.
struct TensorInfo {
  /// The tensor's name, the header's key ("model.layers.0.mlp.up_proj.weight").
  std::string name;
  /// The stored element type.
  SafetensorsDType dtype = SafetensorsDType::kF32;
  /// Extents, outermost first; empty for a scalar. Every extent is >= 0.
  std::vector<std::int64_t> shape;
  /// `data_offsets`: the tensor's bytes are [begin, end) of the data buffer, which starts
  /// right after the header (file offset 8 + N).
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  /// Number of elements (1 for a scalar, 0 when an extent is 0).
  [[nodiscard]] std::int64_t num_elements() const noexcept;
  /// end - begin.
  [[nodiscard]] std::uint64_t size_bytes() const noexcept { return end - begin; }

  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

/// An open safetensors file: the file memory-mapped read-only for the object's lifetime and its
/// validated header. Move-only. Const member functions may be called from any number of
/// threads at once. The file stays open too (a descriptor for as long as the object lives): a
/// box that is one run of the file as it is stored is read with pread(). The file must not be
/// truncated or rewritten while it is open: such a read of bytes no longer there is an IoError,
/// but a copy out of the mapping (a conversion, a box of columns) or a weight read in place
/// that touches a page no longer there raises SIGBUS, as with any mapping.
class SafetensorsFile {
 public:
  /// Maps `file` and validates its header (docs/models.md lists every rule):
  /// - the file has at least the 8 bytes of the header length N; N is at most 100,000,000 (the
  ///   Rust crate's limit); the header fits in the file;
  /// - the header is UTF-8 JSON, starts with '{' (the format requires it), and has no key twice
  ///   in any object;
  /// - each entry other than "__metadata__" is an object with exactly "dtype" (a safetensors
  ///   dtype name), "shape" (an array of non-negative integers) and "data_offsets" ([begin,
  ///   end], 0 <= begin <= end); its element count times the dtype's size is a whole number of
  ///   bytes, does not overflow 64 bits and equals end - begin; end is inside the data buffer;
  /// - the spans of all tensors, in offset order, cover the data buffer from byte 0 to its end
  ///   with no gap and no overlap (what the Rust crate's Metadata::validate requires);
  /// - "__metadata__", when present, is an object whose values are strings.
  /// Throws: IoError when the file cannot be opened or mapped, is not a regular file, or ends
  /// before the header or a tensor does (naming the file and the byte counts); ValueError for
  /// every other broken rule, naming the file and, where there is one, the tensor and the
  /// offending values.
  [[nodiscard]] static SafetensorsFile open(const std::filesystem::path& file);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  /// The path the file was opened with.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Every tensor, in the order of its bytes in the data buffer: by data_offsets begin, then
  /// end (a tensor of no bytes comes before the one that begins where it is), then name. The Rust
  /// crate writes its headers in buffer order, so for its files this is usually the header's.
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }

  /// The tensors' names, in the order of tensors().
  [[nodiscard]] std::vector<std::string> names() const;

  /// Whether the file has a tensor called `name`.
  [[nodiscard]] bool contains(std::string_view name) const noexcept;

  /// The tensor called `name`.
  /// Throws: KeyError (key() == name) naming the file and up to three of its closest names.
  [[nodiscard]] const TensorInfo& info(std::string_view name) const;

  /// The "__metadata__" entries (empty when the header has none).
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept {
    return metadata_;
  }

  /// The stored bytes of tensor `name`, little-endian and row-major, inside the mapping (valid
  /// while this object lives; not aligned beyond one byte).
  /// Throws: KeyError as info().
  [[nodiscard]] std::span<const std::byte> bytes(std::string_view name) const;

  /// The box [offsets[d], offsets[d] + sizes[d]) of tensor `name` as `target` elements, read in
  /// place: a pointer to its first byte inside the mapping, which it keeps mapped for as long as
  /// it lives (after this object is gone too), when the tensor is stored as `target` and the
  /// box's bytes are one run laid out as read_box() would write them and aligned for `target`'s
  /// values; nullptr when the box must be read (converted, gathered from rows, or not valid:
  /// read_box() reports why). The bytes are read-only.
  /// Throws: KeyError as info().
  [[nodiscard]] std::shared_ptr<const std::byte> box_in_place(std::string_view name,
                                                              std::span<const std::int64_t> offsets,
                                                              std::span<const std::int64_t> sizes,
                                                              DType target) const;

  /// Reads all of tensor `name` into `out` as `target` elements, row-major: the same dtype is
  /// copied bit for bit; bf16 or f16 to f32 widens exactly; f32 to bf16 or f16, and bf16 to f16
  /// or back, round to nearest even as numesh/core/dtype.hpp does; a block format (q8_0, q4_0)
  /// quantizes each row (runtime::convert_elements). `out` needs no alignment.
  /// REQUIRES: out.size() == runtime::storage_bytes(target, info(name).shape).
  /// Throws: KeyError as info(); ValueError when the tensor's dtype is not F32, BF16 or F16
  /// (naming it and the tensor), when a block format's rows are not whole blocks, or when a
  /// non-finite value would be quantized (naming the tensor); ShapeError when `out` has the
  /// wrong size; IoError as read_box().
  void read(std::string_view name, DType target, std::span<std::byte> out) const;

  /// Reads the box [offsets[d], offsets[d] + sizes[d]) in every dim d of row-major tensor
  /// `name` into `out`, densely, row-major, as `target` elements (converted as read() does).
  /// For a 2-D weight [rows, cols], offsets {0, c} and sizes {rows, w} read a block of w
  /// columns: the shard of a column-parallel layer. A box with a zero size reads nothing.
  /// REQUIRES: offsets and sizes have one entry per dim of the tensor; 0 <= offsets[d],
  /// 0 <= sizes[d], offsets[d] + sizes[d] <= shape[d]; out.size() ==
  /// runtime::storage_bytes(target, sizes).
  /// Throws: KeyError as info(); ValueError as read(); ShapeError when a requirement on the box
  /// or on `out` does not hold (naming the tensor, its shape and the box); IoError when a box
  /// that is one run of the file as `target` (read with pread()) cannot be read, or lies past
  /// the file's end: the file changed since it was opened.
  void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                std::span<const std::int64_t> sizes, DType target, std::span<std::byte> out) const;

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::shared_ptr<const std::byte> mapping_;  // the whole file, shared with in-place weights
  std::shared_ptr<const detail::ReadableFile> file_;  // open for copies (read_box)
  const std::byte* buffer_ = nullptr;                 // the data buffer: mapping_ + 8 + N
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace numesh::models
