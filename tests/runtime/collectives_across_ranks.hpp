#pragma once

// Collectives on a mesh that spans ranks give the bits of the same collectives on the same mesh
// in one process. Written once and run by each rank: by threads over make_thread_transports in
// runtime_test, and by processes under mpirun -np 2 and 4 in collectives_mpi_test. Each rank
// builds the mesh from devices of its own (synthetic topologies, one core per device), runs
// every collective over every subset of the mesh's axes, in f32, bf16 and f16, and compares its
// own slots' outputs with what one process computes on a mesh of all the devices.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/runtime/transport.hpp"
#include "test_devices.hpp"

namespace numesh::runtime::across_ranks {

/// A mesh split over ranks: rank r holds devices[r] of its slots.
struct RankedMesh {
  std::vector<int> devices;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

/// The meshes to test on `ranks` ranks.
inline std::vector<RankedMesh> ranked_meshes(int ranks) {
  switch (ranks) {
    case 1:
      return {{{4}, {2, 2}, {"dp", "tp"}}};
    case 2:
      return {
          {{2, 2}, {2, 2}, {"dp", "tp"}}, {{1, 3}, {2, 2}, {"dp", "tp"}}, {{2, 2}, {4}, {"tp"}}};
    case 3:
      return {{{2, 1, 3}, {2, 3}, {"dp", "tp"}}};
    case 4:
      return {{{1, 1, 1, 1}, {2, 2}, {"dp", "tp"}}, {{1, 1, 1, 1}, {2, 2}, {"tp", "ep"}}};
    default:
      return {};
  }
}

/// One collective: its name (for messages), the axes it runs over, its dtype, and what it does.
struct Case {
  std::string name;
  std::vector<std::string> axes;
  DType dtype = DType::kF32;
  /// Elements of slot s's input and output, given the rank of s in its group and the group size.
  std::function<std::size_t(std::size_t rank, std::size_t size)> in_count, out_count;
  /// Adds the collective.
  std::function<Frontier(GraphBuilder&, const DeviceMesh&, std::span<const BufferView>,
                         std::span<const BufferView>, const CollectiveArgs&)>
      add;
};

// A value of slot s's input at i: distinct, non-integer and of mixed signs, so that a sum in
// another order, a misplaced element or a wrong source all show.
inline float input_value(std::int64_t slot, std::size_t i) {
  return static_cast<float>((static_cast<std::size_t>(slot) * 7919 + i * 104729) % 1000) / 37.0f -
         13.0f;
}

/// A collective's buffers on this rank and its compiled graph.
struct BuiltCase {
  std::vector<std::vector<std::byte>> in, out;  // per slot; another rank's are empty
  std::vector<std::int64_t> local;
  std::unique_ptr<CompiledGraph> graph;

