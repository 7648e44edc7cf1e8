// Fuzzes the safetensors reader (models/safetensors.hpp): arbitrary bytes as a file, opened
// (header parsed and validated), then every tensor's bytes looked up and, where numesh reads its
// dtype, read whole as fp32 and its first row as a box, and that row read in place
// (box_in_place) must be the bytes the copying read gives. An opened file's tensors must lie
// inside it and hold as many bytes as their shape and dtype say.

#include <cstdlib>
#include <vector>

#include "box_in_place_check.hpp"
#include "fuzz_target.hpp"
#include "numesh/models/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  const auto file = fuzz::scratch().write("model.safetensors", {data, size});
  fuzz::expect_clear_error_only([&] {
    const models::SafetensorsFile st = models::SafetensorsFile::open(file);
    for (const models::TensorInfo& t : st.tensors()) {
      const auto bytes = st.bytes(t.name);
      if (bytes.size() != t.size_bytes() || t.end > size) std::abort();
      if (!models::to_numesh_dtype(t.dtype)) continue;
      std::vector<std::byte> out(static_cast<std::size_t>(t.num_elements()) * 4);
      st.read(t.name, DType::kF32, out);
      if (t.shape.empty()) continue;
      std::vector<std::int64_t> offsets(t.shape.size(), 0), sizes = t.shape;
      sizes[0] = t.shape[0] > 0 ? 1 : 0;
      std::int64_t box = 1;
      for (const std::int64_t s : sizes) box *= s;
      std::vector<std::byte> row(static_cast<std::size_t>(box) * 4);
      st.read_box(t.name, offsets, sizes, DType::kF32, row);
      // The first row in place, as stored: the bytes read_box copies, inside the tensor.
      fuzz::check_box_in_place(st, t.name, bytes, offsets, sizes,
                               *models::to_numesh_dtype(t.dtype));
    }
  });
  return 0;
}
