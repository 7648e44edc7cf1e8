#include "numesh/sharding/easydel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding::easydel {

namespace {

using Axes = std::vector<AxisRule>;

AxisRule tok(std::string_view t) { return AxisRule(t); }

// Python's str() of a spec entry, which EasyDeL uses as the key into mesh.shape.
std::string str_of(const AxisRule& r) { return r.is_name() ? r.name() : r.repr(); }

std::int64_t axis_size_or_one(const Mesh& mesh, const AxisRule& name) {
  auto a = mesh.find_axis(str_of(name));
  return a ? mesh.sizes()[*a] : 1;
}

// Python's sequence indexing with negative indices; nullopt when out of range.
std::optional<std::size_t> py_index(std::int64_t i, std::size_t size) {
  const auto n = static_cast<std::int64_t>(size);
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return static_cast<std::size_t>(i);
}

// layers/_sharding.py _sanitize_spec_for_shape: dims past the rank are skipped, not cut.
PartitionSpec drop_indivisible(const PartitionSpec& spec, const std::vector<std::int64_t>& shape,
                               const Mesh& mesh) {
  std::vector<AxisRule> entries = spec.entries();
  bool changed = false;
  for (std::size_t d = 0; d < entries.size() && d < shape.size(); ++d) {
    if (entries[d].is_none()) continue;
    const std::int64_t factor = mesh_partition_product(mesh, entries[d]);
    if (factor > 1 && shape[d] % factor != 0) {
      entries[d] = AxisRule();
      changed = true;
    }
  }
  return changed ? PartitionSpec(std::move(entries)) : spec;
}

// pick_mesh: the explicit mesh, else the context mesh; empty meshes do not count.
std::optional<Mesh> pick_mesh(const std::optional<Mesh>& mesh) {
  if (mesh && !mesh->empty()) return mesh;
  const Mesh& current = current_mesh();
  if (!current.empty()) return current;
  return std::nullopt;
}

}  // namespace

AttnShardingRules get_shardings(const PartitionManager& pm, ModeArg mode, std::string_view layout,
                                bool qkv_mni_sharding,
                                std::optional<std::size_t> softmax_aux_rank) {
  // EasyDeL checks the layout before resolving anything (its else branch), so "thd" raises
  // NotImplementedError even with a dimension mode.
  const bool bthd = layout == "bthd";
  if (!bthd && layout != "bhtd") {
    throw NotImplementedError(fmt::format("Layout '{}' is not implemented", layout));
  }
  const AxisRule h = tok(qkv_mni_sharding ? tokens::kHead : tokens::kKvHead);
  const AxisRule hd = tok(qkv_mni_sharding ? tokens::kHeadDim : tokens::kKvHeadDim);
  const AxisRule batch = tok(tokens::kBatch);
  const AxisRule qlen = tok(tokens::kQueryLength);
  const AxisRule kvlen = tok(tokens::kKvLength);
  auto resolve = [&](const Axes& axes) { return pm.resolve(axes, mode); };

  AttnShardingRules r;
  if (bthd) {
    r.query = resolve({batch, qlen, tok(tokens::kHead), tok(tokens::kHeadDim)});
    r.key = resolve({batch, kvlen, h, hd});
    r.value = resolve({batch, kvlen, h, hd});
  } else {
    r.query = resolve({batch, tok(tokens::kHead), qlen, tok(tokens::kHeadDim)});
    r.key = resolve({batch, h, kvlen, hd});
    r.value = resolve({batch, h, kvlen, hd});
  }
  r.q_segment_ids = resolve({batch, qlen});
  r.kv_segment_ids = resolve({batch, kvlen});
  r.bias = resolve({batch, tok(tokens::kBiasHeadSeq), qlen, tok(tokens::kBiasKvSeq)});
  r.mask = resolve({batch, AxisRule(), qlen, tok(tokens::kBiasKvSeq)});
  if (softmax_aux_rank) {
    r.softmax_aux = *softmax_aux_rank == 2 ? resolve({tok(tokens::kEmpty), tok(tokens::kKvHead)})
                                           : resolve({tok(tokens::kHead)});
  }
  r.query3d = resolve({batch, tok(tokens::kHead), tok(tokens::kHeadDim)});
  r.output = r.query;
  return r;
}

AxisRule resolve_eformer_axis(std::string_view token, const PartitionManager& pm) {
  return pm.paxis().resolve_axis({AxisRule(token)}, Mode::kTrain).front();
}

