#include "numesh/models/formats/safetensors.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/safetensors_writer.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::file_bytes;
using ::testing::IsEmpty;
using testing::layout_file;
using testing::le_bytes;
using testing::ScratchDir;
using testing::StoredTensor;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

/// Tensor `name` read as `target`, returned as elements of T (uint32_t for fp32 bits,
/// uint16_t for bf16 / f16 bits, float for values).
template <typename T>
std::vector<T> read_as(const SafetensorsFile& file, std::string_view name, DType target) {
  std::vector<T> out(static_cast<std::size_t>(file.info(name).num_elements()));
  file.read(name, target, std::as_writable_bytes(std::span(out)));
  return out;
}

/// The box read with read_box, as elements of T.
template <typename T>
std::vector<T> read_box_as(const SafetensorsFile& file, std::string_view name,
                           const std::vector<std::int64_t>& offsets,
                           const std::vector<std::int64_t>& sizes, DType target) {
  const std::int64_t n =
      std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1}, std::multiplies<>());
  std::vector<T> out(static_cast<std::size_t>(n));
  file.read_box(name, offsets, sizes, target, std::as_writable_bytes(std::span(out)));
  return out;
}

/// The oracle for read_box: the box of row-major `values` of `shape`, element by element from
/// coordinates.
template <typename T>
std::vector<T> naive_box(const std::vector<T>& values, const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& offsets,
                         const std::vector<std::int64_t>& sizes) {
  const std::int64_t n =
      std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1}, std::multiplies<>());
  std::vector<T> out;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rest = i;
    std::int64_t linear = 0;
    std::int64_t stride = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      const std::int64_t coordinate = offsets[d] + rest % sizes[d];
      rest /= sizes[d];
      linear += coordinate * stride;
      stride *= shape[d];
    }
    out.push_back(values[static_cast<std::size_t>(linear)]);
  }
  return out;
}

