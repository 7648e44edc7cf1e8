// The transport's argument checks, its set-up collectives built on send and recv, the blocking
// helpers, and the in-process implementations (one process; ranks as threads).

#include "numesh/runtime/transport.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

// Waits for the TransferDone it hands out; rethrows the transfer's error. The callback owns
// the promise, so the waiter may return (and this object go) while set_value is still
// returning on the transport's thread.
class Completion {
 public:
  TransferDone callback() {
    auto promise = std::make_shared<std::promise<std::exception_ptr>>();
    future_ = promise->get_future();
    return [promise](std::exception_ptr error) { promise->set_value(std::move(error)); };
  }
  void wait() {
    if (std::exception_ptr error = future_.get()) std::rethrow_exception(error);
  }

 private:
  std::future<std::exception_ptr> future_;
};

// Counts transfers down and keeps the first error: all_gather's many transfers in one wait.
// The callbacks share the state, which outlives the waiter as Completion's promise does.
class Countdown {
 public:
  explicit Countdown(int count) : state_(std::make_shared<State>()) { state_->left = count; }
  TransferDone callback() {
    return [state = state_](std::exception_ptr error) {
      const std::lock_guard lock(state->mutex);
      if (error && !state->error) state->error = std::move(error);
      if (--state->left == 0) state->done.notify_all();
    };
  }
  void wait() {
    std::unique_lock lock(state_->mutex);
    state_->done.wait(lock, [this] { return state_->left == 0; });
    if (state_->error) std::rethrow_exception(state_->error);
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable done;
    int left = 0;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
};

}  // namespace

void Transport::check_transfer(std::string_view what, int peer, int tag,
                               const TransferDone& done) const {
  NUMESH_CHECK(peer >= 0 && peer < size(), ValueError, "{} rank {}: no such rank (ranks 0-{})",
               what, peer, size() - 1);
  NUMESH_CHECK(peer != rank(), ValueError, "{} rank {}: that is this rank", what, peer);
  NUMESH_CHECK(tag >= 0 && tag < kTransportTagLimit, ValueError,
               "{} rank {}: tag {} is outside [0, {})", what, peer, tag, kTransportTagLimit);
  NUMESH_CHECK(static_cast<bool>(done), ValueError, "{} rank {}: no completion callback", what,
               peer);
}

void Transport::send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done) {
  check_transfer("send to", peer, tag, done);
  start_send(peer, tag, bytes, std::move(done));
}

void Transport::send_run_stopped(int peer, int tag, TransferDone done) {
  check_transfer("send to", peer, tag, done);
  start_send(peer, tag, {}, std::move(done));
}

std::exception_ptr Transport::run_stopped_error(int peer, int tag) {
  return std::make_exception_ptr(PeerStoppedError(fmt::format(
      "recv from rank {}, tag {}: rank {}'s run stopped before these bytes were "
      "ready (a node failed there or on a rank it waited for, or its run was cancelled)",
      peer, tag, peer)));
}

void Transport::recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done,
                     Patience patience) {
  check_transfer("recv from", peer, tag, done);
  start_recv(peer, tag, bytes, std::move(done), patience);
}

void Transport::set_patience(std::chrono::milliseconds limit) {
  NUMESH_CHECK(limit.count() >= 0, ValueError, "set_patience: {} ms is negative", limit.count());
  patience_ms_.store(limit.count(), std::memory_order_relaxed);
}

std::chrono::milliseconds patience_from_environment() {
  const char* text = std::getenv("NUMESH_RANK_TIMEOUT");
  if (text == nullptr || *text == '\0') return kDefaultPatience;
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  NUMESH_CHECK(
      end != text && *end == '\0' && errno == 0 && seconds >= 0 && seconds < 1e9, ValueError,
      "NUMESH_RANK_TIMEOUT='{}' is not a number of seconds (0 or more; 0: no limit)", text);
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000)));
}

void Transport::start_send(int /*peer*/, int /*tag*/, std::span<const std::byte> /*bytes*/,
                           TransferDone /*done*/) {
  throw NotImplementedError(fmt::format("the {} transport does not send", name()));
}

void Transport::start_recv(int /*peer*/, int /*tag*/, std::span<std::byte> /*bytes*/,
                           TransferDone /*done*/, Patience /*patience*/) {
  throw NotImplementedError(fmt::format("the {} transport does not receive", name()));
}

void Transport::all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
  const auto n = static_cast<std::size_t>(size());
  NUMESH_CHECK(all.size() == n * mine.size(), ValueError,
               "all_gather: {} bytes to gather from {} ranks of {} bytes each need {} bytes, "
               "not {}",
               n * mine.size(), n, mine.size(), n * mine.size(), all.size());
  const std::size_t me = static_cast<std::size_t>(rank());
  if (!mine.empty()) std::memcpy(all.data() + me * mine.size(), mine.data(), mine.size());
  if (n == 1) return;
  Countdown countdown(2 * (size() - 1));
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    start_recv(peer, kAllGatherTag,
               all.subspan(static_cast<std::size_t>(peer) * mine.size(), mine.size()),
               countdown.callback(), Patience::kBounded);
    start_send(peer, kAllGatherTag, mine, countdown.callback());
  }
  countdown.wait();
}

