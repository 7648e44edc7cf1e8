#include "numesh/models/formats/gguf.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/tensor.hpp"
#include "safetensors_writer.hpp"

// GGUF files are written byte by byte here (a little-endian writer of the format's fields), so
// that each test states exactly what is on disk: a well-formed file, or one broken rule. The
// helpers live in their own namespace: the test executable is a unity build, and the
// safetensors tests beside these have helpers of the same kind.
namespace numesh::models::gguf_tests {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using testing::ScratchDir;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// ---- The writer -------------------------------------------------------------------------------

/// The little-endian bytes of `value`.
template <typename T>
std::string le(T value) {
  static_assert(std::endian::native == std::endian::little);
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

/// A GGUF string: its u64 length, then its bytes.
std::string str(std::string_view text) {
  return le<std::uint64_t>(text.size()) + std::string(text);
}

std::string type_of(GgufValueType type) { return le(static_cast<std::uint32_t>(type)); }

constexpr std::uint32_t id(GgufType type) { return static_cast<std::uint32_t>(type); }

/// The 24-byte fixed header.
std::string fixed_header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
  return "GGUF" + le(version) + le(n_tensors) + le(n_kv);
}

/// A key-value pair: the key, the value type, the value's bytes.
std::string kv(std::string_view key, GgufValueType type, std::string_view value) {
  return str(key) + type_of(type) + std::string(value);
}

template <typename T>
std::string kv_scalar(std::string_view key, GgufValueType type, T value) {
  return kv(key, type, le(value));
}

std::string kv_string(std::string_view key, std::string_view value) {
  return kv(key, GgufValueType::kString, str(value));
}

template <typename T>
std::string kv_array(std::string_view key, GgufValueType element, const std::vector<T>& values) {
  std::string body = type_of(element) + le<std::uint64_t>(values.size());
  for (const T& v : values) body += le(v);
  return kv(key, GgufValueType::kArray, body);
}

std::string kv_strings(std::string_view key, const std::vector<std::string>& values) {
  std::string body = type_of(GgufValueType::kString) + le<std::uint64_t>(values.size());
  for (const std::string& v : values) body += str(v);
  return kv(key, GgufValueType::kArray, body);
}

/// One tensor of a file built by gguf_file(): its info and its stored bytes.
struct StoredTensor {
  std::string name;
  std::uint32_t type;            // a GGML type id (id(GgufType::kF32), or any number)
  std::vector<std::int64_t> ne;  // innermost first, as stored
  std::string data;              // the stored bytes
  std::optional<std::uint64_t> offset = std::nullopt;  // the layout's, unless given
};

std::uint64_t round_up(std::uint64_t x, std::uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

std::string tensor_info(const StoredTensor& t, std::uint64_t offset) {
  std::string out = str(t.name) + le(static_cast<std::uint32_t>(t.ne.size()));
  for (const std::int64_t e : t.ne) out += le(e);
  return out + le(t.type) + le(offset);
}

/// A file as GGML writes one: the fixed header, `kvs` (encoded pairs), the tensor infos with
/// offsets laid out back to back each padded to `alignment` (unless a tensor gives its own),
/// zeros up to the alignment (when there are tensors), then each tensor's bytes, padded.
std::string gguf_file(const std::vector<std::string>& kvs, const std::vector<StoredTensor>& tensors,
                      std::uint64_t alignment = 32, std::uint32_t version = 3) {
  std::string out = fixed_header(tensors.size(), kvs.size(), version);
  for (const std::string& pair : kvs) out += pair;
  std::uint64_t offset = 0;
  for (const StoredTensor& t : tensors) {
    out += tensor_info(t, t.offset.value_or(offset));
    offset += round_up(t.data.size(), alignment);
  }
  if (tensors.empty()) return out;
  out.resize(round_up(out.size(), alignment), '\0');
  for (const StoredTensor& t : tensors) {
    out += t.data;
    out.resize(round_up(out.size(), alignment), '\0');
  }
  return out;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// ---- Reading helpers ----------------------------------------------------------------------------

/// Tensor `name` read as `target`, as elements of T (float for values, uint16_t for 16-bit bits).
template <typename T>
std::vector<T> gguf_read(const GgufFile& file, std::string_view name, DType target) {
  std::vector<T> out(static_cast<std::size_t>(file.info(name).num_elements()));
  file.read(name, target, std::as_writable_bytes(std::span(out)));
  return out;
}

/// A box read with read_box as `target`, as elements of T.
template <typename T>
std::vector<T> gguf_read_box(const GgufFile& file, std::string_view name,
                             const std::vector<std::int64_t>& offsets,
                             const std::vector<std::int64_t>& sizes, DType target) {
  const std::int64_t n =
      std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1}, std::multiplies<>());
  std::vector<T> out(static_cast<std::size_t>(n));
  file.read_box(name, offsets, sizes, target, std::as_writable_bytes(std::span(out)));
  return out;
}

/// A box read as the raw bytes of `target` (a block format).
std::string gguf_read_box_bytes(const GgufFile& file, std::string_view name,
                                const std::vector<std::int64_t>& offsets,
                                const std::vector<std::int64_t>& sizes, DType target) {
  std::string out(static_cast<std::size_t>(runtime::storage_bytes(target, sizes)), '\0');
  file.read_box(name, offsets, sizes, target,
                std::as_writable_bytes(std::span(out.data(), out.size())));
  return out;
}

/// The rows [r0, r0 + rows) and columns [c0, c0 + cols) of a row-major matrix with `width`
/// columns.
template <typename T>
std::vector<T> submatrix(const std::vector<T>& values, std::size_t width, std::size_t r0,
                         std::size_t rows, std::size_t c0, std::size_t cols) {
  std::vector<T> out;
  for (std::size_t r = r0; r < r0 + rows; ++r) {
    for (std::size_t c = c0; c < c0 + cols; ++c) out.push_back(values[r * width + c]);
  }
  return out;
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> out;
  for (const float x : values) out.push_back(std::bit_cast<std::uint32_t>(x));
  return out;
}

std::string open_error(const fs::path& file, std::string_view what) {
  return "gguf: cannot open '" + file.string() + "': " + std::string(what);
}

std::string read_error(const fs::path& file, std::string_view tensor, std::string_view what) {
  return "gguf: cannot read tensor '" + std::string(tensor) + "' of '" + file.string() +
         "': " + std::string(what);
}

std::string key_error(const fs::path& file, std::string_view key, std::string_view what) {
  return "gguf: cannot read key '" + std::string(key) + "' of '" + file.string() +
         "': " + std::string(what);
}

// ---- Types --------------------------------------------------------------------------------------

TEST(GgufTypeTest, EveryGgmlTypeHasItsIdNameAndBlock) {
  const struct {
    std::uint32_t id;
    std::string_view name;
    std::int64_t elements;
    std::int64_t bytes;
  } types[] = {
      {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
      {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
      {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
      {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
      {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
      {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
      {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
      {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
      {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
      {41, "Q1_0", 128, 18},    {42, "Q2_0", 64, 18},
  };
  for (const auto& t : types) {
    SCOPED_TRACE(t.name);
    const std::optional<GgufType> type = find_gguf_type(t.id);
    ASSERT_TRUE(type.has_value());
    EXPECT_EQ(static_cast<std::uint32_t>(*type), t.id);
    EXPECT_EQ(to_string(*type), t.name);
    EXPECT_EQ(block_elements(*type), t.elements);
    EXPECT_EQ(block_bytes(*type), t.bytes);
  }
  // Removed from GGML (4, 5, 31 to 33, 36 to 38) and never defined (43 on).
  for (const std::uint32_t removed :
       {4U, 5U, 31U, 32U, 33U, 36U, 37U, 38U, 43U, 99U, 0xFFFFFFFFU}) {
    EXPECT_FALSE(find_gguf_type(removed).has_value()) << removed;
  }
}

TEST(GgufTypeTest, NumeshFormatsMapBothWays) {
  EXPECT_EQ(to_numesh_dtype(GgufType::kF32), DType::kF32);
  EXPECT_EQ(to_numesh_dtype(GgufType::kF16), DType::kF16);
  EXPECT_EQ(to_numesh_dtype(GgufType::kBF16), DType::kBF16);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ8_0), DType::kQ8_0);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ4_0), DType::kQ4_0);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ5_0), DType::kQ5_0);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ3_K), DType::kQ3_K);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ4_K), DType::kQ4_K);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ5_K), DType::kQ5_K);
  EXPECT_EQ(to_numesh_dtype(GgufType::kQ6_K), DType::kQ6_K);
  for (const GgufType other :
       {GgufType::kQ4_1, GgufType::kQ2_K, GgufType::kQ8_K, GgufType::kF64, GgufType::kI8,
        GgufType::kI32, GgufType::kIQ2_XXS, GgufType::kMXFP4}) {
    EXPECT_FALSE(to_numesh_dtype(other).has_value()) << to_string(other);
  }
  // Every numesh format has the GGUF type of its bytes, and back.
  for (const DTypeTraits& f : kDTypes) {
    SCOPED_TRACE(f.name);
    const std::optional<GgufType> type = to_gguf_type(f.dtype);
    ASSERT_TRUE(type.has_value());
    EXPECT_EQ(to_numesh_dtype(*type), f.dtype);
    EXPECT_EQ(block_elements(*type), f.block_elements);
    EXPECT_EQ(block_bytes(*type), f.block_bytes);
  }
}

