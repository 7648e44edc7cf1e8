// The graph builder and the compiled graph: one tbb::flow::graph per device (see graph.hpp for
// why), with completion signalled through an atomic the caller waits on (a short poll, then a
// futex wait: with as many device threads as cores a spinning caller would steal a core from
// the devices).

#include "numesh/runtime/graph.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/flow_graph.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/cancellation.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

namespace flow = oneapi::tbb::flow;
using Msg = flow::continue_msg;
using Clock = std::chrono::steady_clock;

namespace {

// How long run()'s caller polls for the end of the run before it sleeps: runs shorter than
// this (a graph of a few small nodes) end without a futex sleep and wake-up. Spinning longer
// is not free: with as many device threads as cores, a spinning caller holds a core a device
// needs (a 50 us spin made every run of a two-device graph take 50 us; docs/benchmarks.md,
// "Small collectives").
constexpr auto kCallerSpin = std::chrono::microseconds(1);

// The flow-graph priority of transfer nodes (NodeKind::kTransfer); every other node has none.
// oneTBB runs a prioritized node's task as a critical task: before the tasks already queued.
constexpr flow::node_priority_t kTransferPriority = 1;

// Waits until `remaining` is 0: polls for kCallerSpin, then sleeps on the atomic (a futex)
// with `asleep` set, so that the thread ending the run knows to hand over its core.
void wait_for_completion(std::atomic<int>& remaining, std::atomic<bool>& asleep) {
  const auto until = Clock::now() + kCallerSpin;
  while (remaining.load(std::memory_order_acquire) != 0 && Clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  for (int left = remaining.load(std::memory_order_acquire); left != 0;
       left = remaining.load(std::memory_order_acquire)) {
    asleep.store(true, std::memory_order_seq_cst);
    remaining.wait(left, std::memory_order_acquire);
  }
  asleep.store(false, std::memory_order_relaxed);
}

// NUMESH_INJECT_FAULT=NAME[@RUN]: the node named NAME throws InjectedFault instead of running,
// in the RUN-th run (1 when left out) that any graph of this process holding a node so named
// makes; once a process. For testing how a whole program (a command, a rank of an MPI job, a
// server) meets a failing node, where CompiledGraph::inject_fault cannot be reached. Read as
// each graph is compiled; the runs are counted over the whole process.
struct PlannedFault {
  std::string node;
  std::int64_t run = 1;
};

// Runs made so far of graphs holding the planned node, over the whole process, and whether the
// planned fault was armed.
std::atomic<std::int64_t> planned_fault_runs{0};
std::atomic<bool> planned_fault_armed{false};

// At exit: a planned fault that never came is said, so that a misspelt node or a run past the
// program's last does not pass for a program that met its fault and carried on.
void warn_of_unarmed_fault() {
  if (planned_fault_armed.load()) return;
  const char* raw = std::getenv("NUMESH_INJECT_FAULT");
  std::fprintf(stderr,
               "numesh: warning: NUMESH_INJECT_FAULT '%s': no fault was injected (runs of "
               "graphs holding a node so named: %lld)\n",
               raw != nullptr ? raw : "", static_cast<long long>(planned_fault_runs.load()));
}

// The fault NUMESH_INJECT_FAULT plans, if any. Throws ValueError for a value that is not
// NAME[@RUN] with RUN a positive whole number.
std::optional<PlannedFault> planned_fault() {
  const char* raw = std::getenv("NUMESH_INJECT_FAULT");
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  const std::string_view value(raw);
  PlannedFault fault;
  const std::size_t at = value.rfind('@');
  fault.node = std::string(value.substr(0, at));
  if (at != std::string_view::npos) {
    const std::string_view run = value.substr(at + 1);
    const auto [end, error] = std::from_chars(run.data(), run.data() + run.size(), fault.run);
    NUMESH_CHECK(error == std::errc() && end == run.data() + run.size() && fault.run > 0,
                 ValueError,
                 "NUMESH_INJECT_FAULT '{}': the run after '@' must be a positive whole number, "
                 "got '{}'",
                 value, run);
  }
  NUMESH_CHECK(!fault.node.empty(), ValueError,
               "NUMESH_INJECT_FAULT '{}': expected NODE[@RUN], a node's name and optionally "
               "which of its runs fails (1: the first)",
               value);
  static const bool warns_at_exit = std::atexit(warn_of_unarmed_fault) == 0;
  (void)warns_at_exit;
  return fault;
}

}  // namespace

GraphBuilder::GraphBuilder(std::shared_ptr<DeviceSet> devices) : devices_(std::move(devices)) {
  NUMESH_CHECK(devices_ != nullptr, ValueError, "GraphBuilder needs a device set");
}

std::string_view to_string(NodeKind kind) noexcept {
  switch (kind) {
    case NodeKind::kCompute:
      return "compute";
    case NodeKind::kCollective:
      return "collective";
    case NodeKind::kTransfer:
      return "transfer";
  }
  return "?";
}

NodeId GraphBuilder::add(int device, std::string name, std::function<void()> body,
                         std::span<const NodeId> deps, NodeKind kind, std::uint64_t bytes) {
  NUMESH_CHECK(static_cast<bool>(body), ValueError, "node '{}' has no body", name);
  return add_node(device, std::move(name), std::move(body), {}, deps, kind, bytes);
}

NodeId GraphBuilder::add_async(int device, std::string name, AsyncStart start,
                               std::span<const NodeId> deps, NodeKind kind, std::uint64_t bytes) {
  NUMESH_CHECK(static_cast<bool>(start), ValueError, "node '{}' has no start", name);
  return add_node(device, std::move(name), {}, std::move(start), deps, kind, bytes);
}

NodeId GraphBuilder::add_node(int device, std::string name, std::function<void()> body,
                              AsyncStart start, std::span<const NodeId> deps, NodeKind kind,
                              std::uint64_t bytes) {
  NUMESH_CHECK(device >= 0 && static_cast<std::size_t>(device) < devices_->size(), IndexError,
               "node '{}': device {} does not exist ({} devices)", name, device, devices_->size());
  for (NodeId d : deps) {
    NUMESH_CHECK(d < nodes_.size(), IndexError,
                 "node '{}' depends on node {}, which does not exist ({} nodes so far)", name, d,
                 nodes_.size());
  }
  NodeInfo info{std::move(name), device, kind, bytes, {deps.begin(), deps.end()}};
  std::sort(info.deps.begin(), info.deps.end());
  info.deps.erase(std::unique(info.deps.begin(), info.deps.end()), info.deps.end());
  nodes_.push_back(std::move(info));
  bodies_.push_back(std::move(body));
  starts_.push_back(std::move(start));
  return static_cast<NodeId>(nodes_.size() - 1);
}

int GraphBuilder::transfer_tag(int from, int to) {
  int& used = transfer_tags_[{from, to}];
  NUMESH_CHECK(used < kGraphTagLimit, ValueError,
               "the graph needs more than {} transfers from rank {} to rank {} ({} nodes so far): "
               "split it into several graphs",
               kGraphTagLimit, from, to, nodes_.size());
  return used++;
}

void GraphBuilder::depend(NodeId before, NodeId after) {
  NUMESH_CHECK(before < nodes_.size() && after < nodes_.size(), IndexError,
               "edge {} -> {} names a node that does not exist ({} nodes)", before, after,
               nodes_.size());
  NUMESH_CHECK(before < after, ValueError,
               "edge {} -> {} goes backwards: a node can only wait for nodes added before it",
               before, after);
  auto& deps = nodes_[after].deps;
  if (std::find(deps.begin(), deps.end(), before) == deps.end()) deps.push_back(before);
}

const NodeInfo& GraphBuilder::node(NodeId id) const {
  NUMESH_CHECK(id < nodes_.size(), IndexError, "node {} does not exist ({} nodes)", id,
               nodes_.size());
  return nodes_[id];
}

struct CompiledGraph::Impl {
  struct Node {
    NodeInfo info;
    std::function<void()> body;
    // An asynchronous node's start (body empty), else empty.
    AsyncStart start;
    std::unique_ptr<flow::continue_node<Msg>> task;
    std::vector<flow::continue_node<Msg>*> remote_successors;
    bool is_root = false;
    bool is_sink = false;
  };

