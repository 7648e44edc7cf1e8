// Fuzzes the GGUF reader (models/formats/gguf.hpp): arbitrary bytes as a file, opened (header,
// metadata and tensor infos parsed and validated), then every metadata value read through every
// typed getter and element by element, and every tensor's bytes looked up and, where numesh
// reads its type, read whole as fp32, its first row as a box, and that row from its second
// column (a box that cuts a block format's blocks). An opened file's tensors must lie inside
// it, in order and aligned, and hold as many bytes as their ne and type say.

#include <cstdlib>
#include <variant>
#include <vector>

#include "box_in_place_check.hpp"
#include "fuzz_target.hpp"
#include "numesh/models/formats/gguf.hpp"

namespace {

/// Runs one getter: a ValueError for a value of another kind is its documented answer.
template <class Get>
void get(Get&& getter) {
  try {
    (void)getter();
  } catch (const numesh::ValueError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  const auto file = fuzz::scratch().write("model.gguf", {data, size});
  fuzz::expect_clear_error_only([&] {
    const models::GgufFile gguf = models::GgufFile::open(file);
    if (gguf.version() < 2 || gguf.version() > 3) std::abort();
    if (gguf.alignment() == 0 || (gguf.alignment() & (gguf.alignment() - 1)) != 0) std::abort();
    if (!gguf.tensors().empty() &&
        (gguf.data_offset() > size || gguf.data_offset() % gguf.alignment() != 0)) {
      std::abort();
    }
    for (const std::string& key : gguf.keys()) {
      const models::GgufValue* value = gguf.find(key);
      if (value == nullptr) std::abort();
      if (!value->is_array() && value->size() != 1) std::abort();
      for (std::size_t i = 0; i < value->size(); ++i) {
        const auto element = value->at(i);
        if (value->element_type() == models::GgufValueType::kString &&
            !std::holds_alternative<std::string_view>(element)) {
          std::abort();
        }
      }
      get([&] { return gguf.get_int(key); });
      get([&] { return gguf.get_float(key); });
      get([&] { return gguf.get_bool(key); });
      get([&] { return gguf.get_string(key); });
      get([&] { return gguf.get_strings(key); });
      get([&] { return gguf.get_floats(key); });
      get([&] { return gguf.get_ints(key); });
    }
    std::uint64_t expected = 0;
    for (const models::GgufTensorInfo& t : gguf.tensors()) {
      const auto bytes = gguf.bytes(t.name);
      if (bytes.size() != t.size_bytes || t.offset != expected) std::abort();
      if (gguf.data_offset() + t.offset + t.size_bytes > size) std::abort();
      const std::uint64_t a = gguf.alignment();
      expected += (t.size_bytes + a - 1) / a * a;
      if (!models::to_numesh_dtype(t.type)) continue;
      std::vector<std::byte> out(static_cast<std::size_t>(t.num_elements()) * 4);
      gguf.read(t.name, DType::kF32, out);
      if (t.shape.empty()) continue;
      std::vector<std::int64_t> offsets(t.shape.size(), 0), sizes = t.shape;
      sizes[0] = t.shape[0] > 0 ? 1 : 0;
      std::int64_t box = 1;
      for (const std::int64_t s : sizes) box *= s;
      std::vector<std::byte> row(static_cast<std::size_t>(box) * 4);
      gguf.read_box(t.name, offsets, sizes, DType::kF32, row);
      // The first row in place, as stored: the bytes read_box copies, inside the tensor.
      fuzz::check_box_in_place(gguf, t.name, bytes, offsets, sizes,
                               *models::to_numesh_dtype(t.type));
      // The first row from its second column: a box that cuts a block format's blocks.
      const std::size_t last = t.shape.size() - 1;
      if (box == 0 || t.shape[last] < 2) continue;
      offsets[last] = 1;
      sizes[last] = t.shape[last] - 1;
      row.resize(static_cast<std::size_t>(box / t.shape[last] * sizes[last]) * 4);
      gguf.read_box(t.name, offsets, sizes, DType::kF32, row);
    }
  });
  return 0;
}
