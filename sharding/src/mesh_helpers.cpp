#include "numesh/sharding/mesh_helpers.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {

namespace {

const Mesh& mesh_or_current(const Mesh* mesh) {
  return mesh != nullptr ? *mesh : get_incontext_mesh(true);
}

// Python's type() repr of a dynamically typed axis value.
std::string python_type(const AxisRule& r) {
  switch (r.kind()) {
    case AxisRule::Kind::kNone:
      return "<class 'NoneType'>";
    case AxisRule::Kind::kNotGiven:
      return "<class 'eformer.common_types._Empty'>";
    case AxisRule::Kind::kUnconstrained:
      return "<class 'jax._src.partition_spec.UnconstrainedSingleton'>";
    case AxisRule::Kind::kName:
      return "<class 'str'>";
    case AxisRule::Kind::kInt:
      return "<class 'int'>";
    case AxisRule::Kind::kTuple:
      return "<class 'tuple'>";
    case AxisRule::Kind::kList:
      return "<class 'list'>";
  }
  return "<class 'object'>";
}

// mesh.shape[name], raising KeyError as a Python dict does.
std::int64_t axis_size_or_key_error(const Mesh& mesh, const AxisRule& name) {
  if (name.is_name()) return mesh.axis_size(name.name());
  throw KeyError(name.repr(),
                 fmt::format("{} is not an axis of mesh {}", name.repr(), mesh.names_repr()));
}

std::int64_t unbound_checked_size(const Mesh& mesh, const std::string& name) {
  const auto index = mesh.find_axis(name);
  if (!index) throw KeyError(name, fmt::format("unbound axis name: {}", name));
  return mesh.sizes()[*index];
}

// The message Python gives when iterating a non-iterable spec entry.
void collect_names(const AxisRule& item, std::set<std::string>& names) {
  switch (item.kind()) {
    case AxisRule::Kind::kNone:
      return;
    case AxisRule::Kind::kName:
      names.insert(item.name());
      return;
    case AxisRule::Kind::kTuple:
    case AxisRule::Kind::kList:
      for (const AxisRule& m : item.members()) collect_names(m, names);
      return;
    case AxisRule::Kind::kInt:
      throw TypeError("'int' object is not iterable");
    case AxisRule::Kind::kUnconstrained:
      throw TypeError("'UnconstrainedSingleton' object is not iterable");
    case AxisRule::Kind::kNotGiven:
      throw TypeError("'_Empty' object is not iterable");
  }
}

// Decimal text of a big-endian unsigned integer.
std::string big_endian_to_decimal(const unsigned char* bytes, std::size_t n) {
  std::vector<unsigned> digits;  // little-endian base 10^9
  for (std::size_t i = 0; i < n; ++i) {
    unsigned long long carry = bytes[i];
    for (unsigned& d : digits) {
      const unsigned long long v = static_cast<unsigned long long>(d) * 256ULL + carry;
      d = static_cast<unsigned>(v % 1000000000ULL);
      carry = v / 1000000000ULL;
    }
    while (carry != 0) {
      digits.push_back(static_cast<unsigned>(carry % 1000000000ULL));
      carry /= 1000000000ULL;
    }
  }
  if (digits.empty()) return "0";
  std::string out = fmt::format("{}", digits.back());
  for (auto it = digits.rbegin() + 1; it != digits.rend(); ++it) out += fmt::format("{:09}", *it);
  return out;
}

const EVP_MD* find_digest(std::string_view algorithm) {
  static const std::pair<std::string_view, const EVP_MD* (*)()> kDigests[] = {
      {"md5", EVP_md5},           {"sha1", EVP_sha1},          {"sha224", EVP_sha224},
      {"sha256", EVP_sha256},     {"sha384", EVP_sha384},      {"sha512", EVP_sha512},
      {"sha3_224", EVP_sha3_224}, {"sha3_256", EVP_sha3_256},  {"sha3_384", EVP_sha3_384},
      {"sha3_512", EVP_sha3_512}, {"blake2b", EVP_blake2b512}, {"blake2s", EVP_blake2s256},
  };
  for (const auto& [name, fn] : kDigests) {
    if (name == algorithm) return fn();
  }
  return nullptr;
}

}  // namespace

