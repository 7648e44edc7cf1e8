#pragma once

// Collectives as benchmark cases: a collective compiled into a numesh graph over every device,
// and the two baselines it is held against in the same run: the plain shared-memory loop a
// programmer would write without any scheduler, and memcpy. This is the machinery behind
// `numesh bench collectives` and bench/collectives_bench.cpp; C++ programs use it to measure
// their own machine the same way:
//
//   auto devices = runtime::DeviceSet::create(runtime::Topology::discover(), {});
//   runtime::GraphCollective graph(devices, runtime::CollectiveOp::kAllReduce, 64 << 20);
//   runtime::PlainCollective plain(static_cast<int>(devices->size()),
//                                  runtime::CollectiveOp::kAllReduce, 64 << 20);
//   const double t_graph = numesh::median_seconds([&] { graph.run(); }, 20, 0.2);
//   const double t_plain = numesh::median_seconds([&] { plain.run(); }, 20, 0.2);
//   if (!graph.check() || !plain.check()) { /* a wrong result: the figures mean nothing */ }
//
// (median_seconds is in numesh/core/timing.hpp.) Inputs hold small integers, so every sum is
// exact in fp32 and check() compares outputs for equality, whatever the reduction order.
//
// The plain baseline is deliberately not built on numesh or oneTBB: it is what the scheduler
// must beat. Its threads are std::threads pinned with pthread_setaffinity_np, the one place in
// the library that starts threads of its own (docs/benchmarks.md describes the baseline and
// its figures). It is kept as fast as that simple design allows (page-aligned buffers each
// thread first-touches, a spinning barrier when every thread has a CPU), so that a ratio
// above 1 means the scheduler is faster than a good hand-written loop, not than a straw man.

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::diagnostics {

/// The collectives the benchmark cases run.
enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

/// "all-reduce", "all-gather", "reduce-scatter", "all-to-all".
std::string_view to_string(CollectiveOp op) noexcept;
/// Parses the names to_string() gives.
/// Throws: ValueError naming the text and the choices.
CollectiveOp parse_collective_op(std::string_view text);
/// Every op, in declaration order.
std::vector<CollectiveOp> all_collective_ops();

/// A collective over `bytes` per device (the input each device holds: all-gather's output is
/// devices times larger, reduce-scatter's devices times smaller) of `dtype` elements (16-bit
/// buffers hold twice the elements of fp32 ones in the same bytes; reductions widen them, sum
/// in fp32 and round once) on a 1-D mesh of every device of a DeviceSet, compiled once into a
/// numesh graph (runtime/collectives.hpp: sum for the reductions; all-to-all sends equal
/// chunks). Each device's buffers are allocated by its allocator and its input written by its
/// own threads, so the pages lie on its node; inputs hold known values so that check() can
/// verify the outputs after run().
///
/// `chain` collectives per run (1 by default): with chain > 1 every link of the chain first
/// rewrites each device's input (a copy from a private source of the same bytes on the same
/// device, standing in for the node that produces a collective's input in a model's step),
/// then runs the collective after the rewrites of its group; the next link waits for the
/// collective. This is how a decode step meets its collectives, many in one graph run; a
/// chain of 1 times a whole graph run for one collective, its start and end included. The
/// inputs start zeroed then, so a chain whose rewrites never ran gives wrong outputs.
///
/// Thread-safety: not thread-safe; one run() at a time. It runs work on the devices' arenas:
/// do not time it while other work runs on the same devices if the figures are to mean
/// anything.
class GraphCollective {
 public:
  /// Builds the buffers and compiles the graph.
  /// REQUIRES: devices is not null.
  /// Throws: ValueError when bytes is not a positive multiple of the element size x devices
  /// (naming the op, the bytes, the dtype and the devices); what DeviceMesh::create and the
  /// collectives throw.
  /// Throws additionally: ValueError when chain is 0.
  GraphCollective(std::shared_ptr<runtime::DeviceSet> devices, CollectiveOp op, std::size_t bytes,
                  DType dtype = DType::kF32, std::size_t chain = 1);
  /// The same collective over the slots of `mesh`, a 1-D mesh that may span ranks
  /// (docs/distributed.md): this rank holds the buffers of its own slots, and every rank
  /// constructs it at the same time with the same arguments (building the graph numbers its
  /// transfers) and runs it as many times. Parts that cross between ranks go in pieces of
  /// `piece_bytes` (runtime::CollectiveArgs::piece_bytes; 0: whole); all-reduces run
  /// `all_reduce`.
  /// Throws: as above; ValueError when the mesh is not 1-D.
  GraphCollective(runtime::DeviceMesh mesh, CollectiveOp op, std::size_t bytes,
                  DType dtype = DType::kF32, std::size_t chain = 1,
                  std::size_t piece_bytes = runtime::kPipelinePieceBytes,
                  runtime::AllReduceAlgorithm all_reduce = runtime::AllReduceAlgorithm::kAuto);
  /// Runs the compiled graph once.
  /// Throws: what CompiledGraph::run() throws.
  void run() { graph_.run(); }
  /// True when every output of this rank holds the expected values (every element of small
  /// outputs; of large ones every (n / 4096)-th and the last). Call after run().
  [[nodiscard]] bool check() const;
  /// The collective.
  [[nodiscard]] CollectiveOp op() const noexcept { return op_; }
  /// The buffers' element type.
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  /// Collectives per run.
  [[nodiscard]] std::size_t chain() const noexcept { return chain_; }
  /// The compiled graph (for DOT, timing tables and traces).
  runtime::CompiledGraph& graph() noexcept { return graph_; }

 private:
  CollectiveOp op_;
  DType dtype_;
  std::size_t chain_;
  std::size_t count_;
  runtime::DeviceMesh mesh_;
  std::vector<runtime::Tensor> in_, out_, source_;  // source_: the rewrites' copies (chain > 1)
  runtime::CompiledGraph graph_;
};

/// The baseline: `threads` plain std::threads in one process, each owning its buffers of
/// `dtype` elements
/// (page-aligned, allocated and first-touched by itself, pinned to the i-th CPU the process
/// may use, modulo their number; the caller's own binding is restored on destruction), running
/// the same collective in the simplest shared-memory way: reduce-scatter then all-gather for
/// all-reduce, one copy or reduce pass for the others, with a barrier between phases that
/// spins while threads <= the process's CPUs and yields otherwise. The calling thread is
/// rank 0 and pins itself for the object's lifetime. 16-bit reductions widen a block of each
/// input at a time with runtime/convert.hpp's kernels, add in fp32 and round once, as numesh's
/// do. With `chain` > 1 a run is that many links, each rewriting every thread's input from a
/// private copy, a barrier, then the collective (as GraphCollective's chain). The buffers are
/// page-aligned because
/// glibc's memcpy on the project's machine kind is ~20x slower into destinations that are not
/// 64-byte aligned (docs/benchmarks.md): an unaligned baseline would be a straw man.
///
/// Thread-safety: not thread-safe; construct, run() and destroy it on one thread.
class PlainCollective {
 public:
  /// Starts the helper threads (threads - 1 of them; `threads` below 1 counts as 1) and waits
  /// until each has filled its input.
  /// Throws: ValueError as GraphCollective (with `threads` as the devices, and a chain of 0);
  /// std::bad_alloc; std::system_error when a thread cannot start.
  PlainCollective(int threads, CollectiveOp op, std::size_t bytes, DType dtype = DType::kF32,
                  std::size_t chain = 1);
  /// Stops and joins the threads, restores the caller's CPU binding.
  ~PlainCollective();
  PlainCollective(const PlainCollective&) = delete;
  PlainCollective& operator=(const PlainCollective&) = delete;
  /// Runs the collective once on all threads; returns when every thread has finished.
  void run();
  /// True when every output holds the expected values (as GraphCollective::check()).
  [[nodiscard]] bool check() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// memcpy of `bytes` between two page-aligned buffers on the calling thread: the floor a
/// collective moving the same bytes is compared with.
/// Thread-safety: not thread-safe; one run() at a time.
class MemcpyBaseline {
 public:
  /// Allocates both buffers on the calling thread and fills them: the source with a pattern
  /// that varies with the byte's position, the destination with zeros.
  /// Throws: std::bad_alloc.
  explicit MemcpyBaseline(std::size_t bytes);
  ~MemcpyBaseline();
  MemcpyBaseline(const MemcpyBaseline&) = delete;
  MemcpyBaseline& operator=(const MemcpyBaseline&) = delete;
  /// One copy.
  void run();
  /// True when the destination holds the source's bytes (after run()).
  [[nodiscard]] bool copied() const;

 private:
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  std::size_t bytes_;
};

}  // namespace numesh::diagnostics
