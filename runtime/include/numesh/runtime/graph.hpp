#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/runtime/device.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

/// Identifies a node of a GraphBuilder / CompiledGraph (dense, in insertion order).
using NodeId = std::uint32_t;

/// What a node does, for reports, DOT and traces.
enum class NodeKind {
  kCompute,     ///< per-device computation
  kCollective,  ///< one device's part of a collective
  kTransfer,    ///< one end of a transfer between ranks (an asynchronous node); it starts
                ///< before the other kinds' nodes that are ready on its device at the same time
};

/// "compute", "collective" or "transfer".
std::string_view to_string(NodeKind kind) noexcept;

/// Ends an asynchronous node (GraphBuilder::add_async): called once, from any thread, with
/// nullptr when the node's work is done or with the error that ended it.
using NodeDone = std::function<void(std::exception_ptr)>;

/// How the run stands when an asynchronous node starts (GraphBuilder::add_async).
enum class RunState : std::uint8_t {
  kGoing,     ///< no node has failed and the run was not cancelled
  kStopping,  ///< a node failed or the run was cancelled: the node's inputs may not have been
              ///< computed, and a transfer should say so in place of sending them
};

/// Starts an asynchronous node's work (GraphBuilder::add_async) in a run that stands as `run`.
using AsyncStart = std::function<void(NodeDone done, RunState run)>;

/// A node's description.
struct NodeInfo {
  /// Name shown in DOT, timing tables and traces, e.g. "mlp.up[1]" or "all_reduce.rs[0]".
  std::string name;
  /// Index of the device (in the DeviceSet) whose arena runs the node.
  int device = 0;
  /// Kind of work.
  NodeKind kind = NodeKind::kCompute;
  /// Bytes the node moves between devices (collectives; 0 otherwise), for reports.
  std::uint64_t bytes = 0;
  /// The nodes it waits for.
  std::vector<NodeId> deps;
};

/// Per-node timing of one run: seconds since the run started.
struct NodeTiming {
  /// When the body started and ended.
  double start = 0;
  double end = 0;
  /// The arena slot of the thread that ran it (oneTBB's current_thread_index).
  int thread = 0;
  /// True when the body ran to completion; false when it was skipped (the run was cancelled
  /// or failed first) or threw.
  bool ran = false;
};

class CompiledGraph;

/// Graphs' transfers take the tags below this one (transfer_tag); the tags from it up to
/// kTransportTagLimit are for messages sent between runs, outside any graph (a serving engine's
/// calls to the ranks that follow it), so that the two never match each other's transfers.
inline constexpr int kGraphTagLimit = kTransportTagLimit - 64;

/// Builds a task graph: nodes, each bound to a device, with dependencies. Nodes are added in
/// dependency order (a node can only wait for nodes added before it), so every graph is
/// acyclic by construction. compile() turns it into a CompiledGraph that runs many times.
/// Not thread-safe: build from one thread.
class GraphBuilder {
 public:
  /// A builder over `devices`. Throws: ValueError when `devices` is null.
  explicit GraphBuilder(std::shared_ptr<DeviceSet> devices);

