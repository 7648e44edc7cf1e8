#include "numesh/sharding/named_array.hpp"

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

std::int64_t ArrayInfo::itemsize() const {
  static constexpr std::pair<std::string_view, std::int64_t> kSizes[] = {
      {"float64", 8},       {"float32", 4},    {"float16", 2}, {"bfloat16", 2},  {"int64", 8},
      {"int32", 4},         {"int16", 2},      {"int8", 1},    {"uint64", 8},    {"uint32", 4},
      {"uint16", 2},        {"uint8", 1},      {"bool", 1},    {"complex64", 8}, {"complex128", 16},
      {"float8_e4m3fn", 1}, {"float8_e5m2", 1}};
  for (const auto& [name, bytes] : kSizes) {
    if (name == dtype) return bytes;
  }
  throw ValueError(fmt::format("unknown dtype '{}'", dtype));
}

const ArrayInfo& NamedLeaf::require_array() const {
  if (!array) {
    throw TypeError(fmt::format("leaf '{}' is not an array: it has no shape", path));
  }
  return *array;
}

}  // namespace numesh::sharding
