#include "numesh/models/formats/npy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/error.hpp"

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using runtime::HostTensor;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Fixtures written by NumPy 1.24; tests/data/ops/README.md has the Python that made them.
const fs::path kData = NUMESH_OPS_DATA_DIR;

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& file, std::string_view bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << file;
}

HostTensor iota(std::vector<std::int64_t> shape) {
  HostTensor t = HostTensor::zeros(std::move(shape));
  std::iota(t.data.begin(), t.data.end(), 0.0f);
  return t;
}

/// The raw little-endian bytes of `values`.
std::string f4_bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// An .npy file with header dict `dict` (padded with spaces and '\n' to 64 bytes, as NumPy
/// does) followed by `data`, in format version `major`.0.
std::string npy_bytes(std::string_view dict, std::string_view data = {}, char major = 1) {
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  std::string header(dict);
  const std::size_t unpadded = 8 + length_bytes + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += major;
  out += '\0';
  for (std::size_t i = 0; i < length_bytes; ++i) {
    out += static_cast<char>((header.size() >> (8 * i)) & 0xffU);
  }
  return out + header + std::string(data);
}

std::string f4_dict(std::string_view shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) + ", }";
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("numesh_npy_") + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Writes `bytes` to a file `name` in the test's temporary directory and returns its path.
  fs::path file_with(const std::string& name, std::string_view bytes) {
    const fs::path file = dir_ / name;
    write_bytes(file, bytes);
    return file;
  }

  fs::path dir_;
};

class NpyHeaderTest : public NpyTest {};

TEST_F(NpyTest, LoadsNumpyMatrix) {
  const HostTensor t = load_npy(kData / "f4_2x3.npy");
  EXPECT_THAT(t.shape, ElementsAre(2, 3));
  EXPECT_THAT(t.data, ElementsAre(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f));
}

