#include "numesh/models/formats/safetensors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>
#include <system_error>
#include <tuple>
#include <utility>

#include "../box_copy.hpp"
#include "../closest_names.hpp"
#include "../strict_json.hpp"
#include "box_in_place.hpp"
#include "file_mapping.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// The rules are those of the official reader, huggingface/safetensors (Rust crate, read at commit
// 24b0b28, safetensors/src/tensor.rs: SafeTensors::read_metadata and Metadata::validate), and the
// format description in its README; where numesh differs it says so below and in docs/models.md.

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using detail::Json;
using detail::json_excerpt;

constexpr std::size_t kLengthBytes = 8;  // the u64 header length N
// The Rust crate's MAX_HEADER_SIZE: larger headers are refused before anything is allocated. A
// header is ~150 bytes per tensor, so this is room for hundreds of thousands of tensors.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeName {
  SafetensorsDType dtype;
  std::string_view name;
  int bits;
};

// Every dtype of the Rust crate's `enum Dtype` (same commit), with Dtype::bitsize().
constexpr std::array<DTypeName, 22> kDTypes{{
    {SafetensorsDType::kBool, "BOOL", 8},
    {SafetensorsDType::kU8, "U8", 8},
    {SafetensorsDType::kI8, "I8", 8},
    {SafetensorsDType::kI16, "I16", 16},
    {SafetensorsDType::kU16, "U16", 16},
    {SafetensorsDType::kF16, "F16", 16},
    {SafetensorsDType::kBF16, "BF16", 16},
    {SafetensorsDType::kI32, "I32", 32},
    {SafetensorsDType::kU32, "U32", 32},
    {SafetensorsDType::kF32, "F32", 32},
    {SafetensorsDType::kF64, "F64", 64},
    {SafetensorsDType::kI64, "I64", 64},
    {SafetensorsDType::kU64, "U64", 64},
    {SafetensorsDType::kC64, "C64", 64},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 8},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 8},
    {SafetensorsDType::kF8E8M0, "F8_E8M0", 8},
    {SafetensorsDType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {SafetensorsDType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {SafetensorsDType::kF4, "F4", 4},
    {SafetensorsDType::kF6E2M3, "F6_E2M3", 6},
    {SafetensorsDType::kF6E3M2, "F6_E3M2", 6},
}};

// entry() indexes the table by the enum's value.
constexpr bool table_follows_enum() {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_follows_enum(), "kDTypes must list SafetensorsDType in enum order");

const DTypeName& entry(SafetensorsDType dtype) noexcept {
  return kDTypes[static_cast<std::size_t>(dtype)];
}