/// Calls visit(offsets, sizes) for every non-empty box of a tensor of `shape` (every offset and
/// size along each dim, the last dim fastest), stopping after a fatal test failure.
template <typename Visit>
void for_each_box(const std::vector<std::int64_t>& shape, Visit&& visit,
                  std::vector<std::int64_t> offsets = {}, std::vector<std::int64_t> sizes = {}) {
  if (offsets.size() == shape.size()) {
    visit(offsets, sizes);
    return;
  }
  const std::int64_t extent = shape[offsets.size()];
  for (std::int64_t o = 0; o < extent; ++o) {
    for (std::int64_t s = 1; o + s <= extent; ++s) {
      offsets.push_back(o);
      sizes.push_back(s);
      for_each_box(shape, visit, offsets, sizes);
      offsets.pop_back();
      sizes.pop_back();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

std::vector<float> iota_f32(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

std::vector<std::uint32_t> bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> out;
  for (const float x : values) out.push_back(std::bit_cast<std::uint32_t>(x));
  return out;
}

/// "safetensors: cannot open '<file>': <what>", the start of every open() error.
std::string open_error(const fs::path& file, std::string_view what) {
  return "safetensors: cannot open '" + file.string() + "': " + std::string(what);
}

std::string read_error(const fs::path& file, std::string_view tensor, std::string_view what) {
  return "safetensors: cannot read tensor '" + std::string(tensor) + "' of '" + file.string() +
         "': " + std::string(what);
}

TEST(SafetensorsDTypeTest, EveryNameOfTheRustCrateRoundTripsWithItsBitSize) {
  const std::vector<std::pair<std::string_view, int>> names{
      {"BOOL", 8},    {"U8", 8},      {"I8", 8},          {"I16", 16},        {"U16", 16},
      {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"F64", 64},    {"I64", 64},    {"U64", 64},        {"C64", 64},        {"F8_E4M3", 8},
      {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},
      {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const auto& [name, bit_count] : names) {
    SCOPED_TRACE(name);
    const auto dtype = find_safetensors_dtype(name);
    ASSERT_TRUE(dtype.has_value());
    EXPECT_EQ(to_string(*dtype), name);
    EXPECT_EQ(bit_size(*dtype), bit_count);
  }
  EXPECT_FALSE(find_safetensors_dtype("f32").has_value());  // case-sensitive, as the crate
  EXPECT_FALSE(find_safetensors_dtype("F128").has_value());
  EXPECT_FALSE(find_safetensors_dtype("").has_value());
}

TEST(SafetensorsDTypeTest, OnlyF32Bf16AndF16MapToNumeshDtypes) {
  EXPECT_EQ(to_numesh_dtype(SafetensorsDType::kF32), DType::kF32);
  EXPECT_EQ(to_numesh_dtype(SafetensorsDType::kBF16), DType::kBF16);
  EXPECT_EQ(to_numesh_dtype(SafetensorsDType::kF16), DType::kF16);
  EXPECT_FALSE(to_numesh_dtype(SafetensorsDType::kF64).has_value());
  EXPECT_FALSE(to_numesh_dtype(SafetensorsDType::kI64).has_value());
  EXPECT_FALSE(to_numesh_dtype(SafetensorsDType::kF8E4M3).has_value());
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
};

TEST_F(SafetensorsFileTest, ReadsF32TensorsOfRank0To3WithTheirInfo) {
  const fs::path file = dir_.file(
      "ranks.safetensors", layout_file({{"scalar", "F32", {}, le_bytes<float>({3.5f})},
                                        {"vector", "F32", {3}, le_bytes<float>({1, 2, 3})},
                                        {"matrix", "F32", {2, 3}, le_bytes(iota_f32(6))},
                                        {"cube", "F32", {2, 3, 4}, le_bytes(iota_f32(24))}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_EQ(f.path(), file);
  EXPECT_THAT(f.names(), ElementsAre("scalar", "vector", "matrix", "cube"));
  EXPECT_TRUE(f.contains("matrix"));
  EXPECT_FALSE(f.contains("matri"));
  EXPECT_TRUE(f.metadata().empty());

  const TensorInfo& scalar = f.info("scalar");
  EXPECT_EQ(scalar, (TensorInfo{"scalar", SafetensorsDType::kF32, {}, 0, 4}));
  EXPECT_EQ(scalar.num_elements(), 1);
  EXPECT_EQ(f.info("cube"), (TensorInfo{"cube", SafetensorsDType::kF32, {2, 3, 4}, 40, 136}));
  EXPECT_EQ(f.info("cube").num_elements(), 24);
  EXPECT_EQ(f.info("cube").size_bytes(), 96U);

  EXPECT_THAT(read_as<float>(f, "scalar", DType::kF32), ElementsAre(3.5f));
  EXPECT_THAT(read_as<float>(f, "vector", DType::kF32), ElementsAre(1.0f, 2.0f, 3.0f));
  EXPECT_THAT(read_as<float>(f, "matrix", DType::kF32), ElementsAreArray(iota_f32(6)));
  EXPECT_THAT(read_as<float>(f, "cube", DType::kF32), ElementsAreArray(iota_f32(24)));
}

// Expected bits in the three tests below come from PyTorch 1.13 (`x.to(torch.bfloat16)`,
// `.to(torch.float16)`, `.float()`), which rounds to nearest even as numesh does.
TEST_F(SafetensorsFileTest, ReadsF32IntoEachTargetRoundingToNearestEven) {
  const std::vector<std::uint32_t> stored{
      0x3F800000,  // 1.0
      0xC0200000,  // -2.5
      0x3F808000,  // 1 + 2^-8: halfway between bf16 1.0 and 1.0078125, ties to even 0x3F80
      0x3F818000,  // 1 + 3*2^-8: halfway between 0x3F81 and 0x3F82, ties to even 0x3F82
      0x3F808001,  // just above the tie: rounds up to 0x3F81
      0x477FF000,  // 65520: rounds past f16's largest finite value to infinity
      0x477FEFFF,  // just below 65520: f16 65504 (0x7BFF)
      0x33000000,  // 2^-25: halfway between f16 zero and its smallest subnormal, ties to 0
      0x33000001,  // just above: the smallest f16 subnormal
      0x80000000,  // -0.0
      0x7F800000,  // inf
      0x00000001,  // the smallest f32 subnormal: zero in bf16 and f16
  };
  const fs::path file =
      dir_.file("f32.safetensors", layout_file({{"x", "F32", {3, 4}, le_bytes(stored)}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_as<std::uint32_t>(f, "x", DType::kF32), ElementsAreArray(stored));
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kBF16),
              ElementsAre(0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81, 0x4780, 0x4780, 0x3300, 0x3300,
                          0x8000, 0x7F80, 0x0000));
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kF16),
              ElementsAre(0x3C00, 0xC100, 0x3C04, 0x3C0C, 0x3C04, 0x7C00, 0x7BFF, 0x0000, 0x0001,
                          0x8000, 0x7C00, 0x0000));
}

TEST_F(SafetensorsFileTest, ReadsBf16IntoEachTarget) {
  const std::vector<std::uint16_t> stored{0x3F80, 0xC020, 0x3F81, 0x7F80, 0xFF80,
                                          0x0001, 0x8000, 0x477F, 0x3F82};
  const fs::path file =
      dir_.file("bf16.safetensors", layout_file({{"x", "BF16", {9}, le_bytes(stored)}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kBF16), ElementsAreArray(stored));
  EXPECT_THAT(read_as<std::uint32_t>(f, "x", DType::kF32),
              ElementsAre(0x3F800000, 0xC0200000, 0x3F810000, 0x7F800000, 0xFF800000, 0x00010000,
                          0x80000000, 0x477F0000, 0x3F820000));
  // bf16 -> f16 through the exact fp32 value, one rounding: the bf16 subnormal 0x0001 is far
  // below f16's range (0), 0x477F (65280) is exact in f16.
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kF16),
              ElementsAre(0x3C00, 0xC100, 0x3C08, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x7BF8, 0x3C10));
}

TEST_F(SafetensorsFileTest, ReadsF16IntoEachTarget) {
  const std::vector<std::uint16_t> stored{0x3C00, 0xC100, 0x3C01, 0x3C04, 0x3C0C,
                                          0x0001, 0x7BFF, 0xFC00, 0x8000};
  const fs::path file =
      dir_.file("f16.safetensors", layout_file({{"x", "F16", {3, 3}, le_bytes(stored)}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kF16), ElementsAreArray(stored));
  EXPECT_THAT(read_as<std::uint32_t>(f, "x", DType::kF32),
              ElementsAre(0x3F800000, 0xC0200000, 0x3F802000, 0x3F808000, 0x3F818000, 0x33800000,
                          0x477FE000, 0xFF800000, 0x80000000));
  // 0x3C04 and 0x3C0C are bf16 ties (1 + 2^-8, 1 + 3*2^-8): to even, 0x3F80 and 0x3F82.
  EXPECT_THAT(read_as<std::uint16_t>(f, "x", DType::kBF16),
              ElementsAre(0x3F80, 0xC020, 0x3F80, 0x3F80, 0x3F82, 0x3380, 0x4780, 0xFF80, 0x8000));
}

TEST_F(SafetensorsFileTest, SameDtypeReadCopiesBitsEvenOfNaNPayloads) {
  // A conversion would make these NaNs canonical; a same-dtype read must not touch them.
  const std::vector<std::uint32_t> f32{0x7FA00001, 0xFFC12345};
  const std::vector<std::uint16_t> half{0x7D01, 0xFF81};
  const fs::path file =
      dir_.file("nan.safetensors", layout_file({{"f32", "F32", {2}, le_bytes(f32)},
                                                {"bf16", "BF16", {2}, le_bytes(half)},
                                                {"f16", "F16", {2}, le_bytes(half)}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_as<std::uint32_t>(f, "f32", DType::kF32), ElementsAreArray(f32));
  EXPECT_THAT(read_as<std::uint16_t>(f, "bf16", DType::kBF16), ElementsAreArray(half));
  EXPECT_THAT(read_as<std::uint16_t>(f, "f16", DType::kF16), ElementsAreArray(half));
}

TEST_F(SafetensorsFileTest, ConvertsFromAMisalignedBufferIntoAMisalignedOutput) {
  // Header padded to no boundary: the buffer starts at an odd address. Long enough to cross the
  // converter's 2048-element chunks.
  std::vector<float> values(5000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.7f - 900.0f;
  std::vector<std::uint16_t> bf16;
  for (const float x : values) bf16.push_back(bf16_from_f32(x));
  const fs::path file = dir_.file(
      "odd.safetensors",
      layout_file({{"x", "F32", {5000}, le_bytes(values)}, {"y", "BF16", {5000}, le_bytes(bf16)}},
                  {}, /*align=*/1));
  const SafetensorsFile f = SafetensorsFile::open(file);
  ASSERT_NE(reinterpret_cast<std::uintptr_t>(f.bytes("x").data()) % 2, 0U);

  std::vector<std::uint16_t> want_f16;
  for (const std::uint16_t b : bf16) want_f16.push_back(f16_from_f32(f32_from_bf16(b)));
  std::vector<float> want_widened;
  for (const std::uint16_t b : bf16) want_widened.push_back(f32_from_bf16(b));

  // One byte into a buffer: the output is misaligned too.
  std::vector<std::byte> raw(1 + 5000 * 4);
  const auto out = std::span(raw).subspan(1);
  f.read("x", DType::kBF16, out.first(10000));
  std::vector<std::uint16_t> got16(5000);
  std::memcpy(got16.data(), out.data(), 10000);
  EXPECT_EQ(got16, bf16);

  f.read("y", DType::kF16, out.first(10000));
  std::memcpy(got16.data(), out.data(), 10000);
  EXPECT_EQ(got16, want_f16);

  f.read("y", DType::kF32, out);
  std::vector<float> got32(5000);
  std::memcpy(got32.data(), out.data(), out.size());
  EXPECT_EQ(bits(got32), bits(want_widened));

  // Into an aligned output, the same bits.
  EXPECT_EQ(read_as<std::uint16_t>(f, "y", DType::kF16), want_f16);
  EXPECT_EQ(read_as<std::uint16_t>(f, "x", DType::kBF16), bf16);
}

TEST_F(SafetensorsFileTest, ZeroSizeTensorsOpenAndReadNothing) {
  // Empty tensors take no bytes; at the offset where "b" begins, the empty one comes first (it
  // ends first).
  const fs::path file = dir_.file("empty.safetensors",
                                  layout_file({{"a", "F32", {2}, le_bytes<float>({1, 2})},
                                               {"empty_rows", "BF16", {0, 4}, ""},
                                               {"b", "F16", {1}, le_bytes<std::uint16_t>({0x3C00})},
                                               {"empty_cols", "F32", {3, 0}, ""}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(f.names(), ElementsAre("a", "empty_rows", "b", "empty_cols"));
  EXPECT_EQ(f.info("empty_rows"),
            (TensorInfo{"empty_rows", SafetensorsDType::kBF16, {0, 4}, 8, 8}));
  EXPECT_EQ(f.info("empty_rows").num_elements(), 0);
  EXPECT_THAT(f.bytes("empty_cols"), IsEmpty());
  EXPECT_THAT(read_as<float>(f, "empty_rows", DType::kF32), IsEmpty());
  EXPECT_THAT(read_as<std::uint16_t>(f, "empty_cols", DType::kBF16), IsEmpty());
  EXPECT_THAT(read_box_as<float>(f, "empty_cols", {1, 0}, {2, 0}, DType::kF32), IsEmpty());
  EXPECT_THAT(read_box_as<float>(f, "a", {1}, {0}, DType::kF32), IsEmpty());
  EXPECT_THAT(read_as<float>(f, "b", DType::kF32), ElementsAre(1.0f));
}

TEST_F(SafetensorsFileTest, AFileOfOnlyAnEmptyHeaderHasNoTensors) {
  const SafetensorsFile f = SafetensorsFile::open(dir_.file("none.safetensors", file_bytes("{}")));
  EXPECT_THAT(f.tensors(), IsEmpty());
  EXPECT_THAT(f.names(), IsEmpty());
}

TEST_F(SafetensorsFileTest, ListsTensorsInBufferOrderWhateverTheHeaderOrder) {
  const std::string header =
      R"({"z_first": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "a_last": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},)"
      R"( "m_middle": {"data_offsets": [4, 8], "shape": [1], "dtype": "F32"}})";
  const SafetensorsFile f = SafetensorsFile::open(
      dir_.file("order.safetensors", file_bytes(header, le_bytes<float>({1, 2, 3}))));
  EXPECT_THAT(f.names(), ElementsAre("z_first", "m_middle", "a_last"));
  EXPECT_THAT(read_as<float>(f, "a_last", DType::kF32), ElementsAre(3.0f));
}

TEST_F(SafetensorsFileTest, ReadsMetadataAndUtf8Names) {
  const fs::path file =
      dir_.file("meta.safetensors",
                layout_file({{"w\xC3\xA9\xF0\x9F\x98\x80", "F32", {1}, le_bytes<float>({7})}},
                            {{"format", "pt"}, {"note", "caf\xC3\xA9"}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(f.metadata(),
              ElementsAre(std::pair<const std::string, std::string>("format", "pt"),
                          std::pair<const std::string, std::string>("note", "caf\xC3\xA9")));
  EXPECT_THAT(read_as<float>(f, "w\xC3\xA9\xF0\x9F\x98\x80", DType::kF32), ElementsAre(7.0f));
}

TEST_F(SafetensorsFileTest, BytesAreTheStoredSpanInsideTheMapping) {
  const std::string a = le_bytes<float>({1, 2});
  const std::string b = le_bytes<std::uint16_t>({0x1234, 0x5678, 0x9ABC});
  const SafetensorsFile f = SafetensorsFile::open(
      dir_.file("bytes.safetensors", layout_file({{"a", "F32", {2}, a}, {"b", "I16", {3}, b}})));
  const auto span_b = f.bytes("b");
  ASSERT_EQ(span_b.size(), 6U);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(span_b.data()), span_b.size()), b);
  EXPECT_EQ(f.bytes("a").data() + 8, span_b.data());
}

TEST_F(SafetensorsFileTest, OpensEveryDtypeAndReadsTheBytesOfOnesItCannotConvert) {
  std::vector<StoredTensor> tensors;
  for (const std::string_view name :
       {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
        "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}) {
    const int bytes = bit_size(*find_safetensors_dtype(name)) / 8;
    tensors.push_back({"t_" + std::string(name),
                       std::string(name),
                       {2},
                       std::string(static_cast<std::size_t>(2 * bytes), '\x11')});
  }
  // Sub-byte dtypes: a whole number of bytes only for some element counts.
  tensors.push_back({"t_F4", "F4", {2}, "\x21"});
  tensors.push_back({"t_F6_E2M3", "F6_E2M3", {4}, "abc"});
  tensors.push_back({"t_F6_E3M2", "F6_E3M2", {2, 2}, "def"});
  const SafetensorsFile f =
      SafetensorsFile::open(dir_.file("all.safetensors", layout_file(tensors)));
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const StoredTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(to_string(f.info(t.name).dtype), t.dtype);
    EXPECT_EQ(f.bytes(t.name).size(), t.data.size());
  }
  EXPECT_THAT(read_as<std::uint16_t>(f, "t_BF16", DType::kBF16), ElementsAre(0x1111, 0x1111));
}

TEST_F(SafetensorsFileTest, MovesKeepTheMappingAlive) {
  std::vector<SafetensorsFile> files;
  {
    SafetensorsFile f = SafetensorsFile::open(
        dir_.file("a.safetensors", layout_file({{"x", "F32", {2}, le_bytes<float>({4, 5})}})));
    files.push_back(std::move(f));
  }
  files.push_back(SafetensorsFile::open(
      dir_.file("b.safetensors", layout_file({{"y", "F32", {1}, le_bytes<float>({6})}}))));
  SafetensorsFile moved = std::move(files[0]);
  files[0] = std::move(files[1]);
  EXPECT_THAT(read_as<float>(moved, "x", DType::kF32), ElementsAre(4.0f, 5.0f));
  EXPECT_THAT(read_as<float>(files[0], "y", DType::kF32), ElementsAre(6.0f));
}

class SafetensorsBoxTest : public SafetensorsFileTest {};

TEST_F(SafetensorsBoxTest, ReadsColumnBlocksAndRowBlocksOfAMatrix) {
  // [4, 6] weight, values 0..23: the shards of column- and row-parallel layers over 2 and 3.
  const fs::path file =
      dir_.file("w.safetensors", layout_file({{"w", "F32", {4, 6}, le_bytes(iota_f32(24))}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_box_as<float>(f, "w", {0, 0}, {4, 3}, DType::kF32),
              ElementsAre(0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20));
  EXPECT_THAT(read_box_as<float>(f, "w", {0, 3}, {4, 3}, DType::kF32),
              ElementsAre(3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23));
  EXPECT_THAT(read_box_as<float>(f, "w", {0, 4}, {4, 2}, DType::kF32),
              ElementsAre(4, 5, 10, 11, 16, 17, 22, 23));
  EXPECT_THAT(read_box_as<float>(f, "w", {2, 0}, {2, 6}, DType::kF32),
              ElementsAre(12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23));
  EXPECT_THAT(read_box_as<float>(f, "w", {1, 2}, {2, 3}, DType::kF32),
              ElementsAre(8, 9, 10, 14, 15, 16));
  EXPECT_THAT(read_box_as<float>(f, "w", {3, 5}, {1, 1}, DType::kF32), ElementsAre(23));
  EXPECT_THAT(read_box_as<float>(f, "w", {0, 0}, {4, 6}, DType::kF32),
              ElementsAreArray(iota_f32(24)));
}

TEST_F(SafetensorsBoxTest, ReadsAColumnBlockConvertingTheDtype) {
  std::vector<std::uint16_t> stored;
  for (const float x : iota_f32(12)) stored.push_back(bf16_from_f32(x * 0.5f));
  const SafetensorsFile f = SafetensorsFile::open(
      dir_.file("w.safetensors", layout_file({{"w", "BF16", {3, 4}, le_bytes(stored)}})));
  EXPECT_THAT(read_box_as<float>(f, "w", {0, 1}, {3, 2}, DType::kF32),
              ElementsAre(0.5f, 1.0f, 2.5f, 3.0f, 4.5f, 5.0f));
  EXPECT_THAT(read_box_as<std::uint16_t>(f, "w", {1, 2}, {2, 2}, DType::kF16),
              ElementsAre(0x4200, 0x4300, 0x4500, 0x4580));  // 3, 3.5, 5, 5.5
}

TEST_F(SafetensorsBoxTest, EveryBoxOfARank3TensorMatchesTheCoordinateOracle) {
  // All 6 * 10 * 15 = 900 boxes of a [3, 4, 5] tensor, stored as F32 and as BF16.
  const std::vector<std::int64_t> shape{3, 4, 5};
  const std::vector<float> values = iota_f32(60);
  std::vector<std::uint16_t> bf16;
  for (const float x : values) bf16.push_back(bf16_from_f32(x));
  const SafetensorsFile f = SafetensorsFile::open(
      dir_.file("cube.safetensors", layout_file({{"f32", "F32", shape, le_bytes(values)},
                                                 {"bf16", "BF16", shape, le_bytes(bf16)}})));
  int boxes = 0;
  for_each_box(
      shape, [&](const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& sizes) {
        const std::vector<float> want = naive_box(values, shape, offsets, sizes);
        ASSERT_EQ(read_box_as<float>(f, "f32", offsets, sizes, DType::kF32), want)
            << ::testing::PrintToString(offsets) << ::testing::PrintToString(sizes);
        ASSERT_EQ(read_box_as<std::uint16_t>(f, "bf16", offsets, sizes, DType::kBF16),
                  naive_box(bf16, shape, offsets, sizes));
        ASSERT_EQ(read_box_as<float>(f, "bf16", offsets, sizes, DType::kF32), want);
        ++boxes;
      });
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(boxes, 900);
}

// A box is read in place exactly when its elements are one run of the file (their row-major
// indices consecutive: the oracle), stored in the dtype asked for; its bytes are then what
// read_box copies, and they outlive the file object.
TEST_F(SafetensorsBoxTest, BoxesThatAreOneRunOfTheFileAreReadInPlaceAndOutliveTheFile) {
  const std::vector<std::int64_t> shape{3, 4, 5};
  const std::vector<float> values = iota_f32(60);
  std::vector<std::int64_t> index(60);
  for (std::size_t i = 0; i < index.size(); ++i) index[i] = static_cast<std::int64_t>(i);
  std::shared_ptr<const std::byte> kept;
  {
    const SafetensorsFile f = SafetensorsFile::open(
        dir_.file("cube.safetensors", layout_file({{"f32", "F32", shape, le_bytes(values)}})));
    int in_place = 0;
    for_each_box(shape, [&](const std::vector<std::int64_t>& offsets,
                            const std::vector<std::int64_t>& sizes) {
      const std::vector<std::int64_t> at = naive_box(index, shape, offsets, sizes);
      bool run = true;
      for (std::size_t i = 1; i < at.size(); ++i) run = run && at[i] == at[i - 1] + 1;
      const std::shared_ptr<const std::byte> p = f.box_in_place("f32", offsets, sizes, DType::kF32);
      ASSERT_EQ(p != nullptr, run)
          << ::testing::PrintToString(offsets) << ::testing::PrintToString(sizes);
      EXPECT_EQ(f.box_in_place("f32", offsets, sizes, DType::kBF16), nullptr)
          << "another dtype is converted, never read in place";
      if (!run) return;
      ++in_place;
      EXPECT_EQ(p.get(), f.bytes("f32").data() + at.front() * 4);
      std::vector<float> seen(at.size());
      std::memcpy(seen.data(), p.get(), seen.size() * sizeof(float));
      EXPECT_EQ(seen, read_box_as<float>(f, "f32", offsets, sizes, DType::kF32));
    });
    ASSERT_FALSE(HasFatalFailure());
    // Runs: spans of whole [4, 5] slabs (6 boxes), spans of whole rows of one slab short of
    // the slab (3 * 9) and spans of elements of one row short of the row (3 * 4 * 14).
    EXPECT_EQ(in_place, 6 + 27 + 168);
    kept = f.box_in_place("f32", std::vector<std::int64_t>{1, 2, 0},
                          std::vector<std::int64_t>{1, 2, 5}, DType::kF32);
    EXPECT_EQ(f.box_in_place("f32", std::vector<std::int64_t>{0, 0, 0},
                             std::vector<std::int64_t>{1, 0, 5}, DType::kF32),
              nullptr)
        << "a box of no elements";
    EXPECT_EQ(f.box_in_place("f32", std::vector<std::int64_t>{2, 0, 0},
                             std::vector<std::int64_t>{2, 4, 5}, DType::kF32),
              nullptr)
        << "a box past the end: read_box reports it";
    EXPECT_THROW((void)f.box_in_place("f33", std::vector<std::int64_t>{0},
                                      std::vector<std::int64_t>{1}, DType::kF32),
                 KeyError);
  }
  ASSERT_NE(kept, nullptr);
  std::vector<float> seen(10);
  std::memcpy(seen.data(), kept.get(), sizeof(float) * seen.size());
  EXPECT_THAT(seen, ElementsAre(30, 31, 32, 33, 34, 35, 36, 37, 38, 39))
      << "the mapping lives on with the box";
}

// A box that is one run of the file as it is stored is read with pread(), not copied out of the
// mapping: a file cut short after it was opened is then an IoError naming where it ends, where
// a copy out of the mapping would have read zeros (within the last page) or raised SIGBUS.
TEST_F(SafetensorsBoxTest, ARunReadFromAFileCutShortSinceItOpenedIsAnIoError) {
  const fs::path file =
      dir_.file("cut.safetensors", layout_file({{"w", "F32", {4, 6}, le_bytes(iota_f32(24))}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_THAT(read_box_as<float>(f, "w", {3, 0}, {1, 6}, DType::kF32),
              ElementsAre(18, 19, 20, 21, 22, 23));
  const std::uint64_t size = fs::file_size(file);  // the 96 bytes of w end the file
  fs::resize_file(file, size - 50);
  EXPECT_THAT(
      [&] {
        (void)read_box_as<float>(f, "w", {0, 0}, {4, 6}, DType::kF32);
      },
      ThrowsMessage<IoError>(StrEq(fmt::format(
          "safetensors: cannot read tensor 'w' of '{}': the file ends at byte {}, before "
          "the 96 bytes at offset {} (was it changed after it was opened?)",
          file.string(), size - 50, size - 96))));
}

// A run not aligned for its values (f32 two bytes past a multiple of 4: the file's layout, which
// the format allows) is read by copying, never pointed at.
TEST_F(SafetensorsBoxTest, RunsNotAlignedForTheirValuesAreNotReadInPlace) {
  const SafetensorsFile f = SafetensorsFile::open(dir_.file(
      "odd.safetensors", layout_file({{"pad", "U8", {2}, "ab"},
                                      {"w", "F32", {2, 2}, le_bytes<float>({1, 2, 3, 4})}})));
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(f.bytes("w").data()) % 4, 2U);
  const std::vector<std::int64_t> at{0, 0}, whole{2, 2}, second{1, 0}, row{1, 2};
  EXPECT_EQ(f.box_in_place("w", at, whole, DType::kF32), nullptr);
  EXPECT_EQ(f.box_in_place("w", second, row, DType::kF32), nullptr);
  EXPECT_THAT(read_box_as<float>(f, "w", at, whole, DType::kF32), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(f.box_in_place("pad", std::vector<std::int64_t>{0}, std::vector<std::int64_t>{2},
                           DType::kF32),
            nullptr)
      << "U8 is no format numesh keeps weights in: never in place";
}

// numesh's writer replaces a file whole: an open file (a model reading it in place) keeps the
// old bytes, a symlink stays a link whose target is the new file, the old file's permissions
// stay, and no temporary is left beside it.
TEST_F(SafetensorsFileTest, TheWriterReplacesAFileWholeThroughItsLinkKeepingItsMode) {
  const fs::path blob = dir_.path() / "blob", link = dir_.path() / "model.safetensors";
  const runtime::HostTensor one{{2}, {1.0f, 2.0f}}, two{{2}, {3.0f, 4.0f}};
  write_safetensors(blob, {{"w", &one, DType::kF32}});
  fs::permissions(blob, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  fs::create_symlink("blob", link);
  const SafetensorsFile before = SafetensorsFile::open(link);
  write_safetensors(link, {{"w", &two, DType::kF32}});
  EXPECT_TRUE(fs::is_symlink(link)) << "the link stays a link";
  EXPECT_THAT(read_as<float>(SafetensorsFile::open(link), "w", DType::kF32), ElementsAre(3, 4));
  EXPECT_THAT(read_as<float>(before, "w", DType::kF32), ElementsAre(1, 2))
      << "the open file keeps its bytes";
  EXPECT_EQ(fs::status(blob).permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_.path()))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ElementsAre("blob", "model.safetensors")) << "no temporary left";
  EXPECT_THAT(
      [&] {
        write_safetensors(dir_.path() / "no" / "such" / "dir.safetensors",
                          {{"w", &one, DType::kF32}});
      },
      ::testing::ThrowsMessage<IoError>(::testing::HasSubstr(
          "safetensors: cannot write '" + (dir_.path() / "no/such/dir.safetensors").string())));
}

// The writer's stream goes to the file in chunks of 8 MiB whatever its pieces (replace_file.hpp):
// tensors smaller than a chunk, straddling chunk boundaries, of exactly a chunk and of more than
// two (whose middle chunk goes to the file straight from the tensor) read back as written, and
// the file is as long as its header and tensors.
TEST_F(SafetensorsFileTest, TheWriterWritesFilesOfManyChunksWhole) {
  constexpr std::int64_t kChunkFloats = std::int64_t{2} << 20;  // 8 MiB of f32
  std::vector<runtime::HostTensor> values;
  for (const std::int64_t n : {std::int64_t{3}, kChunkFloats / 4 + 1, kChunkFloats,
                               2 * kChunkFloats + kChunkFloats / 4 + 5, std::int64_t{7}}) {
    runtime::HostTensor t = runtime::HostTensor::zeros({n});
    for (std::int64_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(i % 1000003) - 0.5f;
    values.push_back(std::move(t));
  }
  std::vector<TensorToWrite> tensors;
  std::uint64_t data_bytes = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    tensors.push_back({fmt::format("t{}", i), &values[i], DType::kF32});
    data_bytes += values[i].data.size() * sizeof(float);
  }
  const fs::path file = dir_.path() / "big.safetensors";
  write_safetensors(file, tensors);
  const SafetensorsFile f = SafetensorsFile::open(file);
  for (std::size_t i = 0; i < values.size(); ++i) {
    SCOPED_TRACE(i);
    const std::vector<float> read = read_as<float>(f, tensors[i].name, DType::kF32);
    EXPECT_TRUE(read == values[i].data);
  }
  EXPECT_GT(fs::file_size(file), data_bytes + 8);
  EXPECT_LT(fs::file_size(file), data_bytes + 8 + 1024) << "the header is under 1 KiB";
}

// A write the system refuses (here a file past the process's size limit, RLIMIT_FSIZE: EFBIG)
// is an IoError naming the file and the system's reason, and leaves no temporary behind.
TEST_F(SafetensorsFileTest, AWriteTheSystemRefusesIsIoErrorWithItsReasonAndLeavesNothing) {
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails instead
  rlimit small = before;
  small.rlim_cur = rlim_t{1} << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const runtime::HostTensor big = runtime::HostTensor::zeros({std::int64_t{3} << 20});  // 12 MiB
  const fs::path file = dir_.path() / "big.safetensors";
  std::string message;
  try {
    write_safetensors(file, {{"w", &big, DType::kF32}});
  } catch (const IoError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message, "safetensors: writing '" + file.string() + "' failed (File too large)");
  EXPECT_TRUE(fs::is_empty(dir_.path())) << "no temporary left";
}

// A file of 2 MiB or more is mapped at a multiple of 2 MiB (so that the page cache's large
// folios map whole), and its last bytes, past the last whole page, read as written.
TEST_F(SafetensorsFileTest, FilesOf2MiBOrMoreAreMappedAtAMultipleOf2MiB) {
  std::vector<float> values((std::size_t{3} << 18) + 3);  // 3 MiB and 12 bytes
  std::iota(values.begin(), values.end(), 0.0f);
  const fs::path file = dir_.file(
      "big.safetensors",
      layout_file({{"w", "F32", {static_cast<std::int64_t>(values.size())}, le_bytes(values)}}));
  const SafetensorsFile f = SafetensorsFile::open(file);
  const std::span<const std::byte> w = f.bytes("w");
  const auto start = reinterpret_cast<std::uintptr_t>(w.data()) -
                     static_cast<std::uintptr_t>(fs::file_size(file) - w.size());
  EXPECT_EQ(start % (std::uintptr_t{2} << 20), 0U);
  float last = 0;
  std::memcpy(&last, w.data() + w.size() - sizeof(float), sizeof(float));
  EXPECT_EQ(last, static_cast<float>(values.size() - 1));
}

TEST_F(SafetensorsBoxTest, ReadsBoxesOfRank4AndRank0) {
  const std::vector<std::int64_t> shape{2, 3, 2, 4};
  const std::vector<float> values = iota_f32(48);
  const SafetensorsFile f = SafetensorsFile::open(
      dir_.file("t.safetensors", layout_file({{"t", "F32", shape, le_bytes(values)},
                                              {"s", "F32", {}, le_bytes<float>({9})}})));
  for (const auto& [offsets, sizes] :
       std::vector<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>>{
           {{1, 0, 0, 0}, {1, 3, 2, 4}},  // one outer slice: a single run
           {{0, 1, 0, 0}, {2, 2, 2, 4}},  // contiguous inner dims, two outer slices
           {{0, 0, 1, 2}, {2, 3, 1, 2}},
           {{1, 2, 1, 3}, {1, 1, 1, 1}}}) {
    SCOPED_TRACE(::testing::PrintToString(offsets));
    EXPECT_EQ(read_box_as<float>(f, "t", offsets, sizes, DType::kF32),
              naive_box(values, shape, offsets, sizes));
  }
  EXPECT_THAT(read_box_as<float>(f, "s", {}, {}, DType::kF32), ElementsAre(9.0f));
}

class SafetensorsReadErrorTest : public SafetensorsFileTest {
 protected:
  void SetUp() override {
    file_ = dir_.file(
        "model.safetensors",
        layout_file({{"model.layers.0.mlp.up_proj.weight", "F32", {2, 3}, le_bytes(iota_f32(6))},
                     {"model.layers.0.mlp.down_proj.weight", "F32", {3}, le_bytes(iota_f32(3))},
                     {"model.layers.1.mlp.up_proj.weight", "F32", {1}, le_bytes(iota_f32(1))},
                     {"model.norm.weight", "F32", {1}, le_bytes(iota_f32(1))},
                     {"ids", "I64", {2}, le_bytes<std::int64_t>({1, 2})}}));
  }
  fs::path file_;
};

TEST_F(SafetensorsReadErrorTest, UnknownTensorIsKeyErrorNamingTheClosestNames) {
  const SafetensorsFile f = SafetensorsFile::open(file_);
  const std::string message =
      "safetensors: '" + file_.string() +
      "' has no tensor 'model.layers.0.mlp.up_proj.wieght'; the closest names are "
      "'model.layers.0.mlp.up_proj.weight', 'model.layers.1.mlp.up_proj.weight' and "
      "'model.layers.0.mlp.down_proj.weight'";
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { (void)f.info("model.layers.0.mlp.up_proj.wieght"); },
           [&] { (void)f.bytes("model.layers.0.mlp.up_proj.wieght"); },
           [&] {
             std::vector<float> out(6);
             f.read("model.layers.0.mlp.up_proj.wieght", DType::kF32,
                    std::as_writable_bytes(std::span(out)));
           },
           [&] {
             std::vector<float> out(1);
             const std::vector<std::int64_t> box{0, 0};
             const std::vector<std::int64_t> ones{1, 1};
             f.read_box("model.layers.0.mlp.up_proj.wieght", box, ones, DType::kF32,
                        std::as_writable_bytes(std::span(out)));
           }}) {
    EXPECT_THAT(call, ThrowsMessage<KeyError>(StrEq(message)));
  }
  try {
    (void)f.info("nope");
    FAIL() << "no exception";
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "nope");
  }
}

TEST_F(SafetensorsReadErrorTest, UnknownTensorInASmallFileSaysWhatThereIs) {
  const fs::path one =
      dir_.file("one.safetensors", layout_file({{"a", "F32", {1}, le_bytes<float>({1})}}));
  EXPECT_THAT([&] { (void)SafetensorsFile::open(one).info("b"); },
              ThrowsMessage<KeyError>(StrEq("safetensors: '" + one.string() +
                                            "' has no tensor 'b'; the closest name is 'a'")));
  const fs::path none = dir_.file("none.safetensors", file_bytes("{}"));
  EXPECT_THAT([&] { (void)SafetensorsFile::open(none).info("b"); },
              ThrowsMessage<KeyError>(StrEq("safetensors: '" + none.string() +
                                            "' has no tensor 'b'; there are no tensors")));
}

TEST_F(SafetensorsReadErrorTest, DtypesOtherThanF32Bf16F16CannotBeReadButTheirBytesCan) {
  const SafetensorsFile f = SafetensorsFile::open(file_);
  EXPECT_EQ(f.bytes("ids").size(), 16U);
  const std::string message =
      read_error(file_, "ids", "its dtype is I64; numesh reads only F32, BF16 and F16 tensors");
  for (const DType target : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> out(2);
    EXPECT_THAT([&] { f.read("ids", target, std::as_writable_bytes(std::span(out))); },
                ThrowsMessage<ValueError>(StrEq(message)));
    const std::vector<std::int64_t> offsets{0};
    const std::vector<std::int64_t> sizes{1};
    EXPECT_THAT(
        [&] { f.read_box("ids", offsets, sizes, target, std::as_writable_bytes(std::span(out))); },
        ThrowsMessage<ValueError>(StrEq(message)));
  }
}

TEST_F(SafetensorsReadErrorTest, OutputOfTheWrongSizeIsShapeError) {
  const SafetensorsFile f = SafetensorsFile::open(file_);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  std::vector<float> small(5);
  EXPECT_THAT([&] { f.read(name, DType::kF32, std::as_writable_bytes(std::span(small))); },
              ThrowsMessage<ShapeError>(StrEq(read_error(
                  file_, name, "the output has 20 bytes but 6 elements of f32 take 24"))));
  std::vector<float> large(6);  // 24 bytes: the size of 12 bf16 values, not 6
  EXPECT_THAT([&] { f.read(name, DType::kBF16, std::as_writable_bytes(std::span(large))); },
              ThrowsMessage<ShapeError>(StrEq(read_error(
                  file_, name, "the output has 24 bytes but 6 elements of bf16 take 12"))));
  const std::vector<std::int64_t> offsets{0, 1};
  const std::vector<std::int64_t> sizes{2, 2};
  EXPECT_THAT(
      [&] {
        f.read_box(name, offsets, sizes, DType::kF16, std::as_writable_bytes(std::span(large)));
      },
      ThrowsMessage<ShapeError>(
          StrEq(read_error(file_, name, "the output has 24 bytes but 4 elements of f16 take 8"))));
}

TEST_F(SafetensorsReadErrorTest, BoxOfTheWrongRankOrOutsideTheTensorIsShapeError) {
  const SafetensorsFile f = SafetensorsFile::open(file_);
  const std::string name = "model.layers.0.mlp.up_proj.weight";  // [2, 3]
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const struct {
    std::vector<std::int64_t> offsets;
    std::vector<std::int64_t> sizes;
    std::string message;
  } cases[] = {
      {{0}, {2, 3}, "the box has 1 offsets and 2 sizes but the tensor (shape [2, 3]) has rank 2"},
      {{0, 0, 0},
       {1, 1, 1},
       "the box has 3 offsets and 3 sizes but the tensor (shape [2, 3]) has rank 2"},
      {{0, 2},
       {2, 2},
       "the box at offsets [0, 2] of sizes [2, 2] is outside shape [2, 3] in dim 1 (offset 2, "
       "size 2, extent 3)"},
      {{2, 0},
       {1, 3},
       "the box at offsets [2, 0] of sizes [1, 3] is outside shape [2, 3] in dim 0 (offset 2, "
       "size 1, extent 2)"},
      {{-1, 0},
       {1, 1},
       "the box at offsets [-1, 0] of sizes [1, 1] is outside shape [2, 3] in dim 0 (offset -1, "
       "size 1, extent 2)"},
      {{0, 0},
       {1, -1},
       "the box at offsets [0, 0] of sizes [1, -1] is outside shape [2, 3] in dim 1 (offset 0, "
       "size -1, extent 3)"},
      // offset + size would overflow int64: still refused, not wrapped.
      {{0, 1},
       {1, kMax},
       "the box at offsets [0, 1] of sizes [1, 9223372036854775807] is outside shape [2, 3] in "
       "dim 1 (offset 1, size 9223372036854775807, extent 3)"},
      {{kMax, 0},
       {1, 1},
       "the box at offsets [9223372036854775807, 0] of sizes [1, 1] is outside shape [2, 3] in "
       "dim 0 (offset 9223372036854775807, size 1, extent 2)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    std::vector<float> out(6);
    EXPECT_THAT(
        [&] {
          f.read_box(name, c.offsets, c.sizes, DType::kF32, std::as_writable_bytes(std::span(out)));
        },
        ThrowsMessage<ShapeError>(StrEq(read_error(file_, name, c.message))));
  }
}

class SafetensorsOpenErrorTest : public SafetensorsFileTest {
 protected:
  /// Expects open() of a file holding `bytes` to throw E with "<where>: <message>".
  template <typename E>
  void expect_fails(std::string_view bytes, std::string_view message) {
    const fs::path file = dir_.file("bad.safetensors", bytes);
    EXPECT_THAT([&] { (void)SafetensorsFile::open(file); },
                ThrowsMessage<E>(StrEq(open_error(file, message))));
  }
};

TEST_F(SafetensorsOpenErrorTest, MissingFileAndDirectoryAreIoErrors) {
  const fs::path missing = dir_.path() / "absent.safetensors";
  EXPECT_THAT([&] { (void)SafetensorsFile::open(missing); },
              ThrowsMessage<IoError>(StrEq(open_error(missing, "No such file or directory"))));
  EXPECT_THAT([&] { (void)SafetensorsFile::open(dir_.path()); },
              ThrowsMessage<IoError>(StrEq(open_error(dir_.path(), "it is a directory"))));
}

TEST_F(SafetensorsOpenErrorTest, FileShorterThanTheHeaderLengthIsIoError) {
  expect_fails<IoError>("",
                        "file ends early: it has 0 bytes, fewer than the 8 of the header length");
  expect_fails<IoError>(std::string("\x02\0\0\0\0", 5),
                        "file ends early: it has 5 bytes, fewer than the 8 of the header length");
}

TEST_F(SafetensorsOpenErrorTest, HeaderLengthPastTheEndOfTheFileIsIoError) {
  std::string bytes = file_bytes(std::string(100, ' '));
  bytes.resize(18);  // the length says 100, 10 bytes follow
  expect_fails<IoError>(bytes,
                        "file ends early: the header length is 100 bytes but 10 follow it (18 "
                        "bytes in all)");
  // The limit itself is allowed; only the file size stops this one.
  expect_fails<IoError>(std::string("\x00\xE1\xF5\x05\0\0\0\0", 8),  // 100,000,000
                        "file ends early: the header length is 100000000 bytes but 0 follow it "
                        "(8 bytes in all)");
}

TEST_F(SafetensorsOpenErrorTest, HeaderLengthAboveTheLimitIsValueError) {
  expect_fails<ValueError>(std::string("\x01\xE1\xF5\x05\0\0\0\0{}", 10),  // 100,000,001
                           "header length 100000001 is above the limit of 100000000 bytes; the "
                           "file is corrupt or not a safetensors file");
  expect_fails<ValueError>(std::string(8, '\xFF'),
                           "header length 18446744073709551615 is above the limit of 100000000 "
                           "bytes; the file is corrupt or not a safetensors file");
  // A PyTorch .bin is a zip: its first 8 bytes read as a huge length.
  expect_fails<ValueError>(std::string("PK\x03\x04\0\0\x08\x08rest of a zip", 21),
                           "header length 578712552184433488 is above the limit of 100000000 "
                           "bytes; the file is corrupt or not a safetensors file");
}

TEST_F(SafetensorsOpenErrorTest, HeaderThatIsNotUtf8IsValueError) {
  const struct {
    std::string header;
    const char* message;
  } cases[] = {
      {"{\"w\xFF\": 1}", "the header is not valid UTF-8 (byte 0xff at offset 3)"},
      {"{\"w\xC0\x80\": 1}", "the header is not valid UTF-8 (byte 0xc0 at offset 3)"},  // overlong
      {"{\"w\xED\xA0\x80\": 1}",  // a UTF-16 surrogate
       "the header is not valid UTF-8 (byte 0xa0 at offset 4)"},
      {"{\"w\xF4\x90\x80\x80\": 1}",  // above U+10FFFF
       "the header is not valid UTF-8 (byte 0x90 at offset 4)"},
      {"{\"w\xE2\x82\": 1}", "the header is not valid UTF-8 (byte 0x22 at offset 5)"},  // cut short
      {"{\"w\": 1}\xE2\x82", "the header is not valid UTF-8 (it ends inside a character)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    expect_fails<ValueError>(file_bytes(c.header), c.message);
  }
}

TEST_F(SafetensorsOpenErrorTest, HeaderThatIsNotAJsonObjectIsValueError) {
  const std::string not_object = "the header does not start with '{' (it must be a JSON object)";
  expect_fails<ValueError>(file_bytes(""), not_object);
  expect_fails<ValueError>(file_bytes("[]"), not_object);
  expect_fails<ValueError>(file_bytes(" {}"), not_object);  // the format requires '{' first
  expect_fails<ValueError>(file_bytes("\"w\""), not_object);
  expect_fails<ValueError>(
      file_bytes(R"({"w": })"),
      "the header is not valid JSON: parse error at line 1, column 7: syntax error while parsing "
      "value - unexpected '}'; expected '[', '{', or a literal");
  expect_fails<ValueError>(
      file_bytes(R"({"w": {}} x)"),
      "the header is not valid JSON: parse error at line 1, column 11: syntax error while "
      "parsing value - invalid literal; last read: '\"w\": {}} x'; expected end of input");
  expect_fails<ValueError>(
      file_bytes("{\"w\": {}"),
      "the header is not valid JSON: parse error at line 1, column 9: syntax error while parsing "
      "object - unexpected end of input; expected '}'");
  // A number beyond double (nlohmann's out_of_range, which once escaped as its own type: found
  // by safetensors_index_fuzz).
  expect_fails<ValueError>(file_bytes(R"({"w": 1E724})"),
                           "the header is not valid JSON: number overflow parsing '1E724'");
}

TEST_F(SafetensorsOpenErrorTest, KeysThatAppearTwiceAreValueError) {
  expect_fails<ValueError>(
      file_bytes(R"({"w": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},)"
                 R"( "w": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]}})",
                 std::string(8, '\0')),
      "the header has key 'w' twice");
  expect_fails<ValueError>(
      file_bytes(R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [], "data_offsets": [0, 4]}})",
                 std::string(4, '\0')),
      "the header has key 'dtype' twice in the object of 'w'");
  expect_fails<ValueError>(file_bytes(R"({"__metadata__": {"a": "1", "a": "2"}})"),
                           "the header has key 'a' twice in the object of '__metadata__'");
}

TEST_F(SafetensorsOpenErrorTest, HeaderNestedTooDeeplyIsValueError) {
  expect_fails<ValueError>(
      file_bytes("{\"w\": " + std::string(40, '[') + std::string(40, ']') + "}"),
      "the header nests deeper than 32 levels");
}

TEST_F(SafetensorsOpenErrorTest, MalformedEntriesAreValueErrorsNamingTheTensorAndValue) {
  const std::string kDtypes =
      "(BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64, F8_E4M3, F8_E5M2, "
      "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2)";
  const struct {
    std::string entry;  // the value of tensor "w"; the buffer is 8 bytes
    std::string message;
  } cases[] = {
      {"3", "the entry of tensor 'w' is 3, not an object with dtype, shape and data_offsets"},
      {"[]", "the entry of tensor 'w' is [], not an object with dtype, shape and data_offsets"},
      {R"({"shape": [2], "data_offsets": [0, 8]})", "the entry of tensor 'w' has no dtype"},
      {R"({"dtype": "F32", "data_offsets": [0, 8]})", "the entry of tensor 'w' has no shape"},
      {R"({"dtype": "F32", "shape": [2]})", "the entry of tensor 'w' has no data_offsets"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "strides": [1]})",
       "the entry of tensor 'w' has an unknown key 'strides' (an entry has exactly dtype, shape "
       "and data_offsets)"},
      {R"({"dtype": 32, "shape": [2], "data_offsets": [0, 8]})",
       "dtype 32 of tensor 'w' is not a string"},
      {R"({"dtype": "F128", "shape": [2], "data_offsets": [0, 8]})",
       "dtype 'F128' of tensor 'w' is not a safetensors dtype " + kDtypes},
      {R"({"dtype": "f32", "shape": [2], "data_offsets": [0, 8]})",
       "dtype 'f32' of tensor 'w' is not a safetensors dtype " + kDtypes},
      {R"({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]})",
       "shape \"2\" of tensor 'w' is not an array of non-negative integers"},
      {R"({"dtype": "F32", "shape": {"0": 2}, "data_offsets": [0, 8]})",
       "shape {\"0\":2} of tensor 'w' is not an array of non-negative integers"},
      {R"({"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]})",
       "shape [2,-1] of tensor 'w' has the entry -1, which is not a non-negative integer"},
      {R"({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]})",
       "shape [2.0] of tensor 'w' has the entry 2.0, which is not a non-negative integer"},
      {R"({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]})",
       "shape [\"2\"] of tensor 'w' has the entry \"2\", which is not a non-negative integer"},
      {R"({"dtype": "F32", "shape": [null], "data_offsets": [0, 8]})",
       "shape [null] of tensor 'w' has the entry null, which is not a non-negative integer"},
      {R"({"dtype": "F32", "shape": [9223372036854775808, 0], "data_offsets": [0, 0]})",
       "shape [9223372036854775808,0] of tensor 'w' has the entry 9223372036854775808, larger "
       "than 2^63 - 1"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})",
       "data_offsets [0] of tensor 'w' are not two non-negative integers [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]})",
       "data_offsets [0,8,8] of tensor 'w' are not two non-negative integers [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [-1, 8]})",
       "data_offsets [-1,8] of tensor 'w' are not two non-negative integers [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]})",
       "data_offsets [0,8.0] of tensor 'w' are not two non-negative integers [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551616]})",
       "data_offsets [0,1.8446744073709552e+19] of tensor 'w' are not two non-negative integers "
       "[begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": "0-8"})",
       "data_offsets \"0-8\" of tensor 'w' are not two non-negative integers [begin, end]"},
      {R"({"dtype": "F32", "shape": [0], "data_offsets": [8, 0]})",
       "data_offsets [8, 0] of tensor 'w' end before they begin"},
      {R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})",
       "tensor 'w' of dtype F32 and shape [3] needs 12 bytes but its data_offsets [0, 8] hold 8"},
      {R"({"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]})",
       "tensor 'w' of dtype BF16 and shape [2, 3] needs 12 bytes but its data_offsets [0, 8] "
       "hold 8"},
      {R"({"dtype": "F32", "shape": [], "data_offsets": [0, 8]})",
       "tensor 'w' of dtype F32 and shape [] needs 4 bytes but its data_offsets [0, 8] hold 8"},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})",
       "shape [4294967296, 4294967296] of tensor 'w' is too large: its size overflows 64 bits"},
      // The crate multiplies dim by dim, so an overflow before a zero extent is refused too.
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]})",
       "shape [4294967296, 4294967296, 0] of tensor 'w' is too large: its size overflows 64 bits"},
      {R"({"dtype": "F32", "shape": [576460752303423488], "data_offsets": [0, 8]})",  // 2^59 * 32
       "shape [576460752303423488] of tensor 'w' is too large: its size overflows 64 bits"},
      {R"({"dtype": "F4", "shape": [3], "data_offsets": [0, 8]})",
       "tensor 'w' of dtype F4 and shape [3] has 12 bits, not a whole number of bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.entry);
    expect_fails<ValueError>(file_bytes("{\"w\": " + c.entry + "}", std::string(8, '\0')),
                             c.message);
  }
}