  /// Adds a node that runs `body` in device `device`'s arena after every node in `deps`.
  /// Returns its id. Throws: IndexError for a device or dependency that does not exist
  /// (naming it); ValueError for an empty body.
  NodeId add(int device, std::string name, std::function<void()> body,
             std::span<const NodeId> deps = {}, NodeKind kind = NodeKind::kCompute,
             std::uint64_t bytes = 0);
  /// add() with a braced dependency list.
  NodeId add(int device, std::string name, std::function<void()> body,
             std::initializer_list<NodeId> deps, NodeKind kind = NodeKind::kCompute,
             std::uint64_t bytes = 0) {
    return add(device, std::move(name), std::move(body),
               std::span<const NodeId>(deps.begin(), deps.size()), kind, bytes);
  }
  /// Adds an asynchronous node: after every node in `deps`, `start` runs in device `device`'s
  /// arena, begins work that ends elsewhere (a transfer between ranks) and returns at once. The
  /// node completes, and its successors may run, when that work calls `done`: no device thread
  /// waits in between. `done` must be called exactly once per run, unless `start` throws, in
  /// which case it must not be called at all (the throw is the node's error). A run waits for
  /// every started node's `done`, even a cancelled or failed run. An asynchronous node starts
  /// even in a run that is stopping (a node failed, or the run was cancelled), told so by its
  /// RunState: its work is a transfer another rank's graph matches, and leaving one out would
  /// put the ranks' transfers out of step, so a send says that its run stopped in place of
  /// sending what was not computed (Transport::send_run_stopped). A fault injected into it
  /// (CompiledGraph::inject_fault) fails the run before it starts, which then starts as in a
  /// stopping run.
  /// Throws: as add.
  NodeId add_async(int device, std::string name, AsyncStart start,
                   std::span<const NodeId> deps = {}, NodeKind kind = NodeKind::kTransfer,
                   std::uint64_t bytes = 0);
  /// add_async() with a braced dependency list.
  NodeId add_async(int device, std::string name, AsyncStart start,
                   std::initializer_list<NodeId> deps, NodeKind kind = NodeKind::kTransfer,
                   std::uint64_t bytes = 0) {
    return add_async(device, std::move(name), std::move(start),
                     std::span<const NodeId>(deps.begin(), deps.size()), kind, bytes);
  }

  /// Makes `after` wait for `before` as well. Throws: IndexError for unknown ids; ValueError
  /// unless before < after (edges go forward, which keeps the graph acyclic).
  void depend(NodeId before, NodeId after);

  /// The tag of this graph's next transfer from rank `from` to rank `to`: 0, 1, 2... per pair
  /// of ranks, in the order asked. Every rank builds the same graph by the same calls, so both
  /// ends of a transfer get the same tag, and no two transfers between a pair of ranks share a
  /// tag within a run (from run to run, and between graphs run one after the other, the
  /// transport keeps each tag's transfers in order).
  /// Throws: ValueError once a pair of ranks has used every tag below kGraphTagLimit, naming
  /// the ranks and the node count (on those two ranks only).
  /// Graphs that transfer over one transport must therefore run one at a time, in the same
  /// order on every rank: two graphs' transfers under one tag are told apart by order alone.
  /// The same holds for building them where ranks read each other in place (SharedWindows):
  /// a collective's build then exchanges where the bytes lie under the transfer's tag, so build
  /// in the same order on every rank, and not while a graph of the transport runs.
  int transfer_tag(int from, int to);

  /// Number of nodes.
  std::size_t size() const noexcept { return nodes_.size(); }
  /// Node `id`. Throws: IndexError.
  const NodeInfo& node(NodeId id) const;
  /// The devices.
  const std::shared_ptr<DeviceSet>& devices() const noexcept { return devices_; }

  /// Compiles the graph into oneTBB flow graphs (one per device, built inside the device's
  /// arena). The builder is left empty. Reads NUMESH_INJECT_FAULT (CompiledGraph::inject_fault).
  /// Throws: ValueError when NUMESH_INJECT_FAULT is set but not NODE[@RUN].
  CompiledGraph compile();

 private:
  std::shared_ptr<DeviceSet> devices_;
  NodeId add_node(int device, std::string name, std::function<void()> body, AsyncStart start,
                  std::span<const NodeId> deps, NodeKind kind, std::uint64_t bytes);

  std::vector<NodeInfo> nodes_;
  // Per node, the body of a plain node or the start of an asynchronous one (the other empty).
  std::vector<std::function<void()>> bodies_;
  std::vector<AsyncStart> starts_;
  // Transfers numbered so far per (from, to) pair of ranks.
  std::map<std::pair<int, int>, int> transfer_tags_;
};