std::string shape_text(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string offsets_text(const TensorInfo& t) { return fmt::format("[{}, {}]", t.begin, t.end); }

std::uint64_t read_u64_le(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = kLengthBytes; i-- > 0;) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

/// An unsigned JSON integer, or nullopt for anything else (negative, fractional, a string...).
std::optional<std::uint64_t> as_unsigned(const Json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<std::uint64_t>();
}

/// The validated fields of one header entry.
TensorInfo parse_entry(const std::string& name, const Json& entry, const std::string& where) {
  NUMESH_CHECK(entry.is_object(), ValueError,
               "{}: the entry of tensor '{}' is {}, not an object with dtype, shape and "
               "data_offsets",
               where, name, json_excerpt(entry));
  for (const auto& [key, value] : entry.items()) {
    // The Rust crate (serde's default) ignores unknown keys; numesh refuses them, since a key it
    // does not know may change what the bytes mean (a stride, a quantization scale).
    NUMESH_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", ValueError,
                 "{}: the entry of tensor '{}' has an unknown key '{}' (an entry has exactly "
                 "dtype, shape and data_offsets)",
                 where, name, key);
  }
  for (const std::string_view key : {"dtype", "shape", "data_offsets"}) {
    NUMESH_CHECK(entry.contains(key), ValueError, "{}: the entry of tensor '{}' has no {}", where,
                 name, key);
  }

  TensorInfo t;
  t.name = name;

  const Json& dtype = entry["dtype"];
  NUMESH_CHECK(dtype.is_string(), ValueError, "{}: dtype {} of tensor '{}' is not a string", where,
               json_excerpt(dtype), name);
  const auto found = find_safetensors_dtype(dtype.get_ref<const std::string&>());
  if (!found) {
    std::vector<std::string_view> known;
    for (const DTypeName& d : kDTypes) known.push_back(d.name);
    throw ValueError(fmt::format("{}: dtype '{}' of tensor '{}' is not a safetensors dtype ({})",
                                 where, dtype.get_ref<const std::string&>(), name,
                                 fmt::join(known, ", ")));
  }
  t.dtype = *found;

  const Json& shape = entry["shape"];
  NUMESH_CHECK(shape.is_array(), ValueError,
               "{}: shape {} of tensor '{}' is not an array of non-negative integers", where,
               json_excerpt(shape), name);
  for (const Json& extent : shape) {
    const auto e = as_unsigned(extent);
    NUMESH_CHECK(e.has_value(), ValueError,
                 "{}: shape {} of tensor '{}' has the entry {}, which is not a non-negative "
                 "integer",
                 where, json_excerpt(shape), name, json_excerpt(extent));
    // numesh's shapes are int64 (runtime::HostTensor, Tensor); the crate's are usize.
    NUMESH_CHECK(*e <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                 ValueError, "{}: shape {} of tensor '{}' has the entry {}, larger than 2^63 - 1",
                 where, json_excerpt(shape), name, *e);
    t.shape.push_back(static_cast<std::int64_t>(*e));
  }

  const Json& offsets = entry["data_offsets"];
  const bool pair = offsets.is_array() && offsets.size() == 2 && as_unsigned(offsets[0]) &&
                    as_unsigned(offsets[1]);
  NUMESH_CHECK(pair, ValueError,
               "{}: data_offsets {} of tensor '{}' are not two non-negative integers [begin, end]",
               where, json_excerpt(offsets), name);
  t.begin = offsets[0].get<std::uint64_t>();
  t.end = offsets[1].get<std::uint64_t>();
  NUMESH_CHECK(t.begin <= t.end, ValueError,
               "{}: data_offsets {} of tensor '{}' end before they begin", where, offsets_text(t),
               name);

  // The size rule as the crate computes it: the element count multiplied out dim by dim, then
  // by the dtype's bits, every step checked for overflow (so [2^40, 2^40, 0] is refused even
  // though it has no elements), and the bits a whole number of bytes.
  constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const std::int64_t e : t.shape) {
    const auto u = static_cast<std::uint64_t>(e);
    if (u != 0 && elements > kMax / u) {
      overflow = true;
      break;
    }
    elements *= u;
  }
  const auto bits = static_cast<std::uint64_t>(bit_size(t.dtype));
  overflow = overflow || elements > kMax / bits;
  NUMESH_CHECK(!overflow, ValueError,
               "{}: shape {} of tensor '{}' is too large: its size overflows 64 bits", where,
               shape_text(t.shape), name);
  NUMESH_CHECK(elements * bits % 8 == 0, ValueError,
               "{}: tensor '{}' of dtype {} and shape {} has {} bits, not a whole number of bytes",
               where, name, to_string(t.dtype), shape_text(t.shape), elements * bits);
  const std::uint64_t size = elements * bits / 8;
  NUMESH_CHECK(size == t.size_bytes(), ValueError,
               "{}: tensor '{}' of dtype {} and shape {} needs {} bytes but its data_offsets {} "
               "hold {}",
               where, name, to_string(t.dtype), shape_text(t.shape), size, offsets_text(t),
               t.size_bytes());
  return t;
}

