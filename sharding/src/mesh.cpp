#include "numesh/sharding/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "numesh/core/error.hpp"
#include "numesh/sharding/axis_rule.hpp"

namespace numesh::sharding {

Mesh::Mesh(std::vector<std::string> names, std::vector<std::int64_t> sizes)
    : names_(std::move(names)), sizes_(std::move(sizes)) {
  if (names_.size() != sizes_.size()) {
    throw ValueError(fmt::format("mesh has {} axis names ({}) but {} sizes ({})", names_.size(),
                                 fmt::join(names_, ", "), sizes_.size(), fmt::join(sizes_, ", ")));
  }
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i].empty()) throw ValueError(fmt::format("mesh axis {} has an empty name", i));
    if (sizes_[i] < 0) {
      throw ValueError(fmt::format("mesh axis '{}' has negative size {}", names_[i], sizes_[i]));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (names_[j] == names_[i]) {
        throw ValueError(
            fmt::format("mesh axis name '{}' appears twice (axes {} and {})", names_[i], j, i));
      }
    }
  }
}

std::int64_t Mesh::size() const noexcept {
  if (sizes_.empty()) return 0;
  std::int64_t n = 1;
  for (std::int64_t s : sizes_) n *= s;
  return n;
}

std::optional<std::size_t> Mesh::find_axis(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  return std::nullopt;
}

std::int64_t Mesh::axis_size(std::string_view name) const {
  if (auto i = find_axis(name)) return sizes_[*i];
  throw KeyError(std::string(name),
                 fmt::format("mesh axis '{}' is not in the mesh {}", name, names_repr()));
}

std::vector<std::int64_t> Mesh::coords_of(std::int64_t device) const {
  std::vector<std::int64_t> coords(rank());
  for (std::size_t i = rank(); i-- > 0;) {
    coords[i] = device % sizes_[i];
    device /= sizes_[i];
  }
  return coords;
}

std::int64_t Mesh::device_at(const std::vector<std::int64_t>& coords) const {
  std::int64_t device = 0;
  for (std::size_t i = 0; i < rank(); ++i) device = device * sizes_[i] + coords[i];
  return device;
}

std::string Mesh::names_repr() const {
  std::string out = "(";
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (i) out += ", ";
    out += python_repr(names_[i]);
  }
  if (names_.size() == 1) out += ",";
  return out + ")";
}

std::string Mesh::repr() const {
  std::string out = "Mesh(";
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (i) out += ", ";
    out += fmt::format("{}: {}", python_repr(names_[i]), sizes_[i]);
  }
  return out + ")";
}

std::vector<std::int64_t> resolve_mesh_dims(const std::vector<std::int64_t>& dims,
                                            std::int64_t n_devices) {
  const auto unknowns = std::count(dims.begin(), dims.end(), -1);
  if (unknowns > 1) throw ValueError("can only specify one unknown dimension");
  std::int64_t known = 1;
  for (std::int64_t d : dims) {
    if (d != -1) known *= d;
  }
  auto fail = [&] {
    std::string shape = "(";
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (i) shape += ",";
      shape += dims[i] == -1 ? std::string("newaxis") : std::to_string(dims[i]);
    }
    if (dims.size() == 1) shape += ",";
    shape += ")";
    return ValueError(
        fmt::format("cannot reshape array of size {} into shape {}", n_devices, shape));
  };
  for (std::int64_t d : dims) {
    if (d < -1) throw ValueError(fmt::format("negative dimensions not allowed (got {})", d));
  }
  std::vector<std::int64_t> out = dims;
  if (unknowns == 0) {
    if (known != n_devices) throw fail();
    return out;
  }
  // numpy: with a -1 and a zero among the known dims, the size must be 0 as well... but it
  // cannot infer the unknown, so it always fails; with known > 0 the rest must divide evenly.
  if (known == 0 || n_devices % known != 0) throw fail();
  for (std::int64_t& d : out) {
    if (d == -1) d = n_devices / known;
  }
  return out;
}

}  // namespace numesh::sharding
