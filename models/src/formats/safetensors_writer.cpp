#include "numesh/models/formats/safetensors_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <span>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/convert.hpp"
#include "replace_file.hpp"

namespace numesh::models {

namespace {

// (Block formats are refused by write_safetensors before these are asked: element types only.)
std::string_view header_dtype(DType d) {
  switch (element_type(d)) {
    case ElementType::kF32:
      return "F32";
    case ElementType::kBF16:
      return "BF16";
    case ElementType::kF16:
      return "F16";
  }
  return "?";
}

// The Rust crate's order of its Dtype enum, by which it sorts tensors (wider types first).
int rust_rank(DType d) {
  switch (element_type(d)) {
    case ElementType::kF32:
      return 17;
    case ElementType::kBF16:
      return 14;
    case ElementType::kF16:
      return 13;
  }
  return 0;
}

std::string stored_bytes(const runtime::HostTensor& t, DType d) {
  std::string out(t.data.size() * dtype_size(d), '\0');
  std::vector<std::uint16_t> bits;
  switch (element_type(d)) {
    case ElementType::kF32:
      std::memcpy(out.data(), t.data.data(), out.size());
      return out;
    case ElementType::kBF16:
      bits.resize(t.data.size());
      runtime::convert_f32_to_bf16(t.data, bits);
      break;
    case ElementType::kF16:
      bits.resize(t.data.size());
      runtime::convert_f32_to_f16(t.data, bits);
      break;
  }
  std::memcpy(out.data(), bits.data(), out.size());
  return out;
}

}  // namespace

void write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const TensorToWrite& t : tensors) {
    NUMESH_CHECK(!t.name.empty() && seen.insert(t.name).second, ValueError,
                 "{}: tensor name '{}' is empty or listed twice", file.string(), t.name);
    NUMESH_CHECK(is_element_dtype(t.dtype), ValueError,
                 "{}: tensor '{}' as {}: safetensors holds f32, bf16 and f16 tensors",
                 file.string(), t.name, to_string(t.dtype));
  }
  std::vector<const TensorToWrite*> order;
  for (const TensorToWrite& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return rust_rank(a->dtype) != rust_rank(b->dtype) ? rust_rank(a->dtype) > rust_rank(b->dtype)
                                                      : a->name < b->name;
  });
  // nlohmann's ordered_json keeps insertion order: __metadata__ first, then the tensors.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::string> blobs;
  std::uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    blobs.push_back(stored_bytes(*t->values, t->dtype));
    header[t->name] = {{"dtype", header_dtype(t->dtype)},
                       {"shape", t->values->shape},
                       {"data_offsets", {offset, offset + blobs.back().size()}}};
    offset += blobs.back().size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  detail::write_replacing(file, "safetensors", [&](std::ostream& out) {
    const std::uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), sizeof n);  // little-endian, as the machine
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const std::string& b : blobs) out.write(b.data(), static_cast<std::streamsize>(b.size()));
  });
}

}  // namespace numesh::models