  std::shared_ptr<DeviceSet> devices;
  // Declared before `nodes` so that nodes are destroyed first (they refer to their graph).
  std::vector<std::unique_ptr<flow::graph>> graphs;
  std::vector<Node> nodes;
  std::vector<flow::continue_node<Msg>*> roots;
  int sinks = 0;

  std::atomic<int> remaining{0};
  // Set while run()'s caller sleeps on `remaining` (wait_for_completion).
  std::atomic<bool> caller_asleep{false};
  std::atomic<bool> stop{false};
  std::atomic<bool> skipped{false};  // some body did not run because of stop
  std::atomic<bool> running{false};
  // inject_fault's node for the next run, and the one armed for the run in progress (-1: none).
  std::atomic<std::int64_t> next_fault{-1};
  std::int64_t armed_fault = -1;
  // The node NUMESH_INJECT_FAULT names in this graph (-1: none), and in which of the process's
  // runs of such graphs it fails.
  std::int64_t planned_fault = -1;
  std::int64_t planned_fault_run = 0;
  std::mutex error_mutex;
  std::exception_ptr error;
  std::string failed;

  bool timing_on = false;
  Clock::time_point run_start;
  std::vector<NodeTiming> timings;

  ~Impl() {
    // Tasks of the last run may still be returning from their bodies (the completion signal
    // comes from inside the last body); wait for them before the nodes go away.
    for (auto& graph : graphs) {
      if (graph) graph->wait_for_all();  // waits inside the graph's own arena
    }
  }

