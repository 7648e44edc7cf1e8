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
#include <variant>
#include <vector>

#include "numesh/core/dtype.hpp"

// GGUF files, the format of GGML and llama.cpp models. Everything is little-endian:
//
//   "GGUF"  u32 version  u64 tensor count  u64 key-value count        (the 24-byte fixed header)
//   key-value pairs:  string key, u32 value type, the value
//                     (an array: u32 element type, u64 count, the elements)
//   tensor infos:     string name, u32 n_dims, n_dims x i64 ne, u32 GGML type, u64 offset
//   padding to `general.alignment` (default 32), then the data section holding each tensor at
//   its offset, in the order of the infos, each padded to the alignment
//
// where a string is a u64 byte length and that many bytes (no terminator). A tensor's ne lists
// its extents innermost first (ne[0] is the row length, along which a block format's blocks
// run); numesh's shapes are outermost first, so shape is ne reversed: a GGML weight of ne
// [4096, 11008] is a [11008, 4096] matrix, rows of 4096, as the safetensors tensor it was
// converted from.
//
// A file is memory-mapped and validated once by GGML's own reader's rules (ggml-org/ggml
// src/gguf.cpp, gguf_init_from_file_impl / gguf_init_from_reader). GgufFile::open checks, in
// this order, and fails on the first broken rule:
//  1. the file holds at least the 24-byte fixed header;
//  2. it starts with the magic "GGUF" (the message shows what it starts with);
//  3. the version is 2 or 3: 0 is refused; a version whose low 16 bits are zero (3 read with
//     the wrong byte order is 0x03000000) is refused as a big-endian file; 1 (GGUFv1, 32-bit
//     counts) is no longer supported; above 3 is newer than numesh reads;
//  4. the tensor count and the key-value count fit in the bytes after the fixed header (a
//     tensor info takes at least 24 bytes and a key-value pair 14), so that a corrupt count
//     fails here instead of allocating;
//  5. for each key-value pair: every string's length is at most 1 GiB (GGUF_MAX_STRING_LENGTH)
//     and within the file; the key is not empty and appears once; the value type is one of the
//     13 GGUF value types; an array's element type is a value type other than ARRAY (arrays do
//     not nest), its count is at most 2^30 (GGUF_MAX_ARRAY_ELEMENTS) and its elements fit in
//     the file;
//  6. `general.alignment`, when present, is a UINT32 scalar and a power of two;
//  7. for each tensor info: the name is not empty, shorter than 64 bytes (GGML_MAX_NAME, its
//     NUL included) and unique; n_dims is at most 4 (GGML_MAX_DIMS; 0 is a one-element tensor,
//     as in GGML); every ne[i] is >= 0 and their product does not overflow int64; the type is a
//     GGML type id that GGUF files may hold (ids 4, 5, 31 to 33 and 36 to 38 are types GGML
//     removed and are refused by name, ids from 43 up are unknown); ne[0] is a whole number of
//     the type's blocks; the size in bytes does not overflow 64 bits;
//  8. when there are tensors, the data section starts at the end of the infos padded to the
//     alignment, inside the file (with none, it starts at the end of the infos, as in GGML);
//  9. each tensor's offset, relative to the data section, is exactly the sum of the sizes of
//     the tensors before it, each padded to the alignment: so tensors are aligned, in the order
//     of their infos, with no gap and no overlap (GGML's rule; the message tells a misaligned
//     offset from an overlap and from a gap);
// 10. each tensor's bytes end inside the file.
// Failures of 1, 4, 8, 10 and a string, array or value running past the end are IoError ("file
// ends early"); every other rule is a ValueError. Every message names the file and, where there
// is one, the key or the tensor and the offending values. Bytes after the last tensor are
// allowed (GGML pads the last tensor too).
//
// Tensors of the types numesh computes in (one per DType: gguf_types_numesh_reads()) are read
// whole or as a box (the shard a device owns) into the caller's buffer, converted to the DType
// asked for. Every other type opens (its info and bytes are available) but cannot be read.

