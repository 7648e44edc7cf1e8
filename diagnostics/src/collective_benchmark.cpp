#include "numesh/diagnostics/collective_benchmark.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <numeric>
#include <span>
#include <thread>

#include "collective_values.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/convert.hpp"

namespace numesh::diagnostics {

using namespace numesh::runtime;  // the runtime is what this library measures
using detail::check_outputs;
using detail::element_count;
using detail::fill_inputs;
using detail::output_count;

// Named rather than anonymous: a member of a class with linkage must have a type with linkage.
namespace detail {

// A page-aligned block of bytes, zero-filled by the constructing thread (so its pages are
// first-touched where that thread runs). Page-aligned for the reason in the header.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::size_t n)
      : data_(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096 + 4096))),
        size_(n) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, n);
  }
  ~AlignedBytes() { std::free(data_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  std::byte* data_;
  std::size_t size_;
};

}  // namespace detail

namespace {

// A known input value for (rank, element): small integers, exact in every dtype (bf16 holds
// integers exactly up to 256), so fp32 sums of them are exact and the one rounding of a 16-bit
// reduction is known.
float input_value(std::size_t rank, std::size_t i) {
  return static_cast<float>((rank + 1) * 8 + i % 16);
}

// `v` as `dtype` holds it (the reductions round their fp32 sums once).
float stored_value(float v, DType dtype) {
  if (!is_element_dtype(dtype)) return v;  // refused: collectives move element types
  switch (element_type(dtype)) {
    case ElementType::kF32:
      return v;
    case ElementType::kBF16:
      return f32_from_bf16(bf16_from_f32(v));
    case ElementType::kF16:
      return f32_from_f16(f16_from_f32(v));
  }
  return v;
}

// Element i of a buffer of `dtype`, widened.
float element(const void* data, DType dtype, std::size_t i) {
  return widened_element(data, dtype, static_cast<std::int64_t>(i));
}

// Writes input_value(rank, i) for every element of a buffer of `dtype`.
}  // namespace

void detail::fill_inputs(void* data, DType dtype, std::size_t count, std::size_t rank) {
  for (std::size_t i = 0; i < count; ++i) {
    const float v = input_value(rank, i);
    if (!is_element_dtype(dtype)) return;  // refused: collectives move element types
    switch (element_type(dtype)) {
      case ElementType::kF32:
        static_cast<float*>(data)[i] = v;
        break;
      case ElementType::kBF16:
        static_cast<std::uint16_t*>(data)[i] = bf16_from_f32(v);
        break;
      case ElementType::kF16:
        static_cast<std::uint16_t*>(data)[i] = f16_from_f32(v);
        break;
    }
  }
}

namespace {

std::size_t checked_chain(CollectiveOp op, std::size_t chain) {
  NUMESH_CHECK(chain > 0, ValueError, "{}: a chain of 0 collectives runs nothing (1 or more)",
               to_string(op));
  return chain;
}

}  // namespace

std::size_t detail::element_count(CollectiveOp op, std::size_t bytes, std::size_t ranks,
                                  DType dtype) {
  NUMESH_CHECK(is_element_dtype(dtype), ValueError,
               "{}: collectives move f32, bf16 or f16 elements, not {} blocks", to_string(op),
               to_string(dtype));
  const std::size_t elem = dtype_size(dtype);
  NUMESH_CHECK(bytes > 0 && bytes % (elem * ranks) == 0, ValueError,
               "{}: {} bytes is not a positive multiple of {} bytes ({}) x {} devices",
               to_string(op), bytes, elem, to_string(dtype), ranks);
  return bytes / elem;
}

std::size_t detail::output_count(CollectiveOp op, std::size_t count, std::size_t ranks) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return count * ranks;
    case CollectiveOp::kReduceScatter:
      return count / ranks;
    default:
      return count;
  }
}

namespace {

// The value output element i of `rank` must hold (before the rounding to the buffers' dtype).
float expected_value(CollectiveOp op, std::size_t count, std::size_t ranks, std::size_t rank,
                     std::size_t i) {
  const std::size_t chunk = count / ranks;
  switch (op) {
    case CollectiveOp::kAllReduce: {
      float acc = 0;
      for (std::size_t r = 0; r < ranks; ++r) acc += input_value(r, i);
      return acc;
    }
    case CollectiveOp::kAllGather:
      return input_value(i / count, i % count);
    case CollectiveOp::kReduceScatter: {
      float acc = 0;
      for (std::size_t r = 0; r < ranks; ++r) acc += input_value(r, rank * chunk + i);
      return acc;
    }
    case CollectiveOp::kAllToAll:
      return input_value(i / chunk, rank * chunk + i % chunk);
  }
  return 0;
}

}  // namespace

