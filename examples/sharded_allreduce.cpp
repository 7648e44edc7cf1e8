// sharded_allreduce: the runtime from end to end, the way a C++ program embeds it.
//
// Loads a topology (a synthetic two-socket machine with two NUMA nodes each, so the example
// shows four devices anywhere; pass "machine" to use this machine), makes one device per NUMA
// node, lays them into a (dp=2, tp=2) mesh, shards a host tensor by P('dp', 'tp'), sums the
// shards over tp with an all-reduce compiled into a task graph, runs it twice, and gathers
// the result back to check it.
//
//   build/release/examples/sharded_allreduce            # synthetic 2 x 2 NUMA machine
//   build/release/examples/sharded_allreduce machine    # this machine (needs 4 devices)
//
// Links only numesh::numesh, like an external user.

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>

#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace rt = numesh::runtime;
namespace sh = numesh::sharding;

int main(int argc, char** argv) {
  try {
    const bool machine = argc > 1 && std::string(argv[1]) == "machine";
    rt::Topology topology = machine ? rt::Topology::discover()
                                    : rt::Topology::from_synthetic("package:2 numa:2 core:1 pu:1");
    auto devices = rt::DeviceSet::create(topology);  // one device per NUMA node
    const rt::DeviceMesh mesh = rt::DeviceMesh::create(devices, {2, -1}, {"dp", "tp"});
    fmt::print("{}\n", mesh.to_string());

    // An (4, 8) tensor whose element (r, c) is r * 8 + c, sharded by P('dp', 'tp'): each
    // device holds a (2, 4) block, written by the device's own threads.
    rt::HostTensor host = rt::HostTensor::zeros({4, 8});
    for (std::size_t i = 0; i < host.data.size(); ++i) host.data[i] = static_cast<float>(i);
    rt::ShardedTensor x(mesh, host.shape, sh::PartitionSpec{"dp", "tp"});
    rt::scatter(host, x);

    // Sum each device's block with its tp partner's: one all-reduce over tp, out of place.
    rt::ShardedTensor y(mesh, host.shape, sh::PartitionSpec{"dp", "tp"});
    rt::GraphBuilder builder(devices);
    rt::all_reduce(builder, x, y, rt::ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
    rt::CompiledGraph graph = builder.compile();
    graph.run();
    graph.run();  // compiled once, run many times
    fmt::print("graph: {} nodes, one per device\n", graph.size());

    // Device (dp=i, tp=j) now holds block (i, 0) + block (i, 1) of x.
    const float expected = host.data[0] + host.data[4];
    fmt::print("y[0, 0] on device 0 = {} (expected {})\n", y.shard(0).values()[0], expected);
    return y.shard(0).values()[0] == expected ? 0 : 1;
  } catch (const numesh::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
