#include "numesh/models/formats/safetensors_checkpoint.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using testing::file_bytes;
using testing::layout_file;
using testing::le_bytes;
using testing::ScratchDir;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

std::vector<float> read_f32(const SafetensorsCheckpoint& c, std::string_view name) {
  std::vector<float> out(static_cast<std::size_t>(c.info(name).num_elements()));
  c.read(name, DType::kF32, std::as_writable_bytes(std::span(out)));
  return out;
}

/// An index file whose weight_map is `entries` (already JSON: "\"a\": \"f\", ...").
std::string index_json(std::string_view entries) {
  return R"({"metadata": {"total_size": 40}, "weight_map": {)" + std::string(entries) + "}}";
}

class SafetensorsCheckpointTest : public ::testing::Test {
 protected:
  /// Two shards the way transformers names them; shard 2 holds a bf16 matrix.
  void write_two_shards() {
    dir_.file("model-00001-of-00002.safetensors",
              layout_file({{"embed.weight", "F32", {2, 2}, le_bytes<float>({1, 2, 3, 4})},
                           {"layers.0.w", "F32", {2}, le_bytes<float>({5, 6})}}));
    dir_.file(
        "model-00002-of-00002.safetensors",
        layout_file(
            {{"layers.1.w",
              "BF16",
              {2, 3},
              le_bytes<std::uint16_t>({0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0})},  // 1..6
             {"norm.weight", "F32", {1}, le_bytes<float>({7})}}));
  }

  /// "safetensors: cannot open checkpoint index '<dir>/model.safetensors.index.json': <what>"
  std::string index_error(std::string_view what) const {
    return "safetensors: cannot open checkpoint index '" +
           (dir_.path() / "model.safetensors.index.json").string() + "': " + std::string(what);
  }

  /// Expects open() with `index` as the index file to throw ValueError "<index>: <what>".
  void expect_index_fails(std::string_view index, std::string_view what) {
    dir_.file("model.safetensors.index.json", index);
    EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(dir_.path()); },
                ThrowsMessage<ValueError>(StrEq(index_error(what))));
  }

  ScratchDir dir_;
};

TEST_F(SafetensorsCheckpointTest, OpensASingleFileCheckpoint) {
  dir_.file("model.safetensors", layout_file({{"b", "F32", {1}, le_bytes<float>({2})},
                                              {"a", "F32", {2}, le_bytes<float>({3, 4})}}));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  EXPECT_EQ(c.directory(), dir_.path());
  ASSERT_EQ(c.files().size(), 1U);
  EXPECT_EQ(c.files()[0].path(), dir_.path() / "model.safetensors");
  EXPECT_THAT(c.names(), ElementsAre("b", "a"));
  EXPECT_TRUE(c.contains("a"));
  EXPECT_FALSE(c.contains("c"));
  EXPECT_THAT(read_f32(c, "a"), ElementsAre(3.0f, 4.0f));
}

