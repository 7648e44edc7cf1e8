#include "numesh/models/hf/weight_formats.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace numesh::models {

WeightFormats WeightFormats::as_stored(const Checkpoint& checkpoint, DType fallback) {
  WeightFormats formats(fallback);
  for (const std::string& name : checkpoint.names()) {
    const std::optional<DType> format = checkpoint.stored_format(name);
    if (!format) continue;
    formats.stored_.emplace(name, *format);
    if (checkpoint.shape(name).size() >= 2)
      formats.matrix_bytes_[*format] += checkpoint.stored_bytes(name);
  }
  // A checkpoint without a tensor in a format numesh keeps weights in still loads as_stored:
  // every matrix in the fallback (stored_ empty then reads as uniform, which it is).
  return formats;
}

DType WeightFormats::of(std::span<const std::string> tensors) const {
  if (stored_.empty() || tensors.empty()) return fallback_;
  const auto format_of = [&](const std::string& name) {
    const auto it = stored_.find(name);
    return it == stored_.end() ? fallback_ : it->second;
  };
  const DType first = format_of(tensors.front());
  const bool common = std::all_of(tensors.begin(), tensors.end(),
                                  [&](const std::string& t) { return format_of(t) == first; });
  return common ? first : fallback_;
}

std::string to_string(const WeightFormats& formats) {
  if (formats.uniform()) return std::string(to_string(formats.fallback_));
  std::vector<std::pair<DType, std::uint64_t>> by_bytes(formats.matrix_bytes_.begin(),
                                                        formats.matrix_bytes_.end());
  std::stable_sort(by_bytes.begin(), by_bytes.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [format, bytes] : by_bytes) {
    if (!out.empty()) out += '+';
    out += to_string(format);
  }
  return out.empty() ? std::string(to_string(formats.fallback_)) : out;
}

}  // namespace numesh::models