  /// The bytes of every local slot's output.
  std::map<std::int64_t, std::vector<std::byte>> outputs() const {
    std::map<std::int64_t, std::vector<std::byte>> result;
    for (std::int64_t s : local) result[s] = out[static_cast<std::size_t>(s)];
    return result;
  }
  /// Zeroes the outputs, so that a run that wrote nothing shows.
  void clear_outputs() {
    for (auto& o : out) std::fill(o.begin(), o.end(), std::byte{0});
  }
};

/// Builds `c` on `mesh`: this rank's buffers, inputs filled, and the compiled graph.
inline BuiltCase build_case(const DeviceMesh& mesh, const Case& c) {
  const auto groups = mesh.groups(c.axes);
  std::vector<std::size_t> rank(static_cast<std::size_t>(mesh.size())), size(rank.size());
  for (const auto& g : groups) {
    for (std::size_t r = 0; r < g.size(); ++r) {
      rank[static_cast<std::size_t>(g[r])] = r;
      size[static_cast<std::size_t>(g[r])] = g.size();
    }
  }
  const std::size_t item = dtype_size(c.dtype);
  BuiltCase built;
  built.in.resize(rank.size());
  built.out.resize(rank.size());
  built.local = mesh.local_slots();
  std::vector<BufferView> in_views(rank.size()), out_views(rank.size());
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::size_t n_in = c.in_count(rank[i], size[i]), n_out = c.out_count(rank[i], size[i]);
    in_views[i] = {nullptr, n_in, c.dtype};
    out_views[i] = {nullptr, n_out, c.dtype};
    if (!mesh.is_local(s)) continue;
    std::vector<float> values(n_in);
    for (std::size_t k = 0; k < n_in; ++k) values[k] = input_value(s, k);
    built.in[i].resize(n_in * item + 1);
    built.out[i].resize(n_out * item + 1);
    convert_elements(values.data(), DType::kF32, built.in[i].data(), c.dtype, n_in);
    in_views[i].data = built.in[i].data();
    out_views[i].data = built.out[i].data();
  }
  GraphBuilder builder(mesh.device_set());
  CollectiveArgs args;
  args.axes = c.axes;
  c.add(builder, mesh, in_views, out_views, args);
  built.graph = std::make_unique<CompiledGraph>(builder.compile());
  return built;
}

/// The bytes of every local slot's output after running `c` twice on `mesh` (the second run
/// shows that a graph's transfers match again from run to run).
inline std::map<std::int64_t, std::vector<std::byte>> run_case(const DeviceMesh& mesh,
                                                               const Case& c) {
  BuiltCase built = build_case(mesh, c);
  built.graph->run();
  built.clear_outputs();
  built.graph->run();
  return built.outputs();
}

/// Every collective over every subset of `names`, in f32, bf16 and f16.
inline std::vector<Case> cases(const std::vector<std::string>& names) {
  std::vector<Case> all;
  std::vector<std::vector<std::string>> subsets;
  for (unsigned mask = 0; mask < (1u << names.size()); ++mask) {
    std::vector<std::string> axes;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (mask & (1u << i)) axes.push_back(names[i]);
    }
    subsets.push_back(axes);
  }
  const auto fixed = [](std::size_t n) { return [n](std::size_t, std::size_t) { return n; }; };
  // Uneven all-to-all counts with zeros among them: rank i sends (i + 2j) % 3 to rank j.
  const auto a2a_counts = [](std::size_t size) {
    std::vector<std::vector<std::size_t>> counts(size, std::vector<std::size_t>(size));
    for (std::size_t i = 0; i < size; ++i) {
      for (std::size_t j = 0; j < size; ++j) counts[i][j] = (i + 2 * j) % 3 * 5;
    }
    return counts;
  };
  for (const auto& axes : subsets) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string tail =
          fmt::format(" over ({}) in {}", fmt::join(axes, ","), to_string(dtype));
      for (const auto& choice :
           {std::pair{AllReduceAlgorithm::kDirect, "direct"},
            std::pair{AllReduceAlgorithm::kReduceScatterAllGather, "reduce-scatter+all-gather"},
            std::pair{AllReduceAlgorithm::kHierarchical, "hierarchical"}}) {
        // Plain variables, not a structured binding: the lambdas below capture them.
        const AllReduceAlgorithm algorithm = choice.first;
        const char* const label = choice.second;
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          all.push_back({fmt::format("all_reduce {} {}{}", to_string(op), label, tail), axes, dtype,
                         fixed(1001), fixed(1001),
                         [algorithm, op](GraphBuilder& b, const DeviceMesh& m, auto in, auto out,
                                         const CollectiveArgs& a) {
                           return all_reduce(b, m, in, out, 1001, op, a, algorithm);
                         }});
        }
      }
      // Pipelined (CollectiveArgs::piece_bytes) where the group spans ranks: pieces that are
      // not a whole number of elements, and (3 elements over groups of 2 and 4) parts of one,
      // two and no pieces.
      for (const auto& sizes : {std::pair<std::size_t, std::size_t>{1001, 100}, {3, 1}}) {
        for (const AllReduceAlgorithm algorithm :
             {AllReduceAlgorithm::kReduceScatterAllGather, AllReduceAlgorithm::kHierarchical}) {
          // Plain variables, not a structured binding: the lambda below captures them.
          const std::size_t n = sizes.first, piece = sizes.second;
          const bool chain = algorithm == AllReduceAlgorithm::kHierarchical;
          all.push_back({fmt::format("all_reduce sum{} in pieces of {} bytes, {} elements{}",
                                     chain ? " hierarchical" : "", piece, n, tail),
                         axes, dtype, fixed(n), fixed(n),
                         [n, piece, algorithm](GraphBuilder& b, const DeviceMesh& m, auto in,
                                               auto out, CollectiveArgs a) {
                           a.piece_bytes = piece;
                           return all_reduce(b, m, in, out, n, ReduceOp::kSum, a, algorithm);
                         }});
        }
      }
      // The other collectives whole, and (but the broadcast) with their parts that cross ranks
      // in pieces of 20 bytes: 5 f32 elements, 10 of 16 bits; the reduce-scatter's parts of 12
      // elements, the all-to-all's of 5 and 10.
      for (const std::size_t piece : {kPipelinePieceBytes, std::size_t{20}}) {
        const bool whole = piece == kPipelinePieceBytes;
        const std::string name_tail = (whole ? "" : " in pieces of 20 bytes") + tail;
        const ReduceOp op = whole ? ReduceOp::kSum : ReduceOp::kMax;
        all.push_back({"reduce_scatter " + std::string(to_string(op)) + name_tail, axes, dtype,
                       [](std::size_t, std::size_t size) { return 12 * size; }, fixed(12),
                       [piece, op](GraphBuilder& b, const DeviceMesh& m, auto in, auto out,
                                   CollectiveArgs a) {
                         a.piece_bytes = piece;
                         const std::size_t size = m.groups(a.axes).front().size();
                         return reduce_scatter(b, m, in, out, 12 * size, op, a);
                       }});
        all.push_back(
            {"all_gather" + name_tail, axes, dtype, fixed(33),
             [](std::size_t, std::size_t size) { return 33 * size; },
             [piece](GraphBuilder& b, const DeviceMesh& m, auto in, auto out, CollectiveArgs a) {
               a.piece_bytes = piece;
               return all_gather(b, m, in, out, 33, a);
             }});
        all.push_back({"all_to_all" + name_tail, axes, dtype,
                       [a2a_counts](std::size_t r, std::size_t size) {
                         const auto c = a2a_counts(size);
                         return std::accumulate(c[r].begin(), c[r].end(), std::size_t{0});
                       },
                       [a2a_counts](std::size_t r, std::size_t size) {
                         std::size_t n = 0;
                         for (const auto& row : a2a_counts(size)) n += row[r];
                         return n;
                       },
                       [a2a_counts, piece](GraphBuilder& b, const DeviceMesh& m, auto in, auto out,
                                           CollectiveArgs a) {
                         a.piece_bytes = piece;
                         return all_to_all(b, m, in, out,
                                           a2a_counts(m.groups(a.axes).front().size()), a);
                       }});
        all.push_back(
            {"permute" + name_tail, axes, dtype, fixed(40), fixed(40),
             [piece](GraphBuilder& b, const DeviceMesh& m, auto in, auto out, CollectiveArgs a) {
               a.piece_bytes = piece;
               return permute(b, m, in, out, 40, 1, a);
             }});
      }
      all.push_back(
          {"broadcast" + tail, axes, dtype, fixed(40), fixed(40),
           [](GraphBuilder& b, const DeviceMesh& m, auto in, auto out, const CollectiveArgs& a) {
             const auto size = static_cast<std::int64_t>(m.groups(a.axes).front().size());
             return broadcast(b, m, in, out, 40, size - 1, a);
           }});
    }
  }
  return all;
}