std::map<std::string, std::string> parse_metadata(const Json& metadata, const std::string& where) {
  NUMESH_CHECK(metadata.is_object(), ValueError, "{}: __metadata__ is {}, not an object of strings",
               where, json_excerpt(metadata));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    NUMESH_CHECK(value.is_string(), ValueError, "{}: __metadata__ entry '{}' is {}, not a string",
                 where, key, json_excerpt(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

/// Checks that the spans, sorted by offset, tile the buffer [0, buffer_size) exactly.
/// REQUIRES: `tensors` sorted by (begin, end, name); every end <= buffer_size.
void check_layout(const std::vector<TensorInfo>& tensors, std::uint64_t buffer_size,
                  const std::string& where) {
  // The Rust crate requires each tensor, in offset order, to begin exactly where the previous
  // one ended (from 0), and the last to end at the end of the file: no overlap, no hole, no
  // trailing bytes ("This prevents the creation of polyglot files", README). numesh follows it,
  // with messages that tell an overlap from a gap.
  std::uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;  // the tensor whose bytes end at `cursor`
  for (const TensorInfo& t : tensors) {
    if (t.begin < cursor) {
      NUMESH_DCHECK(previous != nullptr);
      if (t.size_bytes() == 0) {
        throw ValueError(fmt::format(
            "{}: data_offsets {} of tensor '{}' lie inside tensor '{}' (data_offsets {}); the "
            "tensors must follow each other in the buffer",
            where, offsets_text(t), t.name, previous->name, offsets_text(*previous)));
      }
      throw ValueError(
          fmt::format("{}: data_offsets {} of tensor '{}' overlap tensor '{}' "
                      "(data_offsets {})",
                      where, offsets_text(t), t.name, previous->name, offsets_text(*previous)));
    }
    if (t.begin > cursor) {
      throw ValueError(fmt::format(
          "{}: bytes [{}, {}) of the data buffer belong to no tensor ({} tensor '{}'); the "
          "tensors must cover the buffer without gaps",
          where, cursor, t.begin,
          previous == nullptr ? "before" : "between tensor '" + previous->name + "' and", t.name));
    }
    if (t.size_bytes() > 0) {
      cursor = t.end;
      previous = &t;
    }
  }
  if (cursor != buffer_size) {
    throw ValueError(fmt::format(
        "{}: bytes [{}, {}) of the data buffer belong to no tensor ({}); the tensors must cover "
        "the buffer to its end",
        where, cursor, buffer_size,
        previous == nullptr ? std::string(tensors.empty() ? "the header lists no tensors"
                                                          : "the tensors hold no bytes")
                            : "after tensor '" + previous->name + "'"));
  }
}

}  // namespace

std::string_view to_string(SafetensorsDType dtype) noexcept { return entry(dtype).name; }

std::optional<SafetensorsDType> find_safetensors_dtype(std::string_view name) noexcept {
  for (const DTypeName& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

int bit_size(SafetensorsDType dtype) noexcept { return entry(dtype).bits; }

std::optional<DType> to_numesh_dtype(SafetensorsDType dtype) noexcept {
  switch (dtype) {
    case SafetensorsDType::kF32:
      return DType::kF32;
    case SafetensorsDType::kBF16:
      return DType::kBF16;
    case SafetensorsDType::kF16:
      return DType::kF16;
    default:
      return std::nullopt;
  }
}

std::int64_t TensorInfo::num_elements() const noexcept {
  std::int64_t n = 1;
  for (const std::int64_t e : shape) n *= e;
  return n;
}

std::shared_ptr<const std::byte> SafetensorsFile::box_in_place(
    std::string_view name, std::span<const std::int64_t> offsets,
    std::span<const std::int64_t> sizes, DType target) const {
  const TensorInfo& t = info(name);
  return detail::box_in_place(mapping_, buffer_ + t.begin, to_numesh_dtype(t.dtype), t.shape,
                              offsets, sizes, target);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const fs::path& file) {
  const std::string where = fmt::format("safetensors: cannot open '{}'", file.string());
  const detail::FileMapping mapped =
      detail::map_file(file, where, kLengthBytes, "the 8 of the header length");
  const std::uint64_t file_size = mapped.size;
  SafetensorsFile out;
  out.path_ = file;
  out.mapping_ = mapped.address;
  out.file_ = mapped.file;
  const std::byte* base = out.mapping_.get();

  const std::uint64_t header_size = read_u64_le(base);
  // Checked before the file size, as the crate does: a huge value is a sign of a file that is
  // not safetensors at all (a PyTorch zip starts with "PK\3\4...").
  NUMESH_CHECK(header_size <= kMaxHeaderBytes, ValueError,
               "{}: header length {} is above the limit of {} bytes; the file is corrupt or not a "
               "safetensors file",
               where, header_size, kMaxHeaderBytes);
  NUMESH_CHECK(header_size <= file_size - kLengthBytes, IoError,
               "{}: file ends early: the header length is {} bytes but {} follow it ({} bytes in "
               "all)",
               where, header_size, file_size - kLengthBytes, file_size);
  const std::string_view header(reinterpret_cast<const char*>(base + kLengthBytes),
                                static_cast<std::size_t>(header_size));
  NUMESH_CHECK(header.starts_with('{'), ValueError,
               "{}: the header does not start with '{{' (it must be a JSON object)", where);
  const Json json = detail::parse_strict_json(header, where, "the header");
  NUMESH_DCHECK(json.is_object());  // it starts with '{' and parsed

  const std::uint64_t buffer_size = file_size - kLengthBytes - header_size;
  out.buffer_ = base + kLengthBytes + header_size;
  for (const auto& [name, value] : json.items()) {
    if (name == kMetadataKey) {
      out.metadata_ = parse_metadata(value, where);
      continue;
    }
    TensorInfo t = parse_entry(name, value, where);
    NUMESH_CHECK(t.end <= buffer_size, IoError,
                 "{}: file ends early: tensor '{}' ends at byte {} of the data buffer, which has "
                 "{} bytes (the file has {}, the buffer starts at byte {})",
                 where, name, t.end, buffer_size, file_size, kLengthBytes + header_size);
    out.tensors_.push_back(std::move(t));
  }
  std::sort(out.tensors_.begin(), out.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_layout(out.tensors_, buffer_size, where);
  for (std::size_t i = 0; i < out.tensors_.size(); ++i) out.index_.emplace(out.tensors_[i].name, i);
  return out;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const noexcept {
  return index_.find(name) != index_.end();
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    const std::vector<std::string> all = names();
    throw KeyError(std::string(name),
                   fmt::format("safetensors: '{}' has no tensor '{}'{}", path_.string(), name,
                               detail::closest_names_hint(name, all)));
  }
  return tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo& t = info(name);
  return {buffer_ + t.begin, static_cast<std::size_t>(t.size_bytes())};
}

void SafetensorsFile::read(std::string_view name, DType target, std::span<std::byte> out) const {
  const TensorInfo& t = info(name);
  const std::vector<std::int64_t> origin(t.shape.size(), 0);
  read_box(name, origin, t.shape, target, out);
}

void SafetensorsFile::read_box(std::string_view name, std::span<const std::int64_t> offsets,
                               std::span<const std::int64_t> sizes, DType target,
                               std::span<std::byte> out) const {
  const TensorInfo& t = info(name);
  const std::string where =
      fmt::format("safetensors: cannot read tensor '{}' of '{}'", name, path_.string());
  const std::optional<DType> stored = to_numesh_dtype(t.dtype);
  NUMESH_CHECK(stored.has_value(), ValueError,
               "{}: its dtype is {}; numesh reads only F32, BF16 and F16 tensors", where,
               to_string(t.dtype));
  (void)detail::check_box(where, t.shape, offsets, sizes, target, out.size());
  const DTypeTraits& format = traits(target);
  // One run of the file as it is: read, not copied out of the mapping (file_mapping.hpp).
  if (detail::read_one_run(*file_, static_cast<std::uint64_t>(buffer_ - mapping_.get()) + t.begin,
                           stored, t.shape, offsets, sizes, target, out, where))
    return;
  try {
    detail::copy_box(buffer_ + t.begin, *stored, t.shape, offsets, sizes, out.data(), target);
  } catch (const ValueError& e) {
    // A value the target cannot hold (a non-finite weight quantized to blocks): name the tensor.
    throw ValueError(fmt::format("{} as {} (box at offsets {}): {}", where, format.name,
                                 shape_text(offsets), e.what()));
  }
}

}  // namespace numesh::models
