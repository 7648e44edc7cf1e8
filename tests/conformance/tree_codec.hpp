#pragma once

// Encoded pytrees of the eformer vectors (SPEC section 17) <-> numesh's flattened leaves.
//
// JAX flattens a tree depth-first: dict keys in sorted order, list elements by index, None
// subtrees skipped (None is an empty pytree). A leaf is any other value; here that is an
// `{"$array": {"shape", "dtype"}}` object, an `{"$spec": [...]}` object or a scalar. The path
// of a leaf is its keys joined with '/' (list indices as decimal), as eformer names leaves.

#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "conformance.hpp"
#include "numesh/sharding/named_array.hpp"

namespace numesh::conformance {

/// One flattened leaf: its key path (strings for dict keys, indices for list elements), the
/// joined path, and the encoded leaf.
struct FlatLeaf {
  std::vector<std::variant<std::string, std::size_t>> keys;
  std::string path;
  const json* value = nullptr;
};

/// True for a JSON value the vectors encode as a pytree leaf.
inline bool is_tree_leaf(const json& j) {
  if (j.is_object()) return j.contains("$array") || j.contains("$spec") || j.contains("$pspec");
  return !j.is_array() && !j.is_null();
}

namespace tree_detail {
inline void flatten(const json& tree, FlatLeaf& prefix, std::vector<FlatLeaf>& out) {
  if (tree.is_null()) return;
  if (is_tree_leaf(tree)) {
    FlatLeaf leaf = prefix;
    leaf.value = &tree;
    for (std::size_t i = 0; i < leaf.keys.size(); ++i) {
      if (i) leaf.path += '/';
      const auto& k = leaf.keys[i];
      leaf.path += k.index() == 0 ? std::get<0>(k) : std::to_string(std::get<1>(k));
    }
    out.push_back(std::move(leaf));
    return;
  }
  if (tree.is_object()) {  // nlohmann's object is a std::map: keys iterate sorted
    for (const auto& [k, v] : tree.items()) {
      prefix.keys.emplace_back(k);
      flatten(v, prefix, out);
      prefix.keys.pop_back();
    }
  } else {
    for (std::size_t i = 0; i < tree.size(); ++i) {
      prefix.keys.emplace_back(i);
      flatten(tree[i], prefix, out);
      prefix.keys.pop_back();
    }
  }
}

inline json rebuild(const json& tree, const std::vector<json>& leaves, std::size_t& next) {
  if (tree.is_null()) return nullptr;
  if (is_tree_leaf(tree)) return leaves.at(next++);
  json out = tree.is_object() ? json::object() : json::array();
  if (tree.is_object()) {
    for (const auto& [k, v] : tree.items()) out[k] = rebuild(v, leaves, next);
  } else {
    for (const auto& v : tree) out.push_back(rebuild(v, leaves, next));
  }
  return out;
}
}  // namespace tree_detail

/// The leaves of `tree` in JAX order.
inline std::vector<FlatLeaf> flatten_tree(const json& tree) {
  std::vector<FlatLeaf> out;
  FlatLeaf prefix;
  tree_detail::flatten(tree, prefix, out);
  return out;
}

/// `tree` with its leaves replaced, in order, by `leaves` (one per leaf of flatten_tree(tree)).
inline json rebuild_tree(const json& tree, const std::vector<json>& leaves) {
  std::size_t next = 0;
  json out = tree_detail::rebuild(tree, leaves, next);
  if (next != leaves.size()) throw NotEvaluated("rebuild_tree: leaf count mismatch");
  return out;
}

/// The value of `tree` at `leaf`'s key path (for a second tree of the same structure, e.g. a
/// dict of specs whose leaves are raw spec lists). Throws NotEvaluated when the path is absent.
inline const json& at_key_path(const json& tree, const FlatLeaf& leaf) {
  const json* node = &tree;
  for (const auto& k : leaf.keys) {
    if (k.index() == 0) {
      if (!node->is_object() || !node->contains(std::get<0>(k))) {
        throw NotEvaluated("second tree has no entry at " + leaf.path);
      }
      node = &(*node)[std::get<0>(k)];
    } else {
      if (!node->is_array() || node->size() <= std::get<1>(k)) {
        throw NotEvaluated("second tree has no entry at " + leaf.path);
      }
      node = &(*node)[std::get<1>(k)];
    }
  }
  return *node;
}

/// The NamedLeaf of a flattened leaf: `$array` leaves carry shape and dtype; any other leaf
/// has no array.
inline sharding::NamedLeaf to_named_leaf(const FlatLeaf& leaf) {
  sharding::NamedLeaf out{leaf.path, std::nullopt};
  if (leaf.value->is_object() && leaf.value->contains("$array")) {
    const json& a = (*leaf.value)["$array"];
    out.array = sharding::ArrayInfo{decode_shape(a.at("shape")), a.value("dtype", "float32")};
  }
  return out;
}

/// to_named_leaf of every leaf of `flat`, in order.
inline std::vector<sharding::NamedLeaf> named_leaves(const std::vector<FlatLeaf>& flat) {
  std::vector<sharding::NamedLeaf> out;
  for (const auto& leaf : flat) out.push_back(to_named_leaf(leaf));
  return out;
}

/// An `{"shape", "dtype"}` object (bare, or as a tree leaf `{"$array": {...}}`) as an ArrayInfo.
inline sharding::ArrayInfo decode_array(const json& j) {
  const json& a = j.is_object() && j.contains("$array") ? j["$array"] : j;
  return sharding::ArrayInfo{decode_shape(a.at("shape")), a.value("dtype", "float32")};
}

/// `{"$spec": [...]}`.
inline json spec_leaf(const sharding::PartitionSpec& spec) {
  return json{{"$spec", encode_spec(spec)}};
}

}  // namespace numesh::conformance