// Token ids as NumPy writes them: np.int32 and np.int64 (its default), negative values kept.
TEST_F(NpyTest, LoadsTokenIdsOfBothIntegerWidths) {
  std::string i4(12, '\0'), i8(24, '\0');
  const std::int32_t small[3] = {7, -1, 2147483647};
  const std::int64_t wide[3] = {0, 4095, -2147483648LL};
  std::memcpy(i4.data(), small, 12);
  std::memcpy(i8.data(), wide, 24);
  const NpyIds a = load_npy_ids(file_with(
      "i4.npy", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 3), }", i4)));
  EXPECT_THAT(a.shape, ElementsAre(1, 3));
  EXPECT_THAT(a.values, ElementsAre(7, -1, 2147483647));
  const NpyIds b = load_npy_ids(file_with(
      "i8.npy", npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", i8)));
  EXPECT_THAT(b.shape, ElementsAre(3));
  EXPECT_THAT(b.values, ElementsAre(0, 4095, -2147483648));
}

TEST_F(NpyTest, TokenIdsRefuseOtherDtypesAndValuesPastInt32) {
  EXPECT_THAT([&] { load_npy_ids(kData / "f4_2x3.npy"); },
              ThrowsMessage<ValueError>(
                  HasSubstr("descr '<f4' is float32; numesh reads only '<i4' or '<i8' (integer "
                            "token ids); save it with np.save(f, a.astype('<i4'))")));
  std::string i8(16, '\0');
  const std::int64_t wide[2] = {1, std::int64_t{1} << 40};
  std::memcpy(i8.data(), wide, 16);
  const fs::path big = file_with(
      "big.npy", npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", i8));
  EXPECT_THAT(
      [&] { load_npy_ids(big); },
      ThrowsMessage<ValueError>(HasSubstr("id 1099511627776 at index 1 does not fit int32")));
  EXPECT_THAT(
      [&] {
        load_npy_ids(file_with(
            "cut.npy", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }",
                                 i8.substr(0, 8))));
      },
      ThrowsMessage<IoError>(HasSubstr("shape (4,) of '<i4' needs 16 data bytes")));
}

TEST_F(NpyTest, LoadsNumpyScalarAsRankZero) {
  const HostTensor t = load_npy(kData / "f4_scalar.npy");
  EXPECT_TRUE(t.shape.empty());
  EXPECT_THAT(t.data, ElementsAre(3.5f));
}

TEST_F(NpyTest, LoadsNumpyArrayWithZeroExtent) {
  const HostTensor t = load_npy(kData / "f4_empty_0x4.npy");
  EXPECT_THAT(t.shape, ElementsAre(0, 4));
  EXPECT_TRUE(t.data.empty());
}

TEST_F(NpyTest, LoadsSpecialValuesBitForBit) {
  const HostTensor t = load_npy(kData / "f4_special_6.npy");
  ASSERT_THAT(t.shape, ElementsAre(6));
  std::vector<std::uint32_t> bits;
  for (float x : t.data) bits.push_back(std::bit_cast<std::uint32_t>(x));
  // -0.0, inf, -inf, nan, the smallest denormal, the largest finite float.
  EXPECT_THAT(bits, ElementsAre(0x80000000U, 0x7f800000U, 0xff800000U, 0x7fc00000U, 0x00000001U,
                                0x7f7fffffU));
}

TEST_F(NpyTest, LoadsFormatVersions2And3) {
  const HostTensor expected = load_npy(kData / "f4_2x3.npy");
  EXPECT_EQ(load_npy(kData / "f4_v2.npy"), expected);
  EXPECT_EQ(load_npy(kData / "f4_v3.npy"), expected);
}

TEST_F(NpyTest, LoadsHeaderLongerThan128Bytes) {
  const HostTensor t = load_npy(kData / "f4_pad64.npy");
  EXPECT_THAT(t.shape, ElementsAre(0, 100, 100, 100, 100, 100, 100, 100, 1, 1));
  EXPECT_TRUE(t.data.empty());
}

TEST_F(NpyTest, RejectsOtherNumpyDtypesNamingThemInWords) {
  const struct {
    const char* file;
    const char* message;
  } cases[] = {
      {"f8_2.npy", "descr '<f8' is float64; numesh reads only '<f4' (fp32)"},
      {"f2_3.npy", "descr '<f2' is float16; numesh reads only '<f4' (fp32)"},
      {"f4_bigendian.npy", "descr '>f4' is big-endian float32; numesh reads only '<f4' (fp32)"},
      {"i8_3.npy", "descr '<i8' is int64; numesh reads only '<f4' (fp32)"},
      {"b1_2.npy", "descr '|b1' is bool; numesh reads only '<f4' (fp32)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const fs::path file = kData / c.file;
    EXPECT_THAT([&] { load_npy(file); },
                ThrowsMessage<ValueError>(
                    AllOf(HasSubstr("npy: cannot load '" + file.string() + "'"),
                          HasSubstr(c.message), HasSubstr("np.save(f, a.astype('<f4'))"))));
  }
}

TEST_F(NpyTest, RejectsFortranOrder) {
  const fs::path file = kData / "f4_fortran.npy";
  EXPECT_THAT([&] { load_npy(file); },
              ThrowsMessage<ValueError>(AllOf(
                  HasSubstr(file.string()), HasSubstr("fortran_order is True (column-major data)"),
                  HasSubstr("np.ascontiguousarray(a)"))));
}

TEST_F(NpyTest, TruncatedFileIsIoErrorNamingExpectedAndActualBytes) {
  const fs::path file = kData / "f4_truncated.npy";
  EXPECT_THAT([&] { load_npy(file); },
              ThrowsMessage<IoError>(AllOf(
                  HasSubstr(file.string()),
                  HasSubstr("file ends early: shape (2, 3) of '<f4' needs 24 data bytes after the "
                            "128-byte header, the file has 20 (148 bytes in all)"))));
}

TEST_F(NpyTest, MissingFileIsIoErrorNamingThePath) {
  const fs::path file = dir_ / "absent.npy";
  EXPECT_THAT([&] { load_npy(file); },
              ThrowsMessage<IoError>(HasSubstr("npy: cannot load '" + file.string() +
                                               "': No such file or directory")));
}

TEST_F(NpyTest, DirectoryIsIoError) {
  EXPECT_THAT([&] { load_npy(dir_); },
              ThrowsMessage<IoError>(HasSubstr("cannot load '" + dir_.string() + "'")));
}

TEST_F(NpyTest, SaveThenLoadRoundTrips) {
  for (const std::vector<std::int64_t>& shape : std::vector<std::vector<std::int64_t>>{
           {}, {5}, {2, 3, 4}, {0, 4}, {4, 0}, {1, 1, 1, 1, 1, 1, 1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    HostTensor t = iota(shape);
    for (float& x : t.data) x = x * 0.37f - 1.5f;
    const fs::path file = dir_ / "round_trip.npy";
    save_npy(file, t);
    EXPECT_EQ(load_npy(file), t);
    // Every header numesh writes ends on a 64-byte boundary, so the data is aligned.
    EXPECT_EQ((read_bytes(file).size() - t.data.size() * sizeof(float)) % 64, 0U);
  }
}

TEST_F(NpyTest, SaveWritesTheBytesNumpyWrites) {
  const struct {
    const char* fixture;
    HostTensor tensor;
  } cases[] = {
      {"f4_2x3.npy", iota({2, 3})},
      {"f4_scalar.npy", HostTensor{{}, {3.5f}}},
      {"f4_empty_0x4.npy", iota({0, 4})},
      {"f4_special_6.npy", load_npy(kData / "f4_special_6.npy")},
      // NumPy's growth-axis spaces push this header from 128 to 192 bytes, and its padding
      // rule adds a full 64 spaces when the header is already aligned.
      {"f4_pad64.npy", iota({0, 100, 100, 100, 100, 100, 100, 100, 1, 1})},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fixture);
    const fs::path file = dir_ / c.fixture;
    save_npy(file, c.tensor);
    EXPECT_EQ(read_bytes(file), read_bytes(kData / c.fixture));
  }
}

TEST_F(NpyTest, SaveReplacesAnExistingFile) {
  const fs::path file = dir_ / "replaced.npy";
  save_npy(file, iota({100}));
  save_npy(file, iota({2}));
  EXPECT_EQ(load_npy(file), iota({2}));
}

TEST_F(NpyTest, SaveIntoMissingDirectoryIsIoError) {
  const fs::path file = dir_ / "no_such_dir" / "out.npy";
  EXPECT_THAT([&] { save_npy(file, iota({2})); },
              ThrowsMessage<IoError>(HasSubstr("npy: cannot save '" + file.string() +
                                               "': cannot open it for writing (No such file or "
                                               "directory)")));
}

TEST_F(NpyTest, SaveToFullDeviceIsIoError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  // Large enough that stdio cannot hide the failure in its buffer until close either way.
  EXPECT_THAT([&] { save_npy("/dev/full", iota({100000})); },
              ThrowsMessage<IoError>(AllOf(HasSubstr("cannot save '/dev/full'"),
                                           HasSubstr("No space left on device"))));
  EXPECT_THAT([&] { save_npy("/dev/full", iota({2})); },
              ThrowsMessage<IoError>(HasSubstr("write failed when closing")));
}

TEST_F(NpyTest, SaveRejectsDataThatDoesNotMatchTheShape) {
  const fs::path file = dir_ / "bad.npy";
  EXPECT_THAT(
      [&] {
        save_npy(file, HostTensor{{2, 3}, std::vector<float>(5)});
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("cannot save '" + file.string() +
                    "': shape (2, 3) has 6 elements but the data has 5 values")));
  EXPECT_THAT(
      [&] {
        save_npy(file, HostTensor{{2, -3}, {}});
      },
      ThrowsMessage<ShapeError>(HasSubstr("shape (2, -3) has a negative extent")));
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(NpyHeaderTest, AcceptsKeysInAnyOrderWithAnyWhitespaceAndQuotes) {
  const std::string data = f4_bytes({0, 1, 2, 3, 4, 5});
  const char* const dicts[] = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{ 'fortran_order' :False,\t'descr':'<f4' ,\n 'shape':( 2 ,3 , ) , }",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,3)}",
  };
  for (const char* dict : dicts) {
    SCOPED_TRACE(dict);
    const HostTensor t = load_npy(file_with("any_order.npy", npy_bytes(dict, data)));
    EXPECT_THAT(t.shape, ElementsAre(2, 3));
    EXPECT_THAT(t.data, ElementsAre(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f));
  }
}

TEST_F(NpyHeaderTest, ParsesShapesOfEveryRank) {
  EXPECT_TRUE(load_npy(file_with("a.npy", npy_bytes(f4_dict("()"), f4_bytes({7})))).shape.empty());
  EXPECT_THAT(load_npy(file_with("b.npy", npy_bytes(f4_dict("(3,)"), f4_bytes({1, 2, 3})))).shape,
              ElementsAre(3));
  EXPECT_THAT(load_npy(file_with("c.npy", npy_bytes(f4_dict("(0, 4)")))).shape, ElementsAre(0, 4));
  EXPECT_THAT(load_npy(file_with("d.npy", npy_bytes(f4_dict("(1, 1, 1, 1)"), f4_bytes({9})))).shape,
              ElementsAre(1, 1, 1, 1));
}

TEST_F(NpyHeaderTest, ReadsVersion2HeaderLength) {
  const HostTensor t =
      load_npy(file_with("v2.npy", npy_bytes(f4_dict("(2,)"), f4_bytes({4, 5}), 2)));
  EXPECT_THAT(t.data, ElementsAre(4.0f, 5.0f));
}

TEST_F(NpyHeaderTest, RejectsMalformedHeadersNamingTheField) {
  const struct {
    std::string dict;
    const char* message;
  } cases[] = {
      {"{'descr': '<f4', 'fortran_order': False}", "header has no 'shape' key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}",
       "header has unknown key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'shape': ()}",
       "header key 'shape' appears twice"},
      {f4_dict("(3)"), "shape (3) is not a tuple of ints"},
      {f4_dict("[2, 3]"), "shape [2, 3] is not a tuple of ints"},
      {f4_dict("(2, '3')"), "shape (2, '3') is not a tuple of ints"},
      {f4_dict("None"), "shape None is not a tuple of ints"},
      {f4_dict("(2, -3)"), "shape (2, -3) has a negative extent"},
      {f4_dict("(4611686018427387904, 2, 0)"),
       "shape (4611686018427387904, 2, 0) is too large (its fp32 size overflows int64)"},
      {f4_dict("(99999999999999999999,)"),
       "cannot parse header at column 52: integer 99999999999999999999 is out of range"},
      {f4_dict("(2.0,)"), "cannot parse header at column 52: expected an integer"},
      {f4_dict("(3L,)"), "cannot parse header at column 52: expected an integer"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", "fortran_order 0 is not True or False"},
      {"{'descr': '<f4', 'fortran_order': false, 'shape': ()}", "unknown name 'false'"},
      {"{'descr': 3, 'fortran_order': False, 'shape': ()}",
       "descr 3 is not a dtype string; numesh reads only '<f4' (fp32)"},
      {"{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': ()}",
       "descr [('x', '<f4'), ('y', '<f4')] is a structured dtype; numesh reads only '<f4' (fp32)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()",
       "expected ',' or '}' after a dict value"},
      {"{'descr': '<f4', 'fortran_order': False 'shape': ()}",
       "cannot parse header at column 41: expected ',' or '}' after a dict value"},
      {f4_dict("()") + " x", "unexpected text after the dict"},
      {"['descr', '<f4']", "cannot parse header at column 1: expected the header must be a dict"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
       "escapes and line breaks in strings are not supported"},
      {"{'descr' '<f4'}", "cannot parse header at column 10: expected ':' after a dict key"},
      {"{3: '<f4'}", "dict key 3 is not a string"},
      {"{'descr': " + std::string(100, '[') + std::string(100, ']') + "}",
       "values nested more than 32 deep"},
      {"{}", "header has no 'descr' key"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dict);
    const fs::path file = file_with("malformed.npy", npy_bytes(c.dict));
    EXPECT_THAT(
        [&] { load_npy(file); },
        ThrowsMessage<ValueError>(
            AllOf(HasSubstr("npy: cannot load '" + file.string() + "': "), HasSubstr(c.message))));
  }
}

TEST_F(NpyHeaderTest, ParseErrorsQuoteTheHeaderWithControlBytesEscaped) {
  const fs::path file = file_with("control.npy", npy_bytes("{'descr':\x01 '<f4'}"));
  EXPECT_THAT([&] { load_npy(file); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "cannot parse header at column 10: unexpected character '\\x01' (header: "
                  "{'descr':\\x01 '<f4'})")));
}

TEST_F(NpyHeaderTest, RejectsOtherDescrsNamingThemInWords) {
  const struct {
    const char* descr;
    const char* words;
  } cases[] = {
      {"<i4", "is int32"},
      {"|u1", "is uint8"},
      {"<c8", "is complex64"},
      {">f8", "is big-endian float64"},
      {"=f4", "is native-endian float32"},
      {"|O", "is Python objects (pickled)"},
      {"<U3", "is str (unicode, up to 3 characters)"},
      {"|S4", "is bytes (up to 4 bytes)"},
      {"|V2", "is void (raw 2-byte records)"},
      {"<M8[ns]", "is datetime64[ns]"},
      {"<m8", "is timedelta64"},
      {"f4", "is not a dtype numesh knows"},
      {"<q9", "is not a dtype numesh knows"},
      {"", "is not a dtype numesh knows"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.descr);
    const std::string dict =
        "{'descr': '" + std::string(c.descr) + "', 'fortran_order': False, 'shape': (1,)}";
    const fs::path file = file_with("descr.npy", npy_bytes(dict, f4_bytes({1})));
    EXPECT_THAT([&] { load_npy(file); },
                ThrowsMessage<ValueError>(HasSubstr("descr '" + std::string(c.descr) + "' " +
                                                    c.words + "; numesh reads only '<f4' (fp32)")));
  }
}

TEST_F(NpyHeaderTest, RejectsFilesThatAreNotNpy) {
  const fs::path text = file_with("text.npy", "hello, world");
  EXPECT_THAT([&] { load_npy(text); },
              ThrowsMessage<ValueError>(
                  HasSubstr("cannot load '" + text.string() +
                            "': not an .npy file (it does not start with \\x93NUMPY)")));
  const fs::path zip = file_with("arrays.npz", std::string("PK\x03\x04", 4) + "rest of a zip");
  EXPECT_THAT([&] { load_npy(zip); },
              ThrowsMessage<ValueError>(HasSubstr("it is a zip archive, perhaps an .npz")));
}

TEST_F(NpyHeaderTest, RejectsUnknownFormatVersions) {
  std::string bytes = npy_bytes(f4_dict("()"), f4_bytes({1}));
  bytes[6] = 4;
  EXPECT_THAT([&] { load_npy(file_with("v4.npy", bytes)); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "unsupported .npy format version 4.0 (numesh reads 1.0, 2.0 and 3.0)")));
  bytes[6] = 1;
  bytes[7] = 1;
  EXPECT_THAT([&] { load_npy(file_with("v1_1.npy", bytes)); },
              ThrowsMessage<ValueError>(HasSubstr("unsupported .npy format version 1.1")));
}

TEST_F(NpyHeaderTest, FilesCutInsideThePreambleAreIoErrors) {
  const std::string full = npy_bytes(f4_dict("()"), f4_bytes({1}));
  const struct {
    std::size_t size;
    const char* message;
  } cases[] = {
      {0, "file ends early: it has 0 bytes, fewer than the 8 of the magic string and version"},
      {5, "file ends early: it has 5 bytes, fewer than the 8 of the magic string and version"},
      {9,
       "file ends early: it has 9 bytes, fewer than the 10 of the magic string, version and header "
       "length"},
      {40,
       "file ends early: the header needs 118 bytes after the first 10, the file has 40 in all"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.size);
    const fs::path file = file_with("cut.npy", std::string_view(full).substr(0, c.size));
    EXPECT_THAT([&] { load_npy(file); },
                ThrowsMessage<IoError>(AllOf(HasSubstr(file.string()), HasSubstr(c.message))));
  }
}

TEST_F(NpyHeaderTest, RejectsAbsurdHeaderLength) {
  std::string bytes = npy_bytes(f4_dict("()"), f4_bytes({1}), 2);
  bytes[8] = 0;
  bytes[9] = 0;
  bytes[10] = 0x20;  // 2 MiB
  bytes[11] = 0;
  EXPECT_THAT(
      [&] { load_npy(file_with("huge_header.npy", bytes)); },
      ThrowsMessage<ValueError>(HasSubstr("header of 2097152 bytes is larger than numesh reads")));
}

TEST_F(NpyHeaderTest, TrailingBytesAfterTheDataAreValueError) {
  const fs::path file = file_with("trailing.npy", npy_bytes(f4_dict("(2,)"), f4_bytes({1, 2, 3})));
  EXPECT_THAT(
      [&] { load_npy(file); },
      ThrowsMessage<ValueError>(AllOf(
          HasSubstr(file.string()),
          HasSubstr("4 unexpected bytes after the data: shape (2,) of '<f4' needs 8 data bytes "
                    "after the 128-byte header, the file has 12"))));
}

}  // namespace
}  // namespace numesh::models
