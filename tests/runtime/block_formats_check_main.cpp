// block_formats_check_main: quantizes and dequantizes what tests/runtime/block_formats_check.py
// wrote, with numesh's Q8_0 and Q4_0 codecs, and writes the results as raw little-endian bytes
// for the script to compare with its NumPy transcription of GGML (and with GGML itself).
//   block_formats_check_main DIR
// Reads DIR/values.f32 (floats, a whole number of 32-value blocks), DIR/blocks.q8_0 and
// DIR/blocks.q4_0 (arbitrary blocks: 34 and 18 bytes each). Writes DIR/values.q8_0 and
// DIR/values.q4_0 (the quantized values), DIR/values.q8_0.f32 and DIR/values.q4_0.f32 (those
// blocks dequantized), DIR/blocks.q8_0.f32 and DIR/blocks.q4_0.f32 (the arbitrary blocks
// dequantized).

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "numesh/runtime/block_formats.hpp"

namespace {

// The file's bytes as a vector of T. Throws std::runtime_error naming the file when it cannot
// be read or is not a whole number of T.
template <typename T>
std::vector<T> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  if (bytes.size() % sizeof(T) != 0) {
    throw std::runtime_error(path.string() + " is not a whole number of " +
                             std::to_string(sizeof(T)) + "-byte items");
  }
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template <typename T>
void write_all(const std::filesystem::path& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace numesh::runtime;
  if (argc != 2) {
    std::fprintf(stderr, "usage: block_formats_check_main DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    const std::vector<float> values = read_all<float>(dir / "values.f32");
    const std::size_t blocks = values.size() / 32;

    std::vector<BlockQ8_0> q8(blocks);
    quantize_q8_0(values, q8);
    write_all(dir / "values.q8_0", q8);
    std::vector<float> back(values.size());
    dequantize_q8_0(q8, back);
    write_all(dir / "values.q8_0.f32", back);

    std::vector<BlockQ4_0> q4(blocks);
    quantize_q4_0(values, q4);
    write_all(dir / "values.q4_0", q4);
    dequantize_q4_0(q4, back);
    write_all(dir / "values.q4_0.f32", back);

    const std::vector<BlockQ8_0> any8 = read_all<BlockQ8_0>(dir / "blocks.q8_0");
    std::vector<float> out8(any8.size() * 32);
    dequantize_q8_0(any8, out8);
    write_all(dir / "blocks.q8_0.f32", out8);
    const std::vector<BlockQ4_0> any4 = read_all<BlockQ4_0>(dir / "blocks.q4_0");
    std::vector<float> out4(any4.size() * 32);
    dequantize_q4_0(any4, out4);
    write_all(dir / "blocks.q4_0.f32", out4);
    std::printf("block_formats_check_main: %zu blocks quantized, %zu + %zu dequantized\n", blocks,
                any8.size(), any4.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "block_formats_check_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