namespace numesh::models {

namespace detail {
class ReadableFile;
}  // namespace detail

/// GGML's tensor types (include/ggml.h `enum ggml_type`), with GGML's ids, which are part of
/// the GGUF format. The ids GGML removed (4, 5, 31 to 33, 36 to 38) have no enumerator: a file
/// naming them is refused at open.
enum class GgufType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
  kQ2_0 = 42,
};

/// The type's name as GGUF tools spell it (gguf-py's GGMLQuantizationType): "F32", "Q4_K",
/// "IQ2_XXS", "BF16", "MXFP4", ...
[[nodiscard]] std::string_view to_string(GgufType type) noexcept;

/// The type of GGML id `id`, or nullopt for an id GGML never had or removed.
[[nodiscard]] std::optional<GgufType> find_gguf_type(std::uint32_t id) noexcept;

/// Elements a block of `type` holds along a row: 1 for F32, F16, BF16, F64 and the integer
/// types; 32 for Q4_0, Q8_0 and the other 32-element blocks; 256 for the K and IQ formats;
/// 64 for NVFP4 and Q2_0; 128 for Q1_0.
[[nodiscard]] std::int64_t block_elements(GgufType type) noexcept;

/// Bytes a block of `type` takes (GGML's type size: 4 for F32, 34 for Q8_0, 144 for Q4_K...).
[[nodiscard]] std::int64_t block_bytes(GgufType type) noexcept;

/// The numesh format with the same bytes (F32 -> kF32, Q5_K -> kQ5_K...: the DType whose
/// DTypeTraits::ggml_type is `type`), or nullopt for the types numesh cannot read.
[[nodiscard]] std::optional<DType> to_numesh_dtype(GgufType type) noexcept;

/// The GGUF type with the same bytes as `dtype` (every numesh format has one: core's format
/// table names it, DTypeTraits::ggml_type).
[[nodiscard]] std::optional<GgufType> to_gguf_type(DType dtype) noexcept;

/// The GGML type names of the tensors numesh reads, one per DType in its order, as a list for a
/// message or a help text: "F32, BF16, F16, Q8_0, ... and Q6_K".
[[nodiscard]] std::string gguf_types_numesh_reads();

/// The type of a metadata value (gguf.h `enum gguf_type`), with GGUF's ids.
enum class GgufValueType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,  ///< one byte; any non-zero byte is true (as gguf.cpp reads it)
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// The value type's name as the GGUF specification (docs/gguf.md) and gguf-py spell it:
/// "UINT8", "INT8", ..., "STRING", "ARRAY", "FLOAT64".
[[nodiscard]] std::string_view to_string(GgufValueType type) noexcept;

/// One metadata value of an open GgufFile: a scalar, or an array of scalars of one type (GGUF
/// arrays do not nest). Strings and numbers are not copied: they stay in the file's mapping, so
/// an array of 150,000 strings (a tokenizer's vocabulary) costs one string_view each. A value is
/// valid while the GgufFile it came from lives (moving the file keeps it valid).
class GgufValue {
 public:
  /// One element: UINT8/16/32/64 as uint64_t, INT8/16/32/64 as int64_t, FLOAT32/64 as double
  /// (exactly), BOOL as bool, STRING as the string's bytes (not necessarily valid UTF-8).
  using Element = std::variant<std::uint64_t, std::int64_t, double, bool, std::string_view>;

  /// kArray for an array, otherwise the scalar's type.
  [[nodiscard]] GgufValueType type() const noexcept {
    return array_ ? GgufValueType::kArray : element_type_;
  }
  /// An array's element type, or a scalar's own type (never kArray).
  [[nodiscard]] GgufValueType element_type() const noexcept { return element_type_; }
  /// Whether the value is an array.
  [[nodiscard]] bool is_array() const noexcept { return array_; }
  /// Number of elements: an array's count (possibly 0), 1 for a scalar.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// Element `i` (the scalar itself for i == 0). REQUIRES: i < size().
  [[nodiscard]] Element at(std::size_t i) const noexcept;

 private:
  friend class GgufFile;

  GgufValueType element_type_ = GgufValueType::kUint8;
  bool array_ = false;
  std::size_t count_ = 0;
  const std::byte* numbers_ = nullptr;     // a number or BOOL's count_ elements, in the mapping
  std::vector<std::string_view> strings_;  // a STRING's count_ elements, in the mapping
};