TEST(GgufTypeTest, ValueTypesAreNamedAsTheSpecification) {
  const std::vector<std::string_view> names{"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                            "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                            "UINT64", "INT64",   "FLOAT64"};
  for (std::uint32_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(to_string(static_cast<GgufValueType>(i)), names[i]);
  }
}

// ---- Metadata -----------------------------------------------------------------------------------

class GgufFileTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
};

/// A file with a key of every value type, scalar and array, and no tensors.
std::string metadata_file() {
  using T = GgufValueType;
  return gguf_file(
      {
          kv_scalar("u8", T::kUint8, std::uint8_t{200}),
          kv_scalar("i8", T::kInt8, std::int8_t{-5}),
          kv_scalar("u16", T::kUint16, std::uint16_t{60000}),
          kv_scalar("i16", T::kInt16, std::int16_t{-300}),
          kv_scalar("u32", T::kUint32, std::uint32_t{4000000000}),
          kv_scalar("i32", T::kInt32, std::int32_t{-70000}),
          kv_scalar("f32", T::kFloat32, 0.1f),
          kv_scalar("bool_true", T::kBool, std::uint8_t{1}),
          kv_scalar("bool_two", T::kBool, std::uint8_t{2}),
          kv_scalar("bool_false", T::kBool, std::uint8_t{0}),
          kv_string("str", "llama"),
          kv_scalar("u64", T::kUint64, std::uint64_t{1} << 40),
          kv_scalar("i64", T::kInt64, -(std::int64_t{1} << 40)),
          kv_scalar("f64", T::kFloat64, 0.1),
          kv_scalar("u64_max", T::kUint64, kU64Max),
          kv_array("a_u8", T::kUint8, std::vector<std::uint8_t>{1, 2, 255}),
          kv_array("a_i8", T::kInt8, std::vector<std::int8_t>{-1, 127}),
          kv_array("a_u16", T::kUint16, std::vector<std::uint16_t>{1, 65535}),
          kv_array("a_i16", T::kInt16, std::vector<std::int16_t>{-32768, 5}),
          kv_array("a_u32", T::kUint32, std::vector<std::uint32_t>{7, 4294967295U}),
          kv_array("a_i32", T::kInt32, std::vector<std::int32_t>{-1, 2}),
          kv_array("a_f32", T::kFloat32, std::vector<float>{0.5f, -1.25f, 0.1f}),
          kv_array("a_bool", T::kBool, std::vector<std::uint8_t>{1, 0}),
          kv_strings("a_str", {"<s>", "", "caf\xC3\xA9"}),
          kv_array("a_u64", T::kUint64, std::vector<std::uint64_t>{0, 9223372036854775807ULL}),
          kv_array("a_i64", T::kInt64,
                   std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 3}),
          kv_array("a_f64", T::kFloat64, std::vector<double>{0.1, 1e-3}),
          kv_array("a_empty", T::kInt32, std::vector<std::int32_t>{}),
          kv_array("a_u64_big", T::kUint64, std::vector<std::uint64_t>{1, 1ULL << 63}),
      },
      {});
}

TEST_F(GgufFileTest, ReadsEveryValueTypeScalarAndArray) {
  const std::string bytes = metadata_file();
  const fs::path file = dir_.file("meta.gguf", bytes);
  const GgufFile f = GgufFile::open(file);
  EXPECT_EQ(f.path(), file);
  EXPECT_EQ(f.version(), 3U);
  EXPECT_EQ(f.alignment(), 32U);
  EXPECT_THAT(f.tensors(), IsEmpty());
  EXPECT_THAT(f.names(), IsEmpty());
  // No tensors: the data section starts where the metadata ends, unpadded (as in GGML).
  EXPECT_EQ(f.data_offset(), bytes.size());
  EXPECT_THAT(f.keys(),
              ElementsAre("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool_true", "bool_two",
                          "bool_false", "str", "u64", "i64", "f64", "u64_max", "a_u8", "a_i8",
                          "a_u16", "a_i16", "a_u32", "a_i32", "a_f32", "a_bool", "a_str", "a_u64",
                          "a_i64", "a_f64", "a_empty", "a_u64_big"));

  // The values themselves.
  const GgufValue* u8 = f.find("u8");
  ASSERT_NE(u8, nullptr);
  EXPECT_EQ(u8->type(), GgufValueType::kUint8);
  EXPECT_EQ(u8->element_type(), GgufValueType::kUint8);
  EXPECT_FALSE(u8->is_array());
  EXPECT_EQ(u8->size(), 1U);
  EXPECT_EQ(u8->at(0), GgufValue::Element(std::uint64_t{200}));
  const GgufValue* strings = f.find("a_str");
  ASSERT_NE(strings, nullptr);
  EXPECT_EQ(strings->type(), GgufValueType::kArray);
  EXPECT_EQ(strings->element_type(), GgufValueType::kString);
  EXPECT_TRUE(strings->is_array());
  EXPECT_EQ(strings->size(), 3U);
  EXPECT_EQ(strings->at(2), GgufValue::Element(std::string_view("caf\xC3\xA9")));
  EXPECT_EQ(f.find("i16")->at(0), GgufValue::Element(std::int64_t{-300}));
  EXPECT_EQ(f.find("f32")->at(0), GgufValue::Element(double{0.1f}));
  EXPECT_EQ(f.find("bool_two")->at(0), GgufValue::Element(true));
  EXPECT_EQ(f.find("a_f64")->at(1), GgufValue::Element(1e-3));
  EXPECT_EQ(f.find("a_empty")->size(), 0U);
  EXPECT_EQ(f.find("a_empty")->type(), GgufValueType::kArray);
  EXPECT_EQ(f.find("nope"), nullptr);

  // Integers of every width and signedness, through get_int.
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -5);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -300);
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i32"), -70000);
  EXPECT_EQ(f.get_int("u64"), std::int64_t{1} << 40);
  EXPECT_EQ(f.get_int("i64"), -(std::int64_t{1} << 40));
  // Floats exactly, and integers as floats.
  EXPECT_EQ(f.get_float("f32"), double{0.1f});
  EXPECT_EQ(f.get_float("f64"), 0.1);
  EXPECT_EQ(f.get_float("u8"), 200.0);
  EXPECT_EQ(f.get_float("i64"), -1099511627776.0);
  EXPECT_EQ(f.get_float("u64_max"), 18446744073709551616.0);
  // BOOL: any non-zero byte is true.
  EXPECT_EQ(f.get_bool("bool_true"), true);
  EXPECT_EQ(f.get_bool("bool_two"), true);
  EXPECT_EQ(f.get_bool("bool_false"), false);
  EXPECT_EQ(f.get_string("str"), "llama");
  // Arrays.
  EXPECT_THAT(f.get_strings("a_str").value(), ElementsAre("<s>", "", "caf\xC3\xA9"));
  EXPECT_THAT(f.get_floats("a_f32").value(), ElementsAre(0.5f, -1.25f, 0.1f));
  EXPECT_THAT(f.get_floats("a_f64").value(), ElementsAre(0.1f, 1e-3f));
  EXPECT_THAT(f.get_floats("a_u8").value(), ElementsAre(1.0f, 2.0f, 255.0f));
  EXPECT_THAT(f.get_floats("a_i16").value(), ElementsAre(-32768.0f, 5.0f));
  EXPECT_THAT(f.get_floats("a_empty").value(), IsEmpty());
  EXPECT_THAT(f.get_ints("a_u8").value(), ElementsAre(1, 2, 255));
  EXPECT_THAT(f.get_ints("a_i8").value(), ElementsAre(-1, 127));
  EXPECT_THAT(f.get_ints("a_u16").value(), ElementsAre(1, 65535));
  EXPECT_THAT(f.get_ints("a_i16").value(), ElementsAre(-32768, 5));
  EXPECT_THAT(f.get_ints("a_u32").value(), ElementsAre(7, 4294967295));
  EXPECT_THAT(f.get_ints("a_i32").value(), ElementsAre(-1, 2));
  EXPECT_THAT(f.get_ints("a_u64").value(), ElementsAre(0, 9223372036854775807));
  EXPECT_THAT(f.get_ints("a_i64").value(),
              ElementsAre(std::numeric_limits<std::int64_t>::min(), 3));
  EXPECT_THAT(f.get_ints("a_empty").value(), IsEmpty());

  // An absent key is nullopt for every getter.
  EXPECT_FALSE(f.get_int("nope").has_value());
  EXPECT_FALSE(f.get_float("nope").has_value());
  EXPECT_FALSE(f.get_bool("nope").has_value());
  EXPECT_FALSE(f.get_string("nope").has_value());
  EXPECT_FALSE(f.get_strings("nope").has_value());
  EXPECT_FALSE(f.get_floats("nope").has_value());
  EXPECT_FALSE(f.get_ints("nope").has_value());
}

