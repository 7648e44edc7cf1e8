// dtype_check_main: writes fp32 values and numesh's bf16 and f16 conversions of them (at every
// kernel level this CPU runs) as raw little-endian files into a folder, for
// tests/ops/dtype_check.py to compare with PyTorch's and NumPy's bits.
//   dtype_check_main DIR
// Files: values.f32 (n floats), then per level L: L.bf16, L.f16 (n uint16 each), and
// levels.txt naming the levels.

#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace {

template <typename T>
void write(const std::filesystem::path& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(T)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dtype_check_main DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  // Every 16-bit pattern widened (exact in fp32), each nudged by one ulp up and down (the
  // rounding cases between neighbours, ties included through the random part), random bits.
  std::vector<float> values;
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    for (std::uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0x1000u, 0x0FFFu, 0x1001u}) {
      values.push_back(std::bit_cast<float>((h << 16) | low));
    }
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) values.push_back(std::bit_cast<float>(any(rng)));
  write(dir / "values.f32", values);
  std::ofstream levels(dir / "levels.txt");
  for (numesh::runtime::KernelLevel l : numesh::runtime::runnable_kernel_levels()) {
    const std::string name(numesh::runtime::to_string(l));
    std::vector<std::uint16_t> bf(values.size()), f16(values.size());
    numesh::runtime::convert_f32_to_bf16(values, bf, l);
    numesh::runtime::convert_f32_to_f16(values, f16, l);
    write(dir / (name + ".bf16"), bf);
    write(dir / (name + ".f16"), f16);
    levels << name << "\n";
  }
  return 0;
}
