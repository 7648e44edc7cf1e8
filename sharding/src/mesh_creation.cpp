#include "numesh/sharding/mesh_creation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "numesh/core/error.hpp"
#include "numesh/sharding/axis_rule.hpp"

namespace numesh::sharding {

namespace {

std::int64_t product(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (std::int64_t x : v) p *= x;
  return p;
}

// Python's repr of a tuple of ints: (1, 3), (2,), ().
std::string tuple_repr(const std::vector<std::int64_t>& v) {
  if (v.size() == 1) return fmt::format("({},)", v[0]);
  return fmt::format("({})", fmt::join(v, ", "));
}

// Python's repr of a list of strings: ['dp', 'tp'].
std::string list_repr(const std::vector<std::string>& v) {
  std::vector<std::string> parts;
  parts.reserve(v.size());
  for (const std::string& s : v) parts.push_back(python_repr(s));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

// Python's type() repr for a JSON value.
std::string python_type(const nlohmann::json& j) {
  if (j.is_string()) return "<class 'str'>";
  if (j.is_boolean()) return "<class 'bool'>";
  if (j.is_number_integer()) return "<class 'int'>";
  if (j.is_number_float()) return "<class 'float'>";
  if (j.is_null()) return "<class 'NoneType'>";
  if (j.is_array()) return "<class 'list'>";
  return "<class 'dict'>";
}

AxisType parse_axis_type(const std::string& text) {
  std::string key = text;
  const auto not_space = [](unsigned char c) { return std::isspace(c) == 0; };
  key.erase(key.begin(), std::find_if(key.begin(), key.end(), not_space));
  key.erase(std::find_if(key.rbegin(), key.rend(), not_space).base(), key.end());
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (key == "auto") return AxisType::kAuto;
  if (key == "explicit") return AxisType::kExplicit;
  if (key == "manual") return AxisType::kManual;
  throw ValueError(
      fmt::format("axis_types must be one of {{'auto', 'explicit', 'manual'}} or AxisType, got {}.",
                  python_repr(text)));
}

void check_length(std::size_t n_types, std::size_t n_names) {
  if (n_types != n_names) {
    throw ValueError(fmt::format(
        "axis_types length must match axis_names length. Got {} types for {} axis names.", n_types,
        n_names));
  }
}

// Python's int(text) for base 10.
std::int64_t python_int(std::string_view text) {
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front())) != 0) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())) != 0) t.remove_suffix(1);
  bool negative = false;
  if (!t.empty() && (t.front() == '+' || t.front() == '-')) {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  std::int64_t value = 0;
  bool last_digit = false;
  bool ok = !t.empty();
  for (char c : t) {
    if (c == '_' && last_digit) {
      last_digit = false;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) {
      ok = false;
      break;
    }
    // Python's int has no bound; a mesh dimension beyond int64 is refused here by name
    // (it overflowed silently before: found by partition_spec_fuzz under UBSan).
    if (value > (std::numeric_limits<std::int64_t>::max() - (c - '0')) / 10) {
      throw ValueError(fmt::format("mesh dimension {} is too large (at most {})", python_repr(text),
                                   std::numeric_limits<std::int64_t>::max()));
    }
    value = value * 10 + (c - '0');
    last_digit = true;
  }
  if (!ok || !last_digit) {
    throw ValueError(fmt::format("invalid literal for int() with base 10: {}", python_repr(text)));
  }
  return negative ? -value : value;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t pos; (pos = text.find(sep, start)) != std::string_view::npos; start = pos + 1) {
    parts.emplace_back(text.substr(start, pos - start));
  }
  parts.emplace_back(text.substr(start));
  return parts;
}

// Python's `%` where the divisor may be 0: ZeroDivisionError, reported as ValueError.
std::int64_t checked_mod(std::int64_t a, std::int64_t b) {
  if (b == 0) throw ValueError("integer division or modulo by zero");
  return a % b;
}

}  // namespace

std::string_view to_string(AxisType type) noexcept {
  switch (type) {
    case AxisType::kAuto:
      return "Auto";
    case AxisType::kExplicit:
      return "Explicit";
    case AxisType::kManual:
      return "Manual";
  }
  return "Auto";
}

