#include "resolve_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "numesh/core/error.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/presets.hpp"
#include "numesh/sharding/shard_layout.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"
#include "render.hpp"

namespace numesh::tools {

using json = nlohmann::json;

namespace {

using sharding::AxisRule;

std::string join_reprs(const std::vector<AxisRule>& rules) {
  std::vector<std::string> parts;
  for (const auto& r : rules) parts.push_back(r.repr());
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

std::string mode_label(const sharding::ModeArg& m) {
  return m.is_dim() ? fmt::format("dim:{}", m.dim()) : std::string(sharding::mode_string(m.mode()));
}

std::string_view reason_name(sharding::CorrectionReason r) {
  switch (r) {
    case sharding::CorrectionReason::kUnsupportedEntry:
      return "unsupported_entry";
    case sharding::CorrectionReason::kAxisNotInMesh:
      return "axis_not_in_mesh";
    case sharding::CorrectionReason::kNotDivisible:
      return "not_divisible";
    case sharding::CorrectionReason::kBeyondRank:
      return "beyond_rank";
  }
  return "unknown";
}

// An axis entry as JSON: a name, null, or an array of members.
json axis_json(const AxisRule& e) {
  if (e.is_none()) return nullptr;
  if (e.is_name()) return e.name();
  if (e.is_sequence()) {
    json members = json::array();
    for (const AxisRule& m : e.members()) members.push_back(axis_json(m));
    return members;
  }
  return e.repr();
}

json spec_json(const sharding::PartitionSpec& spec) {
  json out = json::array();
  for (const AxisRule& e : spec) {
    if (e.is_none()) {
      out.push_back(nullptr);
    } else if (e.is_name()) {
      out.push_back(e.name());
    } else if (e.is_sequence()) {
      json members = json::array();
      for (const AxisRule& m : e.members())
        members.push_back(m.is_name() ? json(m.name()) : json(m.repr()));
      out.push_back(members);
    } else {
      out.push_back(e.repr());
    }
  }
  return out;
}

sharding::Mesh build_mesh(const ResolveOptions& o) {
  const auto dims = parse_int_list(o.mesh_dims, "--mesh-dims");
  std::vector<std::string> names = parse_names(o.mesh_names);
  if (names.size() != dims.size()) {
    throw ValueError(fmt::format("--mesh-names '{}' has {} names but --mesh-dims '{}' has {} dims",
                                 o.mesh_names, names.size(), o.mesh_dims, dims.size()));
  }
  std::int64_t explicit_product = 1;
  for (std::int64_t d : dims) {
    if (d == 0 || d < -1) {
      throw ValueError(fmt::format("--mesh-dims '{}': {} is not a size (use a positive size or -1)",
                                   o.mesh_dims, d));
    }
    if (d > 0) explicit_product *= d;
  }
  const std::int64_t devices = o.devices.value_or(explicit_product);
  if (devices <= 0) throw ValueError(fmt::format("--devices {} is not positive", devices));
  return sharding::Mesh(std::move(names), sharding::resolve_mesh_dims(dims, devices));
}

}  // namespace

CLI::App* add_resolve_command(CLI::App& app, ResolveOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "resolve",
      "Resolve semantic axes to a PartitionSpec, correct it for a shape and a mesh, and show "
      "which slice of the array each device holds.");
  cmd->footer(R"(Examples:
  numesh resolve --axes batch,query_length,embed --mesh-dims 1,2,1,4,1 --shape 8,128,4096
  numesh resolve --preset ColumnWise --mesh-dims 2,4 --mesh-names fsdp,tp --shape 4096,11008
  numesh resolve --axes '(fsdp,sp),tp' --set tensor_parallel_axis=model \
                 --mesh-dims 2,-1 --mesh-names fsdp,model --devices 8 --shape 64,64 --json
Lists whose first item is negative need =: --mesh-dims=-1,2
)");
  auto* axes = cmd->add_option("--axes", o.axes,
                               "Comma-separated semantic axes: tokens (__BATCH__), constant names "
                               "(BATCH), short names (batch), '_' (not sharded), None, or a "
                               "composite '(fsdp,sp)' whose unknown members stay literal mesh "
                               "axis names");
  auto* preset = cmd->add_option("--preset", o.preset,
                                 "An eformer preset instead of --axes (ColumnWise, RowWise, "
                                 "HiddenStateSharding, ...); it carries its own mode");
  axes->excludes(preset);
  preset->excludes(axes);
  cmd->add_option("--mode", o.mode,
                  "train (default), prefill, decode, insert, or dim:N (decode when shape[N] "
                  "== 1, else train; needs --shape). Not with --preset");
  cmd->add_option("--paxis-json", o.paxis_json,
                  "JSON file with PartitionAxis fields (unset fields take eformer's defaults)");
  cmd->add_option("--set", o.sets,
                  "field=value for one PartitionAxis field, repeatable, applied over "
                  "--paxis-json before fields are derived; value: a name, None, or (a,b)");
  cmd->add_option("--mesh-dims", o.mesh_dims, "Mesh axis sizes; one -1 takes the remaining devices")
      ->capture_default_str();
  cmd->add_option("--mesh-names", o.mesh_names, "Mesh axis names, one per dim")
      ->capture_default_str();
  cmd->add_option("--devices", o.devices,
                  "Number of devices the mesh holds (what -1 resolves against); default: the "
                  "product of the explicit dims, so -1 becomes 1");
  cmd->add_option("--shape", o.shape,
                  "Global array shape, e.g. 8,128,4096; enables correction and the layout");
  cmd->add_option("--itemsize", o.itemsize, "Bytes per element for the per-device size")
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print the report as JSON");
  return cmd;
}

void run_resolve(const ResolveOptions& o, std::ostream& out) {
  if (o.axes.empty() && o.preset.empty()) {
    throw ValueError("resolve needs --axes or --preset");
  }
  if (!o.preset.empty() && !o.mode.empty()) {
    throw ValueError(fmt::format(
        "--mode '{}' cannot be combined with --preset '{}' (a preset carries its own mode)", o.mode,
        o.preset));
  }
  if (o.itemsize <= 0) throw ValueError(fmt::format("--itemsize {} is not positive", o.itemsize));

  std::vector<AxisRule> axes;
  sharding::ModeArg mode = sharding::Mode::kTrain;
  if (!o.preset.empty()) {
    const auto* p = sharding::find_preset(o.preset);
    if (p == nullptr) {
      std::vector<std::string_view> names;
      for (const auto& np : sharding::all_presets()) names.push_back(np.name);
      throw ValueError(fmt::format("--preset '{}' is not a preset (one of: {})", o.preset,
                                   fmt::join(names, ", ")));
    }
    axes = p->axes;
    mode = p->mode;
  } else {
    axes = parse_axes(o.axes);
    if (!o.mode.empty()) mode = parse_mode_arg(o.mode);
  }

  std::optional<std::vector<std::int64_t>> shape;
  if (!o.shape.empty()) {
    shape = parse_shape(o.shape, "--shape");
  }
  if (mode.is_dim()) {
    if (!shape) {
      throw ValueError(fmt::format("--mode {} needs --shape (the mode is read from that dim)",
                                   mode_label(mode)));
    }
    const auto rank = static_cast<std::int64_t>(shape->size());
    if (mode.dim() >= rank || mode.dim() < -rank) {
      throw ValueError(fmt::format("--mode {} is outside --shape '{}' (rank {})", mode_label(mode),
                                   o.shape, rank));
    }
  }

  // Errors from the library name the value but not the option it came from; add it.
  const std::string source =
      o.preset.empty() ? fmt::format("--axes '{}'", o.axes) : fmt::format("--preset {}", o.preset);
  const sharding::PartitionManager pm = [&] {
    try {
      return sharding::PartitionManager(build_paxis(o.paxis_json, o.sets));
    } catch (const TypeError& e) {
      throw TypeError(fmt::format("PartitionAxis (--paxis-json/--set): {}", e.what()));
    }
  }();
  const sharding::Mesh mesh = build_mesh(o);
  const sharding::PartitionSpec resolved = [&] {
    try {
      return pm.resolve(axes, mode, shape);
    } catch (const ValueError& e) {
      throw ValueError(fmt::format("{}: {}", source, e.what()));
    }
  }();

  std::optional<sharding::CorrectedSpec> corrected;
  std::optional<sharding::ShardLayout> layout;
  if (shape) {
    corrected = sharding::correct_spec(*shape, resolved, mesh);
    layout.emplace(*shape, corrected->spec, mesh);
  }

  if (o.json) {
    json j;
    json jaxes = json::array();
    for (const auto& a : axes) jaxes.push_back(axis_json(a));
    j["axes"] = jaxes;
    j["mode"] = mode_label(mode);
    j["resolved"] = spec_json(resolved);
    j["resolved_repr"] = resolved.repr();
    j["mesh"] = json{{"names", mesh.names()}, {"sizes", mesh.sizes()}};
    if (shape) {
      j["shape"] = *shape;
      j["corrected"] = spec_json(corrected->spec);
      j["corrected_repr"] = corrected->spec.repr();
      json cs = json::array();
      for (const auto& c : corrected->corrections) {
        cs.push_back(json{{"dim", c.dim},
                          {"entry", c.original.repr()},
                          {"reason", reason_name(c.reason)},
                          {"message", c.message()}});
      }
      j["corrections"] = cs;
      j["layout"] = layout_json(*layout, o.itemsize);
    }
    out << j.dump(2) << "\n";
    return;
  }

  out << fmt::format("axes:      {}\n", join_reprs(axes));
  out << fmt::format("mode:      {}{}\n", mode_label(mode),
                     o.preset.empty() ? "" : fmt::format(" (preset {})", o.preset));
  out << fmt::format("resolved:  {}\n", resolved.repr());
  out << fmt::format("mesh:      {} ({} devices)\n", mesh.repr(), mesh.size());
  if (!shape) {
    out << "(no --shape: correction and layout skipped)\n";
    return;
  }
  out << fmt::format("shape:     [{}]\n", fmt::join(*shape, ", "));
  out << fmt::format("corrected: {}\n", corrected->spec.repr());
  if (corrected->corrections.empty()) {
    out << "  (nothing dropped)\n";
  } else {
    for (const auto& c : corrected->corrections) out << "  " << c.message() << "\n";
  }
  out << "\n";
  render_layout_text(*layout, o.itemsize, out);
}

}  // namespace numesh::tools
