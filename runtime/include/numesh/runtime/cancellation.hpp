#pragma once

#include <atomic>
#include <mutex>
#include <vector>

namespace numesh::runtime {

class CompiledGraph;

/// A request to stop work that runs on other threads' behalf: a front end's Ctrl-C, a client
/// that left. The work is every CompiledGraph::run made under a CancelScope of this source, on
/// whichever threads hold one.
///
/// cancel() stops the graph running under the source at that moment where it is (nodes not
/// started are skipped; running ones finish; run() throws CancelledError) and every later run
/// under it before it starts. Nothing is lost to a race with a run's start: a run either sees
/// the request when it begins or is stopped by it. A cancelled source stays cancelled.
///
/// Thread-safety: every member is safe from any thread, and cancel() from a node body. Not
/// async-signal-safe: a signal handler wakes a thread that calls cancel().
class CancelSource {
 public:
  CancelSource() = default;
  CancelSource(const CancelSource&) = delete;
  CancelSource& operator=(const CancelSource&) = delete;
  /// Requires: no scope of this source alive (a graph still registered would outlive it).
  ~CancelSource() = default;

  /// Requests cancellation: stops the graphs running under the source now and every later one.
  void cancel() noexcept;
  /// True once cancel() was called.
  [[nodiscard]] bool cancelled() const noexcept {
    return cancelled_.load(std::memory_order_acquire);
  }
  /// Graph runs begun under the source so far (the cancelled ones included): how a caller or a
  /// test sees that the work has reached its graphs.
  [[nodiscard]] long runs_begun() const noexcept {
    return runs_begun_.load(std::memory_order_acquire);
  }

 private:
  friend class CompiledGraph;
  // CompiledGraph::run registers itself for its duration; begin() returns false (not
  // registering) when the source was already cancelled.
  bool begin(CompiledGraph& graph);
  void end(CompiledGraph& graph) noexcept;

  std::atomic<bool> cancelled_{false};
  std::atomic<long> runs_begun_{0};
  std::mutex mutex_;                     // orders cancel() against begin() and end()
  std::vector<CompiledGraph*> running_;  // one a thread at most; kept for reuse, not shrunk
};

/// While alive, every CompiledGraph::run on the constructing thread runs under `source`: it
/// throws CancelledError without running a node once the source is cancelled, and stops where
/// it is when cancel() comes during the run. Scopes nest (the innermost one counts) and are
/// destroyed in reverse order on the thread that made them.
class CancelScope {
 public:
  /// Requires: `source` outlives the scope.
  explicit CancelScope(CancelSource& source) noexcept;
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

  /// The source the calling thread's graph runs answer to, or nullptr (none, or shielded).
  [[nodiscard]] static CancelSource* current() noexcept;

 private:
  CancelSource* previous_;
};

/// While alive, graph runs on the constructing thread answer to no source: for work that must
/// be whole or not begun, such as an optimizer's update of the weights (a cancelled step either
/// stops before it or completes it). Destroyed in reverse order on the thread that made it.
class CancelShield {
 public:
  CancelShield() noexcept;
  ~CancelShield();
  CancelShield(const CancelShield&) = delete;
  CancelShield& operator=(const CancelShield&) = delete;

 private:
  CancelSource* previous_;
};

}  // namespace numesh::runtime