  void record_error(NodeId id, std::exception_ptr thrown) {
    {
      const std::lock_guard lock(error_mutex);
      if (!error) {
        error = std::move(thrown);
        failed = nodes[id].info.name;
      }
    }
    stop.store(true, std::memory_order_release);
  }

  // The fault inject_fault armed for node `id` in this run, if it is that node.
  std::exception_ptr injected_fault(NodeId id) const {
    if (static_cast<std::int64_t>(id) != armed_fault) return nullptr;
    const Node& n = nodes[id];
    return std::make_exception_ptr(InjectedFault(
        fmt::format("injected fault in node {} (device {})", n.info.name, n.info.device)));
  }

  // Notes node `id`'s start when timing.
  void note_start(NodeId id) {
    if (!timing_on) return;
    NodeTiming& t = timings[id];
    t.thread = oneapi::tbb::this_task_arena::current_thread_index();
    t.start = std::chrono::duration<double>(Clock::now() - run_start).count();
  }

  // The body of every flow-graph node.
  void fire(NodeId id) {
    Node& n = nodes[id];
    if (n.start) {
      start(id);
      return;
    }
    if (stop.load(std::memory_order_acquire)) {
      skipped.store(true, std::memory_order_relaxed);
    } else {
      try {
        if (std::exception_ptr fault = injected_fault(id)) std::rethrow_exception(fault);
        note_start(id);
        n.body();
        if (timing_on) {
          NodeTiming& t = timings[id];
          t.end = std::chrono::duration<double>(Clock::now() - run_start).count();
          t.ran = true;
        }
      } catch (...) {
        record_error(id, std::current_exception());
      }
    }
    complete(id);
  }