TEST_F(GgufFileTest, GettersRefuseOtherKindsNamingTheKeyAndItsType) {
  const fs::path file = dir_.file("meta.gguf", metadata_file());
  const GgufFile f = GgufFile::open(file);
  const struct {
    std::function<void()> call;
    std::string key;
    std::string message;
  } cases[] = {
      {[&] { (void)f.get_int("str"); }, "str", "it is STRING, not an integer"},
      {[&] { (void)f.get_int("f32"); }, "f32", "it is FLOAT32, not an integer"},
      {[&] { (void)f.get_int("bool_true"); }, "bool_true", "it is BOOL, not an integer"},
      {[&] { (void)f.get_int("a_u32"); }, "a_u32",
       "it is ARRAY of UINT32 (2 elements), not an integer"},
      {[&] { (void)f.get_int("u64_max"); }, "u64_max",
       "its value 18446744073709551615 (UINT64) is above 2^63 - 1, the largest integer numesh "
       "reads"},
      {[&] { (void)f.get_float("str"); }, "str",
       "it is STRING, not a number (FLOAT32, FLOAT64 or an integer)"},
      {[&] { (void)f.get_float("bool_false"); }, "bool_false",
       "it is BOOL, not a number (FLOAT32, FLOAT64 or an integer)"},
      {[&] { (void)f.get_float("a_f32"); }, "a_f32",
       "it is ARRAY of FLOAT32 (3 elements), not a number (FLOAT32, FLOAT64 or an integer)"},
      {[&] { (void)f.get_bool("u8"); }, "u8", "it is UINT8, not BOOL"},
      {[&] { (void)f.get_bool("a_bool"); }, "a_bool", "it is ARRAY of BOOL (2 elements), not BOOL"},
      {[&] { (void)f.get_string("a_str"); }, "a_str",
       "it is ARRAY of STRING (3 elements), not STRING"},
      {[&] { (void)f.get_string("i32"); }, "i32", "it is INT32, not STRING"},
      {[&] { (void)f.get_strings("str"); }, "str", "it is STRING, not an ARRAY of STRING"},
      {[&] { (void)f.get_strings("a_empty"); }, "a_empty",
       "it is ARRAY of INT32 (0 elements), not an ARRAY of STRING"},
      {[&] { (void)f.get_floats("f32"); }, "f32",
       "it is FLOAT32, not an ARRAY of numbers (FLOAT32, FLOAT64 or integers)"},
      {[&] { (void)f.get_floats("a_str"); }, "a_str",
       "it is ARRAY of STRING (3 elements), not an ARRAY of numbers (FLOAT32, FLOAT64 or "
       "integers)"},
      {[&] { (void)f.get_floats("a_bool"); }, "a_bool",
       "it is ARRAY of BOOL (2 elements), not an ARRAY of numbers (FLOAT32, FLOAT64 or "
       "integers)"},
      {[&] { (void)f.get_ints("a_f32"); }, "a_f32",
       "it is ARRAY of FLOAT32 (3 elements), not an ARRAY of integers"},
      {[&] { (void)f.get_ints("i64"); }, "i64", "it is INT64, not an ARRAY of integers"},
      {[&] { (void)f.get_ints("a_u64_big"); }, "a_u64_big",
       "its element 1, 9223372036854775808 (UINT64), is above 2^63 - 1, the largest integer "
       "numesh reads"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(c.call, ThrowsMessage<ValueError>(StrEq(key_error(file, c.key, c.message))));
  }
}

TEST_F(GgufFileTest, AVocabularyOf150000StringsReadsBack) {
  std::vector<std::string> vocabulary;
  for (int i = 0; i < 150000; ++i) vocabulary.push_back("tok" + std::to_string(i));
  const fs::path file =
      dir_.file("vocab.gguf", gguf_file({kv_strings("tokenizer.ggml.tokens", vocabulary),
                                         kv_array("tokenizer.ggml.scores", GgufValueType::kFloat32,
                                                  std::vector<float>(150000, -1.5f))},
                                        {}));
  const GgufFile f = GgufFile::open(file);
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->size(), 150000U);
  EXPECT_EQ(tokens->at(149999), GgufValue::Element(std::string_view("tok149999")));
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens"), vocabulary);
  EXPECT_EQ(f.get_floats("tokenizer.ggml.scores")->size(), 150000U);
}

TEST_F(GgufFileTest, Version2OpensAsVersion3) {
  const GgufFile f = GgufFile::open(dir_.file(
      "v2.gguf", gguf_file({kv_string("general.architecture", "llama")},
                           {{"w", id(GgufType::kF32), {2}, raw(std::vector<float>{1, 2})}}, 32,
                           /*version=*/2)));
  EXPECT_EQ(f.version(), 2U);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_THAT(gguf_read<float>(f, "w", DType::kF32), ElementsAre(1.0f, 2.0f));
}

// ---- Tensors ------------------------------------------------------------------------------------