PartitionSpec get_moe_partition_spec(const PartitionManager& pm, std::string_view direction,
                                     const MoeSpecOptions& o) {
  if (direction != "row" && direction != "column") {
    throw ValueError(fmt::format("direction must be 'row' or 'column', got '{}'", direction));
  }
  const AxisRule ep = resolve_eformer_axis(tokens::kExpertParallel, pm);
  const AxisRule fsdp = resolve_eformer_axis(tokens::kFullyShardedDataParallel, pm);
  const AxisRule sp = resolve_eformer_axis(tokens::kSequenceParallel, pm);
  const AxisRule tp = resolve_eformer_axis(tokens::kTensorParallel, pm);
  std::vector<AxisRule> place{ep};
  if (o.module_view) {
    if (o.sp_is_ep_bound) place.push_back(sp);
    if (o.fsdp_is_ep_bound) place.push_back(fsdp);
  }
  const AxisRule expert = place.size() == 1 ? place.front() : AxisRule::tuple(std::move(place));
  if (o.tensors_are_expert) {
    return o.is_bias ? PartitionSpec{tp, nullptr} : PartitionSpec{tp, nullptr, nullptr};
  }
  if (o.is_bias) return PartitionSpec{expert, tp};
  return direction == "column" ? PartitionSpec{expert, nullptr, tp}
                               : PartitionSpec{expert, tp, nullptr};
}

ExpertMeshShape mesh_shape_ep(const Mesh& mesh, const PartitionManager& pm, bool fsdp_is_ep_bound,
                              bool sp_is_ep_bound) {
  const AxisRule dp = resolve_eformer_axis(tokens::kDataParallel, pm);
  const AxisRule fsdp = resolve_eformer_axis(tokens::kFullyShardedDataParallel, pm);
  const AxisRule ep = resolve_eformer_axis(tokens::kExpertParallel, pm);
  const AxisRule tp = resolve_eformer_axis(tokens::kTensorParallel, pm);
  const AxisRule sp = resolve_eformer_axis(tokens::kSequenceParallel, pm);

  enum Group : std::size_t { kDp = 0, kEp = 1, kTp = 2 };
  ExpertMeshShape out;
  out.names = {dp, ep, tp};
  std::vector<AxisRule> assigned;
  // Dedicated tp and ep axes first, then dp and the bound axes; an axis that aliases one
  // already placed is skipped, which keeps the product equal to the device count.
  auto assign = [&](const AxisRule& name, Group group) {
    if (name.is_none()) return;
    if (std::find(assigned.begin(), assigned.end(), name) != assigned.end()) return;
    assigned.push_back(name);
    // EasyDeL's mesh.shape.get(name, 1): only a plain name can be a key of the mesh shape.
    out.sizes[group] *= name.is_name() ? axis_size_or_one(mesh, name) : 1;
  };
  assign(tp, kTp);
  assign(ep, kEp);
  assign(dp, kDp);
  assign(fsdp, fsdp_is_ep_bound ? kEp : kDp);
  assign(sp, sp_is_ep_bound ? kEp : kDp);
  return out;
}

Mesh expert_mesh(const Mesh& mesh, const PartitionManager& pm, bool fsdp_is_ep_bound,
                 bool sp_is_ep_bound) {
  const ExpertMeshShape shape = mesh_shape_ep(mesh, pm, fsdp_is_ep_bound, sp_is_ep_bound);
  std::vector<std::string> names;
  for (const AxisRule& n : shape.names) {
    if (!n.is_name()) {
      throw ValueError(
          fmt::format("easydel: expert mesh axis name {} is not a plain name", n.repr()));
    }
    names.push_back(n.name());
  }
  if (names[0] == names[1] || names[0] == names[2] || names[1] == names[2]) {
    throw ValueError(fmt::format(
        "easydel: expert mesh axis names ({}, {}, {}) are not distinct; the PartitionAxis "
        "aliases dp, ep or tp",
        python_repr(names[0]), python_repr(names[1]), python_repr(names[2])));
  }
  return Mesh(std::move(names), {shape.sizes[0], shape.sizes[1], shape.sizes[2]});
}

