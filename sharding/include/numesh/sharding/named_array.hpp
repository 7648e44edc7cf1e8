#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace numesh::sharding {

/// What the sharding layer needs to know of an array: its shape and element type (never its
/// data). `dtype` uses numpy's names ("float32", "bfloat16", "int8", ...).
struct ArrayInfo {
  std::vector<std::int64_t> shape;
  std::string dtype = "float32";

  /// Number of elements: the product of the shape (1 for a scalar, 0 if any extent is 0).
  std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  /// Bytes per element of `dtype`. Throws: ValueError for a dtype numesh does not know.
  std::int64_t itemsize() const;
  /// size() * itemsize().
  std::int64_t nbytes() const { return size() * itemsize(); }
};

/// One leaf of a named tree of parameters, flattened in JAX's traversal order: `path` is the
/// key path joined with '/' ("model/layers/0/attn/q_proj/kernel"); `array` is empty for a leaf
/// that has no shape (a Python scalar or other object in eformer's trees).
struct NamedLeaf {
  std::string path;
  std::optional<ArrayInfo> array;

  /// The array. Throws: TypeError "leaf '<path>' is not an array: it has no shape" (eformer
  /// reads `.shape` of the leaf and fails with AttributeError).
  const ArrayInfo& require_array() const;
};

}  // namespace numesh::sharding