/// A compiled task graph. Each device has its own tbb::flow::graph, constructed in the
/// device's arena, so every task of a node for device d runs on d's threads. Edges between
/// nodes of one device are flow-graph edges; an edge to another device is an explicit
/// try_put at the end of the producer, which submits the consumer's task into the consumer's
/// arena. Nothing blocks inside a node: a node is ready when all its inputs are.
///
/// run() allocates nothing of its own (oneTBB's task allocation aside): the graph is built
/// once and re-armed by running.
///
/// An asynchronous node (GraphBuilder::add_async) signals its successors when its `done` is
/// called, from whichever thread calls it, with the same explicit try_put.
///
/// Errors: an exception thrown by a node body cancels the run (nodes that have not started
/// are skipped; running ones finish) and is rethrown from run() unchanged; failed_node() names
/// the node. The graph can run again afterwards.
/// Thread-safety: run() must not be called concurrently with itself (it throws ValueError if
/// it is); cancel(), size(), node() and failed_node() are safe from any thread at any time;
/// timings(), timing_table(), chrome_trace() and to_dot() only while no run is in progress.
/// Never call run() (or scatter(), gather(), Device::allocate(), which run work on devices)
/// from inside a node body: the body holds a device thread, and a one-thread device would
/// wait for itself.
class CompiledGraph {
 public:
  /// Moves the graph; the moved-from object may only be destroyed or assigned to.
  CompiledGraph(CompiledGraph&&) noexcept;
  /// Moves the graph (waiting for this one's in-flight tasks first).
  CompiledGraph& operator=(CompiledGraph&&) noexcept;
  /// Waits for tasks still in flight, then frees the graph.
  ~CompiledGraph();

  /// Runs every node once, each after its dependencies, and returns when all are done. Under
  /// a CancelScope (cancellation.hpp), the scope's source cancels it as cancel() does, and a
  /// run begun after the source was cancelled throws CancelledError without running a node.
  /// Throws: the first exception a node threw (as thrown), PeerStoppedError from a transfer
  /// node among them when another rank's run stopped before sending what this one needed
  /// (GraphBuilder::add_async); CancelledError when cancel() was called during the run;
  /// ValueError when another thread is running this graph.
  void run();
  /// Cancels the run in progress, if any: nodes that have not started are skipped, and run()
  /// throws CancelledError (unless every node had already run, when the run simply completes).
  /// Has no effect on later runs (a cancel() racing with the very start of run() may be lost).
  /// Thread-safe; callable from a node body.
  void cancel() noexcept;

  /// Number of nodes.
  std::size_t size() const noexcept;
  /// Node `id`'s description. Throws: IndexError.
  const NodeInfo& node(NodeId id) const;
  /// The node whose exception ended the last run, or "" when none did.
  std::string failed_node() const;
  /// Makes node `id` throw InjectedFault ("injected fault in node <name> (device d)") instead
  /// of running its body, in the next run only: for testing that a failing node, wherever it
  /// is, ends the run on every device with that one exception and leaves the graph able to run
  /// again. A later call before that run replaces the node.
  /// Throws: IndexError for a node that does not exist. Thread-safe.
  /// The same fault can be planned from outside a program: with NUMESH_INJECT_FAULT=NODE[@RUN]
  /// in its environment, the node named NODE fails in the RUN-th run (1 when left out) that any
  /// graph of the process holding a node so named makes, once a process (read by compile()).
  void inject_fault(NodeId id);

  /// Turns per-node timing on or off for later runs (off by default; costs two clock reads
  /// per node). Not thread-safe with run().
  void set_timing(bool on) noexcept;
  /// Per-node timing of the last run with timing on, indexed by NodeId (one entry per node;
  /// all `ran == false` before the first timed run).
  const std::vector<NodeTiming>& timings() const noexcept;
  /// The last run's timing as a text table: node, device, thread, start and duration in
  /// microseconds, sorted by start.
  std::string timing_table() const;
  /// The last run's timing as Chrome trace JSON (chrome://tracing, Perfetto): one process per
  /// device, one track per arena thread.
  std::string chrome_trace() const;
  /// The graph in Graphviz DOT: one cluster per device, collectives as boxes.
  std::string to_dot() const;

 private:
  friend class GraphBuilder;
  struct Impl;
  explicit CompiledGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace numesh::runtime