/// The one-process mesh of `m`'s shape.
inline DeviceMesh one_process(const RankedMesh& m) {
  const int total = std::accumulate(m.devices.begin(), m.devices.end(), 0);
  return DeviceMesh::create(testing::synthetic_devices(testing::nodes(total)), m.dims, m.names);
}

/// This rank's mesh of `m`, over `transport`.
inline DeviceMesh over_ranks(const RankedMesh& m, const std::shared_ptr<Transport>& transport) {
  return DeviceMesh::create(testing::synthetic_devices(testing::nodes(
                                m.devices[static_cast<std::size_t>(transport->rank())])),
                            transport, m.dims, m.names);
}

/// Runs every buffer collective on every mesh of ranked_meshes(ranks) and checks this rank's
/// outputs against one process's.
inline void buffer_collectives_match_one_process(const std::shared_ptr<Transport>& transport) {
  for (const RankedMesh& m : ranked_meshes(transport->size())) {
    const DeviceMesh mesh = over_ranks(m, transport);
    const DeviceMesh reference = one_process(m);
    for (const Case& c : cases(m.names)) {
      const auto got = run_case(mesh, c);
      const auto want = run_case(reference, c);
      ASSERT_EQ(got.size(), mesh.local_slots().size());
      for (const auto& [slot, bytes] : got) {
        EXPECT_EQ(bytes, want.at(slot))
            << c.name << ": slot " << slot << " of " << mesh.to_string();
      }
    }
  }
}