TEST_F(GgufFileTest, ReadsF32F16Bf16TensorsWholeAndAsBoxes) {
  std::vector<float> values(12);
  std::iota(values.begin(), values.end(), -4.0f);
  for (float& x : values) x *= 0.25f;  // exact in f16 and bf16
  std::vector<std::uint16_t> f16;
  std::vector<std::uint16_t> bf16;
  for (const float x : values) {
    f16.push_back(f16_from_f32(x));
    bf16.push_back(bf16_from_f32(x));
  }
  std::vector<float> cube(24);
  std::iota(cube.begin(), cube.end(), 0.0f);
  const std::string bytes =
      gguf_file({kv_string("general.architecture", "llama")},
                {{"f32", id(GgufType::kF32), {4, 3}, raw(values)},
                 {"f16", id(GgufType::kF16), {4, 3}, raw(f16)},
                 {"bf16", id(GgufType::kBF16), {4, 3}, raw(bf16)},
                 {"cube", id(GgufType::kF32), {2, 3, 4}, raw(cube)},
                 {"scalar", id(GgufType::kF32), {}, raw(std::vector<float>{3.5f})},
                 {"empty", id(GgufType::kF32), {4, 0}, ""}});
  const fs::path file = dir_.file("floats.gguf", bytes);
  const GgufFile f = GgufFile::open(file);
  EXPECT_THAT(f.names(), ElementsAre("f32", "f16", "bf16", "cube", "scalar", "empty"));
  EXPECT_TRUE(f.contains("cube"));
  EXPECT_FALSE(f.contains("cub"));
  EXPECT_EQ(f.info("f32"), (GgufTensorInfo{"f32", GgufType::kF32, {4, 3}, {3, 4}, 0, 48}));
  EXPECT_EQ(f.info("f16"), (GgufTensorInfo{"f16", GgufType::kF16, {4, 3}, {3, 4}, 64, 24}));
  EXPECT_EQ(f.info("bf16"), (GgufTensorInfo{"bf16", GgufType::kBF16, {4, 3}, {3, 4}, 96, 24}));
  EXPECT_EQ(f.info("cube"),
            (GgufTensorInfo{"cube", GgufType::kF32, {2, 3, 4}, {4, 3, 2}, 128, 96}));
  EXPECT_EQ(f.info("scalar"), (GgufTensorInfo{"scalar", GgufType::kF32, {}, {}, 224, 4}));
  EXPECT_EQ(f.info("empty"), (GgufTensorInfo{"empty", GgufType::kF32, {4, 0}, {0, 4}, 256, 0}));
  EXPECT_EQ(f.info("cube").num_elements(), 24);
  EXPECT_EQ(f.info("scalar").num_elements(), 1);
  EXPECT_EQ(f.info("empty").num_elements(), 0);
  EXPECT_EQ(f.data_offset() % 32, 0U);
  // bytes() is the stored span at data_offset() + offset.
  const std::span<const std::byte> stored = f.bytes("f16");
  ASSERT_EQ(stored.size(), 24U);
  EXPECT_EQ(std::memcmp(stored.data(), bytes.data() + f.data_offset() + 64, 24), 0);
  EXPECT_EQ(std::memcmp(stored.data(), f16.data(), 24), 0);

  // Whole, as f32: exact.
  EXPECT_THAT(gguf_read<float>(f, "f32", DType::kF32), ElementsAreArray(values));
  EXPECT_THAT(gguf_read<float>(f, "f16", DType::kF32), ElementsAreArray(values));
  EXPECT_THAT(gguf_read<float>(f, "bf16", DType::kF32), ElementsAreArray(values));
  EXPECT_THAT(gguf_read<float>(f, "cube", DType::kF32), ElementsAreArray(cube));
  EXPECT_THAT(gguf_read<float>(f, "scalar", DType::kF32), ElementsAre(3.5f));
  EXPECT_THAT(gguf_read<float>(f, "empty", DType::kF32), IsEmpty());
  // The same format: the stored bits; f32 to the 16-bit formats: theirs.
  EXPECT_THAT(gguf_read<std::uint16_t>(f, "f16", DType::kF16), ElementsAreArray(f16));
  EXPECT_THAT(gguf_read<std::uint16_t>(f, "bf16", DType::kBF16), ElementsAreArray(bf16));
  EXPECT_THAT(gguf_read<std::uint16_t>(f, "f32", DType::kBF16), ElementsAreArray(bf16));
  EXPECT_THAT(gguf_read<std::uint16_t>(f, "bf16", DType::kF16), ElementsAreArray(f16));

  // Row boxes and column boxes, in shape order ([3, 4]: 3 rows of 4).
  EXPECT_THAT(gguf_read_box<float>(f, "f32", {1, 0}, {2, 4}, DType::kF32),
              ElementsAreArray(submatrix(values, 4, 1, 2, 0, 4)));
  EXPECT_THAT(gguf_read_box<float>(f, "f32", {0, 1}, {3, 2}, DType::kF32),
              ElementsAreArray(submatrix(values, 4, 0, 3, 1, 2)));
  EXPECT_THAT(gguf_read_box<float>(f, "f16", {0, 3}, {3, 1}, DType::kF32),
              ElementsAreArray(submatrix(values, 4, 0, 3, 3, 1)));
  EXPECT_THAT(gguf_read_box<std::uint16_t>(f, "f16", {0, 1}, {3, 2}, DType::kF16),
              ElementsAreArray(submatrix(f16, 4, 0, 3, 1, 2)));
  EXPECT_THAT(gguf_read_box<std::uint16_t>(f, "bf16", {2, 0}, {1, 4}, DType::kBF16),
              ElementsAreArray(submatrix(bf16, 4, 2, 1, 0, 4)));
  // A box of the [4, 3, 2] cube: cube[1:3, 1:3, 1:2].
  EXPECT_THAT(gguf_read_box<float>(f, "cube", {1, 1, 1}, {2, 2, 1}, DType::kF32),
              ElementsAre(9.0f, 11.0f, 15.0f, 17.0f));
  EXPECT_THAT(gguf_read_box<float>(f, "f32", {1, 2}, {0, 2}, DType::kF32), IsEmpty());
}

TEST_F(GgufFileTest, ReadsQ8_0AndQ4_0WholeAndAsRowAndColumnBoxes) {
  // [3, 64]: 3 rows of two blocks.
  const std::vector<float> x = random_values(3 * 64, 1);
  std::vector<runtime::BlockQ8_0> q8(6);
  std::vector<runtime::BlockQ4_0> q4(6);
  runtime::quantize_q8_0(x, q8);
  runtime::quantize_q4_0(x, q4);
  std::vector<float> dq8(x.size());
  std::vector<float> dq4(x.size());
  runtime::dequantize_q8_0(q8, dq8);
  runtime::dequantize_q4_0(q4, dq4);
  const fs::path file =
      dir_.file("blocks.gguf", gguf_file({}, {{"q8", id(GgufType::kQ8_0), {64, 3}, raw(q8)},
                                              {"q4", id(GgufType::kQ4_0), {64, 3}, raw(q4)}}));
  const GgufFile f = GgufFile::open(file);
  EXPECT_EQ(f.info("q8"), (GgufTensorInfo{"q8", GgufType::kQ8_0, {64, 3}, {3, 64}, 0, 204}));
  EXPECT_EQ(f.info("q4"), (GgufTensorInfo{"q4", GgufType::kQ4_0, {64, 3}, {3, 64}, 224, 108}));

  struct Format {
    std::string name;
    DType dtype;
    std::size_t block_bytes;
    std::string stored;
    std::vector<float> dequantized;
  };
  for (const Format& q : {Format{"q8", DType::kQ8_0, 34, raw(q8), dq8},
                          Format{"q4", DType::kQ4_0, 18, raw(q4), dq4}}) {
    SCOPED_TRACE(q.name);
    const auto blocks = [&](std::initializer_list<std::size_t> which) {
      std::string out;
      for (const std::size_t b : which) out += q.stored.substr(b * q.block_bytes, q.block_bytes);
      return out;
    };
    EXPECT_EQ(bits_of(gguf_read<float>(f, q.name, DType::kF32)), bits_of(q.dequantized));
    EXPECT_EQ(gguf_read_box_bytes(f, q.name, {0, 0}, {3, 64}, q.dtype), q.stored);
    // Rows 1 and 2; the second block of each row (a column box on the blocks).
    EXPECT_EQ(gguf_read_box_bytes(f, q.name, {1, 0}, {2, 64}, q.dtype), blocks({2, 3, 4, 5}));
    EXPECT_EQ(gguf_read_box_bytes(f, q.name, {0, 32}, {3, 32}, q.dtype), blocks({1, 3, 5}));
    EXPECT_EQ(bits_of(gguf_read_box<float>(f, q.name, {0, 32}, {3, 32}, DType::kF32)),
              bits_of(submatrix(q.dequantized, 64, 0, 3, 32, 32)));
    // Columns 8 to 24 of rows 1 and 2: inside the first block, dequantized and sliced.
    EXPECT_EQ(bits_of(gguf_read_box<float>(f, q.name, {1, 8}, {2, 16}, DType::kF32)),
              bits_of(submatrix(q.dequantized, 64, 1, 2, 8, 16)));
    // Columns 20 to 52: across the two blocks.
    EXPECT_EQ(bits_of(gguf_read_box<float>(f, q.name, {0, 20}, {3, 32}, DType::kF32)),
              bits_of(submatrix(q.dequantized, 64, 0, 3, 20, 32)));
  }
  // One block format into another: through f32, requantized by GGML's reference quantizer.
  std::vector<runtime::BlockQ4_0> requantized(6);
  runtime::quantize_q4_0(dq8, requantized);
  EXPECT_EQ(gguf_read_box_bytes(f, "q8", {0, 0}, {3, 64}, DType::kQ4_0), raw(requantized));
}