void Transport::barrier() {
  const std::byte token{1};
  std::vector<std::byte> all(static_cast<std::size_t>(size()));
  all_gather({&token, 1}, all);
}

void send_blocking(Transport& transport, int peer, int tag, std::span<const std::byte> bytes) {
  Completion completion;
  transport.send(peer, tag, bytes, completion.callback());
  completion.wait();
}

void recv_blocking(Transport& transport, int peer, int tag, std::span<std::byte> bytes,
                   Patience patience) {
  Completion completion;
  transport.recv(peer, tag, bytes, completion.callback(), patience);
  completion.wait();
}

// ---- Ranks as endpoints in one process ------------------------------------------------------

namespace {

// The transfers posted and not yet matched, keyed by (sender, receiver, tag); each side in the
// order posted, so that a key's transfers match first to first.
class ThreadHub {
 public:
  void send(int from, int to, int tag, std::span<const std::byte> bytes, TransferDone done) {
    std::unique_lock lock(mutex_);
    Queues& q = queues_[{from, to, tag}];
    if (q.recvs.empty()) {
      q.sends.push_back({bytes, std::move(done)});
      return;
    }
    PendingRecv r = std::move(q.recvs.front());
    q.recvs.pop_front();
    lock.unlock();
    deliver(from, tag, bytes, std::move(done), r.bytes, std::move(r.done));
  }

  void recv(int from, int to, int tag, std::span<std::byte> bytes, TransferDone done) {
    std::unique_lock lock(mutex_);
    Queues& q = queues_[{from, to, tag}];
    if (q.sends.empty()) {
      q.recvs.push_back({bytes, std::move(done)});
      return;
    }
    PendingSend s = std::move(q.sends.front());
    q.sends.pop_front();
    lock.unlock();
    deliver(from, tag, s.bytes, std::move(s.done), bytes, std::move(done));
  }

 private:
  struct PendingSend {
    std::span<const std::byte> bytes;
    TransferDone done;
  };
  struct PendingRecv {
    std::span<std::byte> bytes;
    TransferDone done;
  };
  struct Queues {
    std::deque<PendingSend> sends;
    std::deque<PendingRecv> recvs;
  };

  // Copies a matched pair and completes both, outside the lock (a callback may post again).
  // A size mismatch fails the receive alone, as MPI does; no bytes where some were expected
  // are a send_run_stopped.
  static void deliver(int from, int tag, std::span<const std::byte> sent, TransferDone send_done,
                      std::span<std::byte> into, TransferDone recv_done) {
    std::exception_ptr error;
    if (sent.empty() && !into.empty()) {
      error = Transport::run_stopped_error(from, tag);
    } else if (sent.size() < into.size()) {
      error = std::make_exception_ptr(
          ValueError(fmt::format("recv from rank {}, tag {}: {} bytes arrived where {} were "
                                 "expected",
                                 from, tag, sent.size(), into.size())));
    } else if (sent.size() > into.size()) {
      error = std::make_exception_ptr(ValueError(fmt::format(
          "recv from rank {}, tag {}: the transfer is larger than the {} bytes expected", from, tag,
          into.size())));
    } else if (!sent.empty()) {
      std::memcpy(into.data(), sent.data(), sent.size());
    }
    send_done(nullptr);
    recv_done(std::move(error));
  }

  std::mutex mutex_;
  std::map<std::tuple<int, int, int>, Queues> queues_;
};

class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadHub> hub, int rank, int size)
      : hub_(std::move(hub)), rank_(rank), size_(size) {}
  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "threads"; }

 protected:
  void start_send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done) override {
    hub_->send(rank_, peer, tag, bytes, std::move(done));
  }
  // Ranks as threads of one process wait without limit (recv's contract).
  void start_recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done,
                  Patience /*patience*/) override {
    hub_->recv(peer, rank_, tag, bytes, std::move(done));
  }

 private:
  std::shared_ptr<ThreadHub> hub_;
  int rank_;
  int size_;
};

}  // namespace

std::vector<std::shared_ptr<Transport>> make_thread_transports(int ranks) {
  NUMESH_CHECK(ranks >= 1, ValueError, "make_thread_transports: {} ranks (1 or more)", ranks);
  auto hub = std::make_shared<ThreadHub>();
  std::vector<std::shared_ptr<Transport>> endpoints;
  for (int r = 0; r < ranks; ++r)
    endpoints.push_back(std::make_shared<ThreadTransport>(hub, r, ranks));
  return endpoints;
}

int launched_ranks() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      return n > 0 ? n : 0;
    }
  }
  return 0;
}

bool launched_by_mpi() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace numesh::runtime
