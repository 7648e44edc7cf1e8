#include "fuzz_target.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace numesh::fuzz {

ScratchDir::ScratchDir()
    : path_(std::filesystem::temp_directory_path() /
            ("numesh-fuzz-" + std::to_string(::getpid()))) {
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::filesystem::path ScratchDir::write(std::string_view name,
                                        std::span<const std::uint8_t> bytes) const {
  std::filesystem::path file = path_ / name;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", file.c_str());
    std::abort();
  }
  return file;
}

const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

}  // namespace numesh::fuzz