// A box that is one run of the file as it is stored is read with pread(), not copied out of the
// mapping: a file cut short after it was opened is then an IoError naming where it ends, where
// a copy out of the mapping would have read zeros (within the last page) or raised SIGBUS.
TEST_F(GgufFileTest, ARunReadFromAFileCutShortSinceItOpenedIsAnIoError) {
  std::vector<float> values(16);
  std::iota(values.begin(), values.end(), 1.0f);
  const fs::path file =
      dir_.file("cut.gguf", gguf_file({}, {{"w", id(GgufType::kF32), {4, 4}, raw(values)}}));
  const GgufFile f = GgufFile::open(file);
  EXPECT_EQ(gguf_read_box<float>(f, "w", {1, 0}, {2, 4}, DType::kF32),
            std::vector<float>(values.begin() + 4, values.begin() + 12));
  const std::uint64_t size = fs::file_size(file);  // the 64 bytes of w end the file
  fs::resize_file(file, size - 40);
  EXPECT_THAT(
      [&] {
        (void)gguf_read_box<float>(f, "w", {0, 0}, {4, 4}, DType::kF32);
      },
      ThrowsMessage<IoError>(StrEq(fmt::format(
          "gguf: cannot read tensor 'w' of '{}': the file ends at byte {}, before the 64 "
          "bytes at offset {} (was it changed after it was opened?)",
          file.string(), size - 40, size - 64))));
  // Cut before the run starts: the end named is the file's, not the run's first byte.
  fs::resize_file(file, size - 100);
  EXPECT_THAT(
      [&] {
        (void)gguf_read_box<float>(f, "w", {2, 0}, {2, 4}, DType::kF32);
      },
      ThrowsMessage<IoError>(StrEq(fmt::format(
          "gguf: cannot read tensor 'w' of '{}': the file ends at byte {}, before the 32 "
          "bytes at offset {} (was it changed after it was opened?)",
          file.string(), size - 100, size - 32))));
}

TEST_F(GgufFileTest, KFormatBoxesThatCutBlocksReadTheDequantizedSlice) {
  // Q4_K [2, 512]: 2 rows of 2 super-blocks; Q6_K [2, 256].
  const std::vector<float> x = random_values(2 * 512, 3);
  std::vector<runtime::BlockQ4_K> q4k(4);
  runtime::quantize_q4_k(x, q4k);
  std::vector<float> dq4k(x.size());
  runtime::dequantize_q4_k(q4k, dq4k);
  const std::vector<float> y = random_values(2 * 256, 4);
  std::vector<runtime::BlockQ6_K> q6k(2);
  runtime::quantize_q6_k(y, q6k);
  std::vector<float> dq6k(y.size());
  runtime::dequantize_q6_k(q6k, dq6k);
  const fs::path file =
      dir_.file("k.gguf", gguf_file({}, {{"q4k", id(GgufType::kQ4_K), {512, 2}, raw(q4k)},
                                         {"q6k", id(GgufType::kQ6_K), {256, 2}, raw(q6k)}}));
  const GgufFile f = GgufFile::open(file);
  EXPECT_EQ(f.info("q4k").size_bytes, 4U * 144);
  EXPECT_EQ(f.info("q6k").offset, 576U);

  EXPECT_EQ(bits_of(gguf_read<float>(f, "q4k", DType::kF32)), bits_of(dq4k));
  EXPECT_EQ(bits_of(gguf_read<float>(f, "q6k", DType::kF32)), bits_of(dq6k));
  // On the blocks: the second super-block of each row, byte for byte.
  const std::string stored = raw(q4k);
  EXPECT_EQ(gguf_read_box_bytes(f, "q4k", {0, 256}, {2, 256}, DType::kQ4_K),
            stored.substr(144, 144) + stored.substr(3 * 144, 144));
  // Columns 128 to 384 cut both super-blocks of each row.
  const std::vector<float> slice = submatrix(dq4k, 512, 0, 2, 128, 256);
  EXPECT_EQ(bits_of(gguf_read_box<float>(f, "q4k", {0, 128}, {2, 256}, DType::kF32)),
            bits_of(slice));
  EXPECT_EQ(bits_of(gguf_read_box<float>(f, "q4k", {1, 100}, {1, 60}, DType::kF32)),
            bits_of(submatrix(dq4k, 512, 1, 1, 100, 60)));
  EXPECT_EQ(bits_of(gguf_read_box<float>(f, "q6k", {0, 16}, {2, 32}, DType::kF32)),
            bits_of(submatrix(dq6k, 256, 0, 2, 16, 32)));
  // ... converted to another format: the slice's values stored as that format.
  std::vector<std::uint16_t> slice_f16;
  for (const float v : slice) slice_f16.push_back(f16_from_f32(v));
  EXPECT_THAT(gguf_read_box<std::uint16_t>(f, "q4k", {0, 128}, {2, 256}, DType::kF16),
              ElementsAreArray(slice_f16));
  std::vector<runtime::BlockQ8_0> slice_q8(16);
  runtime::quantize_q8_0(slice, slice_q8);
  EXPECT_EQ(gguf_read_box_bytes(f, "q4k", {0, 128}, {2, 256}, DType::kQ8_0), raw(slice_q8));
  // The same format from a box that cuts its blocks: requantized from the slice (the only bytes
  // a Q4_K box of columns 128 to 384 can have).
  std::vector<runtime::BlockQ4_K> slice_q4k(2);
  runtime::quantize_q4_k(slice, slice_q4k);
  EXPECT_EQ(gguf_read_box_bytes(f, "q4k", {0, 128}, {2, 256}, DType::kQ4_K), raw(slice_q4k));
}

TEST_F(GgufFileTest, AlignmentFromTheMetadataLaysOutTheData) {
  const std::string bytes =
      gguf_file({kv_scalar("general.alignment", GgufValueType::kUint32, std::uint32_t{64})},
                {{"a", id(GgufType::kF32), {3}, raw(std::vector<float>{1, 2, 3})},
                 {"b", id(GgufType::kF32), {2}, raw(std::vector<float>{4, 5})}},
                64);
  const GgufFile f = GgufFile::open(dir_.file("aligned.gguf", bytes));
  EXPECT_EQ(f.alignment(), 64U);
  EXPECT_EQ(f.data_offset() % 64, 0U);
  EXPECT_EQ(f.info("b").offset, 64U);
  EXPECT_THAT(gguf_read<float>(f, "b", DType::kF32), ElementsAre(4.0f, 5.0f));
}

TEST_F(GgufFileTest, ZeroSizeTensorsAndTrailingBytesAreAllowed) {
  const std::string bytes =
      gguf_file({},
                {{"none", id(GgufType::kF32), {0}, ""},
                 {"w", id(GgufType::kF32), {1}, raw(std::vector<float>{7})},
                 {"huge_but_empty", id(GgufType::kQ4_K), {std::int64_t{1} << 40, 1 << 30, 0}, ""},
                 {"v", id(GgufType::kF32), {1}, raw(std::vector<float>{8})}}) +
      "trailing bytes";
  const GgufFile f = GgufFile::open(dir_.file("empty.gguf", bytes));
  EXPECT_EQ(f.info("w").offset, 0U);
  EXPECT_EQ(f.info("huge_but_empty").size_bytes, 0U);
  EXPECT_EQ(f.info("v").offset, 32U);
  EXPECT_THAT(gguf_read<float>(f, "v", DType::kF32), ElementsAre(8.0f));
  EXPECT_THAT(gguf_read<float>(f, "none", DType::kF32), IsEmpty());
}

