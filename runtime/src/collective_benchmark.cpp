#include "numesh/runtime/collective_benchmark.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"

namespace numesh::runtime {

namespace {

// A page-aligned block of floats, zero-filled by the constructing thread (so its pages are
// first-touched where that thread runs). Page-aligned for the reason in the header.
class AlignedFloats {
 public:
  explicit AlignedFloats(std::size_t n)
      : data_(static_cast<float*>(
            std::aligned_alloc(4096, (n * sizeof(float) + 4095) / 4096 * 4096 + 4096))),
        size_(n) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, n * sizeof(float));
  }
  ~AlignedFloats() { std::free(data_); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() noexcept { return data_; }
  const float* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  float* data_;
  std::size_t size_;
};

// A known input value for (rank, element): small integers, so sums are exact.
float input_value(std::size_t rank, std::size_t i) {
  return static_cast<float>((rank + 1) * 8 + i % 16);
}

std::size_t element_count(CollectiveOp op, std::size_t bytes, std::size_t ranks) {
  NUMESH_CHECK(bytes > 0 && bytes % (sizeof(float) * ranks) == 0, ValueError,
               "{}: {} bytes is not a positive multiple of 4 bytes x {} devices", to_string(op),
               bytes, ranks);
  return bytes / sizeof(float);
}

// Output elements per rank for `count` input elements per rank.
std::size_t output_count(CollectiveOp op, std::size_t count, std::size_t ranks) {
  switch (op) {
    case CollectiveOp::kAllGather: return count * ranks;
    case CollectiveOp::kReduceScatter: return count / ranks;
    default: return count;
  }
}

// The value output element i of `rank` must hold.
float expected_value(CollectiveOp op, std::size_t count, std::size_t ranks, std::size_t rank,
                     std::size_t i) {
  const std::size_t chunk = count / ranks;
  switch (op) {
    case CollectiveOp::kAllReduce: {
      float acc = 0;
      for (std::size_t r = 0; r < ranks; ++r) acc += input_value(r, i);
      return acc;
    }
    case CollectiveOp::kAllGather: return input_value(i / count, i % count);
    case CollectiveOp::kReduceScatter: {
      float acc = 0;
      for (std::size_t r = 0; r < ranks; ++r) acc += input_value(r, rank * chunk + i);
      return acc;
    }
    case CollectiveOp::kAllToAll: return input_value(i / chunk, rank * chunk + i % chunk);
  }
  return 0;
}

bool check_outputs(CollectiveOp op, std::size_t count, std::size_t ranks,
                   const std::function<const float*(std::size_t)>& out) {
  const std::size_t n = output_count(op, count, ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const float* v = out(r);
    // Every element of small outputs, a stride of large ones.
    const std::size_t step = std::max<std::size_t>(1, n / 4096);
    for (std::size_t i = 0; i < n; i += step) {
      if (v[i] != expected_value(op, count, ranks, r, i)) return false;
    }
    if (n > 0 && v[n - 1] != expected_value(op, count, ranks, r, n - 1)) return false;
  }
  return true;
}

}  // namespace

std::string_view to_string(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all-reduce";
    case CollectiveOp::kAllGather: return "all-gather";
    case CollectiveOp::kReduceScatter: return "reduce-scatter";
    case CollectiveOp::kAllToAll: return "all-to-all";
  }
  return "?";
}

CollectiveOp parse_collective_op(std::string_view text) {
  for (CollectiveOp op : all_collective_ops()) {
    if (text == to_string(op)) return op;
  }
  throw ValueError(fmt::format(
      "unknown collective '{}' (choose all-reduce, all-gather, reduce-scatter or all-to-all)",
      text));
}

std::vector<CollectiveOp> all_collective_ops() {
  return {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
          CollectiveOp::kAllToAll};
}

GraphCollective::GraphCollective(std::shared_ptr<DeviceSet> devices, CollectiveOp op,
                                 std::size_t bytes)
    : op_(op),
      count_(element_count(op, bytes, devices->size())),
      mesh_(DeviceMesh::create(devices, {-1}, {"x"})),
      graph_([&] {
        const std::size_t ranks = devices->size();
        const std::size_t out_n = output_count(op, count_, ranks);
        std::vector<BufferView> iv, ov;
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto slot = static_cast<std::int64_t>(r);
          in_.emplace_back(mesh_.device(slot), std::vector<std::int64_t>{static_cast<std::int64_t>(count_)});
          out_.emplace_back(mesh_.device(slot), std::vector<std::int64_t>{static_cast<std::int64_t>(out_n)});
          auto v = in_.back().values();
          // Written by the device's threads, so the pages stay on its node.
          mesh_.device(slot).execute([&] {
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = input_value(r, i);
          });
        }
        for (auto& t : in_) iv.push_back(view(t));
        for (auto& t : out_) ov.push_back(view(t));
        GraphBuilder b(devices);
        const CollectiveArgs args{.axes = {"x"}, .after = {}, .name = {}};
        switch (op) {
          case CollectiveOp::kAllReduce:
            all_reduce(b, mesh_, iv, ov, count_, ReduceOp::kSum, args);
            break;
          case CollectiveOp::kAllGather: all_gather(b, mesh_, iv, ov, count_, args); break;
          case CollectiveOp::kReduceScatter:
            reduce_scatter(b, mesh_, iv, ov, count_, ReduceOp::kSum, args);
            break;
          case CollectiveOp::kAllToAll: {
            const std::size_t chunk = count_ / ranks;
            all_to_all(b, mesh_, iv, ov,
                                std::vector<std::vector<std::size_t>>(ranks, std::vector<std::size_t>(ranks, chunk)),
                                args);
            break;
          }
        }
        return b.compile();
      }()) {}

