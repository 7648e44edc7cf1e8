#pragma once

// PRIVATE to ops/src: the small weights a model's layout writes, written together.
//
// Each laid_out() of a weight with values scatters it: one fill_shards graph, whose start and
// end synchronize every device. A model's layers lay out many small vectors (two norms a layer;
// Qwen2's three biases, Qwen3's q and k norms; small MoE routers), one graph each before
// (docs/benchmarks.md, "Session 54"). While a DeferredScatters is open on a thread, laid_out()
// there keeps a copy of the values of weights up to kMaxBytes and flush() scatters them all in
// one graph.

#include <cstddef>
#include <memory>
#include <vector>

#include "numesh/runtime/tensor.hpp"

namespace numesh::ops::detail {

/// A scope in which laid_out() defers the scatter of small weights to flush(). Scopes nest: the
/// innermost open one on the thread collects. Not thread-safe: one thread opens, fills and
/// flushes it.
class DeferredScatters {
 public:
  /// Host values up to this many bytes (a norm of a hidden size of 16384) are deferred; larger
  /// ones (matrices) are scattered at once, so the copies kept until flush() stay small.
  static constexpr std::size_t kMaxBytes = std::size_t{64} << 10;

  /// Opens the scope on the calling thread.
  DeferredScatters();
  /// Closes it, restoring the scope it was opened in. Weights added and not flushed keep the
  /// memory they were laid out with (BufferContents::kUnspecified): only a layout that threw,
  /// and is thrown away whole, may leave them (debug builds assert it).
  ~DeferredScatters();
  DeferredScatters(const DeferredScatters&) = delete;
  DeferredScatters& operator=(const DeferredScatters&) = delete;

  /// The innermost scope open on the calling thread, or nullptr.
  static DeferredScatters* active() noexcept;

  /// True when `host`'s values are small enough to defer.
  static bool defers(const runtime::HostTensor& host) noexcept;

  /// Keeps `host` (a copy the caller gives) to scatter into `tensor` at flush().
  /// REQUIRES: defers(host); nobody reads `tensor` before flush().
  void add(runtime::HostTensor host, std::shared_ptr<runtime::ShardedTensor> tensor);

  /// Scatters every weight added since the last flush, in one graph (runtime::scatter of
  /// spans), and forgets them. Throws: what runtime::scatter throws; a shape error before
  /// anything is written, a failure inside the graph after some weights are written and not
  /// others (none is written twice: the next flush starts empty).
  void flush();

 private:
  std::vector<runtime::HostTensor> hosts_;
  std::vector<std::shared_ptr<runtime::ShardedTensor>> tensors_;
  DeferredScatters* outer_;
};

}  // namespace numesh::ops::detail
