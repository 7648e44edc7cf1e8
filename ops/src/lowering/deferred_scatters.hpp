#pragma once

// PRIVATE to ops/src: the small weights a model's layout writes, written together.
//
// Each laid_out() of a weight with values scatters it: one fill_shards graph, whose start and
// end synchronize every device. A model's layers lay out hundreds of small vectors (two norms a
// layer; Qwen2's three biases, Qwen3's q and k norms; MoE routers), and one graph each cost a
// 12-layer model's layout 2.25 ms of its 3.7 (25 norms, 2 vCPUs). While a DeferredScatters is
// open on a thread, laid_out() there keeps the values of small weights (up to kMaxBytes) and
// flush() scatters them all in one graph.

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
  /// Host values up to this many bytes are deferred; larger ones are scattered at once (a copy
  /// of them kept until flush() would cost their size again).
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 20;

  /// Opens the scope on the calling thread.
  DeferredScatters();
  /// Closes it. Weights not flushed stay unwritten (a layout that threw is thrown away whole).
  ~DeferredScatters();
  DeferredScatters(const DeferredScatters&) = delete;
  DeferredScatters& operator=(const DeferredScatters&) = delete;

  /// The innermost scope open on the calling thread, or nullptr.
  static DeferredScatters* active() noexcept;

  /// True when `host`'s values are small enough to defer.
  static bool defers(const runtime::HostTensor& host) noexcept;

  /// Keeps a copy of `host` to scatter into `tensor` at flush(). REQUIRES: defers(host); nobody
  /// reads `tensor` before flush().
  void add(const runtime::HostTensor& host, std::shared_ptr<runtime::ShardedTensor> tensor);

  /// Scatters every weight added since the last flush, in one graph (runtime::scatter of
  /// spans). Throws: what runtime::scatter throws (nothing kept is then written).
  void flush();

 private:
  std::vector<runtime::HostTensor> hosts_;
  std::vector<std::shared_ptr<runtime::ShardedTensor>> tensors_;
  DeferredScatters* outer_;
};

}  // namespace numesh::ops::detail