TEST_F(SafetensorsCheckpointTest, OpensTwoShardsThroughTheIndexAndForwardsEveryRead) {
  write_two_shards();
  dir_.file("model.safetensors.index.json",
            index_json(R"("layers.1.w": "model-00002-of-00002.safetensors",)"
                       R"( "embed.weight": "model-00001-of-00002.safetensors",)"
                       R"( "norm.weight": "model-00002-of-00002.safetensors",)"
                       R"( "layers.0.w": "model-00001-of-00002.safetensors")"));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  ASSERT_EQ(c.files().size(), 2U);
  EXPECT_EQ(c.files()[0].path().filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(c.files()[1].path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_THAT(c.names(), ElementsAre("embed.weight", "layers.0.w", "layers.1.w", "norm.weight"));
  EXPECT_EQ(&c.file_of("norm.weight"), &c.files()[1]);
  EXPECT_EQ(&c.file_of("embed.weight"), &c.files()[0]);

  EXPECT_EQ(c.info("layers.1.w").dtype, SafetensorsDType::kBF16);
  EXPECT_EQ(c.bytes("layers.1.w").data(), c.files()[1].bytes("layers.1.w").data());
  EXPECT_THAT(read_f32(c, "embed.weight"), ElementsAre(1.0f, 2.0f, 3.0f, 4.0f));
  EXPECT_THAT(read_f32(c, "layers.1.w"), ElementsAre(1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f));
  EXPECT_THAT(read_f32(c, "norm.weight"), ElementsAre(7.0f));

  // A column block of the bf16 matrix from the second shard.
  std::vector<float> block(4);
  const std::vector<std::int64_t> offsets{0, 1};
  const std::vector<std::int64_t> sizes{2, 2};
  c.read_box("layers.1.w", offsets, sizes, DType::kF32, std::as_writable_bytes(std::span(block)));
  EXPECT_THAT(block, ElementsAre(2.0f, 3.0f, 5.0f, 6.0f));
}

TEST_F(SafetensorsCheckpointTest, TheIndexWinsOverASingleFile) {
  write_two_shards();
  dir_.file("model.safetensors", layout_file({{"other", "F32", {1}, le_bytes<float>({0})}}));
  dir_.file("model.safetensors.index.json",
            index_json(R"("embed.weight": "model-00001-of-00002.safetensors",)"
                       R"( "layers.0.w": "model-00001-of-00002.safetensors",)"
                       R"( "layers.1.w": "model-00002-of-00002.safetensors",)"
                       R"( "norm.weight": "model-00002-of-00002.safetensors")"));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  EXPECT_EQ(c.files().size(), 2U);
  EXPECT_FALSE(c.contains("other"));
}

TEST_F(SafetensorsCheckpointTest, AnIndexNeedNotListEveryShardFileInTheDirectory) {
  // Only the files the index names are opened; a stray shard beside them is never read.
  write_two_shards();
  dir_.file("model-00003-of-00002.safetensors", "not a safetensors file");
  dir_.file("model.safetensors.index.json",
            index_json(R"("embed.weight": "model-00001-of-00002.safetensors",)"
                       R"( "layers.0.w": "model-00001-of-00002.safetensors")"));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  EXPECT_THAT(c.names(), ElementsAre("embed.weight", "layers.0.w"));
}

TEST_F(SafetensorsCheckpointTest, MovedCheckpointStillReads) {
  dir_.file("model.safetensors", layout_file({{"a", "F32", {1}, le_bytes<float>({3})}}));
  SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  const SafetensorsCheckpoint moved = std::move(c);
  EXPECT_THAT(read_f32(moved, "a"), ElementsAre(3.0f));
}

TEST_F(SafetensorsCheckpointTest, UnknownTensorIsKeyErrorNamingTheDirectory) {
  write_two_shards();
  dir_.file("model.safetensors.index.json",
            index_json(R"("embed.weight": "model-00001-of-00002.safetensors",)"
                       R"( "layers.0.w": "model-00001-of-00002.safetensors",)"
                       R"( "layers.1.w": "model-00002-of-00002.safetensors",)"
                       R"( "norm.weight": "model-00002-of-00002.safetensors")"));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  const std::string message = "safetensors: checkpoint '" + dir_.path().string() +
                              "' has no tensor 'layers.2.w'; the closest names are 'layers.0.w', "
                              "'layers.1.w' and 'embed.weight'";
  EXPECT_THAT([&] { (void)c.info("layers.2.w"); }, ThrowsMessage<KeyError>(StrEq(message)));
  EXPECT_THAT([&] { (void)c.file_of("layers.2.w"); }, ThrowsMessage<KeyError>(StrEq(message)));
  EXPECT_THAT([&] { (void)c.bytes("layers.2.w"); }, ThrowsMessage<KeyError>(StrEq(message)));
  std::vector<float> out(1);
  EXPECT_THAT([&] { c.read("layers.2.w", DType::kF32, std::as_writable_bytes(std::span(out))); },
              ThrowsMessage<KeyError>(StrEq(message)));
}

TEST_F(SafetensorsCheckpointTest, ReadErrorsComeFromTheFileHoldingTheTensor) {
  write_two_shards();
  dir_.file("model.safetensors.index.json",
            index_json(R"("embed.weight": "model-00001-of-00002.safetensors",)"
                       R"( "layers.0.w": "model-00001-of-00002.safetensors",)"
                       R"( "layers.1.w": "model-00002-of-00002.safetensors",)"
                       R"( "norm.weight": "model-00002-of-00002.safetensors")"));
  const SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir_.path());
  std::vector<float> out(6);
  const std::vector<std::int64_t> offsets{0, 2};
  const std::vector<std::int64_t> sizes{2, 2};
  EXPECT_THAT(
      [&] {
        c.read_box("layers.1.w", offsets, sizes, DType::kF32,
                   std::as_writable_bytes(std::span(out)));
      },
      ThrowsMessage<ShapeError>(StrEq(
          "safetensors: cannot read tensor 'layers.1.w' of '" +
          (dir_.path() / "model-00002-of-00002.safetensors").string() +
          "': the box at offsets [0, 2] of sizes [2, 2] is outside shape [2, 3] in dim 1 (offset "
          "2, size 2, extent 3)")));
}

TEST_F(SafetensorsCheckpointTest, DirectoryWithoutEitherFileIsIoError) {
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(dir_.path()); },
              ThrowsMessage<IoError>(
                  StrEq("safetensors: cannot open checkpoint '" + dir_.path().string() +
                        "': it has neither model.safetensors.index.json nor model.safetensors")));
}

TEST_F(SafetensorsCheckpointTest, MissingDirectoryOrAFileIsIoError) {
  const fs::path missing = dir_.path() / "absent";
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(missing); },
              ThrowsMessage<IoError>(StrEq("safetensors: cannot open checkpoint '" +
                                           missing.string() + "': no such directory")));
  const fs::path file = dir_.file("model.safetensors", file_bytes("{}"));
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(file); },
              ThrowsMessage<IoError>(StrEq("safetensors: cannot open checkpoint '" + file.string() +
                                           "': it is not a directory")));
}