const Mesh& get_incontext_mesh(bool raise_error) {
  const Mesh& mesh = current_mesh();
  if (mesh.empty() && raise_error) throw NoMeshError("No mesh found under this context manager.");
  return mesh;
}

std::int64_t get_axes_size_in_mesh(std::string_view name, const Mesh* mesh) {
  return mesh_or_current(mesh).axis_size(name);
}

std::int64_t get_axes_size_in_mesh(const std::vector<std::string>& names, const Mesh* mesh) {
  const Mesh& m = mesh_or_current(mesh);
  std::int64_t product = 1;
  for (const std::string& n : names) product *= m.axis_size(n);
  return product;
}

std::int64_t get_axes_size_in_mesh(const AxisRule& axis_names, const Mesh* mesh) {
  const Mesh& m = mesh_or_current(mesh);
  if (axis_names.is_name()) return m.axis_size(axis_names.name());
  if (axis_names.is_sequence()) {
    std::int64_t product = 1;
    for (const AxisRule& n : axis_names.members()) product *= axis_size_or_key_error(m, n);
    return product;
  }
  throw TypeError(
      fmt::format("axis_names must be str or Sequence[str], got {}", python_type(axis_names)));
}

std::vector<std::string> get_mesh_axis_names(const Mesh* mesh) {
  return mesh_or_current(mesh).names();
}

std::int64_t get_mesh_axis_size(const Mesh& mesh, const std::vector<std::string>& axis_names) {
  std::int64_t product = 1;
  for (const std::string& n : axis_names) product *= unbound_checked_size(mesh, n);
  return product;
}

std::int64_t get_submesh_device_index(const Mesh& mesh,
                                      const std::vector<std::int64_t>& device_coords,
                                      const std::vector<std::string>& axis_names) {
  if (device_coords.size() != mesh.rank()) {
    throw ValueError(fmt::format("device coordinates ({}) need one entry per axis of mesh {}",
                                 fmt::join(device_coords, ", "), mesh.repr()));
  }
  for (std::size_t a = 0; a < mesh.rank(); ++a) {
    if (device_coords[a] < 0 || device_coords[a] >= mesh.sizes()[a]) {
      throw ValueError(fmt::format("device coordinate {} is outside axis '{}' of size {}",
                                   device_coords[a], mesh.names()[a], mesh.sizes()[a]));
    }
  }
  std::int64_t index = 0;
  std::int64_t stride = 1;
  for (auto it = axis_names.rbegin(); it != axis_names.rend(); ++it) {
    const std::int64_t size = unbound_checked_size(mesh, *it);
    index += device_coords[*mesh.find_axis(*it)] * stride;
    stride *= size;
  }
  return index;
}

std::string get_safe_hash_int(std::string_view text, std::string_view algorithm) {
  const EVP_MD* md = find_digest(algorithm);
  if (md == nullptr) throw ValueError(fmt::format("Unsupported hash algorithm: {}", algorithm));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &length, md, nullptr) != 1) {
    throw Error(fmt::format("Error generating hash: OpenSSL {} digest failed", algorithm));
  }
  return big_endian_to_decimal(digest, length);
}

bool names_in_current_mesh(const std::vector<std::string>& names) {
  const Mesh& mesh = current_mesh();
  return std::all_of(names.begin(), names.end(),
                     [&](const std::string& n) { return mesh.has_axis(n); });
}

std::vector<std::string> get_names_from_partition_spec(const std::vector<PartitionSpec>& specs) {
  std::set<std::string> names;
  for (const PartitionSpec& spec : specs) {
    for (const AxisRule& entry : spec) collect_names(entry, names);
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> get_names_from_partition_spec(
    const std::map<std::string, PartitionSpec>& specs) {
  std::vector<PartitionSpec> values;
  values.reserve(specs.size());
  for (const auto& [key, spec] : specs) values.push_back(spec);
  return get_names_from_partition_spec(values);
}

}  // namespace numesh::sharding
