#include "numesh/models/engine/engine_following.hpp"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

// The encoding writes every field of RequestOptions by name: a field added there must be added
// here too, which these sizes make a compile error rather than a field silently not sent.
static_assert(sizeof(ops::SamplingOptions) == 24, "encode every field of SamplingOptions");
static_assert(sizeof(RequestOptions) == 88, "encode every field of RequestOptions");

// Marks an encoded call (and the encoding's version).
constexpr std::array<char, 4> kMark = {'N', 'E', 'C', '1'};

class Writer {
 public:
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_all(const std::vector<T>& values) {
    put(static_cast<std::uint64_t>(values.size()));
    const auto* p = reinterpret_cast<const std::byte*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size() * sizeof(T));
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  T get(std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> get_all(std::string_view what) {
    const auto count = get<std::uint64_t>(what);
    NUMESH_CHECK(count <= (bytes_.size() - at_) / sizeof(T), ValueError,
                 "engine call: {} {} do not fit in the {} bytes left of {}", count, what,
                 bytes_.size() - at_, bytes_.size());
    std::vector<T> values(count);
    if (count != 0) std::memcpy(values.data(), bytes_.data() + at_, count * sizeof(T));
    at_ += count * sizeof(T);
    return values;
  }
  bool get_flag(std::string_view what) {
    const auto flag = get<std::uint8_t>(what);
    NUMESH_CHECK(flag <= 1, ValueError, "engine call: its {} is {}, not 0 or 1", what, flag);
    return flag == 1;
  }
  void end() const {
    NUMESH_CHECK(at_ == bytes_.size(), ValueError, "engine call: {} bytes left over after {} of {}",
                 bytes_.size() - at_, at_, bytes_.size());
  }

 private:
  void need(std::size_t n, std::string_view what) const {
    NUMESH_CHECK(bytes_.size() - at_ >= n, ValueError,
                 "engine call: its {} ends past the end of its {} bytes", what, bytes_.size());
  }
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::byte> encode_engine_call(const EngineCall& call) {
  Writer w;
  w.put(kMark);
  w.put(call.kind);
  w.put(call.sequence);
  if (call.kind != EngineCall::Kind::kSubmit) return w.take();
  w.put_all(call.prompt);
  const RequestOptions& o = call.options;
  w.put(o.max_new_tokens);
  w.put_all(o.stop_ids);
  w.put(static_cast<std::uint8_t>(o.sampling.has_value()));
  if (o.sampling) {
    w.put(o.sampling->temperature);
    w.put(o.sampling->top_k);
    w.put(o.sampling->top_p);
  }
  w.put(o.seed);
  w.put(static_cast<std::uint8_t>(o.logprobs.has_value()));
  if (o.logprobs) w.put(*o.logprobs);
  return w.take();
}

EngineCall decode_engine_call(std::span<const std::byte> bytes) {
  Reader r(bytes);
  const auto mark = r.get<std::array<char, 4>>("mark");
  NUMESH_CHECK(mark == kMark, ValueError, "engine call: the bytes do not start with the mark {}",
               std::string_view(kMark.data(), kMark.size()));
  EngineCall call;
  call.kind = r.get<EngineCall::Kind>("kind");
  NUMESH_CHECK(call.kind <= EngineCall::Kind::kEnd, ValueError, "engine call: unknown kind {}",
               static_cast<int>(call.kind));
  call.sequence = r.get<SequenceId>("sequence");
  if (call.kind == EngineCall::Kind::kSubmit) {
    call.prompt = r.get_all<std::int32_t>("prompt tokens");
    RequestOptions& o = call.options;
    o.max_new_tokens = r.get<std::int64_t>("max_new_tokens");
    o.stop_ids = r.get_all<std::int64_t>("stop ids");
    if (r.get_flag("sampling flag")) {
      ops::SamplingOptions s;
      s.temperature = r.get<double>("temperature");
      s.top_k = r.get<std::int64_t>("top_k");
      s.top_p = r.get<double>("top_p");
      o.sampling = s;
    }
    o.seed = r.get<std::uint64_t>("seed");
    if (r.get_flag("logprobs flag")) o.logprobs = r.get<std::int64_t>("logprobs");
  }
  r.end();
  return call;
}

EngineFollowers::EngineFollowers(const runtime::DeviceMesh& mesh)
    : transport_(mesh.transport()), ranks_(mesh.ranks()) {
  NUMESH_CHECK(ranks_ > 1 && mesh.this_rank() == 0, ValueError,
               "engine followers: rank {} of a mesh over {} rank(s) sends no calls (rank 0 of a "
               "mesh over several ranks does)",
               mesh.this_rank(), ranks_);
}

void EngineFollowers::send(const EngineCall& call) {
  const std::vector<std::byte> bytes = encode_engine_call(call);
  const std::uint64_t size = bytes.size();
  for (int rank = 1; rank < ranks_; ++rank) {
    runtime::send_blocking(*transport_, rank, kEngineCallTag,
                           std::as_bytes(std::span<const std::uint64_t>(&size, 1)));
    runtime::send_blocking(*transport_, rank, kEngineCallTag, bytes);
  }
}

void follow_engine(Engine& engine) {
  const runtime::DeviceMesh& mesh = engine.mesh();
  const int rank = mesh.this_rank();
  NUMESH_CHECK(mesh.ranks() > 1 && rank != 0, ValueError,
               "follow_engine: rank {} of a mesh over {} rank(s) has no rank 0 to follow (ranks "
               "1 and up of a mesh over several ranks follow rank 0)",
               rank, mesh.ranks());
  (void)engine.scheduler();  // throws ValueError without serving options
  runtime::Transport& transport = *mesh.transport();
  std::vector<std::byte> bytes;
  std::string failed;  // this rank's last step threw this, and rank 0 has not said it failed too
  for (;;) {
    // Between calls this rank waits for work, as long as rank 0's server idles.
    std::uint64_t size = 0;
    runtime::recv_blocking(transport, 0, kEngineCallTag,
                           std::as_writable_bytes(std::span<std::uint64_t>(&size, 1)),
                           runtime::Patience::kUnbounded);
    bytes.resize(size);
    runtime::recv_blocking(transport, 0, kEngineCallTag, bytes);
    EngineCall call = decode_engine_call(bytes);
    NUMESH_CHECK(failed.empty() || call.kind == EngineCall::Kind::kFailed, Error,
                 "follow_engine: rank {}'s step failed where rank 0's did not: {}", rank, failed);
    switch (call.kind) {
      case EngineCall::Kind::kSubmit: {
        const std::size_t tokens = call.prompt.size();
        const std::optional<SequenceId> id = engine.submit(std::move(call.prompt), call.options);
        NUMESH_CHECK(id == call.sequence, Error,
                     "follow_engine: rank 0's engine admitted a request of {} prompt tokens as {} "
                     "where rank {}'s {}: the ranks' engines differ",
                     tokens, call.sequence, rank,
                     id ? fmt::format("admitted it as {}", *id) : std::string("refused it"));
        break;
      }
      case EngineCall::Kind::kCancel:
        engine.cancel(call.sequence);
        break;
      case EngineCall::Kind::kStep:
        try {
          (void)engine.step();
        } catch (const TimeoutError&) {
          throw;  // a rank hangs: nothing to agree on
        } catch (const Error& e) {
          // Rank 0's step should have failed alike (on the same logits): it says so next.
          failed = e.what();
        }
        break;
      case EngineCall::Kind::kFailed:
        NUMESH_CHECK(!failed.empty(), Error,
                     "follow_engine: rank 0's step failed where rank {}'s did not", rank);
        failed.clear();  // the step's cancellations follow
        break;
      case EngineCall::Kind::kEnd:
        return;
    }
  }
}

}  // namespace numesh::models