std::vector<AxisType> normalize_axis_types(const std::vector<std::string>& axis_names,
                                           const std::vector<AxisType>& types) {
  std::vector<AxisType> out = types;
  if (out.size() == 1 && axis_names.size() > 1) out.assign(axis_names.size(), types[0]);
  check_length(out.size(), axis_names.size());
  return out;
}

std::optional<std::vector<AxisType>> normalize_axis_types(
    const std::vector<std::string>& axis_names, const nlohmann::json& axis_types) {
  if (axis_types.is_null()) return std::nullopt;
  std::vector<nlohmann::json> entries;
  if (axis_types.is_string()) {
    entries.assign(axis_names.size(), axis_types);
  } else if (axis_types.is_array()) {
    entries.assign(axis_types.begin(), axis_types.end());
    if (entries.size() == 1 && axis_names.size() > 1) entries.assign(axis_names.size(), entries[0]);
  } else {
    std::string type = python_type(axis_types);  // "<class 'int'>" -> 'int'
    type = type.substr(7, type.size() - 8);
    throw TypeError(fmt::format("{} object is not iterable", type));
  }
  std::vector<AxisType> out;
  out.reserve(entries.size());
  for (const nlohmann::json& e : entries) {
    if (!e.is_string()) {
      throw TypeError(fmt::format("axis_types entries must be strings or AxisType values, got {}.",
                                  python_type(e)));
    }
    out.push_back(parse_axis_type(e.get<std::string>()));
  }
  check_length(out.size(), axis_names.size());
  return out;
}

std::vector<std::int64_t> calculate_host_mesh_shape(
    const std::vector<std::int64_t>& global_mesh_shape, std::int64_t total_devices,
    std::int64_t num_processes) {
  const std::int64_t total = product(global_mesh_shape);
  if (total != total_devices * num_processes) {
    throw ValueError(
        fmt::format("Mesh size {} doesn't match available devices {} (local x "
                    "processes)",
                    total, total_devices * num_processes));
  }
  std::vector<std::int64_t> host = global_mesh_shape;
  std::int64_t remaining = num_processes;
  for (std::size_t i = 0; remaining > 1 && i < host.size(); ++i) {
    const std::int64_t dim = host[i];
    if (dim >= remaining) {
      host[i] = dim / remaining;
      remaining = 1;
    } else {
      host[i] = 1;
      if (dim == 0) throw ValueError("integer division or modulo by zero");
      remaining /= dim;
    }
  }
  const std::int64_t host_total = product(host);
  if (host_total != total_devices) {
    throw ValueError(fmt::format(
        "Host mesh shape {} uses {} devices instead of {}. Ensure that num_processes factors "
        "the global mesh shape.",
        tuple_repr(host), host_total, total_devices));
  }
  return host;
}

std::vector<std::int64_t> fill_minus_one_to_target(const std::vector<std::int64_t>& shape,
                                                   std::int64_t target) {
  std::vector<std::int64_t> out = shape;
  std::vector<std::size_t> minus;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) minus.push_back(i);
  }
  if (minus.size() > 1) throw ValueError("Only one -1 is supported in dcn_mesh_dims.");
  std::int64_t known = 1;
  for (std::int64_t v : out) {
    if (v == -1) continue;
    if (v <= 0) throw ValueError(fmt::format("dcn_mesh_dims entries must be > 0 or -1, got {}", v));
    known *= v;
  }
  if (!minus.empty()) {
    if (target % known != 0) {
      throw ValueError(
          fmt::format("dcn_mesh_dims product ({}) does not divide target ({}).", known, target));
    }
    out[minus[0]] = target / known;
  }
  if (product(out) != target) {
    throw ValueError(fmt::format("dcn_mesh_dims product {} must equal {}; got {}", product(out),
                                 target, tuple_repr(out)));
  }
  return out;
}