/// The collectives on sharded tensors: redistribute (all-gather, all-to-all, slicing), reduce-
/// scatter and all-reduce of a [6, 12] tensor between specs, over ranks and in one process.
inline void sharded_collectives_match_one_process(const std::shared_ptr<Transport>& transport) {
  using sharding::AxisRule;
  using sharding::PartitionSpec;
  for (const RankedMesh& m : ranked_meshes(transport->size())) {
    if (m.names.size() < 2) continue;  // the specs below shard over two axes
    const DeviceMesh mesh = over_ranks(m, transport);
    const DeviceMesh reference = one_process(m);
    const std::string a = m.names.front(), b = m.names.back();
    const PartitionSpec none{}, split_a{AxisRule(a)}, split_ab{AxisRule(a), AxisRule(b)},
        split_ba{AxisRule(b), AxisRule(a)}, cols_b{AxisRule(), AxisRule(b)};
    struct Sharded {
      std::string name;
      PartitionSpec in, out;
      std::vector<std::string> axes;
      int kind;  // 0 redistribute, 1 reduce-scatter, 2 all-reduce
    };
    const std::vector<Sharded> all{
        {"redistribute all-gather", split_ab, none, m.names, 0},
        {"redistribute all-to-all", split_ab, split_ba, m.names, 0},
        {"redistribute slice", none, cols_b, {b}, 0},
        {"redistribute rows to columns", split_a, cols_b, m.names, 0},
        {"reduce-scatter", none, split_a, {a}, 1},
        {"all-reduce", cols_b, cols_b, {a}, 2},
    };
    for (const Sharded& c : all) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        auto run = [&](const DeviceMesh& on) {
          ShardedTensor in(on, {6, 12}, c.in, dtype), out(on, {6, 12}, c.out, dtype);
          for (std::int64_t s : on.local_slots()) {
            Tensor& shard = in.shard(s);
            std::vector<float> values(static_cast<std::size_t>(shard.size()));
            for (std::size_t k = 0; k < values.size(); ++k) values[k] = input_value(s, k);
            convert_elements(values.data(), DType::kF32, shard.data(), dtype, values.size());
          }
          GraphBuilder builder(on.device_set());
          CollectiveArgs args;
          args.axes = c.axes;
          if (c.kind == 0) redistribute(builder, in, out, args);
          if (c.kind == 1) reduce_scatter(builder, in, out, ReduceOp::kSum, args);
          if (c.kind == 2) all_reduce(builder, in, out, ReduceOp::kSum, args);
          builder.compile().run();
          std::map<std::int64_t, std::vector<std::byte>> result;
          for (std::int64_t s : on.local_slots()) {
            const Tensor& shard = out.shard(s);
            const auto* p = static_cast<const std::byte*>(shard.data());
            result[s].assign(p, p + shard.size() * static_cast<std::int64_t>(dtype_size(dtype)));
          }
          return result;
        };
        const auto got = run(mesh);
        const auto want = run(reference);
        for (const auto& [slot, bytes] : got) {
          EXPECT_EQ(bytes, want.at(slot))
              << c.name << " " << c.in.repr() << " -> " << c.out.repr() << " in "
              << to_string(dtype) << ": slot " << slot << " of " << mesh.to_string();
        }
      }
    }
  }
}

