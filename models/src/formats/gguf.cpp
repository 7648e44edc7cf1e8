#include "numesh/models/formats/gguf.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "../box_copy.hpp"
#include "../closest_names.hpp"
#include "box_in_place.hpp"
#include "file_mapping.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/convert.hpp"

// The rules are those of GGML's reader, ggml-org/ggml src/gguf.cpp (gguf_init_from_reader: the
// header, the key-value pairs, the tensor infos, the data section), with its limits
// (GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS, GGML_MAX_NAME, GGML_MAX_DIMS) and the type
// sizes of src/ggml-common.h. Where numesh differs it says so below: it refuses counts the file
// cannot hold before reading on, empty tensor names, and tensors whose bytes end past the file
// (GGML's reader leaves that to its caller: llama.cpp's loader checks it).

namespace numesh::models {
namespace {

// Numbers are read in place from the mapping; GGUF v3's big-endian files are refused by their
// version (numesh runs on little-endian machines only).
static_assert(std::endian::native == std::endian::little, "GGUF's numbers are read in place");

namespace fs = std::filesystem;

constexpr std::uint64_t kFixedHeaderBytes = 24;  // magic, version, tensor count, kv count
// The fewest bytes a tensor info takes (an empty name, n_dims 0: the name's length, n_dims, the
// type and the offset) and a key-value pair (a one-byte key, its length, the type, a one-byte
// value): the counts are checked against them before anything is read or allocated.
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
constexpr std::uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;
constexpr std::uint64_t kMaxStringBytes = std::uint64_t{1} << 30;    // GGUF_MAX_STRING_LENGTH
constexpr std::uint64_t kMaxArrayElements = std::uint64_t{1} << 30;  // GGUF_MAX_ARRAY_ELEMENTS
constexpr std::size_t kMaxNameBytes = 64;                            // GGML_MAX_NAME, NUL included
constexpr std::uint32_t kMaxDims = 4;                                // GGML_MAX_DIMS
constexpr std::uint32_t kTypeIdEnd = 43;                             // GGML_TYPE_COUNT
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr std::string_view kLayoutRule =
    "GGUF stores each tensor where the one before it ends, padded to the alignment";

struct TypeEntry {
  GgufType type;
  std::string_view name;
  std::int64_t block_elements;
  std::int64_t block_bytes;
};

// Every type GGUF files may hold, in id order; block sizes from src/ggml-common.h (QK* and the
// block structs' static_asserted sizes).
constexpr std::array<TypeEntry, 35> kTypes{{
    {GgufType::kF32, "F32", 1, 4},
    {GgufType::kF16, "F16", 1, 2},
    {GgufType::kQ4_0, "Q4_0", 32, 18},
    {GgufType::kQ4_1, "Q4_1", 32, 20},
    {GgufType::kQ5_0, "Q5_0", 32, 22},
    {GgufType::kQ5_1, "Q5_1", 32, 24},
    {GgufType::kQ8_0, "Q8_0", 32, 34},
    {GgufType::kQ8_1, "Q8_1", 32, 36},
    {GgufType::kQ2_K, "Q2_K", 256, 84},
    {GgufType::kQ3_K, "Q3_K", 256, 110},
    {GgufType::kQ4_K, "Q4_K", 256, 144},
    {GgufType::kQ5_K, "Q5_K", 256, 176},
    {GgufType::kQ6_K, "Q6_K", 256, 210},
    {GgufType::kQ8_K, "Q8_K", 256, 292},
    {GgufType::kIQ2_XXS, "IQ2_XXS", 256, 66},
    {GgufType::kIQ2_XS, "IQ2_XS", 256, 74},
    {GgufType::kIQ3_XXS, "IQ3_XXS", 256, 98},
    {GgufType::kIQ1_S, "IQ1_S", 256, 50},
    {GgufType::kIQ4_NL, "IQ4_NL", 32, 18},
    {GgufType::kIQ3_S, "IQ3_S", 256, 110},
    {GgufType::kIQ2_S, "IQ2_S", 256, 82},
    {GgufType::kIQ4_XS, "IQ4_XS", 256, 136},
    {GgufType::kI8, "I8", 1, 1},
    {GgufType::kI16, "I16", 1, 2},
    {GgufType::kI32, "I32", 1, 4},
    {GgufType::kI64, "I64", 1, 8},
    {GgufType::kF64, "F64", 1, 8},
    {GgufType::kIQ1_M, "IQ1_M", 256, 56},
    {GgufType::kBF16, "BF16", 1, 2},
    {GgufType::kTQ1_0, "TQ1_0", 256, 54},
    {GgufType::kTQ2_0, "TQ2_0", 256, 66},
    {GgufType::kMXFP4, "MXFP4", 32, 17},
    {GgufType::kNVFP4, "NVFP4", 64, 36},
    {GgufType::kQ1_0, "Q1_0", 128, 18},
    {GgufType::kQ2_0, "Q2_0", 64, 18},
}};

// The ids GGML removed (commented out in enum ggml_type): named in the error that refuses them.
constexpr std::array<std::pair<std::uint32_t, std::string_view>, 8> kRemovedTypes{{
    {4, "Q4_2"},
    {5, "Q4_3"},
    {31, "Q4_0_4_4"},
    {32, "Q4_0_4_8"},
    {33, "Q4_0_8_8"},
    {36, "IQ4_NL_4_4"},
    {37, "IQ4_NL_4_8"},
    {38, "IQ4_NL_8_8"},
}};

// Position in kTypes of each id below kTypeIdEnd, -1 for none.
constexpr std::array<std::int8_t, kTypeIdEnd> make_type_index() {
  std::array<std::int8_t, kTypeIdEnd> index{};
  for (std::int8_t& i : index) i = -1;
  for (std::size_t i = 0; i < kTypes.size(); ++i) {
    index[static_cast<std::uint32_t>(kTypes[i].type)] = static_cast<std::int8_t>(i);
  }
  return index;
}
constexpr auto kTypeIndex = make_type_index();

constexpr bool types_complete() {
  // Every id is a type, a removed type, or neither, never both; the table is in id order.
  for (std::size_t i = 1; i < kTypes.size(); ++i) {
    if (static_cast<std::uint32_t>(kTypes[i - 1].type) >=
        static_cast<std::uint32_t>(kTypes[i].type))
      return false;
  }
  std::size_t removed_or_known = 0;
  for (std::uint32_t id = 0; id < kTypeIdEnd; ++id) {
    const bool known = kTypeIndex[id] >= 0;
    bool removed = false;
    for (const auto& r : kRemovedTypes) removed = removed || r.first == id;
    if (known && removed) return false;
    removed_or_known += known || removed ? 1 : 0;
  }
  return removed_or_known == kTypeIdEnd;
}
static_assert(types_complete(), "kTypes and kRemovedTypes cover GGML's ids 0 to 42 once each");

// Each numesh format is the GGML type core's table names (DTypeTraits::ggml_type): its block has
// the same elements and bytes.
constexpr bool formats_are_their_ggml_types() {
  for (const DTypeTraits& f : numesh::kDTypes) {
    if (f.ggml_type >= kTypeIdEnd || kTypeIndex[f.ggml_type] < 0) return false;
    const TypeEntry& t = kTypes[static_cast<std::size_t>(kTypeIndex[f.ggml_type])];
    if (t.block_elements != f.block_elements || t.block_bytes != f.block_bytes) return false;
  }
  return true;
}
static_assert(formats_are_their_ggml_types(), "every DType's ggml_type has its block's size");

const TypeEntry& type_entry(GgufType type) noexcept {
  return kTypes[static_cast<std::size_t>(kTypeIndex[static_cast<std::uint32_t>(type)])];
}

struct ValueTypeEntry {
  std::string_view name;
  std::uint64_t size;  // bytes of one element; 0 for STRING and ARRAY
};

// Indexed by GgufValueType.
constexpr std::array<ValueTypeEntry, 13> kValueTypes{{
    {"UINT8", 1},
    {"INT8", 1},
    {"UINT16", 2},
    {"INT16", 2},
    {"UINT32", 4},
    {"INT32", 4},
    {"FLOAT32", 4},
    {"BOOL", 1},
    {"STRING", 0},
    {"ARRAY", 0},
    {"UINT64", 8},
    {"INT64", 8},
    {"FLOAT64", 8},
}};

bool is_integer_type(GgufValueType type) noexcept {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    case GgufValueType::kFloat32:
    case GgufValueType::kBool:
    case GgufValueType::kString:
    case GgufValueType::kArray:
    case GgufValueType::kFloat64:
      return false;
  }
  return false;
}

bool is_numeric_type(GgufValueType type) noexcept {
  return is_integer_type(type) || type == GgufValueType::kFloat32 ||
         type == GgufValueType::kFloat64;
}

template <typename T>
T load_le(const std::byte* p) noexcept {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

/// Text from the file for a message: a key, a name. Long ones (a corrupt length can make a key
/// of a gigabyte) are cut to their first 64 bytes and "...".
std::string excerpt(std::string_view text) {
  constexpr std::size_t kMax = 64;
  if (text.size() <= kMax) return std::string(text);
  return fmt::format("{}...", text.substr(0, kMax));
}

std::string dims_text(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// "UINT32", or "ARRAY of STRING (3 elements)".
std::string value_text(const GgufValue& value) {
  if (!value.is_array()) return std::string(to_string(value.element_type()));
  return fmt::format("ARRAY of {} ({} element{})", to_string(value.element_type()), value.size(),
                     value.size() == 1 ? "" : "s");
}

/// `x` rounded up to a multiple of `alignment`. REQUIRES: alignment a power of two; no overflow.
constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t alignment) noexcept {
  return (x + alignment - 1) & ~(alignment - 1);
}

/// A cursor over the mapped file that refuses to read past its end. `what` arguments are
/// callables giving the name of what is read, formatted only when it does not fit.
class GgufCursor {
 public:
  GgufCursor(const std::byte* base, std::uint64_t size, const std::string& where) noexcept
      : base_(base), size_(size), where_(where) {}

  [[nodiscard]] std::uint64_t position() const noexcept { return position_; }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return size_ - position_; }

  /// The next `n` bytes. Throws: IoError when fewer remain.
  template <typename What>
  const std::byte* take(std::uint64_t n, const What& what) {
    if (n > remaining()) {
      throw IoError(
          fmt::format("{}: file ends early: {} needs {} bytes at byte {} but the file "
                      "has {}",
                      where_, what(), n, position_, size_));
    }
    const std::byte* p = base_ + position_;
    position_ += n;
    return p;
  }

  template <typename T, typename What>
  T read(const What& what) {
    return load_le<T>(take(sizeof(T), what));
  }

  /// A GGUF string: its u64 length, then its bytes.
  /// Throws: ValueError for a length above 1 GiB; IoError as take().
  template <typename What>
  std::string_view read_string(const What& what) {
    const auto length =
        read<std::uint64_t>([&] { return fmt::format("the length of {}", what()); });
    NUMESH_CHECK(length <= kMaxStringBytes, ValueError,
                 "{}: {} is {} bytes long, above GGUF's limit of 1 GiB ({} bytes)", where_, what(),
                 length, kMaxStringBytes);
    const std::byte* p = take(length, what);
    return {reinterpret_cast<const char*>(p), static_cast<std::size_t>(length)};
  }

 private:
  const std::byte* base_;
  std::uint64_t size_;
  std::uint64_t position_ = 0;
  const std::string& where_;
};

/// "50 4B 03 04 ('PK??')": the first four bytes, in hex and as text.
std::string magic_text(const std::byte* p) {
  std::string hex;
  std::string text;
  for (int i = 0; i < 4; ++i) {
    const auto c = std::to_integer<unsigned char>(p[i]);
    hex += fmt::format("{}{:02X}", i == 0 ? "" : " ", c);
    text += c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
  }
  return fmt::format("{} ('{}')", hex, text);
}

/// Copies the box of a block-format tensor whose columns cut its blocks: each row's covering
/// blocks dequantized to fp32, then the columns asked for converted to `to`.
/// REQUIRES: rank >= 1; the box inside the shape with no zero size; its rows whole blocks of
/// `to`.
void copy_box_cutting_blocks(const std::byte* src, DType from, std::span<const std::int64_t> shape,
                             std::span<const std::int64_t> offsets,
                             std::span<const std::int64_t> sizes, std::byte* dst, DType to) {
  const std::size_t last = shape.size() - 1;
  const std::int64_t block = traits(from).block_elements;
  const std::int64_t begin = offsets[last] / block * block;
  const std::int64_t end = (offsets[last] + sizes[last] + block - 1) / block * block;
  std::vector<float> covering(static_cast<std::size_t>(end - begin));
  const auto src_row = static_cast<std::size_t>(row_bytes(from, shape[last]));
  const auto skip = static_cast<std::size_t>(row_bytes(from, begin));
  const auto dst_row = static_cast<std::size_t>(row_bytes(to, sizes[last]));
  const auto first = static_cast<std::size_t>(offsets[last] - begin);
  const auto width = static_cast<std::size_t>(sizes[last]);

  std::int64_t rows = 1;
  for (std::size_t d = 0; d < last; ++d) rows *= sizes[d];
  std::vector<std::int64_t> index(last, 0);  // the row's position in the box, outer dims
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t source_row = 0;
    for (std::size_t d = 0; d < last; ++d)
      source_row = source_row * shape[d] + offsets[d] + index[d];
    runtime::convert_elements(src + static_cast<std::size_t>(source_row) * src_row + skip, from,
                              covering.data(), DType::kF32, covering.size());
    runtime::convert_elements(covering.data() + first, DType::kF32,
                              dst + static_cast<std::size_t>(r) * dst_row, to, width);
    for (std::size_t d = last; d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

std::string_view to_string(GgufType type) noexcept { return type_entry(type).name; }

std::optional<GgufType> find_gguf_type(std::uint32_t id) noexcept {
  if (id >= kTypeIdEnd || kTypeIndex[id] < 0) return std::nullopt;
  return static_cast<GgufType>(id);
}

std::int64_t block_elements(GgufType type) noexcept { return type_entry(type).block_elements; }

std::int64_t block_bytes(GgufType type) noexcept { return type_entry(type).block_bytes; }

std::optional<DType> to_numesh_dtype(GgufType type) noexcept {
  for (const DTypeTraits& f : numesh::kDTypes) {
    if (f.ggml_type == static_cast<std::uint32_t>(type)) return f.dtype;
  }
  return std::nullopt;
}

std::optional<GgufType> to_gguf_type(DType dtype) noexcept {
  return static_cast<GgufType>(traits(dtype).ggml_type);
}

std::string gguf_types_numesh_reads() {
  std::string text;
  for (std::size_t i = 0; i < numesh::kDTypes.size(); ++i) {
    if (i > 0) text += i + 1 == numesh::kDTypes.size() ? " and " : ", ";
    text += to_string(static_cast<GgufType>(numesh::kDTypes[i].ggml_type));
  }
  return text;
}

std::string_view to_string(GgufValueType type) noexcept {
  return kValueTypes[static_cast<std::size_t>(type)].name;
}

GgufValue::Element GgufValue::at(std::size_t i) const noexcept {
  const std::byte* p = numbers_ + i * kValueTypes[static_cast<std::size_t>(element_type_)].size;
  switch (element_type_) {
    case GgufValueType::kUint8:
      return std::uint64_t{load_le<std::uint8_t>(p)};
    case GgufValueType::kInt8:
      return std::int64_t{load_le<std::int8_t>(p)};
    case GgufValueType::kUint16:
      return std::uint64_t{load_le<std::uint16_t>(p)};
    case GgufValueType::kInt16:
      return std::int64_t{load_le<std::int16_t>(p)};
    case GgufValueType::kUint32:
      return std::uint64_t{load_le<std::uint32_t>(p)};
    case GgufValueType::kInt32:
      return std::int64_t{load_le<std::int32_t>(p)};
    case GgufValueType::kUint64:
      return load_le<std::uint64_t>(p);
    case GgufValueType::kInt64:
      return load_le<std::int64_t>(p);
    case GgufValueType::kFloat32:
      return double{load_le<float>(p)};
    case GgufValueType::kFloat64:
      return load_le<double>(p);
    case GgufValueType::kBool:
      return load_le<std::uint8_t>(p) != 0;
    case GgufValueType::kString:
      return strings_[i];
    case GgufValueType::kArray:
      break;  // never an element type
  }
  return std::uint64_t{0};
}

std::int64_t GgufTensorInfo::num_elements() const noexcept {
  // An extent of 0 first: open() checks the product for overflow only when none is 0.
  if (std::find(ne.begin(), ne.end(), std::int64_t{0}) != ne.end()) return 0;
  std::int64_t n = 1;
  for (const std::int64_t e : ne) n *= e;
  return n;
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

std::shared_ptr<const std::byte> GgufFile::box_in_place(std::string_view name,
                                                        std::span<const std::int64_t> offsets,
                                                        std::span<const std::int64_t> sizes,
                                                        DType target) const {
  const GgufTensorInfo& t = info(name);
  return detail::box_in_place(mapping_, mapping_.get() + data_offset_ + t.offset,
                              to_numesh_dtype(t.type), t.shape, offsets, sizes, target);
}
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const fs::path& file) {
  const std::string where = fmt::format("gguf: cannot open '{}'", file.string());
  const detail::FileMapping mapped = detail::map_file(
      file, where, kFixedHeaderBytes,
      "the 24 of GGUF's fixed header (magic, version, tensor count, key-value count)");
  const std::uint64_t file_size = mapped.size;
  GgufFile out;
  out.path_ = file;
  out.mapping_ = mapped.address;
  out.file_ = mapped.file;
  GgufCursor r(out.mapping_.get(), file_size, where);

  // The fixed header (its 24 bytes are there).
  const std::byte* magic = r.take(4, [] { return std::string("the magic"); });
  NUMESH_CHECK(std::memcmp(magic, "GGUF", 4) == 0, ValueError,
               "{}: it starts with {}, not the magic 'GGUF' (47 47 55 46): it is not a GGUF file",
               where, magic_text(magic));
  const auto version = r.read<std::uint32_t>([] { return std::string("the version"); });
  NUMESH_CHECK(version != 0, ValueError,
               "{}: version 0 is not a GGUF version (numesh reads versions 2 and 3)", where);
  // GGML's test: the versions are small, so a version with its low 16 bits zero is a small one
  // read in the other byte order (3 is 0x03000000).
  NUMESH_CHECK((version & 0xFFFFu) != 0, ValueError,
               "{}: version {} (0x{:08X}) is far too large: the file is likely big-endian (version "
               "{} in the other byte order), which numesh does not read",
               where, version, version, __builtin_bswap32(version));
  NUMESH_CHECK(version != 1, ValueError,
               "{}: version 1 (GGUFv1) is no longer supported, as in GGML; numesh reads versions 2 "
               "and 3: convert the model again with a current llama.cpp",
               where);
  NUMESH_CHECK(version <= 3, ValueError,
               "{}: version {} is newer than numesh reads (versions 2 and 3)", where, version);
  out.version_ = version;
  const auto n_tensors = r.read<std::uint64_t>([] { return std::string("the tensor count"); });
  const auto n_kv = r.read<std::uint64_t>([] { return std::string("the key-value count"); });
  // GGML bounds the counts by what it could allocate; numesh by what the file can hold, so
  // that a corrupt count fails here and not after reserving memory for it.
  const std::uint64_t rest = r.remaining();
  NUMESH_CHECK(n_tensors <= rest / kMinTensorInfoBytes, IoError,
               "{}: file ends early: it declares {} tensors, whose infos take at least {} bytes "
               "each, but {} bytes follow the 24-byte fixed header",
               where, n_tensors, kMinTensorInfoBytes, rest);
  NUMESH_CHECK(n_kv <= (rest - n_tensors * kMinTensorInfoBytes) / kMinKeyValueBytes, IoError,
               "{}: file ends early: it declares {} key-value pairs, which take at least {} bytes "
               "each, and {} tensors, whose infos take at least {}, but {} bytes follow the "
               "24-byte fixed header",
               where, n_kv, kMinKeyValueBytes, n_tensors, kMinTensorInfoBytes, rest);

  // The key-value pairs.
  out.keys_.reserve(static_cast<std::size_t>(n_kv));
  out.values_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string_view key = r.read_string([&] { return fmt::format("key {}", i); });
    NUMESH_CHECK(!key.empty(), ValueError, "{}: key {} is empty", where, i);
    const auto [slot, fresh] = out.key_index_.emplace(std::string(key), out.keys_.size());
    NUMESH_CHECK(fresh, ValueError, "{}: key '{}' appears twice (key-value pairs {} and {})", where,
                 excerpt(key), slot->second, i);
    const auto name = [&] { return excerpt(key); };

    GgufValue value;
    const auto type_id =
        r.read<std::uint32_t>([&] { return fmt::format("the value type of key '{}'", name()); });
    NUMESH_CHECK(type_id < kValueTypes.size(), ValueError,
                 "{}: key '{}' has value type {}, which is not a GGUF value type (0 to 12)", where,
                 name(), type_id);
    auto type = static_cast<GgufValueType>(type_id);
    std::uint64_t count = 1;
    if (type == GgufValueType::kArray) {
      value.array_ = true;
      const auto element_id = r.read<std::uint32_t>(
          [&] { return fmt::format("the element type of key '{}'", name()); });
      NUMESH_CHECK(element_id != static_cast<std::uint32_t>(GgufValueType::kArray), ValueError,
                   "{}: key '{}' is an array of arrays, which GGUF does not allow", where, name());
      NUMESH_CHECK(element_id < kValueTypes.size(), ValueError,
                   "{}: key '{}' is an array of value type {}, which is not a GGUF value type (0 "
                   "to 12)",
                   where, name(), element_id);
      type = static_cast<GgufValueType>(element_id);
      count = r.read<std::uint64_t>(
          [&] { return fmt::format("the element count of key '{}'", name()); });
      NUMESH_CHECK(count <= kMaxArrayElements, ValueError,
                   "{}: key '{}' is an array of {} elements, above GGUF's limit of 2^30 ({})",
                   where, name(), count, kMaxArrayElements);
    }
    value.element_type_ = type;
    value.count_ = static_cast<std::size_t>(count);
    if (type == GgufValueType::kString) {
      if (value.array_) {
        // Each string takes at least its 8-byte length: checked before reserving.
        NUMESH_CHECK(count <= r.remaining() / 8, IoError,
                     "{}: file ends early: the array of key '{}' ({} STRING elements) needs at "
                     "least {} bytes at byte {} but the file has {}",
                     where, name(), count, count * 8, r.position(), file_size);
        value.strings_.reserve(value.count_);
        for (std::uint64_t j = 0; j < count; ++j) {
          value.strings_.push_back(
              r.read_string([&] { return fmt::format("element {} of key '{}'", j, name()); }));
        }
      } else {
        value.strings_.push_back(
            r.read_string([&] { return fmt::format("the value of key '{}'", name()); }));
      }
    } else {
      const std::uint64_t element_bytes = kValueTypes[static_cast<std::size_t>(type)].size;
      value.numbers_ = r.take(count * element_bytes, [&] {
        return value.array_ ? fmt::format("the array of key '{}' ({} {} elements)", name(), count,
                                          to_string(type))
                            : fmt::format("the {} value of key '{}'", to_string(type), name());
      });
    }
    out.keys_.emplace_back(key);
    out.values_.push_back(std::move(value));
  }

  if (const GgufValue* alignment = out.find(kAlignmentKey)) {
    NUMESH_CHECK(!alignment->is_array() && alignment->element_type() == GgufValueType::kUint32,
                 ValueError, "{}: key '{}' is {}; it must be UINT32", where, kAlignmentKey,
                 value_text(*alignment));
    const auto a = static_cast<std::uint32_t>(std::get<std::uint64_t>(alignment->at(0)));
    NUMESH_CHECK(std::has_single_bit(a), ValueError, "{}: {} is {}, not a power of two", where,
                 kAlignmentKey, a);
    out.alignment_ = a;
  }

  // The tensor infos.
  out.tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    const std::string_view name =
        r.read_string([&] { return fmt::format("the name of tensor {}", i); });
    // GGML takes an empty name; numesh looks tensors up by name, and no writer makes one.
    NUMESH_CHECK(!name.empty(), ValueError, "{}: tensor {} has an empty name", where, i);
    NUMESH_CHECK(name.size() < kMaxNameBytes, ValueError,
                 "{}: the name of tensor {}, '{}', is {} bytes long; GGML's names have at most 63 "
                 "(GGML_MAX_NAME is 64 with the terminating NUL)",
                 where, i, excerpt(name), name.size());
    const auto [slot, fresh] = out.tensor_index_.emplace(std::string(name), out.tensors_.size());
    NUMESH_CHECK(fresh, ValueError, "{}: tensor name '{}' appears twice (tensors {} and {})", where,
                 name, slot->second, i);

    GgufTensorInfo t;
    t.name = name;
    const auto n_dims = r.read<std::uint32_t>(
        [&] { return fmt::format("the dimension count of tensor '{}'", name); });
    NUMESH_CHECK(n_dims <= kMaxDims, ValueError,
                 "{}: tensor '{}' has {} dimensions; GGML tensors have at most 4", where, name,
                 n_dims);
    for (std::uint32_t j = 0; j < n_dims; ++j) {
      const auto e =
          r.read<std::int64_t>([&] { return fmt::format("ne[{}] of tensor '{}'", j, name); });
      NUMESH_CHECK(e >= 0, ValueError, "{}: tensor '{}' has ne[{}] = {}, a negative extent", where,
                   name, j, e);
      t.ne.push_back(e);
    }
    // A tensor with an extent 0 has no elements, whatever the others (GGML's rule too).
    std::int64_t elements = 1;
    if (std::find(t.ne.begin(), t.ne.end(), 0) != t.ne.end()) {
      elements = 0;
    } else {
      for (const std::int64_t e : t.ne) {
        NUMESH_CHECK(!__builtin_mul_overflow(elements, e, &elements), ValueError,
                     "{}: tensor '{}' has ne {}: its element count overflows 64-bit integers",
                     where, name, dims_text(t.ne));
      }
    }

    const auto type_id =
        r.read<std::uint32_t>([&] { return fmt::format("the type of tensor '{}'", name); });
    const std::optional<GgufType> type = find_gguf_type(type_id);
    if (!type) {
      for (const auto& [id, removed] : kRemovedTypes) {
        NUMESH_CHECK(id != type_id, ValueError,
                     "{}: tensor '{}' has type {} ({}), which GGML removed: GGUF files may no "
                     "longer hold it",
                     where, name, type_id, removed);
      }
      throw ValueError(fmt::format(
          "{}: tensor '{}' has type {}, which is not a GGML type (GGML's types have ids 0 to {})",
          where, name, type_id, kTypeIdEnd - 1));
    }
    t.type = *type;
    const std::int64_t block = block_elements(t.type);
    const std::int64_t row = t.ne.empty() ? 1 : t.ne[0];
    NUMESH_CHECK(row % block == 0, ValueError,
                 "{}: tensor '{}' of type {} has rows of {} elements (ne[0]), not a whole number "
                 "of its {}-element blocks",
                 where, name, to_string(t.type), row, block);
    const auto blocks = static_cast<std::uint64_t>(elements / block);
    const auto bytes_per_block = static_cast<std::uint64_t>(block_bytes(t.type));
    NUMESH_CHECK(blocks <= std::numeric_limits<std::uint64_t>::max() / bytes_per_block, ValueError,
                 "{}: tensor '{}' of type {} and ne {} takes more than 2^64 bytes", where, name,
                 to_string(t.type), dims_text(t.ne));
    t.size_bytes = blocks * bytes_per_block;
    t.offset =
        r.read<std::uint64_t>([&] { return fmt::format("the offset of tensor '{}'", name); });
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    out.tensors_.push_back(std::move(t));
  }

  // The data section: after the infos, padded to the alignment when there are tensors (GGML
  // seeks there only then).
  std::uint64_t data = r.position();
  if (n_tensors > 0) {
    const std::uint64_t padded = round_up(data, out.alignment_);
    NUMESH_CHECK(padded <= file_size, IoError,
                 "{}: file ends early: the data section starts at byte {} (the end of the tensor "
                 "infos, byte {}, padded to the alignment {}) but the file has {} bytes",
                 where, padded, data, out.alignment_, file_size);
    data = padded;
  }
  out.data_offset_ = data;

  // Each tensor where the ones before it end, padded (GGML's rule), and inside the file.
  const std::uint64_t data_size = file_size - data;
  std::uint64_t expected = 0;
  const GgufTensorInfo* previous = nullptr;  // the last tensor before this one with bytes
  for (const GgufTensorInfo& t : out.tensors_) {
    if (t.offset != expected) {
      NUMESH_CHECK(t.offset % out.alignment_ == 0, ValueError,
                   "{}: tensor '{}' has offset {}, not a multiple of the alignment {} (expected "
                   "{}: {})",
                   where, t.name, t.offset, out.alignment_, expected, kLayoutRule);
      if (t.offset < expected) {
        NUMESH_DCHECK(previous != nullptr);
        throw ValueError(fmt::format(
            "{}: tensor '{}' has offset {}, inside the bytes of the tensors before it, which end "
            "at {} with tensor '{}' (padded to the alignment): it would overlap them (expected "
            "{}: {})",
            where, t.name, t.offset, expected, previous->name, expected, kLayoutRule));
      }
      throw ValueError(fmt::format(
          "{}: tensor '{}' has offset {}, but {}: bytes [{}, {}) of the data section would belong "
          "to no tensor ({})",
          where, t.name, t.offset,
          &t == out.tensors_.data()
              ? std::string("it is the first tensor, at offset 0")
              : fmt::format("the tensors before it end at {} (padded to the alignment)", expected),
          expected, t.offset, kLayoutRule));
    }
    NUMESH_CHECK(t.offset <= data_size && t.size_bytes <= data_size - t.offset, IoError,
                 "{}: file ends early: tensor '{}' takes {} bytes from byte {} (offset {} in the "
                 "data section, which starts at byte {}) but the file has {} bytes",
                 where, t.name, t.size_bytes, data + t.offset, t.offset, data, file_size);
    expected += round_up(t.size_bytes, out.alignment_);
    if (t.size_bytes > 0) previous = &t;
  }
  return out;
}

std::vector<std::string> GgufFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

bool GgufFile::contains(std::string_view name) const noexcept {
  return tensor_index_.find(name) != tensor_index_.end();
}

const GgufTensorInfo& GgufFile::info(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    const std::vector<std::string> all = names();
    throw KeyError(std::string(name), fmt::format("gguf: '{}' has no tensor '{}'{}", path_.string(),
                                                  name, detail::closest_names_hint(name, all)));
  }
  return tensors_[it->second];
}

