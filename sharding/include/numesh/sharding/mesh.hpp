#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace numesh::sharding {

/// A logical device mesh: ordered, named axes with sizes; devices are numbered 0..size()-1 in
/// row-major order over the axes (the last axis varies fastest), as `np.arange(n).reshape`.
///
/// Example: Mesh({"dp", "tp"}, {2, 4}) has 8 devices; device 5 sits at coordinates {1, 1}.
/// The physical DeviceMesh of the runtime binds each of these slots to a NUMA device.
///
/// A mesh is *empty* (JAX's `mesh.empty`) when it has no devices: no axes at all, or an axis of
/// size 0. Operations that need a mesh treat an empty mesh as "no mesh".
/// A regular value type. Thread-safety: const methods are safe to call concurrently.
class Mesh {
 public:
  /// The empty mesh (no axes, no devices).
  Mesh() = default;
  /// A mesh with the given axes. Throws: ValueError when the lengths differ, a name repeats or
  /// is empty, or a size is negative (each naming the offending values).
  Mesh(std::vector<std::string> names, std::vector<std::int64_t> sizes);

  /// Axis names in mesh order.
  const std::vector<std::string>& names() const noexcept { return names_; }
  /// Axis sizes in mesh order.
  const std::vector<std::int64_t>& sizes() const noexcept { return sizes_; }
  /// Number of axes.
  std::size_t rank() const noexcept { return names_.size(); }
  /// Number of devices: the product of the sizes; 0 for a mesh with no axes.
  std::int64_t size() const noexcept;
  /// True when the mesh has no devices.
  bool empty() const noexcept { return size() == 0; }

  /// Index of axis `name`, or nullopt.
  std::optional<std::size_t> find_axis(std::string_view name) const noexcept;
  /// True when `name` is an axis of the mesh.
  bool has_axis(std::string_view name) const noexcept { return find_axis(name).has_value(); }
  /// Size of axis `name`. Throws: KeyError (key = name) when the mesh has no such axis.
  std::int64_t axis_size(std::string_view name) const;

  /// Coordinates of `device` over the axes. REQUIRES: 0 <= device < size().
  std::vector<std::int64_t> coords_of(std::int64_t device) const;
  /// Device at `coords`. REQUIRES: one coordinate per axis, each within its size.
  std::int64_t device_at(const std::vector<std::int64_t>& coords) const;

  /// Python tuple repr of the names: `('dp', 'tp')`.
  std::string names_repr() const;
  /// `Mesh('dp': 2, 'tp': 4)`.
  std::string repr() const;

  friend bool operator==(const Mesh&, const Mesh&) = default;

 private:
  std::vector<std::string> names_;
  std::vector<std::int64_t> sizes_;
};

/// Resolves mesh dims with numpy `reshape` rules, as eformer's create_mesh does with
/// `np.arange(n_devices).reshape(dims).shape`: one `-1` takes all remaining devices.
/// Example: resolve_mesh_dims({2, -1, 1, 2, 1}, 8) == {2, 2, 1, 2, 1}.
/// Throws: ValueError "can only specify one unknown dimension" for two -1s, and "cannot
/// reshape array of size N into shape (a,newaxis,...)" when the dims do not multiply to N.
[[nodiscard]] std::vector<std::int64_t> resolve_mesh_dims(const std::vector<std::int64_t>& dims,
                                                          std::int64_t n_devices);

}  // namespace numesh::sharding
