#pragma once

// Shared by `numesh bench collectives` and the Google Benchmark programs: a collective compiled
// into a numesh graph over every device, the plain shared-memory baseline it is measured
// against, a memcpy baseline, and the timing loop. Benchmark code, not part of the library.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::bench {

/// A page-aligned block of floats, zero-filled by the constructing thread. The baselines use
/// it because glibc's memcpy on this machine kind is ~20x slower into destinations that are
/// not 64-byte aligned (docs/benchmarks.md): an unaligned baseline would be a straw man.
class AlignedFloats {
 public:
  explicit AlignedFloats(std::size_t n);
  ~AlignedFloats();
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() noexcept { return data_; }
  const float* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  float* data_;
  std::size_t size_;
};

/// The collectives the benchmarks measure.
enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

/// "all-reduce", "all-gather", "reduce-scatter", "all-to-all".
std::string_view to_string(CollectiveOp op) noexcept;
/// Parses the names above. Throws: ValueError naming the text and the choices.
CollectiveOp parse_collective_op(std::string_view text);
/// Every op, in the order above.
std::vector<CollectiveOp> all_collective_ops();

/// A collective of `bytes` per device (the input each device holds) over a 1-D mesh of all
/// devices, compiled once into a numesh graph. Inputs are filled with known values so that
/// check() can verify the output after run().
class GraphCollective {
 public:
  /// Throws: ValueError when bytes is not a positive multiple of 4 * devices.
  GraphCollective(std::shared_ptr<runtime::DeviceSet> devices, CollectiveOp op, std::size_t bytes);
  /// Runs the compiled graph once.
  void run() { graph_.run(); }
  /// True when every output holds the expected values.
  bool check() const;
  /// The compiled graph (for DOT and timing).
  runtime::CompiledGraph& graph() noexcept { return graph_; }

 private:
  CollectiveOp op_;
  std::size_t count_;
  runtime::DeviceMesh mesh_;
  std::vector<runtime::Tensor> in_, out_;
  runtime::CompiledGraph graph_;
};

/// The baseline: `threads` plain std::threads in one process, each owning its buffers
/// (allocated and first-touched by itself, pinned to the i-th CPU the process may use; the
/// caller's own binding is restored on destruction), running
/// the same collective in the simplest shared-memory way: reduce-scatter then all-gather for
/// all-reduce, one copy or reduce pass for the others, with a barrier between phases that
/// spins while threads <= the process's CPUs and yields otherwise. The calling thread is
/// rank 0.
class PlainCollective {
 public:
  /// Starts the helper threads. Throws: ValueError as GraphCollective.
  PlainCollective(int threads, CollectiveOp op, std::size_t bytes);
  /// Stops and joins the threads.
  ~PlainCollective();
  PlainCollective(const PlainCollective&) = delete;
  PlainCollective& operator=(const PlainCollective&) = delete;
  /// Runs the collective once on all threads.
  void run();
  /// True when every output holds the expected values.
  bool check() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// memcpy of `bytes` between two buffers on the calling thread.
class MemcpyBaseline {
 public:
  explicit MemcpyBaseline(std::size_t bytes);
  /// One copy.
  void run();

 private:
  AlignedFloats src_, dst_;
  std::size_t bytes_;
};

/// Median wall time in seconds of `fn` over at least `min_repeats` calls and at least
/// `min_seconds` in total, after one warm-up call.
double median_seconds(const std::function<void()>& fn, int min_repeats, double min_seconds);

/// "4 KiB", "64 MiB".
std::string format_bytes(std::size_t bytes);
/// Parses "4K", "64KiB", "1M", "64MiB", "4096". Throws: ValueError naming the text.
std::size_t parse_bytes(std::string_view text);

}  // namespace numesh::bench