std::span<const std::byte> GgufFile::bytes(std::string_view name) const {
  const GgufTensorInfo& t = info(name);
  return {mapping_.get() + data_offset_ + t.offset, static_cast<std::size_t>(t.size_bytes)};
}

const GgufValue* GgufFile::find(std::string_view key) const noexcept {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &values_[it->second];
}

namespace {

std::string getter_where(std::string_view key, const fs::path& file) {
  return fmt::format("gguf: cannot read key '{}' of '{}'", key, file.string());
}

constexpr auto kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// An integer element as int64, or nullopt for a UINT64 above 2^63 - 1.
std::optional<std::int64_t> as_int64(const GgufValue::Element& e) noexcept {
  if (const auto* u = std::get_if<std::uint64_t>(&e)) {
    if (*u > kInt64Max) return std::nullopt;
    return static_cast<std::int64_t>(*u);
  }
  return std::get<std::int64_t>(e);
}

/// A number element (integer or float) as double.
double to_double(const GgufValue::Element& e) noexcept {
  if (const auto* u = std::get_if<std::uint64_t>(&e)) return static_cast<double>(*u);
  if (const auto* s = std::get_if<std::int64_t>(&e)) return static_cast<double>(*s);
  return std::get<double>(e);
}

}  // namespace

std::optional<std::int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const std::string where = getter_where(key, path_);
  NUMESH_CHECK(!v->is_array() && is_integer_type(v->element_type()), ValueError,
               "{}: it is {}, not an integer", where, value_text(*v));
  const GgufValue::Element e = v->at(0);
  const std::optional<std::int64_t> value = as_int64(e);
  NUMESH_CHECK(value.has_value(), ValueError,
               "{}: its value {} (UINT64) is above 2^63 - 1, the largest integer numesh reads",
               where, std::get<std::uint64_t>(e));
  return value;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  NUMESH_CHECK(!v->is_array() && is_numeric_type(v->element_type()), ValueError,
               "{}: it is {}, not a number (FLOAT32, FLOAT64 or an integer)",
               getter_where(key, path_), value_text(*v));
  return to_double(v->at(0));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  NUMESH_CHECK(!v->is_array() && v->element_type() == GgufValueType::kBool, ValueError,
               "{}: it is {}, not BOOL", getter_where(key, path_), value_text(*v));
  return std::get<bool>(v->at(0));
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  NUMESH_CHECK(!v->is_array() && v->element_type() == GgufValueType::kString, ValueError,
               "{}: it is {}, not STRING", getter_where(key, path_), value_text(*v));
  return std::string(v->strings_[0]);
}