  // Starts asynchronous node `id`; finish() ends it. The device's flow graph counts the node
  // as work in flight meanwhile (reserve_wait), so that the graph is not destroyed while the
  // node's `done` may still come.
  //
  // It starts even in a run that is stopping (a node failed, or the run was cancelled) and
  // even with a fault injected: its work is a transfer that another rank's graph matches, and
  // one left out would leave the two ranks' transfers out of step, each of the peer's later
  // runs receiving what this rank sent for the run before. It is told that the run is
  // stopping, so that a send tells its peer instead of sending what may not have been
  // computed. An injected fault fails the run first, as a fault in the node's own work before
  // the transfer would.
  void start(NodeId id) {
    Node& n = nodes[id];
    flow::graph& graph = *graphs[static_cast<std::size_t>(n.info.device)];
    graph.reserve_wait();
    note_start(id);
    if (std::exception_ptr fault = injected_fault(id)) record_error(id, std::move(fault));
    // Acquire: a node that failed before this one's predecessors completed set stop first.
    const RunState state =
        stop.load(std::memory_order_acquire) ? RunState::kStopping : RunState::kGoing;
    // Its transfer no longer carries the run's work: a cancelled run that had skipped nothing
    // else still ends cancelled, as its peer's does.
    if (state == RunState::kStopping) skipped.store(true, std::memory_order_relaxed);
    try {
      n.start(
          [this, id](std::exception_ptr error_of_work) { finish(id, std::move(error_of_work)); },
          state);
    } catch (...) {
      // The start's contract: it throws only before its work began, so done will not come.
      finish(id, std::current_exception());
    }
  }

  // Ends asynchronous node `id`. noexcept: it may run inside the start that posted the work
  // (a transport that completes at once), where an exception escaping would end the node a
  // second time.
  void finish(NodeId id, std::exception_ptr work_error) noexcept {
    Node& n = nodes[id];
    if (work_error) {
      record_error(id, std::move(work_error));
    } else if (timing_on) {
      NodeTiming& t = timings[id];
      t.end = std::chrono::duration<double>(Clock::now() - run_start).count();
      t.ran = true;
    }
    flow::graph& graph = *graphs[static_cast<std::size_t>(n.info.device)];
    complete(id);
    graph.release_wait();
  }

