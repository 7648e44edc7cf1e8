#pragma once

// The options of every command that makes devices: which topology (this machine, a synthetic
// description or an XML file), how to cut it into devices (--policy, --smt, --threads) and,
// for the commands that lay the devices into a named mesh, the mesh (--dims, --names); and the
// one way each is turned into devices and a DeviceMesh, with the same checks and messages for
// every command.

#include <memory>
#include <optional>
#include <string>

#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// --synthetic / --xml / --policy / --smt / --threads, as given on the command line (checked
/// by placement_options and make_devices, so that every bad value is a numesh::Error naming it).
struct MachineOptions {
  std::optional<std::string> synthetic;  ///< --synthetic DESC, e.g. "package:2 numa:2 core:8 pu:2".
  std::optional<std::string> xml;        ///< --xml FILE (an `lstopo --of xml` export).
  std::string policy = "numa";           ///< --policy: numa, l3 or core.
  bool smt = false;                      ///< --smt: one thread per PU instead of per core.
  int max_threads = 0;                   ///< --threads N: cap per device (0 = no cap).
};

/// The machine options plus --dims and --names: what a command that lays the devices into a
/// named mesh takes. The defaults are `numesh run`'s and `numesh op`'s (the dp, ep, tp axes of
/// a model); a command with other defaults sets them before registering the options, which
/// show them in --help.
struct MeshOptions {
  MachineOptions machine;          ///< topology and placement
  std::string dims = "1,1,-1";     ///< --dims: mesh dims, comma-separated; one -1 takes the rest
  std::string names = "dp,ep,tp";  ///< --names: mesh axis names, comma-separated
};

/// Registers --synthetic, --xml (the two exclude each other), --policy and --smt on `cmd`, and
/// --threads when `with_threads`. Not thread-safe (CLI11 setup); `options` must outlive `cmd`'s
/// parsing.
void add_machine_options(CLI::App& cmd, MachineOptions& options, bool with_threads);

/// Registers --dims and --names on `cmd`, with the current values of `options` as the defaults
/// --help shows. For a command whose --help lists other options between the machine options
/// and these (`numesh op`); add_mesh_options registers both at once. Not thread-safe (CLI11
/// setup).
void add_mesh_shape_options(CLI::App& cmd, MeshOptions& options);

/// add_machine_options(cmd, options.machine, with_threads), then add_mesh_shape_options.
/// Not thread-safe (CLI11 setup).
void add_mesh_options(CLI::App& cmd, MeshOptions& options, bool with_threads);

/// The topology the options name (the running machine when neither --synthetic nor --xml).
/// Throws: TopologyError naming the description or file.
runtime::Topology load_topology(const MachineOptions& options);

/// The placement the options name.
/// Throws: ValueError for a bad --policy (parse_policy_option: `explicit` is refused, it needs
/// cpusets the CLI does not take) or a negative --threads, naming the value.
runtime::PlacementOptions placement_options(const MachineOptions& options);

/// The devices: placement_options (checked first, so that a bad value is reported even when
/// loading the topology would fail too), then load_topology, then DeviceSet::create, which
/// prints a `numesh: warning:` line on stderr for each device it cannot pin.
/// Throws: as placement_options and load_topology; what DeviceSet::create throws.
std::shared_ptr<runtime::DeviceSet> make_devices(const MachineOptions& options);

/// Checks what the mesh options decide without creating anything: --dims must be a list of
/// integers. make_mesh checks it first too; a command that loads inputs before it creates
/// devices calls this before loading them, so that a bad --dims is reported first.
/// Throws: ValueError "--dims '{text}': '{item}' is not an integer".
void check_mesh_options(const MeshOptions& options);

/// The devices (make_devices) laid out as the mesh --dims and --names ask for, eformer's
/// create_mesh (DeviceMesh::create). The mesh holds the device set (DeviceMesh::device_set())
/// and the placement it was made with (DeviceSet::options()). Under mpirun, a collective: each
/// rank makes its devices from the cores it was bound to, and the mesh spans command_world()'s
/// ranks, their devices in rank order (a device set-up error on any rank stops every rank,
/// naming it).
/// Throws: ValueError for a bad --dims (check_mesh_options, before any device exists); as
/// make_devices; ValueError from DeviceMesh::create naming the dims, the names and the devices
/// when they do not fit ("mesh dims (2,4) do not fit the 2 devices the numa placement made
/// (numa0, numa1): ...") or names are empty, repeated or not one per dim.
runtime::DeviceMesh make_mesh(const MeshOptions& options);

}  // namespace numesh::tools