TEST_F(SafetensorsCheckpointTest, AnIndexThatIsADirectoryIsIoError) {
  fs::create_directory(dir_.path() / "model.safetensors.index.json");
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(dir_.path()); },
              ThrowsMessage<IoError>(StrEq(index_error("it is not a regular file"))));
}

TEST_F(SafetensorsCheckpointTest, BrokenSingleFileErrorNamesTheFile) {
  const fs::path file = dir_.file("model.safetensors", "abc");
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(dir_.path()); },
              ThrowsMessage<IoError>(StrEq("safetensors: cannot open '" + file.string() +
                                           "': file ends early: it has 3 bytes, fewer than the 8 "
                                           "of the header length")));
}

TEST_F(SafetensorsCheckpointTest, MalformedIndexIsValueError) {
  expect_index_fails("{\"weight_map\": ",
                     "the index is not valid JSON: parse error at line 1, "
                     "column 16: syntax error while parsing value - "
                     "unexpected end of input; expected '[', '{', or a "
                     "literal");
  expect_index_fails("[1]", "the index is [1], not a JSON object");
  expect_index_fails("\"\xFF\"", "the index is not valid UTF-8 (byte 0xff at offset 1)");
  expect_index_fails(R"({"metadata": {}})", "the index has no weight_map");
  expect_index_fails(R"({"weight_map": ["a"]})",
                     "weight_map is [\"a\"], not an object of tensor name -> file name");
  expect_index_fails(R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})",
                     "the index has key 'a' twice in the object of 'weight_map'");
  expect_index_fails(R"({"weight_map": {"a": 1}})",
                     "weight_map maps tensor 'a' to 1, not a file name");
  for (const std::string_view bad :
       {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", "", ".", ".."}) {
    SCOPED_TRACE(bad);
    expect_index_fails(R"({"weight_map": {"a": ")" + std::string(bad) + "\"}}",
                       "weight_map maps tensor 'a' to '" + std::string(bad) +
                           "', which is not the name of a file in the checkpoint's directory");
  }
}

TEST_F(SafetensorsCheckpointTest, IndexNamingAMissingShardIsIoErrorNamingTheShard) {
  dir_.file("model.safetensors.index.json",
            index_json(R"("a": "model-00001-of-00001.safetensors")"));
  const fs::path shard = dir_.path() / "model-00001-of-00001.safetensors";
  EXPECT_THAT([&] { (void)SafetensorsCheckpoint::open(dir_.path()); },
              ThrowsMessage<IoError>(StrEq("safetensors: cannot open '" + shard.string() +
                                           "': No such file or directory")));
}

TEST_F(SafetensorsCheckpointTest, IndexThatDisagreesWithItsShardsIsValueError) {
  write_two_shards();
  const std::string all_but_norm = R"("embed.weight": "model-00001-of-00002.safetensors",)"
                                   R"( "layers.0.w": "model-00001-of-00002.safetensors",)"
                                   R"( "layers.1.w": "model-00002-of-00002.safetensors")";
  // A listed tensor that is not in its file.
  expect_index_fails(
      index_json(all_but_norm + R"(, "norm.weight": "model-00002-of-00002.safetensors",)"
                                R"( "layers.1.bias": "model-00002-of-00002.safetensors")"),
      "weight_map maps tensor 'layers.1.bias' to "
      "'model-00002-of-00002.safetensors', which has no such tensor; the closest "
      "names are 'layers.1.w' and 'norm.weight'");
  // A listed tensor in the other file.
  expect_index_fails(
      index_json(all_but_norm + R"(, "norm.weight": "model-00001-of-00002.safetensors")"),
      "weight_map maps tensor 'norm.weight' to 'model-00001-of-00002.safetensors' "
      "but it is in 'model-00002-of-00002.safetensors'");
  // A tensor in a shard that the index does not list.
  expect_index_fails(index_json(all_but_norm),
                     "'model-00002-of-00002.safetensors' holds tensor 'norm.weight', which "
                     "weight_map does not list");
}

TEST_F(SafetensorsCheckpointTest, TensorInTwoShardsIsValueError) {
  dir_.file("a.safetensors", layout_file({{"w", "F32", {1}, le_bytes<float>({1})}}));
  dir_.file("b.safetensors", layout_file({{"w", "F32", {1}, le_bytes<float>({2})},
                                          {"v", "F32", {1}, le_bytes<float>({3})}}));
  expect_index_fails(index_json(R"("w": "a.safetensors", "v": "b.safetensors")"),
                     "tensor 'w' is in both 'a.safetensors' and 'b.safetensors'");
}

}  // namespace
}  // namespace numesh::models