  // Signals node `id`'s successors on other devices (and every successor of an asynchronous
  // node; a plain node's local successors follow through flow-graph edges) and counts a sink.
  void complete(NodeId id) noexcept {
    Node& n = nodes[id];
    for (auto* successor : n.remote_successors) successor->try_put(Msg());
    if (n.is_sink && remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      remaining.notify_all();
      // The woken caller needs a core, and when every core runs a device thread (this one
      // included, which would go on spinning in oneTBB's search for work) it waited 7 us for
      // one: hand this core over once. An empty run of two single-thread devices on two cores
      // took 9.1 us before, 4.7 us with the yield (docs/benchmarks.md, "Small collectives").
      // The flag is a hint: read after the caller woke it is false and nothing is yielded, or
      // already set by the caller of the next run, which costs one needless yield.
      if (caller_asleep.load(std::memory_order_seq_cst)) sched_yield();
    }
  }
};

CompiledGraph GraphBuilder::compile() {
  auto impl = std::make_unique<CompiledGraph::Impl>();
  impl->devices = devices_;
  const std::size_t n = nodes_.size();
  impl->nodes.resize(n);
  impl->timings.resize(n);
  impl->graphs.resize(devices_->size());
  // A flow graph attaches to the arena it is constructed in; build each device's graph in its
  // arena so that its tasks run there.
  for (std::size_t d = 0; d < devices_->size(); ++d) {
    devices_->device(d).execute([&] { impl->graphs[d] = std::make_unique<flow::graph>(); });
  }
  std::vector<int> successors(n, 0);
  for (const NodeInfo& info : nodes_) {
    for (NodeId dep : info.deps) ++successors[dep];
  }
  CompiledGraph::Impl* raw = impl.get();
  for (std::size_t i = 0; i < n; ++i) {
    auto& node = impl->nodes[i];
    node.info = std::move(nodes_[i]);
    node.body = std::move(bodies_[i]);
    node.start = std::move(starts_[i]);
    int remote = 0;
    for (NodeId dep : node.info.deps) {
      // Signalled by an explicit try_put (complete()), not a flow-graph edge.
      const auto& producer = impl->nodes[dep];
      if (producer.info.device != node.info.device || producer.start) ++remote;
    }
    node.is_root = node.info.deps.empty();
    node.is_sink = successors[i] == 0;
    if (node.is_sink) ++impl->sinks;
    const auto id = static_cast<NodeId>(i);
    // Remote predecessors (and, for roots, the caller) are counted up front; local ones are
    // counted by make_edge. A transfer's end (a send, a receive, a doorbell) is started before
    // any computation that is ready on its device at the same time: it takes a moment, and
    // another rank may be waiting on it. Without the priority a one-thread device could run a
    // 4 ms reduction first, holding the peer rank idle for that long (docs/benchmarks.md,
    // "Session 44: transfers before computation").
    node.task = std::make_unique<flow::continue_node<Msg>>(
        *impl->graphs[static_cast<std::size_t>(node.info.device)], remote + (node.is_root ? 1 : 0),
        [raw, id](const Msg&) { raw->fire(id); },
        node.info.kind == NodeKind::kTransfer ? kTransferPriority : flow::no_priority);
    if (node.is_root) impl->roots.push_back(node.task.get());
    for (NodeId dep : node.info.deps) {
      auto& producer = impl->nodes[dep];
      // An asynchronous node's body returns before the node completes: its successors are
      // signalled by complete(), not by a flow-graph edge.
      if (producer.info.device == node.info.device && !producer.start) {
        flow::make_edge(*producer.task, *node.task);
      } else {
        producer.remote_successors.push_back(node.task.get());
      }
    }
  }
  if (const std::optional<PlannedFault> fault = planned_fault()) {
    for (std::size_t i = 0; i < n; ++i) {
      if (impl->nodes[i].info.name != fault->node) continue;
      impl->planned_fault = static_cast<std::int64_t>(i);
      impl->planned_fault_run = fault->run;
      break;
    }
  }
  nodes_.clear();
  bodies_.clear();
  starts_.clear();
  transfer_tags_.clear();
  return CompiledGraph(std::move(impl));
}

CompiledGraph::CompiledGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGraph::CompiledGraph(CompiledGraph&&) noexcept = default;
CompiledGraph& CompiledGraph::operator=(CompiledGraph&&) noexcept = default;
CompiledGraph::~CompiledGraph() = default;

void CompiledGraph::run() {
  Impl& g = *impl_;
  NUMESH_CHECK(!g.running.exchange(true, std::memory_order_acq_rel), ValueError,
               "CompiledGraph::run: the graph is already running in another thread");
  struct Running {
    std::atomic<bool>& flag;
    ~Running() { flag.store(false, std::memory_order_release); }
  } running{g.running};

  {
    const std::lock_guard lock(g.error_mutex);
    g.error = nullptr;
    g.failed.clear();
  }
  g.skipped.store(false, std::memory_order_relaxed);
  g.stop.store(false, std::memory_order_release);
  // Registered after stop is reset, so that the source's cancel() cannot be undone by it.
  CancelSource* const source = CancelScope::current();
  if (source != nullptr && !source->begin(*this)) {
    throw CancelledError("graph run cancelled by the caller before it began");
  }
  struct Registered {
    CancelSource* source;
    CompiledGraph& graph;
    ~Registered() {
      if (source != nullptr) source->end(graph);
    }
  } registered{source, *this};
  // Read by the bodies, which the roots' try_put below starts: the put orders this write first.
  g.armed_fault = g.next_fault.exchange(-1, std::memory_order_acq_rel);
  if (g.planned_fault >= 0 && g.armed_fault < 0 &&
      planned_fault_runs.fetch_add(1, std::memory_order_relaxed) + 1 == g.planned_fault_run) {
    g.armed_fault = g.planned_fault;
    planned_fault_armed.store(true);
  }
  if (g.timing_on) {
    std::fill(g.timings.begin(), g.timings.end(), NodeTiming{});
    g.run_start = Clock::now();
  }
  if (g.nodes.empty()) return;
  g.remaining.store(g.sinks, std::memory_order_release);
  for (auto* root : g.roots) root->try_put(Msg());
  wait_for_completion(g.remaining, g.caller_asleep);
  if (g.error) std::rethrow_exception(g.error);
  // A cancel() that came after every body had run cancelled nothing: the run completed.
  if (g.skipped.load(std::memory_order_acquire)) {
    throw CancelledError("graph run cancelled by the caller");
  }
}

void CompiledGraph::cancel() noexcept {
  if (impl_ && impl_->running.load(std::memory_order_acquire)) {
    impl_->stop.store(true, std::memory_order_release);
  }
}

std::size_t CompiledGraph::size() const noexcept { return impl_->nodes.size(); }

const NodeInfo& CompiledGraph::node(NodeId id) const {
  NUMESH_CHECK(id < impl_->nodes.size(), IndexError, "node {} does not exist ({} nodes)", id,
               impl_->nodes.size());
  return impl_->nodes[id].info;
}

std::string CompiledGraph::failed_node() const {
  const std::lock_guard lock(impl_->error_mutex);
  return impl_->failed;
}

void CompiledGraph::inject_fault(NodeId id) {
  NUMESH_CHECK(id < impl_->nodes.size(), IndexError,
               "inject_fault: node {} does not exist ({} nodes)", id, impl_->nodes.size());
  impl_->next_fault.store(static_cast<std::int64_t>(id), std::memory_order_release);
}

void CompiledGraph::set_timing(bool on) noexcept { impl_->timing_on = on; }

const std::vector<NodeTiming>& CompiledGraph::timings() const noexcept { return impl_->timings; }

std::string CompiledGraph::timing_table() const {
  const Impl& g = *impl_;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.timings[i].ran) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return g.timings[a].start < g.timings[b].start; });
  std::size_t width = 4;
  for (std::size_t i : order) width = std::max(width, g.nodes[i].info.name.size());
  std::string out = fmt::format("{:<{}}  {:>6}  {:>6}  {:>12}  {:>12}\n", "node", width, "device",
                                "thread", "start us", "duration us");
  for (std::size_t i : order) {
    const NodeTiming& t = g.timings[i];
    out += fmt::format("{:<{}}  {:>6}  {:>6}  {:>12.1f}  {:>12.1f}\n", g.nodes[i].info.name, width,
                       g.nodes[i].info.device, t.thread, t.start * 1e6, (t.end - t.start) * 1e6);
  }
  return out;
}

