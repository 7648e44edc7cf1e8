// Cancellation of graph runs from other threads. The scope is a thread-local pointer so that a
// front end can make a whole model call cancellable (a CausalLm's logits runs three graphs, a
// training step several) without every layer between it and CompiledGraph::run passing a
// source along.

#include "numesh/runtime/cancellation.hpp"

#include <algorithm>

#include "numesh/runtime/graph.hpp"

namespace numesh::runtime {

namespace {
thread_local CancelSource* current_source = nullptr;
}  // namespace

void CancelSource::cancel() noexcept {
  cancelled_.store(true, std::memory_order_release);
  // Under the mutex, so that a run that registered before this point is stopped here and one
  // that registers after it sees cancelled_ (begin() reads it under the same mutex).
  const std::lock_guard lock(mutex_);
  for (CompiledGraph* graph : running_) graph->cancel();
}

bool CancelSource::begin(CompiledGraph& graph) {
  const std::lock_guard lock(mutex_);
  runs_begun_.fetch_add(1, std::memory_order_acq_rel);
  if (cancelled_.load(std::memory_order_acquire)) return false;
  running_.push_back(&graph);
  return true;
}

void CancelSource::end(CompiledGraph& graph) noexcept {
  const std::lock_guard lock(mutex_);
  const auto at = std::find(running_.begin(), running_.end(), &graph);
  if (at != running_.end()) running_.erase(at);
}

CancelScope::CancelScope(CancelSource& source) noexcept : previous_(current_source) {
  current_source = &source;
}

CancelScope::~CancelScope() { current_source = previous_; }

CancelSource* CancelScope::current() noexcept { return current_source; }

CancelShield::CancelShield() noexcept : previous_(current_source) { current_source = nullptr; }

CancelShield::~CancelShield() { current_source = previous_; }

}  // namespace numesh::runtime
