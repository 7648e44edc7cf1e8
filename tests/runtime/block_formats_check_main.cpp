// block_formats_check_main: quantizes and dequantizes what tests/runtime/block_formats_check.py
// wrote, with numesh's Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS codecs, and
// writes the results as raw little-endian bytes for the script to compare with its NumPy
// transcription of GGML (and with GGML itself).
//   block_formats_check_main DIR
// Reads DIR/values.f32 (floats, a whole number of 32-value blocks), DIR/blocks.q8_0 and
// DIR/blocks.q4_0 (arbitrary blocks: 34 and 18 bytes each). Writes DIR/values.q8_0 and
// DIR/values.q4_0 (the quantized values), DIR/values.q8_0.f32 and DIR/values.q4_0.f32 (those
// blocks dequantized), DIR/blocks.q8_0.f32 and DIR/blocks.q4_0.f32 (the arbitrary blocks
// dequantized), and likewise DIR/values.iq4_nl, DIR/values.iq4_nl.f32 and DIR/blocks.iq4_nl.f32
// from DIR/blocks.iq4_nl. The same for the super-block formats, from DIR/values_k.f32 (a whole
// number of 256-value blocks) and DIR/blocks.FORMAT (arbitrary blocks) for q3_k, q4_k, q5_k, q6_k
// and iq4_xs: writes DIR/values_k.FORMAT, DIR/values_k.FORMAT.f32 and DIR/blocks.FORMAT.f32.

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
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

// Writes the values quantized with `quantize` (to name + "." + format) and those blocks
// dequantized (to that + ".f32"), and the arbitrary blocks read from "blocks." + format
// dequantized (to "blocks." + format + ".f32"). Returns how many arbitrary blocks there were.
template <typename Block, std::size_t kElements, typename Quantize, typename Dequantize>
std::size_t run_format(const std::filesystem::path& dir, const std::string& name,
                       const std::vector<float>& values, const std::string& format,
                       Quantize quantize, Dequantize dequantize) {
  std::vector<Block> blocks(values.size() / kElements);
  quantize(values, blocks);
  write_all(dir / (name + "." + format), blocks);
  std::vector<float> back(values.size());
  dequantize(blocks, back);
  write_all(dir / (name + "." + format + ".f32"), back);
  const std::vector<Block> any = read_all<Block>(dir / ("blocks." + format));
  std::vector<float> out(any.size() * kElements);
  dequantize(any, out);
  write_all(dir / ("blocks." + format + ".f32"), out);
  return any.size();
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

    std::vector<BlockQ5_0> q5(blocks);
    quantize_q5_0(values, q5);
    write_all(dir / "values.q5_0", q5);
    dequantize_q5_0(q5, back);
    write_all(dir / "values.q5_0.f32", back);

    const std::vector<BlockQ8_0> any8 = read_all<BlockQ8_0>(dir / "blocks.q8_0");
    std::vector<float> out8(any8.size() * 32);
    dequantize_q8_0(any8, out8);
    write_all(dir / "blocks.q8_0.f32", out8);
    const std::vector<BlockQ4_0> any4 = read_all<BlockQ4_0>(dir / "blocks.q4_0");
    std::vector<float> out4(any4.size() * 32);
    dequantize_q4_0(any4, out4);
    write_all(dir / "blocks.q4_0.f32", out4);
    const std::vector<BlockQ5_0> any5 = read_all<BlockQ5_0>(dir / "blocks.q5_0");
    std::vector<float> out5(any5.size() * 32);
    dequantize_q5_0(any5, out5);
    write_all(dir / "blocks.q5_0.f32", out5);
    const std::size_t iq4_nl_any = run_format<BlockIQ4_NL, 32>(
        dir, "values", values, "iq4_nl",
        [](std::span<const float> x, std::span<BlockIQ4_NL> y) { quantize_iq4_nl(x, y); },
        [](std::span<const BlockIQ4_NL> y, std::span<float> x) { dequantize_iq4_nl(y, x); });
    std::printf(
        "block_formats_check_main: %zu blocks quantized, %zu + %zu + %zu + %zu dequantized\n",
        blocks, any8.size(), any4.size(), any5.size(), iq4_nl_any);

    const std::vector<float> values_k = read_all<float>(dir / "values_k.f32");
    const std::size_t q3_k_any = run_format<BlockQ3_K, 256>(
        dir, "values_k", values_k, "q3_k",
        [](std::span<const float> x, std::span<BlockQ3_K> y) { quantize_q3_k(x, y); },
        [](std::span<const BlockQ3_K> y, std::span<float> x) { dequantize_q3_k(y, x); });
    const std::size_t q4_k_any = run_format<BlockQ4_K, 256>(
        dir, "values_k", values_k, "q4_k",
        [](std::span<const float> x, std::span<BlockQ4_K> y) { quantize_q4_k(x, y); },
        [](std::span<const BlockQ4_K> y, std::span<float> x) { dequantize_q4_k(y, x); });
    const std::size_t q5_k_any = run_format<BlockQ5_K, 256>(
        dir, "values_k", values_k, "q5_k",
        [](std::span<const float> x, std::span<BlockQ5_K> y) { quantize_q5_k(x, y); },
        [](std::span<const BlockQ5_K> y, std::span<float> x) { dequantize_q5_k(y, x); });
    const std::size_t q6_k_any = run_format<BlockQ6_K, 256>(
        dir, "values_k", values_k, "q6_k",
        [](std::span<const float> x, std::span<BlockQ6_K> y) { quantize_q6_k(x, y); },
        [](std::span<const BlockQ6_K> y, std::span<float> x) { dequantize_q6_k(y, x); });
    const std::size_t iq4_xs_any = run_format<BlockIQ4_XS, 256>(
        dir, "values_k", values_k, "iq4_xs",
        [](std::span<const float> x, std::span<BlockIQ4_XS> y) { quantize_iq4_xs(x, y); },
        [](std::span<const BlockIQ4_XS> y, std::span<float> x) { dequantize_iq4_xs(y, x); });
    std::printf(
        "block_formats_check_main: %zu super-blocks quantized to q3_k, q4_k, q5_k, q6_k and "
        "iq4_xs, %zu + %zu + %zu + %zu + %zu dequantized\n",
        values_k.size() / 256, q3_k_any, q4_k_any, q5_k_any, q6_k_any, iq4_xs_any);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "block_formats_check_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