std::string CompiledGraph::chrome_trace() const {
  const Impl& g = *impl_;
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t d = 0; d < g.devices->size(); ++d) {
    const DeviceSpec& spec = g.devices->device(d).spec();
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", d},
                      {"args",
                       {{"name", fmt::format("device {} ({}, cpus {})", d, spec.label,
                                             spec.cpuset.to_string())}}}});
  }
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const NodeTiming& t = g.timings[i];
    if (!t.ran) continue;
    const NodeInfo& info = g.nodes[i].info;
    events.push_back({{"name", info.name},
                      {"cat", to_string(info.kind)},
                      {"ph", "X"},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"pid", info.device},
                      {"tid", t.thread},
                      {"args", {{"node", i}, {"bytes", info.bytes}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump(1);
}

std::string CompiledGraph::to_dot() const {
  const Impl& g = *impl_;
  auto quote = [](const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out;
  };
  std::string out = "digraph numesh {\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n";
  for (std::size_t d = 0; d < g.devices->size(); ++d) {
    const DeviceSpec& spec = g.devices->device(d).spec();
    out += fmt::format("  subgraph cluster_device{} {{\n    label=\"device {} ({}, cpus {})\";\n",
                       d, d, quote(spec.label), spec.cpuset.to_string());
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      const NodeInfo& info = g.nodes[i].info;
      if (static_cast<std::size_t>(info.device) != d) continue;
      const char* shape = info.kind == NodeKind::kCompute      ? "ellipse"
                          : info.kind == NodeKind::kCollective ? "box"
                                                               : "parallelogram";
      out += fmt::format("    n{} [label=\"{}\", shape={}];\n", i, quote(info.name), shape);
    }
    out += "  }\n";
  }
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    for (NodeId dep : g.nodes[i].info.deps) {
      const bool cross = g.nodes[dep].info.device != g.nodes[i].info.device;
      out += fmt::format("  n{} -> n{}{};\n", dep, i, cross ? " [style=dashed]" : "");
    }
  }
  return out + "}\n";
}

}  // namespace numesh::runtime
