// safetensors_check_main: performs the reads tests/models/safetensors_check.py asks for, with
// numesh's reader, on the checkpoint that script wrote, and writes each result as raw
// little-endian bytes for the script to compare with PyTorch.
//   safetensors_check_main DIR
// DIR/requests.json is an array of {"name", "target": "f32"|"bf16"|"f16", "box": null (the
// whole tensor, read()) or [offsets, sizes] (read_box()), "out": a file name in DIR}.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: safetensors_check_main DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    const auto checkpoint = numesh::models::SafetensorsCheckpoint::open(dir / "checkpoint");
    std::ifstream in(dir / "requests.json");
    const nlohmann::json requests = nlohmann::json::parse(in);
    for (const nlohmann::json& r : requests) {
      const auto name = r.at("name").get<std::string>();
      const numesh::DType target = numesh::parse_dtype(r.at("target").get<std::string>());
      std::vector<std::int64_t> offsets;
      std::vector<std::int64_t> sizes;
      if (r.at("box").is_null()) {
        sizes = checkpoint.info(name).shape;
        offsets.assign(sizes.size(), 0);
      } else {
        offsets = r.at("box").at(0).get<std::vector<std::int64_t>>();
        sizes = r.at("box").at(1).get<std::vector<std::int64_t>>();
      }
      const std::int64_t count =
          std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1}, std::multiplies<>());
      std::vector<std::byte> out(static_cast<std::size_t>(count) * numesh::dtype_size(target));
      if (r.at("box").is_null()) {
        checkpoint.read(name, target, out);
      } else {
        checkpoint.read_box(name, offsets, sizes, target, out);
      }
      std::ofstream file(dir / r.at("out").get<std::string>(), std::ios::binary);
      file.write(reinterpret_cast<const char*>(out.data()),
                 static_cast<std::streamsize>(out.size()));
      if (!file) {
        std::fprintf(stderr, "safetensors_check_main: cannot write %s\n",
                     r.at("out").get<std::string>().c_str());
        return 1;
      }
    }
    std::printf("safetensors_check_main: %zu reads from %zu files\n", requests.size(),
                checkpoint.files().size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors_check_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