std::optional<std::vector<std::string>> GgufFile::get_strings(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  NUMESH_CHECK(v->is_array() && v->element_type() == GgufValueType::kString, ValueError,
               "{}: it is {}, not an ARRAY of STRING", getter_where(key, path_), value_text(*v));
  return std::vector<std::string>(v->strings_.begin(), v->strings_.end());
}

std::optional<std::vector<float>> GgufFile::get_floats(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  NUMESH_CHECK(v->is_array() && is_numeric_type(v->element_type()), ValueError,
               "{}: it is {}, not an ARRAY of numbers (FLOAT32, FLOAT64 or integers)",
               getter_where(key, path_), value_text(*v));
  std::vector<float> out(v->size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(to_double(v->at(i)));
  return out;
}

std::optional<std::vector<std::int64_t>> GgufFile::get_ints(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const std::string where = getter_where(key, path_);
  NUMESH_CHECK(v->is_array() && is_integer_type(v->element_type()), ValueError,
               "{}: it is {}, not an ARRAY of integers", where, value_text(*v));
  std::vector<std::int64_t> out(v->size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const GgufValue::Element e = v->at(i);
    const std::optional<std::int64_t> value = as_int64(e);
    NUMESH_CHECK(value.has_value(), ValueError,
                 "{}: its element {}, {} (UINT64), is above 2^63 - 1, the largest integer numesh "
                 "reads",
                 where, i, std::get<std::uint64_t>(e));
    out[i] = *value;
  }
  return out;
}

void GgufFile::read(std::string_view name, DType target, std::span<std::byte> out) const {
  const GgufTensorInfo& t = info(name);
  const std::vector<std::int64_t> origin(t.shape.size(), 0);
  read_box(name, origin, t.shape, target, out);
}

void GgufFile::read_box(std::string_view name, std::span<const std::int64_t> offsets,
                        std::span<const std::int64_t> sizes, DType target,
                        std::span<std::byte> out) const {
  const GgufTensorInfo& t = info(name);
  const std::string where =
      fmt::format("gguf: cannot read tensor '{}' of '{}'", name, path_.string());
  const std::optional<DType> stored = to_numesh_dtype(t.type);
  NUMESH_CHECK(stored.has_value(), ValueError, "{}: its type is {}; numesh reads only {} tensors",
               where, to_string(t.type), gguf_types_numesh_reads());
  const std::size_t rank = t.shape.size();
  const std::uint64_t elements =
      detail::check_box(where, t.shape, offsets, sizes, target, out.size());
  if (elements == 0) return;
  const DTypeTraits& format = traits(target);

  // One run of the file as it is: read, not copied out of the mapping (file_mapping.hpp).
  if (detail::read_one_run(*file_, data_offset_ + t.offset, stored, t.shape, offsets, sizes, target,
                           out, where))
    return;
  const std::byte* src = mapping_.get() + data_offset_ + t.offset;
  const std::int64_t block = traits(*stored).block_elements;
  // A block format's box whose columns cut its blocks cannot be converted block by block.
  const bool cuts_blocks =
      rank > 0 && (offsets[rank - 1] % block != 0 || sizes[rank - 1] % block != 0);
  try {
    if (cuts_blocks) {
      copy_box_cutting_blocks(src, *stored, t.shape, offsets, sizes, out.data(), target);
    } else {
      detail::copy_box(src, *stored, t.shape, offsets, sizes, out.data(), target);
    }
  } catch (const ValueError& e) {
    // A value the target cannot hold (a non-finite weight quantized to blocks): name the tensor.
    throw ValueError(fmt::format("{} as {} (box at offsets {}): {}", where, format.name,
                                 dims_text(offsets), e.what()));
  }
}

}  // namespace numesh::models
