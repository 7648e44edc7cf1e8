#include "numesh/models/formats/gguf_writer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <variant>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "replace_file.hpp"

namespace numesh::models {

namespace {

template <typename T>
void put(std::string& out, T value) {  // little-endian, as every machine numesh runs on
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  out += s;
}

std::uint64_t padded(std::uint64_t n, std::uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

}  // namespace

GgufWriter::GgufWriter(std::uint32_t alignment) : alignment_(alignment) {
  NUMESH_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, ValueError,
               "gguf: the alignment {} is not a power of two", alignment);
  if (alignment != 32) add_uint32("general.alignment", alignment);
}

void GgufWriter::add_key(std::string key, GgufValueType type, std::string payload) {
  NUMESH_CHECK(!key.empty(), ValueError, "gguf: a metadata key is empty");
  NUMESH_CHECK(std::find(keys_.begin(), keys_.end(), key) == keys_.end(), ValueError,
               "gguf: metadata key '{}' is given twice", key);
  put_string(metadata_, key);
  put<std::uint32_t>(metadata_, static_cast<std::uint32_t>(type));
  metadata_ += payload;
  keys_.push_back(std::move(key));
}

bool GgufWriter::contains(std::string_view key) const noexcept {
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

void GgufWriter::add_uint32(std::string key, std::uint32_t value) {
  std::string p;
  put(p, value);
  add_key(std::move(key), GgufValueType::kUint32, std::move(p));
}

void GgufWriter::add_int32(std::string key, std::int32_t value) {
  std::string p;
  put(p, value);
  add_key(std::move(key), GgufValueType::kInt32, std::move(p));
}

void GgufWriter::add_float32(std::string key, float value) {
  std::string p;
  put(p, value);
  add_key(std::move(key), GgufValueType::kFloat32, std::move(p));
}

void GgufWriter::add_bool(std::string key, bool value) {
  std::string p;
  put<std::uint8_t>(p, value ? 1 : 0);
  add_key(std::move(key), GgufValueType::kBool, std::move(p));
}

void GgufWriter::add_string(std::string key, std::string value) {
  std::string p;
  put_string(p, value);
  add_key(std::move(key), GgufValueType::kString, std::move(p));
}

void GgufWriter::add_strings(std::string key, std::vector<std::string> values) {
  std::string p;
  put<std::uint32_t>(p, static_cast<std::uint32_t>(GgufValueType::kString));
  put<std::uint64_t>(p, values.size());
  for (const std::string& v : values) put_string(p, v);
  add_key(std::move(key), GgufValueType::kArray, std::move(p));
}

void GgufWriter::add_float32s(std::string key, std::vector<float> values) {
  std::string p;
  put<std::uint32_t>(p, static_cast<std::uint32_t>(GgufValueType::kFloat32));
  put<std::uint64_t>(p, values.size());
  for (const float v : values) put(p, v);
  add_key(std::move(key), GgufValueType::kArray, std::move(p));
}

void GgufWriter::add_int32s(std::string key, std::vector<std::int32_t> values) {
  std::string p;
  put<std::uint32_t>(p, static_cast<std::uint32_t>(GgufValueType::kInt32));
  put<std::uint64_t>(p, values.size());
  for (const std::int32_t v : values) put(p, v);
  add_key(std::move(key), GgufValueType::kArray, std::move(p));
}

void GgufWriter::add_value(std::string key, const GgufValue& value) {
  std::string p;
  const GgufValueType type = value.element_type();
  const auto element = [&](const GgufValue::Element& e) {
    switch (type) {
      case GgufValueType::kUint8:
        put(p, static_cast<std::uint8_t>(std::get<std::uint64_t>(e)));
        break;
      case GgufValueType::kUint16:
        put(p, static_cast<std::uint16_t>(std::get<std::uint64_t>(e)));
        break;
      case GgufValueType::kUint32:
        put(p, static_cast<std::uint32_t>(std::get<std::uint64_t>(e)));
        break;
      case GgufValueType::kUint64:
        put(p, std::get<std::uint64_t>(e));
        break;
      case GgufValueType::kInt8:
        put(p, static_cast<std::int8_t>(std::get<std::int64_t>(e)));
        break;
      case GgufValueType::kInt16:
        put(p, static_cast<std::int16_t>(std::get<std::int64_t>(e)));
        break;
      case GgufValueType::kInt32:
        put(p, static_cast<std::int32_t>(std::get<std::int64_t>(e)));
        break;
      case GgufValueType::kInt64:
        put(p, std::get<std::int64_t>(e));
        break;
      case GgufValueType::kFloat32:
        put(p, static_cast<float>(std::get<double>(e)));
        break;
      case GgufValueType::kFloat64:
        put(p, std::get<double>(e));
        break;
      case GgufValueType::kBool:
        put<std::uint8_t>(p, std::get<bool>(e) ? 1 : 0);
        break;
      case GgufValueType::kString:
        put_string(p, std::get<std::string_view>(e));
        break;
      case GgufValueType::kArray:
        break;  // GgufValue never has array elements
    }
  };
  if (!value.is_array()) {
    element(value.at(0));
    add_key(std::move(key), type, std::move(p));
    return;
  }
  put<std::uint32_t>(p, static_cast<std::uint32_t>(type));
  put<std::uint64_t>(p, value.size());
  for (std::size_t i = 0; i < value.size(); ++i) element(value.at(i));
  add_key(std::move(key), GgufValueType::kArray, std::move(p));
}

std::uint64_t GgufWriter::tensor_bytes(std::span<const std::int64_t> shape,
                                       GgufType type) noexcept {
  std::uint64_t elements = 1;
  for (const std::int64_t e : shape) elements *= static_cast<std::uint64_t>(e);
  return elements / static_cast<std::uint64_t>(block_elements(type)) *
         static_cast<std::uint64_t>(block_bytes(type));
}

void GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> shape, GgufType type,
                            Fill fill) {
  NUMESH_CHECK(!name.empty() && name.size() < 64, ValueError,
               "gguf: tensor name '{}' must have 1 to 63 bytes (ggml's GGML_MAX_NAME)", name);
  NUMESH_CHECK(std::none_of(tensors_.begin(), tensors_.end(),
                            [&](const Tensor& t) { return t.name == name; }),
               ValueError, "gguf: tensor '{}' is given twice", name);
  NUMESH_CHECK(!shape.empty() && shape.size() <= 4 &&
                   std::all_of(shape.begin(), shape.end(), [](std::int64_t e) { return e >= 0; }),
               ValueError,
               "gguf: tensor '{}' has shape [{}]; GGUF holds 1 to 4 dims, none negative", name,
               fmt::join(shape, ", "));
  NUMESH_CHECK(shape.back() % block_elements(type) == 0, ValueError,
               "gguf: tensor '{}' has rows of {} elements, not whole blocks of {} ({})", name,
               shape.back(), block_elements(type), to_string(type));
  tensors_.push_back({std::move(name), std::move(shape), type, std::move(fill)});
}

void GgufWriter::write(const std::filesystem::path& file) const {
  std::string header;
  header += "GGUF";
  put<std::uint32_t>(header, 3);
  put<std::uint64_t>(header, tensors_.size());
  put<std::uint64_t>(header, keys_.size());
  header += metadata_;
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(header, t.name);
    put<std::uint32_t>(header, static_cast<std::uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d)
      put<std::uint64_t>(header, static_cast<std::uint64_t>(*d));
    put<std::uint32_t>(header, static_cast<std::uint32_t>(t.type));
    put<std::uint64_t>(header, offset);
    offset += padded(tensor_bytes(t.shape, t.type), alignment_);
  }
  header.resize(padded(header.size(), alignment_), '\0');

  detail::write_replacing(file, "gguf", [&](std::ostream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::vector<std::byte> data;
    for (const Tensor& t : tensors_) {
      const std::uint64_t size = tensor_bytes(t.shape, t.type);
      data.assign(padded(size, alignment_), std::byte{0});
      t.fill(std::span<std::byte>(data.data(), size));
      out.write(reinterpret_cast<const char*>(data.data()),
                static_cast<std::streamsize>(data.size()));
    }
  });
}

}  // namespace numesh::models
