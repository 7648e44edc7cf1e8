#include "mesh_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <ostream>

#include "numesh/runtime/device_mesh.hpp"

namespace numesh::tools {

namespace {

// How the device's memory is placed, checked with a probe page where the OS can tell:
// "bound, on node 0", "first-touch, on node 0", "unbound".
std::string memory_report(runtime::Device& d) {
  std::string text(runtime::to_string(d.memory_binding()));
  const runtime::DeviceBuffer probe = d.allocate(4096);
  if (const auto node = probe.query_node()) {
    text += *node >= 0 ? fmt::format(", on node {}", *node) : ", spread over nodes";
  }
  return text;
}

}  // namespace

CLI::App* add_mesh_command(CLI::App& app, MeshCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "mesh",
      "Lay the devices of this machine (or a synthetic or XML topology) into a named mesh, as "
      "eformer's create_mesh does, and show which device sits at which coordinate.");
  cmd->footer(R"(Examples:
  numesh mesh --dims 2,-1 --names dp,tp
  numesh mesh --synthetic 'package:2 numa:2 core:4 pu:1' --dims 2,2 --names dp,tp --json)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/false);
  cmd->add_flag("--json", o.json, "Print JSON instead of text");
  return cmd;
}

void run_mesh(const MeshCommandOptions& o, std::ostream& out) {
  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  const runtime::DeviceSet& devices = mesh.devices();
  const runtime::PlacementOptions& placement = devices.options();

  nlohmann::json slots = nlohmann::json::array();
  std::vector<std::string> memory;
  for (std::int64_t s = 0; s < mesh.size(); ++s) memory.push_back(memory_report(mesh.device(s)));
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const runtime::Device& d = mesh.device(s);
    slots.push_back({{"slot", s},
                     {"coords", mesh.coords(s)},
                     {"device", d.index()},
                     {"label", d.spec().label},
                     {"cpuset", d.spec().cpuset.to_string()},
                     {"threads", d.spec().threads},
                     {"numa_node", d.spec().numa_node},
                     {"pinning", std::string(runtime::to_string(d.pinning()))},
                     {"memory", memory[static_cast<std::size_t>(s)]}});
  }
  nlohmann::json groups = nlohmann::json::object();
  for (const std::string& axis : mesh.mesh().names()) {
    groups[axis] = mesh.groups(std::vector<std::string>{axis});
  }
  if (o.json) {
    out << nlohmann::json{{"mesh",
                           {{"names", mesh.mesh().names()}, {"sizes", mesh.mesh().sizes()}}},
                          {"policy", std::string(runtime::to_string(placement.policy))},
                          {"slots", slots},
                          {"groups", groups},
                          {"notes", devices.notes()}}
               .dump(2)
        << "\n";
    return;
  }
  out << mesh.to_string() << "\n\n";
  out << fmt::format("{:>4}  {:<14}  {:>6}  {:<10}  {:<12}  {:>7}  {:>4}  {:<16}  {}\n", "slot",
                     "coords", "device", "label", "cpus", "threads", "node", "pinning", "memory");
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const runtime::Device& d = mesh.device(s);
    std::vector<std::string> coords;
    const auto c = mesh.coords(s);
    for (std::size_t a = 0; a < c.size(); ++a) {
      coords.push_back(fmt::format("{}={}", mesh.mesh().names()[a], c[a]));
    }
    out << fmt::format("{:>4}  {:<14}  {:>6}  {:<10}  {:<12}  {:>7}  {:>4}  {:<16}  {}\n", s,
                       fmt::format("{}", fmt::join(coords, ",")), d.index(), d.spec().label,
                       d.spec().cpuset.to_string(), d.spec().threads, d.spec().numa_node,
                       runtime::to_string(d.pinning()), memory[static_cast<std::size_t>(s)]);
  }
  out << "\ngroups (collectives over one axis run within each group):\n";
  for (const std::string& axis : mesh.mesh().names()) {
    std::vector<std::string> parts;
    for (const auto& g : mesh.groups(std::vector<std::string>{axis})) {
      parts.push_back(fmt::format("{{{}}}", fmt::join(g, ",")));
    }
    out << fmt::format("  {}: {}\n", axis, fmt::join(parts, " "));
  }
  if (!devices.notes().empty()) {
    out << "\nnotes:\n";
    for (const std::string& n : devices.notes()) out << "  - " << n << "\n";
  }
}

}  // namespace numesh::tools
