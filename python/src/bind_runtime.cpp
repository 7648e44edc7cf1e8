#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

using runtime::DeviceMesh;
using runtime::Topology;

py::list numa_nodes_of(const Topology& t) {
  py::list out;
  for (const auto& n : t.numa_nodes()) {
    out.append(py::dict("index"_a = n.index, "os_index"_a = n.os_index,
                        "cpus"_a = n.cpuset.to_string(), "memory_bytes"_a = n.memory_bytes,
                        "package"_a = n.package));
  }
  return out;
}

std::string topology_repr(const Topology& t) {
  return "Topology(" + std::string(runtime::to_string(t.source())) +
         (t.origin().empty() ? "" : " '" + t.origin() + "'") + ": " +
         std::to_string(t.packages().size()) + " packages, " +
         std::to_string(t.numa_nodes().size()) + " NUMA nodes, " +
         std::to_string(t.cores().size()) + " cores, " + std::to_string(t.cpuset().size()) +
         " PUs)";
}

py::list devices_of(const DeviceMesh& mesh) {
  py::list out;
  for (std::int64_t slot = 0; slot < mesh.size(); ++slot) {
    const runtime::DeviceSpec& d = mesh.device(slot).spec();
    out.append(py::dict("index"_a = d.index, "label"_a = d.label, "cpus"_a = d.cpuset.to_string(),
                        "threads"_a = d.threads, "numa_node"_a = d.numa_node,
                        "coords"_a = py::tuple(py::cast(mesh.coords(slot)))));
  }
  return out;
}

}  // namespace

runtime::DeviceMesh default_device_mesh() {
  return DeviceMesh::create(runtime::DeviceSet::create(Topology::discover()), {1, 1, -1},
                            {"dp", "ep", "tp"});
}

void bind_runtime(py::module_& m) {
  py::class_<Topology>(m, "Topology", R"pbdoc(
A machine's NUMA nodes, packages, L3 groups, cores and PUs, as hwloc discovers them.
Topology.discover() is this machine; from_synthetic("package:2 numa:2 core:8 pu:2") and
from_xml(path) describe another (devices placed on those run unpinned).
)pbdoc")
      .def_static("discover", &Topology::discover,
                  "This machine, restricted to the CPUs this process may run on.")
      .def_static("from_synthetic", &Topology::from_synthetic, "description"_a,
                  "An hwloc synthetic description. Raises numesh.Error (TopologyError) naming a "
                  "description hwloc refuses or one of more than 4096 PUs.")
      .def_static(
          "from_xml", [](const std::string& path) { return Topology::from_xml(path); }, "path"_a,
          "An hwloc XML export (lstopo --of xml).")
      .def_property_readonly(
          "source", [](const Topology& t) { return std::string(runtime::to_string(t.source())); })
      .def_property_readonly("origin", &Topology::origin)
      .def_property_readonly("can_bind", &Topology::can_bind,
                             "True when devices placed on it can be pinned (this machine).")
      .def_property_readonly(
          "numa_nodes", &numa_nodes_of,
          "One dict per NUMA node: index, os_index, cpus, memory_bytes, package.")
      .def_property_readonly("cores", [](const Topology& t) { return t.cores().size(); })
      .def_property_readonly("pus", [](const Topology& t) { return t.cpuset().size(); })
      .def_property_readonly("notes", &Topology::notes)
      .def("__repr__", &topology_repr);

  py::class_<DeviceMesh>(m, "DeviceMesh", R"pbdoc(
Devices of the machine (each a oneTBB arena pinned to its cores, its memory on its NUMA node)
laid out as a named mesh, as eformer's create_mesh lays out JAX devices:
DeviceMesh(dims=(1, 1, -1), names=("dp", "ep", "tp"), policy="numa") puts the machine's NUMA
devices on tp. `policy` cuts the topology into devices ("numa", "l3" or "core"), `smt` gives
one thread per PU instead of per core, `threads` caps each device's threads (0: no cap).
)pbdoc")
      .def(py::init([](const std::vector<std::int64_t>& dims, const std::vector<std::string>& names,
                       const std::string& policy, bool smt, int threads,
                       std::optional<Topology> topology) {
             runtime::PlacementOptions placement;
             placement.policy = runtime::parse_placement_policy(policy);
             placement.use_smt = smt;
             placement.max_threads_per_device = threads;
             return DeviceMesh::create(
                 runtime::DeviceSet::create(topology ? std::move(*topology) : Topology::discover(),
                                            placement),
                 dims, names);
           }),
           "dims"_a = std::vector<std::int64_t>{1, 1, -1},
           "names"_a = std::vector<std::string>{"dp", "ep", "tp"}, py::kw_only(),
           "policy"_a = "numa", "smt"_a = false, "threads"_a = 0, "topology"_a = py::none())
      .def_property_readonly("mesh", &DeviceMesh::mesh, "The logical mesh (axis names and sizes).")
      .def_property_readonly("size", &DeviceMesh::size)
      .def_property_readonly("devices", &devices_of,
                             "One dict per mesh slot: index, label, cpus, threads, numa_node, "
                             "coords.")
      .def("__repr__", &DeviceMesh::to_string);
}

}  // namespace numesh::python
