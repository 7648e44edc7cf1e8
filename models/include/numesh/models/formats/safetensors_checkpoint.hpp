#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/formats/safetensors.hpp"

// A Hugging Face checkpoint directory's weights: one `model.safetensors`, or shards listed by
// `model.safetensors.index.json` (the layout `save_pretrained` writes for large models, whose
// "weight_map" maps each tensor name to the shard file holding it). Every shard is opened and
// validated once; tensors are then found by name whichever file holds them.

namespace numesh::models {

/// The tensors of a checkpoint directory, sharded or not. Move-only. Const member functions
/// may be called from any number of threads at once.
class SafetensorsCheckpoint final : public Checkpoint {
 public:
  /// The index's file name, and the single file's when there is no index.
  static constexpr std::string_view kIndexFile = "model.safetensors.index.json";
  static constexpr std::string_view kSingleFile = "model.safetensors";

  /// Opens the checkpoint in `directory`. When kIndexFile exists, it must be a JSON object whose
  /// "weight_map" is an object of tensor name -> shard file name (a bare name in `directory`);
  /// other top-level keys (the "metadata" transformers writes) are not read. Each shard is
  /// opened once, as SafetensorsFile::open does, and the index must match the shards exactly:
  /// every tensor it names is in the file it names, no tensor is in two files, and no file holds
  /// a tensor the index does not list. Without an index, kSingleFile is opened.
  /// Throws: IoError when `directory` is not a directory, has neither file, or a file cannot be
  /// read (naming the directory or the file); ValueError for a malformed index or an index that
  /// does not match its shards (naming the tensor and the files); whatever
  /// SafetensorsFile::open throws for a shard.
  [[nodiscard]] static SafetensorsCheckpoint open(const std::filesystem::path& directory);

  SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
  SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept = default;
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;
  ~SafetensorsCheckpoint() override = default;

  /// The directory given to open().
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return directory_; }
  /// directory().
  [[nodiscard]] const std::filesystem::path& location() const noexcept override {
    return directory_;
  }
  /// The paths of files(), in their order.
  [[nodiscard]] std::vector<std::filesystem::path> weight_files() const override;

  /// The open files, in file-name order (model-00001-of-00002... first).
  [[nodiscard]] const std::vector<SafetensorsFile>& files() const noexcept { return files_; }

  /// Every tensor's name: file by file in the order of files(), and inside a file in the order
  /// of SafetensorsFile::tensors() (the order of the bytes on disk).
  [[nodiscard]] std::vector<std::string> names() const override;

  /// Whether some file has a tensor called `name`.
  [[nodiscard]] bool contains(std::string_view name) const noexcept override;

  /// The file holding tensor `name`.
  /// Throws: KeyError (key() == name) naming the directory and up to three of the closest names.
  [[nodiscard]] const SafetensorsFile& file_of(std::string_view name) const;

  /// The tensor called `name`. Throws: KeyError as file_of().
  [[nodiscard]] const TensorInfo& info(std::string_view name) const;

  /// info(name).shape. Throws: KeyError as file_of().
  [[nodiscard]] std::vector<std::int64_t> shape(std::string_view name) const override;

  /// info(name).size_bytes(). Throws: KeyError as file_of().
  [[nodiscard]] std::uint64_t stored_bytes(std::string_view name) const override;
  /// F32, BF16 and F16 tensors as kF32, kBF16 and kF16; nullopt for the other dtypes.
  [[nodiscard]] std::optional<DType> stored_format(std::string_view name) const override;

  /// SafetensorsFile::bytes of the file holding `name`. Throws: KeyError as file_of().
  [[nodiscard]] std::span<const std::byte> bytes(std::string_view name) const;

  /// Checkpoint::box_in_place: SafetensorsFile::box_in_place on the file holding `name`.
  [[nodiscard]] std::shared_ptr<const std::byte> box_in_place(std::string_view name,
                                                              std::span<const std::int64_t> offsets,
                                                              std::span<const std::int64_t> sizes,
                                                              DType target) const override;

  /// SafetensorsFile::read_box on the file holding `name`; the same requirements (read(), the
  /// whole tensor, is Checkpoint's).
  /// Throws: KeyError as file_of(); otherwise as SafetensorsFile::read_box.
  void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                std::span<const std::int64_t> sizes, DType target,
                std::span<std::byte> out) const override;

 private:
  SafetensorsCheckpoint() = default;

  std::filesystem::path directory_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t, std::less<>> file_by_tensor_;  // name -> position in files_
};

}  // namespace numesh::models