/// The first node of `graph` of kind `kind` that a send node waits for (or, when none does, the
/// first of that kind): a fault there stops the run before that send starts.
inline NodeId fed_to_a_send(const CompiledGraph& graph, NodeKind kind) {
  for (NodeId id = 0; id < graph.size(); ++id) {
    const NodeInfo& node = graph.node(id);
    if (node.name.find(".send[") == std::string::npos) continue;
    for (const NodeId dep : node.deps) {
      if (graph.node(dep).kind == kind) return dep;
    }
  }
  NodeId id = 0;
  while (id < graph.size() && graph.node(id).kind != kind) ++id;
  return id;
}

/// a_failed_run_stops_the_ranks_that_need_it for one all-reduce `all` on mesh `m`: a fault on
/// the last rank, in a transfer node and then in a collective node that a send waits for.
inline void check_a_failed_run(const Case& all, const RankedMesh& m,
                               const std::shared_ptr<Transport>& transport) {
  const DeviceMesh mesh = over_ranks(m, transport);
  const auto want = run_case(one_process(m), all);
  BuiltCase built = build_case(mesh, all);
  CompiledGraph& graph = *built.graph;
  const int last = transport->size() - 1;
  const bool failing = transport->rank() == last;
  for (NodeKind kind : {NodeKind::kTransfer, NodeKind::kCollective}) {
    if (kind == NodeKind::kTransfer && transport->size() == 1) continue;  // none in one process
    if (failing) {
      const NodeId victim = fed_to_a_send(graph, kind);
      ASSERT_LT(victim, graph.size())
          << "no " << to_string(kind) << " node on rank " << transport->rank();
      graph.inject_fault(victim);
      EXPECT_THROW(graph.run(), InjectedFault) << to_string(kind);
      EXPECT_EQ(graph.failed_node(), graph.node(victim).name);
    } else {
      // Run once and match after: EXPECT_THAT would run a failing run again to explain it.
      // The error names the rank this one heard it from: the failed rank, or one that had
      // stopped because of it.
      std::string error = "(no error)";
      try {
        graph.run();
      } catch (const PeerStoppedError& e) {
        error = e.what();
      }
      EXPECT_THAT(error, ::testing::MatchesRegex(
                             ".*rank [0-9]+'s run stopped before these bytes were ready.*"))
          << "rank " << transport->rank() << ", a fault in a " << to_string(kind)
          << " node of rank " << last << " on " << mesh.to_string();
    }
    built.clear_outputs();
    EXPECT_NO_THROW(graph.run()) << "rank " << transport->rank() << ", the run after a fault in a "
                                 << to_string(kind) << " node of rank " << last << " on "
                                 << mesh.to_string() << " failed in " << graph.failed_node();
    for (const auto& [slot, bytes] : built.outputs()) {
      EXPECT_EQ(bytes, want.at(slot)) << "after a fault in a " << to_string(kind) << " node: slot "
                                      << slot << " of " << mesh.to_string();
    }
  }
}

/// A run that fails on one rank, in a transfer or in a collective's own node, fails there with
/// that error, and every other rank's run, which needs what the failed rank would have sent
/// after the fault (the all-gather stage of a reduce-scatter+all-gather all-reduce over every
/// rank), stops with PeerStoppedError naming the failed rank or a rank that stopped because of
/// it, never completing with what it was sent in place of the failed rank's work. Every rank's
/// transfers stay in step: every later run on every rank gives one process's bits again.
inline void a_failed_run_stops_the_ranks_that_need_it(const std::shared_ptr<Transport>& transport) {
  for (const RankedMesh& m : ranked_meshes(transport->size())) {
    const auto everything = cases(m.names);
    // Whole and in pieces (on one rank, the pieces are whole).
    for (const std::string_view kind :
         {"all_reduce sum reduce-scatter+all-gather", "all_reduce sum in pieces of 100 bytes"}) {
      const auto it = std::find_if(everything.begin(), everything.end(), [&](const Case& k) {
        return k.axes.size() == m.names.size() && k.dtype == DType::kF32 &&
               k.name.rfind(kind, 0) == 0;
      });
      ASSERT_NE(it, everything.end()) << kind;
      check_a_failed_run(*it, m, transport);
    }
  }
}

}  // namespace numesh::runtime::across_ranks