std::optional<PartitionSpec> create_stable_sharding(const StableShardingArgs& args,
                                                    const std::optional<Mesh>& mesh) {
  if (!mesh) return args.state_ps;
  if (args.dep_is_none || !args.state_ps) return std::nullopt;
  const PartitionSpec& state = *args.state_ps;
  if (!args.preserved_indices) {
    if (!args.tensor_shape) return state;
    return get_corrected_named_sharding(*args.tensor_shape, state, *mesh).spec();
  }
  std::vector<AxisRule> entries(state.size());
  const PartitionSpec& source = args.clone_ps ? *args.clone_ps : state;
  for (std::int64_t i : *args.preserved_indices) {
    // Python evaluates `source_ps[idx]` before the assignment `new_spec[idx] = ...`.
    const auto from = py_index(i, source.size());
    if (!from) throw IndexError("tuple index out of range");
    const auto to = py_index(i, entries.size());
    if (!to) throw IndexError("list assignment index out of range");
    entries[*to] = source[*from];
  }
  PartitionSpec sharding(std::move(entries));
  if (!args.tensor_shape) return sharding;
  return get_corrected_named_sharding(*args.tensor_shape, sharding, *mesh).spec();
}

Mode get_mode(const std::vector<std::int64_t>& query_shape, bool bthd) {
  const std::size_t dim = bthd ? 1 : 2;
  if (dim >= query_shape.size()) throw IndexError("tuple index out of range");
  return query_shape[dim] == 1 ? Mode::kDecode : Mode::kTrain;
}

std::string generalize_numeric_path(std::string_view pattern) {
  // Python 3.7+ re.escape escapes exactly these characters.
  static constexpr std::string_view kSpecial = "()[]{}?*+-|^$\\.&~# \t\n\r\v\f";
  std::string out = "^(?:.*/)?";
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = pattern.find('/', start);
    const std::string_view part = pattern.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
      out += "\\d+";
    } else {
      for (char c : part) {
        if (kSpecial.find(c) != std::string_view::npos) out += '\\';
        out += c;
      }
    }
    if (slash == std::string_view::npos) break;
    out += '/';
    start = slash + 1;
  }
  out += '$';
  return out;
}

std::int64_t mesh_partition_product(const Mesh& mesh, const AxisRule& entry) {
  if (entry.is_none()) return 1;
  if (entry.is_sequence()) {
    std::int64_t product = 1;
    for (const AxisRule& m : entry.members()) {
      if (m.is_none()) continue;
      product *= axis_size_or_one(mesh, m);
    }
    return product;
  }
  return axis_size_or_one(mesh, entry);
}

PartitionSpec sanitize_partition_spec_for_shape(const PartitionSpec& spec,
                                                const std::vector<std::int64_t>& shape,
                                                const Mesh& mesh) {
  if (spec.size() > shape.size()) {
    std::vector<AxisRule> cut(spec.entries().begin(),
                              spec.entries().begin() + static_cast<std::ptrdiff_t>(shape.size()));
    return drop_indivisible(PartitionSpec(std::move(cut)), shape, mesh);
  }
  return drop_indivisible(spec, shape, mesh);
}

std::optional<PartitionSpec> resolve_safe_sharding(const DynamicShardingAxes& axes,
                                                   const std::vector<std::int64_t>& shape,
                                                   const PartitionManager* pm,
                                                   const std::optional<Mesh>& mesh) {
  if (pm == nullptr) return std::nullopt;
  std::optional<PartitionSpec> resolved;
  // EasyDeL's attempts: with the shape (twice: with and without its mode argument, which a
  // preset ignores), then without it (twice). Two distinct calls remain.
  try {
    resolved = pm->resolve(axes, shape);
  } catch (const Error&) {
    try {
      resolved = pm->resolve(axes);
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  const auto m = pick_mesh(mesh);
  if (!m) return resolved;
  return drop_indivisible(*resolved, shape, *m);
}

std::optional<PartitionSpec> resolve_safe_sharding(const std::vector<AxisRule>& axes,
                                                   const std::vector<std::int64_t>& shape,
                                                   const PartitionManager* pm,
                                                   const std::optional<Mesh>& mesh, ModeArg mode) {
  if (pm == nullptr) return std::nullopt;
  std::optional<PartitionSpec> resolved;
  // Only EasyDeL's first attempt can succeed for a plain list: the others leave `mode` out,
  // and eformer then demands dynamic axes.
  try {
    resolved = pm->resolve(axes, mode, shape);
  } catch (const Error&) {
    return std::nullopt;
  }
  const auto m = pick_mesh(mesh);
  if (!m) return resolved;
  return drop_indivisible(*resolved, shape, *m);
}

}  // namespace numesh::sharding::easydel