/// One tensor of a GGUF file. A regular value type.
struct GgufTensorInfo {
  /// The tensor's name ("blk.0.attn_q.weight").
  std::string name;
  /// The stored type.
  GgufType type = GgufType::kF32;
  /// Extents as stored, innermost first (n_dims of them, 0 to 4); every extent >= 0.
  std::vector<std::int64_t> ne;
  /// Extents outermost first (ne reversed), numesh's and NumPy's order: the last dim is the
  /// row, a whole number of the type's blocks. Empty for n_dims 0 (one element).
  std::vector<std::int64_t> shape;
  /// Where the tensor's bytes begin, relative to the data section (GgufFile::data_offset()).
  std::uint64_t offset = 0;
  /// The tensor's bytes: num_elements() / block_elements(type) * block_bytes(type).
  std::uint64_t size_bytes = 0;

  /// Number of elements (1 for n_dims 0, 0 when an extent is 0).
  [[nodiscard]] std::int64_t num_elements() const noexcept;

  friend bool operator==(const GgufTensorInfo&, const GgufTensorInfo&) = default;
};

/// An open GGUF file: the file memory-mapped read-only for the object's lifetime, its
/// validated metadata and tensor infos. Move-only. Const member functions may be called from
/// any number of threads at once. The file stays open too (a descriptor for as long as the
/// object lives): a box that is one run of the file as it is stored is read with pread(). The
/// file must not be truncated or rewritten while it is open: such a read of bytes no longer
/// there is an IoError, but a copy out of the mapping (a conversion, a box of columns) or a
/// weight read in place that touches a page no longer there raises SIGBUS, as with any mapping.
class GgufFile {
 public:
  /// Maps `file` and validates it by every rule of this header's comment (GGML's reader's).
  /// Throws: IoError when the file cannot be opened or mapped, is not a regular file, or ends
  /// before a count, string, value, tensor info, the data section or a tensor's bytes do
  /// (naming the file, what ends early and the byte counts); ValueError for every other broken
  /// rule, naming the file and, where there is one, the key or tensor and the offending values.
  [[nodiscard]] static GgufFile open(const std::filesystem::path& file);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  /// The path the file was opened with.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The format version: 2 or 3.
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  /// `general.alignment`, or 32 when the file has no such key: a power of two.
  [[nodiscard]] std::uint32_t alignment() const noexcept { return alignment_; }
  /// The file offset of the data section, which every GgufTensorInfo::offset is relative to.
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }

  /// Every tensor, in the file's order (also the order of their bytes).
  [[nodiscard]] const std::vector<GgufTensorInfo>& tensors() const noexcept { return tensors_; }
  /// The tensors' names, in the order of tensors().
  [[nodiscard]] std::vector<std::string> names() const;
  /// Whether the file has a tensor called `name`.
  [[nodiscard]] bool contains(std::string_view name) const noexcept;
  /// The tensor called `name`.
  /// Throws: KeyError (key() == name) naming the file and up to three of its closest names.
  [[nodiscard]] const GgufTensorInfo& info(std::string_view name) const;
  /// The stored bytes of tensor `name` inside the mapping (valid while this object lives). Their
  /// file offset is a multiple of alignment(), so their address is too, up to the page size.
  /// Throws: KeyError as info().
  [[nodiscard]] std::span<const std::byte> bytes(std::string_view name) const;

  /// The metadata keys, in the file's order.
  [[nodiscard]] const std::vector<std::string>& keys() const noexcept { return keys_; }
  /// The value of `key`, or nullptr when the file has no such key. The pointer is valid while
  /// this object lives.
  [[nodiscard]] const GgufValue* find(std::string_view key) const noexcept;

  // Typed metadata getters: each returns nullopt when the file has no `key`, and otherwise
  // throws ValueError naming the file, the key, its type and what was expected when the value
  // is not of the kind asked for ("gguf: cannot read key 'llama.block_count' of '<file>': it is
  // STRING, not an integer").

  /// A scalar of any integer type (UINT8 to INT64). Throws: ValueError as above, or for a
  /// UINT64 above 2^63 - 1.
  [[nodiscard]] std::optional<std::int64_t> get_int(std::string_view key) const;
  /// A FLOAT32 or FLOAT64 scalar (exact), or an integer scalar converted to double (rounded to
  /// nearest beyond 2^53). Throws: ValueError as above.
  [[nodiscard]] std::optional<double> get_float(std::string_view key) const;
  /// A BOOL scalar. Throws: ValueError as above.
  [[nodiscard]] std::optional<bool> get_bool(std::string_view key) const;
  /// A STRING scalar, its bytes copied. Throws: ValueError as above.
  [[nodiscard]] std::optional<std::string> get_string(std::string_view key) const;
  /// An ARRAY of STRING, copied. Throws: ValueError as above.
  [[nodiscard]] std::optional<std::vector<std::string>> get_strings(std::string_view key) const;
  /// An ARRAY of FLOAT32, FLOAT64 or any integer type, each element converted to float (FLOAT32
  /// exactly; the others rounded to nearest). Throws: ValueError as above.
  [[nodiscard]] std::optional<std::vector<float>> get_floats(std::string_view key) const;
  /// An ARRAY of any integer type. Throws: ValueError as above, or naming the first UINT64
  /// element above 2^63 - 1 and its index.
  [[nodiscard]] std::optional<std::vector<std::int64_t>> get_ints(std::string_view key) const;

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

  /// Reads all of tensor `name` into `out` as `target` elements, row-major in shape order (ne
  /// reversed): the same format is copied byte for byte; F16 and BF16 widen to f32 exactly and
  /// f32 narrows to them rounding to nearest even; a block format dequantizes as GGML does and
  /// quantizes by GGML's reference quantizers (runtime::convert_elements). `out` needs no
  /// alignment.
  /// REQUIRES: out.size() == runtime::storage_bytes(target, info(name).shape).
  /// Throws: KeyError as info(); ValueError when the tensor's type is not one numesh reads
  /// (gguf_types_numesh_reads(); naming it and the tensor), when the rows are not
  /// whole blocks of `target`, or when a non-finite value would be quantized (naming the
  /// tensor); ShapeError when `out` has the wrong size; IoError as read_box().
  void read(std::string_view name, DType target, std::span<std::byte> out) const;

  /// Reads the box [offsets[d], offsets[d] + sizes[d]) in every dim d of tensor `name`'s shape
  /// (outermost first) into `out`, densely, row-major, as `target` elements, converted as read()
  /// does. For a 2-D weight [rows, cols], offsets {0, c} and sizes {rows, w} read w columns: the
  /// shard of a column-parallel layer. A box with a zero size reads nothing. A block-format
  /// tensor's box whose columns start and end on its blocks is converted block by block (the
  /// same format: copied); one whose columns cut its blocks (a Q4_K row of 512 read from column
  /// 128) dequantizes the blocks covering each row and converts the columns asked for.
  /// REQUIRES: offsets and sizes have one entry per dim of the shape; 0 <= offsets[d],
  /// 0 <= sizes[d], offsets[d] + sizes[d] <= shape[d]; out.size() ==
  /// runtime::storage_bytes(target, sizes).
  /// Throws: KeyError as info(); ValueError as read() (a box's rows not whole blocks of
  /// `target`); ShapeError when a requirement on the box or on `out` does not hold (naming the
  /// tensor, its shape and the box); IoError when a box that is one run of the file as
  /// `target` (read with pread()) cannot be read, or lies past the file's end: the file changed
  /// since it was opened.
  void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                std::span<const std::int64_t> sizes, DType target, std::span<std::byte> out) const;

 private:
  GgufFile() = default;

  std::filesystem::path path_;
  std::shared_ptr<const std::byte> mapping_;  // the whole file, shared with in-place weights
  std::shared_ptr<const detail::ReadableFile> file_;  // open for copies (read_box)
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::vector<GgufValue> values_;                              // values_[i] is keys_[i]'s
  std::map<std::string, std::size_t, std::less<>> key_index_;  // key -> position in keys_
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;  // name -> position
};

}  // namespace numesh::models