// ---- Read errors --------------------------------------------------------------------------------

TEST_F(GgufFileTest, TypesNumeshDoesNotComputeInOpenButCannotBeRead) {
  const std::string q2k(84, '\x11');
  const fs::path file = dir_.file(
      "q2k.gguf",
      gguf_file({}, {{"q2k", id(GgufType::kQ2_K), {256, 1}, q2k},
                     {"ids", id(GgufType::kI32), {2}, raw(std::vector<std::int32_t>{1, 2})}}));
  const GgufFile f = GgufFile::open(file);
  EXPECT_EQ(f.info("q2k"), (GgufTensorInfo{"q2k", GgufType::kQ2_K, {256, 1}, {1, 256}, 0, 84}));
  EXPECT_EQ(std::memcmp(f.bytes("q2k").data(), q2k.data(), q2k.size()), 0);
  std::vector<float> out(256);
  for (const auto& [tensor, type] :
       {std::pair<std::string, std::string>{"q2k", "Q2_K"}, {"ids", "I32"}}) {
    const std::string& name = tensor;  // lambdas capture it (clang 14 cannot capture bindings)
    const std::string message =
        read_error(file, name,
                   "its type is " + type +
                       "; numesh reads only F32, BF16, F16, Q8_0, Q4_0, "
                       "Q5_0, IQ4_NL, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS tensors");
    EXPECT_THAT([&] { f.read(name, DType::kF32, std::as_writable_bytes(std::span(out))); },
                ThrowsMessage<ValueError>(StrEq(message)));
    const std::vector<std::int64_t> offsets{0, 0};
    const std::vector<std::int64_t> sizes{1, 1};
    EXPECT_THAT(
        [&] {
          f.read_box(name, offsets, sizes, DType::kF32, std::as_writable_bytes(std::span(out)));
        },
        ThrowsMessage<ValueError>(StrEq(message)));
  }
}

