// numesh_scheduler: numesh as a scheduling library only, no mesh or sharding: the caller's own
// node bodies placed on devices (one per NUMA node, each a pinned oneTBB arena with memory on
// its node), data handed from one device to another, a run cancelled, a run that fails, and the
// same compiled graph run again after each. scripts/test.sh builds it against an installed
// numesh (find_package) and numesh's source tree (add_subdirectory), and checks what it prints.
//
//   numesh_scheduler            # a synthetic machine of two NUMA nodes, anywhere
//   numesh_scheduler machine    # this machine's NUMA nodes

#include <cstdio>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>

#include "numesh/core/error.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/graph.hpp"

namespace rt = numesh::runtime;

int main(int argc, char** argv) {
  try {
    const bool machine = argc > 1 && std::string(argv[1]) == "machine";
    auto devices = rt::DeviceSet::create(
        machine ? rt::Topology::discover() : rt::Topology::from_synthetic("numa:2 core:1 pu:1"));
    const int last =
        static_cast<int>(devices->size()) - 1;  // the consumer's device (0 on one node)
    constexpr std::size_t kCount = 1 << 16;

    // Each buffer lives in its device's NUMA node.
    rt::DeviceBuffer produced = devices->device(0).allocate(kCount * sizeof(double));
    rt::DeviceBuffer consumed =
        devices->device(static_cast<std::size_t>(last)).allocate(kCount * sizeof(double));
    const auto as_doubles = [](rt::DeviceBuffer& b) {
      return std::span<double>(reinterpret_cast<double*>(b.data()),
                               b.size_bytes() / sizeof(double));
    };
    double total = 0.0;
    bool cancel_this_run = false;
    bool fail_this_run = false;
    rt::CompiledGraph* running = nullptr;

    // produce (device 0) -> copy across (last device) -> reduce (last device).
    rt::GraphBuilder builder(devices);
    const rt::NodeId produce = builder.add(0, "produce", [&] {
      auto v = as_doubles(produced);
      std::iota(v.begin(), v.end(), 1.0);
    });
    const rt::NodeId copy = builder.add(last, "copy",
                                        [&] {
                                          if (cancel_this_run)
                                            running->cancel();  // nodes not yet started are skipped
                                          if (fail_this_run)
                                            throw std::runtime_error("the caller's own error");
                                          auto from = as_doubles(produced);
                                          auto to = as_doubles(consumed);
                                          std::copy(from.begin(), from.end(), to.begin());
                                        },
                                        {produce});
    builder.add(last, "reduce",
                [&] {
                  auto v = as_doubles(consumed);
                  total = std::accumulate(v.begin(), v.end(), 0.0);
                },
                {copy});
    rt::CompiledGraph graph = builder.compile();
    running = &graph;

    const double expected = static_cast<double>(kCount) * (kCount + 1) / 2;
    graph.run();
    std::printf("scheduler: %zu devices, %zu nodes, total %.0f (expected %.0f)\n", devices->size(),
                graph.size(), total, expected);

    total = 0.0;
    cancel_this_run = true;
    try {
      graph.run();
    } catch (const numesh::CancelledError& e) {
      std::printf("scheduler: cancelled: %s; reduce ran: %s\n", e.what(),
                  total == 0.0 ? "no" : "yes");
    }
    cancel_this_run = false;

    fail_this_run = true;
    try {
      graph.run();
    } catch (const std::runtime_error& e) {
      std::printf("scheduler: failed in node %s: %s\n", graph.failed_node().c_str(), e.what());
    }
    fail_this_run = false;

    graph.run();
    std::printf("scheduler: run again: total %.0f %s\n", total, total == expected ? "ok" : "WRONG");
    return total == expected ? 0 : 1;
  } catch (const numesh::Error& e) {
    std::fprintf(stderr, "numesh_scheduler: error: %s\n", e.what());
    return 2;
  }
}