bool detail::check_outputs(CollectiveOp op, std::size_t count, std::size_t ranks, DType dtype,
                           const std::function<const void*(std::size_t)>& out,
                           std::span<const std::size_t> which) {
  const std::size_t n = output_count(op, count, ranks);
  const auto matches = [&](const void* v, std::size_t r, std::size_t i) {
    return element(v, dtype, i) == stored_value(expected_value(op, count, ranks, r, i), dtype);
  };
  for (std::size_t r : which) {
    const void* v = out(r);
    // Every element of small outputs, a stride of large ones.
    const std::size_t step = std::max<std::size_t>(1, n / 4096);
    for (std::size_t i = 0; i < n; i += step) {
      if (!matches(v, r, i)) return false;
    }
    if (n > 0 && !matches(v, r, n - 1)) return false;
  }
  return true;
}

namespace {

// dst[0, n) = the sum over `srcs` of their [offset, offset + n), as a plain loop would: fp32
// adds in source order, and for 16-bit buffers the sources widened a block at a time with the
// library's conversion kernels and the sum rounded once (what numesh's reductions compute).
void plain_reduce(DType dtype, const std::vector<const std::byte*>& srcs, std::size_t offset,
                  std::size_t n, std::byte* dst) {
  const std::size_t elem = dtype_size(dtype);
  if (dtype == DType::kF32) {
    auto* d = reinterpret_cast<float*>(dst);
    std::memcpy(d, srcs[0] + offset * elem, n * elem);
    for (std::size_t j = 1; j < srcs.size(); ++j) {
      const auto* src = reinterpret_cast<const float*>(srcs[j] + offset * elem);
      for (std::size_t i = 0; i < n; ++i) d[i] += src[i];
    }
    return;
  }
  constexpr std::size_t kBlock = 4096;
  thread_local std::vector<float> sum(kBlock), part(kBlock);
  const auto widen = [dtype](const std::byte* src, std::size_t count, std::span<float> to) {
    const std::span<const std::uint16_t> bits(reinterpret_cast<const std::uint16_t*>(src), count);
    if (!is_element_dtype(dtype)) return;  // block formats refused
    switch (element_type(dtype)) {
      case ElementType::kBF16:
        convert_bf16_to_f32(bits, to);
        break;
      case ElementType::kF16:
        convert_f16_to_f32(bits, to);
        break;
      case ElementType::kF32:
        break;  // summed above
    }
  };
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t m = std::min(kBlock, n - b);
    widen(srcs[0] + (offset + b) * elem, m, sum);
    for (std::size_t j = 1; j < srcs.size(); ++j) {
      widen(srcs[j] + (offset + b) * elem, m, part);
      for (std::size_t i = 0; i < m; ++i) sum[i] += part[i];
    }
    const std::span<std::uint16_t> out(reinterpret_cast<std::uint16_t*>(dst) + b, m);
    if (!is_element_dtype(dtype)) return;  // block formats refused
    switch (element_type(dtype)) {
      case ElementType::kBF16:
        convert_f32_to_bf16({sum.data(), m}, out);
        break;
      case ElementType::kF16:
        convert_f32_to_f16({sum.data(), m}, out);
        break;
      case ElementType::kF32:
        break;  // summed above
    }
  }
}

}  // namespace

std::string_view to_string(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all-reduce";
    case CollectiveOp::kAllGather:
      return "all-gather";
    case CollectiveOp::kReduceScatter:
      return "reduce-scatter";
    case CollectiveOp::kAllToAll:
      return "all-to-all";
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
                                 std::size_t bytes, DType dtype, std::size_t chain)
    : GraphCollective(DeviceMesh::create(std::move(devices), {-1}, {"x"}), op, bytes, dtype,
                      chain) {}