TEST_F(GgufFileTest, UnknownTensorIsKeyErrorWithTheClosestNames) {
  const fs::path file = dir_.file(
      "names.gguf",
      gguf_file({}, {{"blk.0.attn_q.weight", id(GgufType::kF32), {1}, raw(std::vector<float>{1})},
                     {"blk.0.attn_k.weight", id(GgufType::kF32), {1}, raw(std::vector<float>{2})},
                     {"output_norm.weight", id(GgufType::kF32), {1}, raw(std::vector<float>{3})}}));
  const GgufFile f = GgufFile::open(file);
  const std::string message = "gguf: '" + file.string() +
                              "' has no tensor 'blk.0.attn_q.weigth'; the closest names are "
                              "'blk.0.attn_q.weight', 'blk.0.attn_k.weight' and "
                              "'output_norm.weight'";
  std::vector<float> out(1);
  const std::vector<std::int64_t> zero{0};
  const std::vector<std::int64_t> one{1};
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { (void)f.info("blk.0.attn_q.weigth"); },
           [&] { (void)f.bytes("blk.0.attn_q.weigth"); },
           [&] {
             f.read("blk.0.attn_q.weigth", DType::kF32, std::as_writable_bytes(std::span(out)));
           },
           [&] {
             f.read_box("blk.0.attn_q.weigth", zero, one, DType::kF32,
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

TEST_F(GgufFileTest, BadBoxesOutputsAndTargetsAreRefused) {
  std::vector<float> values(12, 1.0f);
  values[5] = std::numeric_limits<float>::quiet_NaN();
  const fs::path file =
      dir_.file("box.gguf", gguf_file({}, {{"w", id(GgufType::kF32), {4, 3}, raw(values)}}));
  const GgufFile f = GgufFile::open(file);
  std::vector<float> out(12);
  const auto read_box = [&](std::vector<std::int64_t> offsets, std::vector<std::int64_t> sizes,
                            DType target, std::size_t bytes) {
    f.read_box("w", offsets, sizes, target, std::as_writable_bytes(std::span(out)).first(bytes));
  };
  EXPECT_THAT(
      [&] {
        read_box({0}, {3, 4}, DType::kF32, 48);
      },
      ThrowsMessage<ShapeError>(
          StrEq(read_error(file, "w",
                           "the box has 1 offsets and 2 sizes but the tensor (shape [3, 4]) has "
                           "rank 2"))));
  EXPECT_THAT(
      [&] {
        read_box({0, 2}, {3, 3}, DType::kF32, 36);
      },
      ThrowsMessage<ShapeError>(StrEq(
          read_error(file, "w",
                     "the box at offsets [0, 2] of sizes [3, 3] is outside shape [3, 4] in dim 1 "
                     "(offset 2, size 3, extent 4)"))));
  EXPECT_THAT(
      [&] {
        read_box({0, 0}, {3, 4}, DType::kF32, 44);
      },
      ThrowsMessage<ShapeError>(
          StrEq(read_error(file, "w", "the output has 44 bytes but 12 elements of f32 take 48"))));
  EXPECT_THAT(
      [&] {
        read_box({0, 0}, {3, 4}, DType::kQ8_0, 48);
      },
      ThrowsMessage<ValueError>(
          StrEq("gguf: cannot read tensor 'w' of '" + file.string() +
                "' as q8_0: the box's rows of 4 elements are not whole blocks of 32")));
  // A NaN cannot be quantized: the converter's message, prefixed with the tensor and box.
  const std::vector<float> wide(64, 1.0f);
  std::vector<float> with_nan = wide;
  with_nan[40] = std::numeric_limits<float>::quiet_NaN();
  const fs::path nan_file =
      dir_.file("nan.gguf", gguf_file({}, {{"nan", id(GgufType::kF32), {64}, raw(with_nan)}}));
  const GgufFile g = GgufFile::open(nan_file);
  std::vector<runtime::BlockQ8_0> q(2);
  EXPECT_THAT([&] { g.read("nan", DType::kQ8_0, std::as_writable_bytes(std::span(q))); },
              ThrowsMessage<ValueError>(
                  ::testing::StartsWith("gguf: cannot read tensor 'nan' of '" + nan_file.string() +
                                        "' as q8_0 (box at offsets [0]): ")));
}

// ---- Open errors --------------------------------------------------------------------------------

class GgufOpenErrorTest : public GgufFileTest {
 protected:
  /// Expects open() of a file holding `bytes` to throw E with "<where>: <message>".
  template <typename E>
  void expect_fails(std::string_view bytes, std::string_view message) {
    const fs::path file = dir_.file("bad.gguf", bytes);
    EXPECT_THAT([&] { (void)GgufFile::open(file); },
                ThrowsMessage<E>(StrEq(open_error(file, message))));
  }
};

constexpr std::string_view kRule =
    "GGUF stores each tensor where the one before it ends, padded to the alignment";

TEST_F(GgufOpenErrorTest, MissingFileAndDirectoryAreIoErrors) {
  const fs::path missing = dir_.path() / "absent.gguf";
  EXPECT_THAT([&] { (void)GgufFile::open(missing); },
              ThrowsMessage<IoError>(StrEq(open_error(missing, "No such file or directory"))));
  EXPECT_THAT([&] { (void)GgufFile::open(dir_.path()); },
              ThrowsMessage<IoError>(StrEq(open_error(dir_.path(), "it is a directory"))));
}

TEST_F(GgufOpenErrorTest, TruncatedFilesAreIoErrorsSayingWhatEndsEarly) {
  expect_fails<IoError>("",
                        "file ends early: it has 0 bytes, fewer than the 24 of GGUF's fixed header "
                        "(magic, version, tensor count, key-value count)");
  expect_fails<IoError>(fixed_header(0, 0).substr(0, 23),
                        "file ends early: it has 23 bytes, fewer than the 24 of GGUF's fixed "
                        "header (magic, version, tensor count, key-value count)");
  // Inside a key: its length says 12, 7 bytes follow.
  expect_fails<IoError>(fixed_header(0, 1) + le<std::uint64_t>(12) + "general",
                        "file ends early: key 0 needs 12 bytes at byte 32 but the file has 39");
}

TEST_F(GgufOpenErrorTest, TruncatedValuesInfosAndDataAreIoErrors) {
  using T = GgufValueType;
  // A scalar value: 2 of its 4 bytes.
  expect_fails<IoError>(
      fixed_header(0, 1) + str("n") + type_of(T::kUint32) + std::string("\x07\x00", 2),
      "file ends early: the UINT32 value of key 'n' needs 4 bytes at byte 37 but "
      "the file has 39");
  // A string value: its length, then 3 of its 100 bytes.
  expect_fails<IoError>(
      fixed_header(0, 1) + str("name") + type_of(T::kString) + std::string(4, '\0'),
      "file ends early: the length of the value of key 'name' needs 8 bytes at "
      "byte 40 but the file has 44");
  expect_fails<IoError>(
      fixed_header(0, 1) + str("name") + type_of(T::kString) + le<std::uint64_t>(100) + "abc",
      "file ends early: the value of key 'name' needs 100 bytes at byte 48 but the file has 51");
  // The second string of an array.
  expect_fails<IoError>(fixed_header(0, 1) + str("v") + type_of(T::kArray) + type_of(T::kString) +
                            le<std::uint64_t>(2) + str("a") + le<std::uint64_t>(2) + "b",
                        "file ends early: element 1 of key 'v' needs 2 bytes at byte 66 but the "
                        "file has 67");
  // A tensor info: its second extent.
  expect_fails<IoError>(
      fixed_header(1, 0) + str("w") + le<std::uint32_t>(2) + le<std::int64_t>(4) +
          std::string(4, '\0'),
      "file ends early: ne[1] of tensor 'w' needs 8 bytes at byte 45 but the file "
      "has 49");
  // The data section: its padded start, then a tensor's bytes.
  const std::string one = gguf_file({}, {{"w", id(GgufType::kF32), {4}, std::string(16, 'x')}});
  ASSERT_EQ(one.size(), 96U);
  expect_fails<IoError>(one.substr(0, 57),
                        "file ends early: the data section starts at byte 64 (the end of the "
                        "tensor infos, byte 57, padded to the alignment 32) but the file has 57 "
                        "bytes");
  expect_fails<IoError>(one.substr(0, 74),
                        "file ends early: tensor 'w' takes 16 bytes from byte 64 (offset 0 in the "
                        "data section, which starts at byte 64) but the file has 74 bytes");
  const std::string two = gguf_file({}, {{"a", id(GgufType::kF32), {4}, std::string(16, 'x')},
                                         {"b", id(GgufType::kF32), {4}, std::string(16, 'y')}});
  expect_fails<IoError>(two.substr(0, 140),
                        "file ends early: tensor 'b' takes 16 bytes from byte 128 (offset 32 in "
                        "the data section, which starts at byte 96) but the file has 140 bytes");
  // A tensor far larger than the file.
  expect_fails<IoError>(gguf_file({}, {{"w", id(GgufType::kF32), {std::int64_t{1} << 40}, ""}}),
                        "file ends early: tensor 'w' takes 4398046511104 bytes from byte 64 "
                        "(offset 0 in the data section, which starts at byte 64) but the file has "
                        "64 bytes");
}

TEST_F(GgufOpenErrorTest, CountsPastWhatTheFileHoldsFailBeforeAnythingIsRead) {
  expect_fails<IoError>(fixed_header(1000, 0) + std::string(100, '\0'),
                        "file ends early: it declares 1000 tensors, whose infos take at least 24 "
                        "bytes each, but 100 bytes follow the 24-byte fixed header");
  expect_fails<IoError>(fixed_header(kU64Max, 0) + std::string(100, '\0'),
                        "file ends early: it declares 18446744073709551615 tensors, whose infos "
                        "take at least 24 bytes each, but 100 bytes follow the 24-byte fixed "
                        "header");
  expect_fails<IoError>(fixed_header(1, 10) + std::string(100, '\0'),
                        "file ends early: it declares 10 key-value pairs, which take at least 14 "
                        "bytes each, and 1 tensors, whose infos take at least 24, but 100 bytes "
                        "follow the 24-byte fixed header");
  expect_fails<IoError>(fixed_header(0, kU64Max),
                        "file ends early: it declares 18446744073709551615 key-value pairs, which "
                        "take at least 14 bytes each, and 0 tensors, whose infos take at least 24, "
                        "but 0 bytes follow the 24-byte fixed header");
}

TEST_F(GgufOpenErrorTest, StringAndArrayLengthsAreBoundedByTheLimitsAndTheFile) {
  using T = GgufValueType;
  expect_fails<IoError>(fixed_header(0, 1) + le<std::uint64_t>(1000) + "abcdef",
                        "file ends early: key 0 needs 1000 bytes at byte 32 but the file has 38");
  expect_fails<ValueError>(
      fixed_header(0, 1) + le<std::uint64_t>(std::uint64_t{1} << 31) + "abcdef",
      "key 0 is 2147483648 bytes long, above GGUF's limit of 1 GiB "
      "(1073741824 bytes)");
  expect_fails<IoError>(fixed_header(0, 1) + str("a") + type_of(T::kArray) + type_of(T::kUint32) +
                            le<std::uint64_t>(1000) + le<std::uint32_t>(1),
                        "file ends early: the array of key 'a' (1000 UINT32 elements) needs 4000 "
                        "bytes at byte 49 but the file has 53");
  expect_fails<ValueError>(fixed_header(0, 1) + str("a") + type_of(T::kArray) + type_of(T::kUint8) +
                               le<std::uint64_t>((std::uint64_t{1} << 30) + 1) + "x",
                           "key 'a' is an array of 1073741825 elements, above GGUF's limit of 2^30 "
                           "(1073741824)");
  expect_fails<IoError>(fixed_header(0, 1) + str("v") + type_of(T::kArray) + type_of(T::kString) +
                            le<std::uint64_t>(1000) + le<std::uint64_t>(0),
                        "file ends early: the array of key 'v' (1000 STRING elements) needs at "
                        "least 8000 bytes at byte 49 but the file has 57");
}

TEST_F(GgufOpenErrorTest, WrongMagicAndUnsupportedVersionsAreValueErrors) {
  const std::string rest = le<std::uint32_t>(3) + le<std::uint64_t>(0) + le<std::uint64_t>(0);
  expect_fails<ValueError>("GGML" + rest,
                           "it starts with 47 47 4D 4C ('GGML'), not the magic 'GGUF' (47 47 55 "
                           "46): it is not a GGUF file");
  expect_fails<ValueError>(std::string("PK\x03\x04", 4) + rest,
                           "it starts with 50 4B 03 04 ('PK?\?'), not the magic 'GGUF' (47 47 55 "
                           "46): it is not a GGUF file");
  expect_fails<ValueError>(fixed_header(0, 0, 0),
                           "version 0 is not a GGUF version (numesh reads versions 2 and 3)");
  expect_fails<ValueError>(fixed_header(0, 0, 1),
                           "version 1 (GGUFv1) is no longer supported, as in GGML; numesh reads "
                           "versions 2 and 3: convert the model again with a current llama.cpp");
  expect_fails<ValueError>(fixed_header(0, 0, 0x03000000),
                           "version 50331648 (0x03000000) is far too large: the file is likely "
                           "big-endian (version 3 in the other byte order), which numesh does not "
                           "read");
  expect_fails<ValueError>(fixed_header(0, 0, 4),
                           "version 4 is newer than numesh reads (versions 2 and 3)");
}

TEST_F(GgufOpenErrorTest, BrokenKeysAndValueTypesAreValueErrors) {
  using T = GgufValueType;
  expect_fails<ValueError>(
      fixed_header(0, 1) + str("") + type_of(T::kUint8) + std::string("\x01\x00", 2),
      "key 0 is empty");
  expect_fails<ValueError>(
      gguf_file({kv_scalar("a", T::kUint8, std::uint8_t{1}), kv_string("b", "x"),
                 kv_scalar("a", T::kUint8, std::uint8_t{2})},
                {}),
      "key 'a' appears twice (key-value pairs 0 and 2)");
  // A long key is shown cut to its first 64 bytes.
  const std::string long_key(100, 'k');
  expect_fails<ValueError>(
      gguf_file({kv_string(long_key, "x"), kv_string(long_key, "y")}, {}),
      "key '" + std::string(64, 'k') + "...' appears twice (key-value pairs 0 and 1)");
  expect_fails<ValueError>(gguf_file({kv("k", static_cast<T>(13), le<std::uint32_t>(0))}, {}),
                           "key 'k' has value type 13, which is not a GGUF value type (0 to 12)");
  expect_fails<ValueError>(
      gguf_file({kv("k", static_cast<T>(0xFFFFFFFF), le<std::uint32_t>(0))}, {}),
      "key 'k' has value type 4294967295, which is not a GGUF value type (0 to 12)");
  expect_fails<ValueError>(
      gguf_file({kv("k", T::kArray, type_of(T::kArray) + le<std::uint64_t>(0))}, {}),
      "key 'k' is an array of arrays, which GGUF does not allow");
  expect_fails<ValueError>(
      gguf_file({kv("k", T::kArray, le<std::uint32_t>(13) + le<std::uint64_t>(0))}, {}),
      "key 'k' is an array of value type 13, which is not a GGUF value type (0 to 12)");
}

TEST_F(GgufOpenErrorTest, AlignmentMustBeAUint32PowerOfTwo) {
  using T = GgufValueType;
  expect_fails<ValueError>(
      gguf_file({kv_scalar("general.alignment", T::kUint64, std::uint64_t{32})}, {}),
      "key 'general.alignment' is UINT64; it must be UINT32");
  expect_fails<ValueError>(
      gguf_file({kv_array("general.alignment", T::kUint32, std::vector<std::uint32_t>{32})}, {}),
      "key 'general.alignment' is ARRAY of UINT32 (1 element); it must be UINT32");
  expect_fails<ValueError>(gguf_file({kv_string("general.alignment", "32")}, {}),
                           "key 'general.alignment' is STRING; it must be UINT32");
  expect_fails<ValueError>(
      gguf_file({kv_scalar("general.alignment", T::kUint32, std::uint32_t{0})}, {}),
      "general.alignment is 0, not a power of two");
  expect_fails<ValueError>(
      gguf_file({kv_scalar("general.alignment", T::kUint32, std::uint32_t{48})}, {}),
      "general.alignment is 48, not a power of two");
}

TEST_F(GgufOpenErrorTest, BrokenTensorNamesAreValueErrors) {
  const std::string four(4, 'x');
  expect_fails<ValueError>(gguf_file({}, {{"", id(GgufType::kF32), {1}, four}}),
                           "tensor 0 has an empty name");
  const std::string name63(63, 'n');
  EXPECT_NO_THROW((void)GgufFile::open(
      dir_.file("63.gguf", gguf_file({}, {{name63, id(GgufType::kF32), {1}, four}}))));
  const std::string name64(64, 'n');
  expect_fails<ValueError>(
      gguf_file({},
                {{"a", id(GgufType::kF32), {1}, four}, {name64, id(GgufType::kF32), {1}, four}}),
      "the name of tensor 1, '" + name64 +
          "', is 64 bytes long; GGML's names have at most 63 (GGML_MAX_NAME is 64 with the "
          "terminating NUL)");
  expect_fails<ValueError>(gguf_file({}, {{"a", id(GgufType::kF32), {1}, four},
                                          {"b", id(GgufType::kF32), {1}, four},
                                          {"a", id(GgufType::kF32), {1}, four}}),
                           "tensor name 'a' appears twice (tensors 0 and 2)");
}

TEST_F(GgufOpenErrorTest, BrokenShapesAndTypesAreValueErrors) {
  const auto file_of = [](std::uint32_t type, std::vector<std::int64_t> ne) {
    return gguf_file({}, {{"w", type, std::move(ne), ""}});
  };
  const std::uint32_t f32 = id(GgufType::kF32);
  expect_fails<ValueError>(file_of(f32, {1, 1, 1, 1, 1}),
                           "tensor 'w' has 5 dimensions; GGML tensors have at most 4");
  expect_fails<ValueError>(file_of(f32, {4, -1}), "tensor 'w' has ne[1] = -1, a negative extent");
  expect_fails<ValueError>(
      file_of(f32, {std::int64_t{1} << 32, std::int64_t{1} << 32}),
      "tensor 'w' has ne [4294967296, 4294967296]: its element count overflows 64-bit integers");
  expect_fails<ValueError>(file_of(f32, {std::int64_t{1} << 62, 2}),
                           "tensor 'w' has ne [4611686018427387904, 2]: its element count "
                           "overflows 64-bit integers");
  expect_fails<ValueError>(file_of(f32, {std::int64_t{1} << 62}),
                           "tensor 'w' of type F32 and ne [4611686018427387904] takes more than "
                           "2^64 bytes");
  expect_fails<ValueError>(file_of(31, {32}),
                           "tensor 'w' has type 31 (Q4_0_4_4), which GGML removed: GGUF files may "
                           "no longer hold it");
  expect_fails<ValueError>(file_of(4, {32}),
                           "tensor 'w' has type 4 (Q4_2), which GGML removed: GGUF files may no "
                           "longer hold it");
  expect_fails<ValueError>(file_of(99, {32}),
                           "tensor 'w' has type 99, which is not a GGML type (GGML's types have "
                           "ids 0 to 42)");
  expect_fails<ValueError>(file_of(43, {32}),
                           "tensor 'w' has type 43, which is not a GGML type (GGML's types have "
                           "ids 0 to 42)");
  expect_fails<ValueError>(file_of(id(GgufType::kQ8_0), {33, 2}),
                           "tensor 'w' of type Q8_0 has rows of 33 elements (ne[0]), not a whole "
                           "number of its 32-element blocks");
  expect_fails<ValueError>(file_of(id(GgufType::kQ4_K), {128}),
                           "tensor 'w' of type Q4_K has rows of 128 elements (ne[0]), not a whole "
                           "number of its 256-element blocks");
}

TEST_F(GgufOpenErrorTest, OffsetsMustFollowGgmlsLayout) {
  const auto three = [](std::optional<std::uint64_t> a, std::optional<std::uint64_t> b) {
    return gguf_file({}, {{"a", id(GgufType::kF32), {4}, std::string(16, 'a'), a},
                          {"b", id(GgufType::kF32), {4}, std::string(16, 'b'), b},
                          {"c", id(GgufType::kF32), {4}, std::string(16, 'c')}});
  };
  const std::string rule(kRule);
  expect_fails<ValueError>(three(std::nullopt, 40),
                           "tensor 'b' has offset 40, not a multiple of the alignment 32 (expected "
                           "32: " +
                               rule + ")");
  expect_fails<ValueError>(three(std::nullopt, 0),
                           "tensor 'b' has offset 0, inside the bytes of the tensors before it, "
                           "which end at 32 with tensor 'a' (padded to the alignment): it would "
                           "overlap them (expected 32: " +
                               rule + ")");
  expect_fails<ValueError>(three(std::nullopt, 64),
                           "tensor 'b' has offset 64, but the tensors before it end at 32 (padded "
                           "to the alignment): bytes [32, 64) of the data section would belong to "
                           "no tensor (" +
                               rule + ")");
  // Out of order (b's bytes first): refused at a, as GGML refuses it.
  expect_fails<ValueError>(three(32, 0),
                           "tensor 'a' has offset 32, but it is the first tensor, at offset 0: "
                           "bytes [0, 32) of the data section would belong to no tensor (" +
                               rule + ")");
  // The overlapped tensor is the last one with bytes, past tensors of none.
  expect_fails<ValueError>(
      gguf_file({}, {{"a", id(GgufType::kF32), {4}, std::string(16, 'a')},
                     {"empty", id(GgufType::kF32), {0}, ""},
                     {"c", id(GgufType::kF32), {4}, std::string(16, 'c'), 0}}),
      "tensor 'c' has offset 0, inside the bytes of the tensors before it, which end at 32 with "
      "tensor 'a' (padded to the alignment): it would overlap them (expected 32: " +
          rule + ")");
}

}  // namespace
}  // namespace numesh::models::gguf_tests