bool GraphCollective::check() const {
  return check_outputs(op_, count_, in_.size(),
                       [this](std::size_t r) { return out_[r].values().data(); });
}

// The plain baseline.

struct PlainCollective::State {
  CollectiveOp op;
  std::size_t ranks;
  std::size_t count;
  bool spin;
  std::vector<std::unique_ptr<AlignedFloats>> in, out;
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> go{0};        // generation the helpers should run
  std::atomic<bool> quit{false};
  std::atomic<std::size_t> arrived{0};     // barrier: threads arrived in this phase
  std::atomic<std::uint64_t> phase{0};     // barrier: completed phases

  void wait_until(const std::function<bool()>& ready) const {
    int spins = 0;
    while (!ready()) {
      if (!spin || ++spins > 1000) std::this_thread::yield();
    }
  }

  void barrier() {
    const std::uint64_t p = phase.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks) {
      arrived.store(0, std::memory_order_relaxed);
      phase.store(p + 1, std::memory_order_release);
      return;
    }
    wait_until([&] { return phase.load(std::memory_order_acquire) != p; });
  }

  void work(std::size_t r) {
    const std::size_t chunk = count / ranks;
    float* dst = out[r]->data();
    switch (op) {
      case CollectiveOp::kAllReduce: {
        const std::size_t b = r * chunk;
        std::memcpy(dst + b, in[0]->data() + b, chunk * sizeof(float));
        for (std::size_t j = 1; j < ranks; ++j) {
          const float* src = in[j]->data() + b;
          for (std::size_t i = 0; i < chunk; ++i) dst[b + i] += src[i];
        }
        barrier();
        for (std::size_t j = 0; j < ranks; ++j) {
          if (j != r) std::memcpy(dst + j * chunk, out[j]->data() + j * chunk, chunk * sizeof(float));
        }
        break;
      }
      case CollectiveOp::kAllGather:
        for (std::size_t j = 0; j < ranks; ++j) {
          std::memcpy(dst + j * count, in[j]->data(), count * sizeof(float));
        }
        break;
      case CollectiveOp::kReduceScatter:
        std::memcpy(dst, in[0]->data() + r * chunk, chunk * sizeof(float));
        for (std::size_t j = 1; j < ranks; ++j) {
          const float* src = in[j]->data() + r * chunk;
          for (std::size_t i = 0; i < chunk; ++i) dst[i] += src[i];
        }
        break;
      case CollectiveOp::kAllToAll:
        for (std::size_t j = 0; j < ranks; ++j) {
          std::memcpy(dst + j * chunk, in[j]->data() + r * chunk, chunk * sizeof(float));
        }
        break;
    }
    barrier();
  }

  std::vector<int> cpus;     // the CPUs this process may use (taskset, cgroups)
  cpu_set_t caller_affinity;  // rank 0's binding before the benchmark, restored after

  void setup(std::size_t r) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[r % cpus.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    // Allocated and first-touched by the thread that owns them.
    in[r] = std::make_unique<AlignedFloats>(count);
    out[r] = std::make_unique<AlignedFloats>(output_count(op, count, ranks));
    for (std::size_t i = 0; i < count; ++i) in[r]->data()[i] = input_value(r, i);
  }
};

PlainCollective::PlainCollective(int threads, CollectiveOp op, std::size_t bytes)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.op = op;
  s.ranks = static_cast<std::size_t>(std::max(1, threads));
  s.count = element_count(op, bytes, s.ranks);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) s.cpus.push_back(c);
  }
  if (s.cpus.empty()) s.cpus.push_back(0);
  pthread_getaffinity_np(pthread_self(), sizeof(s.caller_affinity), &s.caller_affinity);
  s.spin = s.ranks <= s.cpus.size();
  s.in.resize(s.ranks);
  s.out.resize(s.ranks);
  std::atomic<std::size_t> ready{0};
  for (std::size_t r = 1; r < s.ranks; ++r) {
    s.threads.emplace_back([&s, &ready, r] {
      s.setup(r);
      ++ready;
      std::uint64_t seen = 0;
      while (true) {
        s.wait_until([&] { return s.quit.load() || s.go.load(std::memory_order_acquire) != seen; });
        if (s.quit.load()) return;
        seen = s.go.load(std::memory_order_acquire);
        s.work(r);
      }
    });
  }
  s.setup(0);
  while (ready.load() + 1 < s.ranks) std::this_thread::yield();
}

PlainCollective::~PlainCollective() {
  state_->quit.store(true);
  for (auto& t : state_->threads) t.join();
  pthread_setaffinity_np(pthread_self(), sizeof(state_->caller_affinity), &state_->caller_affinity);
}

void PlainCollective::run() {
  state_->go.fetch_add(1, std::memory_order_acq_rel);
  state_->work(0);
}

bool PlainCollective::check() const {
  const State& s = *state_;
  return check_outputs(s.op, s.count, s.ranks, [&s](std::size_t r) { return s.out[r]->data(); });
}

struct MemcpyBaseline::Buffers {
  explicit Buffers(std::size_t floats) : src(floats), dst(floats) {}
  AlignedFloats src, dst;
};

MemcpyBaseline::MemcpyBaseline(std::size_t bytes)
    : buffers_(std::make_unique<Buffers>((bytes + 3) / 4)), bytes_(bytes) {
  std::memset(buffers_->src.data(), 1, bytes);
}

MemcpyBaseline::~MemcpyBaseline() = default;

void MemcpyBaseline::run() { std::memcpy(buffers_->dst.data(), buffers_->src.data(), bytes_); }

}  // namespace numesh::runtime