TEST_F(SafetensorsOpenErrorTest, MetadataThatIsNotStringsIsValueError) {
  expect_fails<ValueError>(file_bytes(R"({"__metadata__": 3})"),
                           "__metadata__ is 3, not an object of strings");
  expect_fails<ValueError>(file_bytes(R"({"__metadata__": ["a"]})"),
                           "__metadata__ is [\"a\"], not an object of strings");
  expect_fails<ValueError>(file_bytes(R"({"__metadata__": {"ok": "x", "n": 1}})"),
                           "__metadata__ entry 'n' is 1, not a string");
  expect_fails<ValueError>(file_bytes(R"({"__metadata__": {"nested": {"a": "b"}}})"),
                           "__metadata__ entry 'nested' is {\"a\":\"b\"}, not a string");
}

TEST_F(SafetensorsOpenErrorTest, TensorEndingPastTheBufferIsIoError) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  expect_fails<IoError>(file_bytes(header, std::string(8, '\0')),
                        "file ends early: tensor 'w' ends at byte 16 of the data buffer, which "
                        "has 8 bytes (the file has 78, the buffer starts at byte 70)");
}

TEST_F(SafetensorsOpenErrorTest, SpansThatOverlapOrLeaveGapsAreValueError) {
  const auto entry = [](std::string_view name, std::string_view shape, int begin, int end) {
    return "\"" + std::string(name) + "\": {\"dtype\": \"F32\", \"shape\": " + std::string(shape) +
           ", \"data_offsets\": [" + std::to_string(begin) + ", " + std::to_string(end) + "]}";
  };
  const struct {
    std::string header;
    std::size_t buffer;
    std::string message;
  } cases[] = {
      {"{" + entry("a", "[2]", 0, 8) + ", " + entry("b", "[2]", 4, 12) + "}", 12,
       "data_offsets [4, 12] of tensor 'b' overlap tensor 'a' (data_offsets [0, 8])"},
      {"{" + entry("b", "[2]", 0, 8) + ", " + entry("a", "[2]", 0, 8) + "}", 8,
       "data_offsets [0, 8] of tensor 'b' overlap tensor 'a' (data_offsets [0, 8])"},
      {"{" + entry("a", "[2]", 0, 8) + ", " + entry("e", "[0]", 4, 4) + "}", 8,
       "data_offsets [4, 4] of tensor 'e' lie inside tensor 'a' (data_offsets [0, 8]); the "
       "tensors must follow each other in the buffer"},
      {"{" + entry("a", "[2]", 4, 12) + "}", 12,
       "bytes [0, 4) of the data buffer belong to no tensor (before tensor 'a'); the tensors must "
       "cover the buffer without gaps"},
      {"{" + entry("a", "[2]", 0, 8) + ", " + entry("b", "[2]", 12, 20) + "}", 20,
       "bytes [8, 12) of the data buffer belong to no tensor (between tensor 'a' and tensor "
       "'b'); the tensors must cover the buffer without gaps"},
      {"{" + entry("a", "[2]", 0, 8) + "}", 12,
       "bytes [8, 12) of the data buffer belong to no tensor (after tensor 'a'); the tensors "
       "must cover the buffer to its end"},
      {"{}", 4,
       "bytes [0, 4) of the data buffer belong to no tensor (the header lists no tensors); the "
       "tensors must cover the buffer to its end"},
      {"{" + entry("e", "[0]", 0, 0) + "}", 4,
       "bytes [0, 4) of the data buffer belong to no tensor (the tensors hold no bytes); the "
       "tensors must cover the buffer to its end"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    expect_fails<ValueError>(file_bytes(c.header, std::string(c.buffer, '\0')), c.message);
  }
}

}  // namespace
}  // namespace numesh::models
