#include "numesh/models/formats/safetensors_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../closest_names.hpp"
#include "../strict_json.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// The index is a transformers convention rather than part of the safetensors format
// (transformers/utils/hub.py, get_checkpoint_shard_files, reads only "weight_map"), so only what
// a reader needs is checked: the map itself, and that it agrees with the shards' own headers.

namespace numesh::models {
namespace {

namespace fs = std::filesystem;
using detail::Json;

std::string read_text(const fs::path& file, const std::string& where) {
  errno = 0;
  std::ifstream in(file, std::ios::binary);
  NUMESH_CHECK(in.is_open(), IoError, "{}: cannot open it for reading ({})", where,
               std::generic_category().message(errno));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  NUMESH_CHECK(!in.bad(), IoError, "{}: read failed", where);
  return text;
}

/// Whether `name` names a file directly inside the checkpoint's directory: an index must not
/// reach elsewhere ("../other/model.safetensors", "/etc/passwd").
bool is_bare_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& directory) {
  const std::string where =
      fmt::format("safetensors: cannot open checkpoint '{}'", directory.string());
  std::error_code ec;
  const fs::file_status status = fs::status(directory, ec);
  NUMESH_CHECK(status.type() != fs::file_type::not_found, IoError, "{}: no such directory", where);
  NUMESH_CHECK(!ec, IoError, "{}: {}", where, ec.message());
  NUMESH_CHECK(fs::is_directory(status), IoError, "{}: it is not a directory", where);

  SafetensorsCheckpoint out;
  out.directory_ = directory;
  const fs::path index_path = directory / kIndexFile;
  if (!fs::exists(index_path)) {
    const fs::path single = directory / kSingleFile;
    NUMESH_CHECK(fs::exists(single), IoError, "{}: it has neither {} nor {}", where, kIndexFile,
                 kSingleFile);
    out.files_.push_back(SafetensorsFile::open(single));
    for (const TensorInfo& t : out.files_[0].tensors()) out.file_by_tensor_.emplace(t.name, 0);
    return out;
  }

  const std::string index_where =
      fmt::format("safetensors: cannot open checkpoint index '{}'", index_path.string());
  NUMESH_CHECK(fs::is_regular_file(index_path), IoError, "{}: it is not a regular file",
               index_where);
  const Json index =
      detail::parse_strict_json(read_text(index_path, index_where), index_where, "the index");
  NUMESH_CHECK(index.is_object(), ValueError, "{}: the index is {}, not a JSON object", index_where,
               detail::json_excerpt(index));
  NUMESH_CHECK(index.contains("weight_map"), ValueError, "{}: the index has no weight_map",
               index_where);
  const Json& weight_map = index["weight_map"];
  NUMESH_CHECK(weight_map.is_object(), ValueError,
               "{}: weight_map is {}, not an object of tensor name -> file name", index_where,
               detail::json_excerpt(weight_map));

  // Tensor -> file as the index says, and the distinct files in name order, each opened once.
  std::map<std::string, std::string, std::less<>> listed;
  std::set<std::string> file_names;
  for (const auto& [tensor, file] : weight_map.items()) {
    NUMESH_CHECK(file.is_string(), ValueError,
                 "{}: weight_map maps tensor '{}' to {}, not a file name", index_where, tensor,
                 detail::json_excerpt(file));
    const auto& name = file.get_ref<const std::string&>();
    NUMESH_CHECK(is_bare_file_name(name), ValueError,
                 "{}: weight_map maps tensor '{}' to '{}', which is not the name of a file in the "
                 "checkpoint's directory",
                 index_where, tensor, name);
    listed.emplace(tensor, name);
    file_names.insert(name);
  }
  std::vector<std::string> file_list(file_names.begin(), file_names.end());
  for (const std::string& name : file_list) {
    out.files_.push_back(SafetensorsFile::open(directory / name));
  }

  // What the shards hold, which must be what the index says: no tensor in two files, every
  // listed tensor in its file, and nothing in a file that the index leaves out (a stale shard
  // from an earlier save).
  for (std::size_t i = 0; i < out.files_.size(); ++i) {
    for (const TensorInfo& t : out.files_[i].tensors()) {
      const auto [it, inserted] = out.file_by_tensor_.emplace(t.name, i);
      NUMESH_CHECK(inserted, ValueError, "{}: tensor '{}' is in both '{}' and '{}'", index_where,
                   t.name, file_list[it->second], file_list[i]);
    }
  }
  for (const auto& [tensor, file] : listed) {
    const auto found = out.file_by_tensor_.find(tensor);
    if (found == out.file_by_tensor_.end()) {
      const auto in_file = std::lower_bound(file_list.begin(), file_list.end(), file);
      const std::vector<std::string> candidates =
          out.files_[static_cast<std::size_t>(in_file - file_list.begin())].names();
      throw ValueError(
          fmt::format("{}: weight_map maps tensor '{}' to '{}', which has no such "
                      "tensor{}",
                      index_where, tensor, file, detail::closest_names_hint(tensor, candidates)));
    }
    NUMESH_CHECK(file_list[found->second] == file, ValueError,
                 "{}: weight_map maps tensor '{}' to '{}' but it is in '{}'", index_where, tensor,
                 file, file_list[found->second]);
  }
  for (const auto& [tensor, file] : out.file_by_tensor_) {
    NUMESH_CHECK(listed.contains(tensor), ValueError,
                 "{}: '{}' holds tensor '{}', which weight_map does not list", index_where,
                 file_list[file], tensor);
  }
  return out;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(file_by_tensor_.size());
  for (const SafetensorsFile& f : files_) {
    for (const TensorInfo& t : f.tensors()) out.push_back(t.name);
  }
  return out;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const noexcept {
  return file_by_tensor_.find(name) != file_by_tensor_.end();
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(std::string_view name) const {
  const auto it = file_by_tensor_.find(name);
  if (it == file_by_tensor_.end()) {
    throw KeyError(
        std::string(name),
        fmt::format("safetensors: checkpoint '{}' has no tensor '{}'{}", directory_.string(), name,
                    detail::closest_names_hint(name, names())));
  }
  return files_[it->second];
}

const TensorInfo& SafetensorsCheckpoint::info(std::string_view name) const {
  return file_of(name).info(name);
}

std::span<const std::byte> SafetensorsCheckpoint::bytes(std::string_view name) const {
  return file_of(name).bytes(name);
}

std::vector<fs::path> SafetensorsCheckpoint::weight_files() const {
  std::vector<fs::path> out;
  for (const SafetensorsFile& f : files_) out.push_back(f.path());
  return out;
}

std::vector<std::int64_t> SafetensorsCheckpoint::shape(std::string_view name) const {
  return info(name).shape;
}

std::uint64_t SafetensorsCheckpoint::stored_bytes(std::string_view name) const {
  return info(name).size_bytes();
}

std::optional<DType> SafetensorsCheckpoint::stored_format(std::string_view name) const {
  return to_numesh_dtype(info(name).dtype);
}

std::shared_ptr<const std::byte> SafetensorsCheckpoint::box_in_place(
    std::string_view name, std::span<const std::int64_t> offsets,
    std::span<const std::int64_t> sizes, DType target) const {
  return file_of(name).box_in_place(name, offsets, sizes, target);
}

void SafetensorsCheckpoint::read_box(std::string_view name, std::span<const std::int64_t> offsets,
                                     std::span<const std::int64_t> sizes, DType target,
                                     std::span<std::byte> out) const {
  file_of(name).read_box(name, offsets, sizes, target, out);
}

}  // namespace numesh::models