GraphCollective::GraphCollective(DeviceMesh mesh, CollectiveOp op, std::size_t bytes, DType dtype,
                                 std::size_t chain, std::size_t piece_bytes,
                                 AllReduceAlgorithm all_reduce_algorithm)
    : op_(op),
      dtype_(dtype),
      chain_(checked_chain(op, chain)),
      count_(element_count(op, bytes, static_cast<std::size_t>(mesh.size()), dtype)),
      mesh_(std::move(mesh)),
      graph_([&] {
        NUMESH_CHECK(mesh_.mesh().rank() == 1, ValueError,
                     "{}: the benchmark runs on a 1-D mesh, not {}", to_string(op),
                     mesh_.to_string());
        const auto ranks = static_cast<std::size_t>(mesh_.size());
        const std::size_t out_n = output_count(op, count_, ranks);
        // Every slot has a view; only this rank's point at buffers.
        std::vector<BufferView> iv(ranks, BufferView{nullptr, count_, dtype}),
            ov(ranks, BufferView{nullptr, out_n, dtype});
        for (const std::int64_t slot : mesh_.local_slots()) {
          const auto r = static_cast<std::size_t>(slot);
          in_.emplace_back(mesh_.device(slot),
                           std::vector<std::int64_t>{static_cast<std::int64_t>(count_)}, dtype);
          out_.emplace_back(mesh_.device(slot),
                            std::vector<std::int64_t>{static_cast<std::int64_t>(out_n)}, dtype);
          // A chain rewrites the inputs from their sources, so they start zeroed.
          if (chain_ > 1) {
            source_.emplace_back(mesh_.device(slot),
                                 std::vector<std::int64_t>{static_cast<std::int64_t>(count_)},
                                 dtype);
          }
          void* v = chain_ > 1 ? source_.back().data() : in_.back().data();
          // Written by the device's threads, so the pages stay on its node.
          mesh_.device(slot).execute([&] { fill_inputs(v, dtype, count_, r); });
          iv[r] = view(in_.back());
          ov[r] = view(out_.back());
        }
        GraphBuilder b(mesh_.device_set());
        Frontier done = ready_frontier(static_cast<std::int64_t>(ranks));
        for (std::size_t link = 0; link < chain_; ++link) {
          CollectiveArgs args{.axes = {"x"}, .after = done, .name = {}, .piece_bytes = piece_bytes};
          if (chain_ > 1) {
            // Every rank's collective read every input of the last link: all of `done` first.
            std::vector<NodeId> deps;
            for (NodeId id : done) {
              if (id != kReady) deps.push_back(id);
            }
            const std::size_t input_bytes = count_ * dtype_size(dtype);
            for (std::size_t k = 0; k < mesh_.local_slots().size(); ++k) {
              const std::int64_t slot = mesh_.local_slots()[k];
              void* dst = in_[k].data();
              const void* src = source_[k].data();
              args.after[static_cast<std::size_t>(slot)] = b.add(
                  mesh_.device(slot).index(), fmt::format("rewrite_input[{}]", slot),
                  [dst, src, input_bytes] { std::memcpy(dst, src, input_bytes); }, deps);
            }
          }
          switch (op) {
            case CollectiveOp::kAllReduce:
              done =
                  all_reduce(b, mesh_, iv, ov, count_, ReduceOp::kSum, args, all_reduce_algorithm);
              break;
            case CollectiveOp::kAllGather:
              done = all_gather(b, mesh_, iv, ov, count_, args);
              break;
            case CollectiveOp::kReduceScatter:
              done = reduce_scatter(b, mesh_, iv, ov, count_, ReduceOp::kSum, args);
              break;
            case CollectiveOp::kAllToAll: {
              const std::size_t chunk = count_ / ranks;
              done = all_to_all(b, mesh_, iv, ov,
                                std::vector<std::vector<std::size_t>>(
                                    ranks, std::vector<std::size_t>(ranks, chunk)),
                                args);
              break;
            }
          }
        }
        return b.compile();
      }()) {}

bool GraphCollective::check() const {
  std::vector<std::size_t> local;
  for (const std::int64_t slot : mesh_.local_slots())
    local.push_back(static_cast<std::size_t>(slot));
  return check_outputs(
      op_, count_, static_cast<std::size_t>(mesh_.size()), dtype_,
      [this](std::size_t r) {
        return out_[r - static_cast<std::size_t>(mesh_.local_slots().front())].data();
      },
      local);
}

// The plain baseline.