MeshLayout create_mesh_layout(const std::vector<std::int64_t>& axis_dims,
                              const std::vector<std::string>& axis_names,
                              const CreateMeshOptions& options) {
  const std::vector<std::int64_t> global = resolve_mesh_dims(axis_dims, options.device_count);
  std::vector<std::int64_t> local = global;
  std::vector<std::int64_t> dcn(global.size(), 1);
  if (options.num_slices > 1) {
    const auto axis = std::find_if(global.begin(), global.end(),
                                   [&](std::int64_t d) { return d % options.num_slices == 0; });
    if (axis == global.end()) {
      throw ValueError(
          fmt::format("Multi-slice detected (num_slices={}) but no mesh axis in {} "
                      "is divisible by num_slices.",
                      options.num_slices, tuple_repr(global)));
    }
    const auto index = static_cast<std::size_t>(axis - global.begin());
    local[index] /= options.num_slices;
    if (options.dcn_mesh_dims) {
      dcn = fill_minus_one_to_target(*options.dcn_mesh_dims, options.num_slices);
    } else {
      dcn[index] = options.num_slices;
    }
  } else if (options.process_count > 1) {
    if (options.device_count % options.process_count != 0) {
      throw ValueError(fmt::format("{} devices cannot be split evenly over {} processes",
                                   options.device_count, options.process_count));
    }
    local = calculate_host_mesh_shape(global, options.device_count / options.process_count,
                                      options.process_count);
    if (options.dcn_mesh_dims) {
      dcn = fill_minus_one_to_target(*options.dcn_mesh_dims, options.process_count);
    } else {
      for (std::size_t i = 0; i < global.size(); ++i) dcn[i] = global[i] / local[i];
      if (product(dcn) != options.process_count) {
        std::fill(dcn.begin(), dcn.end(), 1);
        if (!dcn.empty()) dcn[0] = options.process_count;
      }
    }
  }
  if (dcn.size() != local.size()) {
    throw ValueError(fmt::format("dcn_mesh_dims {} must have one entry per mesh axis {}",
                                 tuple_repr(dcn), tuple_repr(local)));
  }
  std::vector<std::int64_t> sizes(local.size());
  for (std::size_t i = 0; i < local.size(); ++i) sizes[i] = local[i] * dcn[i];
  return MeshLayout{Mesh(axis_names, sizes), std::move(local), std::move(dcn)};
}

Mesh create_mesh(const std::vector<std::int64_t>& axis_dims,
                 const std::vector<std::string>& axis_names, const CreateMeshOptions& options) {
  return create_mesh_layout(axis_dims, axis_names, options).mesh;
}

ParsedMeshSpec parse_mesh_from_string(std::string_view axis_dims,
                                      const std::vector<std::string>& names) {
  ParsedMeshSpec out;
  if (axis_dims.find(':') != std::string_view::npos) {
    for (const std::string& piece : split(axis_dims, ',')) {
      const std::vector<std::string> kv = split(piece, ':');
      if (kv.size() < 2) throw ValueError("not enough values to unpack (expected 2, got 1)");
      if (kv.size() > 2) throw ValueError("too many values to unpack (expected 2)");
      if (std::find(names.begin(), names.end(), kv[0]) == names.end()) {
        throw ValueError(
            fmt::format("Axis name '{}' not found in provided names: {}", kv[0], list_repr(names)));
      }
      out.axis_dims.push_back(python_int(kv[1]));
      out.axis_names.push_back(kv[0]);
    }
    const std::set<std::string> used(out.axis_names.begin(), out.axis_names.end());
    const std::set<std::string> wanted(names.begin(), names.end());
    if (used != wanted) throw ValueError("Not all axis names were used in 'axis_dims'");
  } else {
    for (const std::string& piece : split(axis_dims, ','))
      out.axis_dims.push_back(python_int(piece));
    out.axis_names = names;
  }
  if (out.axis_dims.size() != names.size()) {
    throw ValueError("Number of dimensions and names must match");
  }
  return out;
}

std::vector<MeshPartitionHelper::Method> MeshPartitionHelper::suggest_methods(
    const std::vector<std::int64_t>& shape) const {
  std::vector<Method> methods;
  const std::size_t dims = shape.size();
  const bool has_fsdp = mesh_.has_axis("fsdp");
  const bool has_sp = mesh_.has_axis("sp");
  if (dims > 1 && has_fsdp && has_sp &&
      shape[0] * shape[1] >= mesh_.axis_size("fsdp") * mesh_.axis_size("sp")) {
    methods.push_back({"fsdp", "sp"});
  }
  if (dims > 0 && mesh_.has_axis("dp")) methods.push_back({"dp"});
  const bool has_fsdp_sp =
      std::find(methods.begin(), methods.end(), Method{"fsdp", "sp"}) != methods.end();
  if (dims > 1 && has_sp && !has_fsdp_sp) methods.push_back({"sp"});
  if (mesh_.has_axis("tp")) methods.push_back({"tp"});
  const bool mentions_fsdp = std::any_of(methods.begin(), methods.end(), [](const Method& m) {
    return std::find(m.begin(), m.end(), "fsdp") != m.end();
  });
  if (has_fsdp && !mentions_fsdp) methods.push_back({"fsdp"});
  return methods;
}

