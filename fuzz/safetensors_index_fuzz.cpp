// Fuzzes the sharded-checkpoint index (models/safetensors_checkpoint.hpp): arbitrary bytes as
// model.safetensors.index.json in a folder that also holds two valid shards, tensor "a" in
// model-00001-of-00002.safetensors and "b" in model-00002-of-00002.safetensors. What opens must
// name only tensors that are really there.

#include <cstdlib>
#include <string>

#include "fuzz_target.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"

namespace {

// A safetensors file of one F32 tensor `name` of two values.
std::string one_tensor_file(const std::string& name) {
  std::string header =
      "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return file + header + std::string(8, '\x01');
}

void write_shards() {
  const auto& dir = numesh::fuzz::scratch();
  for (const auto& [file, tensor] :
       {std::pair<std::string, std::string>{"model-00001-of-00002.safetensors", "a"},
        {"model-00002-of-00002.safetensors", "b"}}) {
    const std::string bytes = one_tensor_file(tensor);
    dir.write(file, {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const bool shards_written = (write_shards(), true);
  (void)shards_written;
  fuzz::scratch().write(models::SafetensorsCheckpoint::kIndexFile, {data, size});
  fuzz::expect_clear_error_only([&] {
    const auto checkpoint = models::SafetensorsCheckpoint::open(fuzz::scratch().path());
    for (const std::string& name : checkpoint.names()) {
      if (name != "a" && name != "b") std::abort();
    }
  });
  return 0;
}