struct PlainCollective::State {
  CollectiveOp op;
  DType dtype;
  std::size_t ranks;
  std::size_t count;
  std::size_t chain;
  bool spin;
  // source: what each link of a chain copies into `in` (empty for a chain of 1).
  std::vector<std::unique_ptr<detail::AlignedBytes>> in, out, source;
  std::vector<const std::byte*> inputs;  // in's data, for the reductions (filled once)
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> go{0};  // generation the helpers should run
  std::atomic<bool> quit{false};
  std::atomic<std::size_t> arrived{0};  // barrier: threads arrived in this phase
  std::atomic<std::uint64_t> phase{0};  // barrier: completed phases

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
    for (std::size_t link = 0; link < chain; ++link) {
      if (chain > 1) {
        std::memcpy(in[r]->data(), source[r]->data(), count * dtype_size(dtype));
        barrier();
      }
      collective(r);
    }
  }

  void collective(std::size_t r) {
    const std::size_t chunk = count / ranks, elem = dtype_size(dtype);
    std::byte* dst = out[r]->data();
    switch (op) {
      case CollectiveOp::kAllReduce: {
        const std::size_t b = r * chunk;
        plain_reduce(dtype, inputs, b, chunk, dst + b * elem);
        barrier();
        for (std::size_t j = 0; j < ranks; ++j) {
          if (j != r)
            std::memcpy(dst + j * chunk * elem, out[j]->data() + j * chunk * elem, chunk * elem);
        }
        break;
      }
      case CollectiveOp::kAllGather:
        for (std::size_t j = 0; j < ranks; ++j)
          std::memcpy(dst + j * count * elem, in[j]->data(), count * elem);
        break;
      case CollectiveOp::kReduceScatter:
        plain_reduce(dtype, inputs, r * chunk, chunk, dst);
        break;
      case CollectiveOp::kAllToAll:
        for (std::size_t j = 0; j < ranks; ++j) {
          std::memcpy(dst + j * chunk * elem, in[j]->data() + r * chunk * elem, chunk * elem);
        }
        break;
    }
    barrier();
  }

  std::vector<int> cpus;      // the CPUs this process may use (taskset, cgroups)
  cpu_set_t caller_affinity;  // rank 0's binding before the benchmark, restored after

  void setup(std::size_t r) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[r % cpus.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    // Allocated and first-touched by the thread that owns them.
    const std::size_t elem = dtype_size(dtype);
    in[r] = std::make_unique<detail::AlignedBytes>(count * elem);
    out[r] = std::make_unique<detail::AlignedBytes>(output_count(op, count, ranks) * elem);
    if (chain > 1) {
      source[r] = std::make_unique<detail::AlignedBytes>(count * elem);
      fill_inputs(source[r]->data(), dtype, count, r);  // `in` stays zeroed until a link's copy
    } else {
      fill_inputs(in[r]->data(), dtype, count, r);
    }
  }
};

PlainCollective::PlainCollective(int threads, CollectiveOp op, std::size_t bytes, DType dtype,
                                 std::size_t chain)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.op = op;
  s.dtype = dtype;
  s.chain = checked_chain(op, chain);
  s.ranks = static_cast<std::size_t>(std::max(1, threads));
  s.count = element_count(op, bytes, s.ranks, dtype);
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
  s.source.resize(s.ranks);
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
  for (const auto& buffer : s.in) s.inputs.push_back(buffer->data());
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
  std::vector<std::size_t> all(s.ranks);
  std::iota(all.begin(), all.end(), std::size_t{0});
  return check_outputs(
      s.op, s.count, s.ranks, s.dtype, [&s](std::size_t r) { return s.out[r]->data(); }, all);
}

struct MemcpyBaseline::Buffers {
  explicit Buffers(std::size_t bytes) : src(bytes), dst(bytes) {}
  detail::AlignedBytes src, dst;
};

MemcpyBaseline::MemcpyBaseline(std::size_t bytes)
    : buffers_(std::make_unique<Buffers>(bytes)), bytes_(bytes) {
  // 1 + i mod 251: never 0, and a copy that drops or shifts bytes does not give it back.
  auto* src = reinterpret_cast<unsigned char*>(buffers_->src.data());
  for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(1 + i % 251);
}

MemcpyBaseline::~MemcpyBaseline() = default;

void MemcpyBaseline::run() { std::memcpy(buffers_->dst.data(), buffers_->src.data(), bytes_); }

bool MemcpyBaseline::copied() const {
  return std::memcmp(buffers_->dst.data(), buffers_->src.data(), bytes_) == 0;
}

}  // namespace numesh::diagnostics