PartitionSpec MeshPartitionHelper::create_partition_spec(const std::vector<std::int64_t>& shape,
                                                         const std::vector<Method>& methods,
                                                         std::int64_t min_shard_size) const {
  if (shape.empty()) return PartitionSpec();
  const std::size_t dims = shape.size();
  std::vector<AxisRule> spec(dims);
  const std::int64_t total_elements = product(shape);
  const std::int64_t total_devices = mesh_.rank() == 0 ? 1 : product(mesh_.sizes());
  // numpy's int64 `//` by 0 gives 0 (with a warning), not an error.
  const std::int64_t per_device = total_devices == 0 ? 0 : total_elements / (total_devices * 2);
  const std::int64_t min_elements_per_device = std::max(min_shard_size, per_device);
  const auto size_of = [&](const std::string& axis) { return mesh_.axis_size(axis); };

  for (const Method& method : methods) {
    std::int64_t combined = 1;
    for (const std::string& a : method) {
      if (mesh_.has_axis(a)) combined *= mesh_.axis_size(a);
    }
    if (method.size() == 1) {
      for (std::size_t d = 0; d < dims; ++d) {
        if (shape[d] >= min_elements_per_device && checked_mod(shape[d], size_of(method[0])) == 0 &&
            spec[d].is_none()) {
          spec[d] = AxisRule(method[0]);
          break;
        }
      }
    } else if (method.size() == 2) {
      // numpy int64 `%` by 0 gives 0 as well.
      const std::int64_t area = dims >= 2 ? shape[0] * shape[1] : 0;
      if (dims >= 2 && area >= combined && (combined == 0 || area % combined == 0)) {
        if (shape[0] >= size_of(method[0]) && shape[1] >= size_of(method[1]) && spec[0].is_none() &&
            spec[1].is_none()) {
          spec[0] = AxisRule(method[0]);
          spec[1] = AxisRule(method[1]);
          break;
        }
      } else if (dims >= 2 && shape[0] >= combined && (combined == 0 || shape[0] % combined == 0) &&
                 spec[0].is_none()) {
        spec[0] = AxisRule::tuple({AxisRule(method[0]), AxisRule(method[1])});
        break;
      }
    }
  }

  const bool all_none =
      std::all_of(spec.begin(), spec.end(), [](const AxisRule& r) { return r.is_none(); });
  if (all_none) {
    for (const Method& method : methods) {
      if (method.size() == 1) {
        for (std::size_t d = 0; d < dims; ++d) {
          if (shape[d] >= min_shard_size && checked_mod(shape[d], size_of(method[0])) == 0 &&
              spec[d].is_none()) {
            spec[d] = AxisRule(method[0]);
            break;
          }
        }
      } else if (method.size() == 2 && method == Method{"fsdp", "sp"}) {
        // eformer quirk: no divisibility check here; a 1-d shape (reachable only with
        // caller-given methods) makes eformer index spec[1] out of range.
        if (dims < 2 && spec[0].is_none()) throw IndexError("list index out of range");
        if (spec[0].is_none() && spec[1].is_none()) {
          spec[0] = AxisRule("fsdp");
          spec[1] = AxisRule("sp");
          break;
        }
        if (spec[0].is_none()) {
          spec[0] = AxisRule::tuple({AxisRule("fsdp"), AxisRule("sp")});
          break;
        }
      }
    }
  }
  return PartitionSpec(std::move(spec));
}

PartitionSpec MeshPartitionHelper::auto_partition_spec(const std::vector<std::int64_t>& shape,
                                                       std::int64_t min_shard_size) const {
  return create_partition_spec(shape, suggest_methods(shape), min_shard_size);
}

}  // namespace numesh::sharding
