// The MPI transport (NUMESH_WITH_MPI): the runtime's only file that includes mpi.h. One progress
// thread per process owns every MPI call after initialisation (so MPI_THREAD_SERIALIZED suffices
// when numesh initialises MPI): send and recv queue their transfer to it and return; it posts
// MPI_Isend / MPI_Irecv, polls them with MPI_Testsome and runs each transfer's callback as it
// completes. Errors are returned (MPI_ERRORS_RETURN on the transport's communicator), never
// fatal.

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

namespace {

std::string mpi_message(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("error {}", code);
  return {text, static_cast<std::size_t>(length)};
}

void check_mpi(int code, std::string_view call) {
  if (code != MPI_SUCCESS) throw Error(fmt::format("{} failed: {}", call, mpi_message(code)));
}

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(bool finalize_at_end) : finalize_(finalize_at_end) {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    heard_.resize(static_cast<std::size_t>(size_));
    // MPI_Finalize deletes MPI_COMM_SELF's attributes first: a program that finalises MPI
    // itself, before this transport dies at exit, closes it there, while MPI still works.
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &close_at_finalize, &keyval_, nullptr),
              "MPI_Comm_create_keyval");
    check_mpi(MPI_Comm_set_attr(MPI_COMM_SELF, keyval_, this), "MPI_Comm_set_attr");
    thread_ = std::thread([this] { progress(); });
  }

  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;                    // closed by close_at_finalize
    MPI_Comm_delete_attr(MPI_COMM_SELF, keyval_);  // runs close_at_finalize, so close()
    MPI_Comm_free_keyval(&keyval_);
    // MPI_Finalize belongs on the thread that initialised MPI; elsewhere it is left undone.
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (finalize_ && main_thread != 0) MPI_Finalize();
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "mpi"; }

 protected:
  void start_send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done) override {
    enqueue({Transfer::kSend, peer, tag, const_cast<std::byte*>(bytes.data()),
             checked_count("send to", peer, bytes.size()), std::move(done), Clock::now(),
             patience(), Patience::kBounded});
  }
  void start_recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done,
                  Patience wait) override {
    enqueue({Transfer::kRecv, peer, tag, bytes.data(),
             checked_count("recv from", peer, bytes.size()), std::move(done), Clock::now(),
             patience(), wait});
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Transfer {
    enum Kind { kSend, kRecv } kind;
    int peer;
    int tag;
    std::byte* data;  // a send's bytes are only read (MPI_Isend takes a const pointer)
    int count;
    TransferDone done;
    Clock::time_point started;
    std::chrono::milliseconds patience;  // the transport's when it started (zero: no limit)
    Patience wait;                       // kUnbounded: a receive that waits for work
  };
  using ErrorOf = std::function<std::exception_ptr(const Transfer&)>;

  static const char* verb(const Transfer& t) {
    return t.kind == Transfer::kSend ? "send to" : "recv from";
  }
  static const char* call(const Transfer& t) {
    return t.kind == Transfer::kSend ? "MPI_Isend" : "MPI_Irecv";
  }

  static int checked_count(std::string_view what, int peer, std::size_t bytes) {
    NUMESH_CHECK(bytes <= static_cast<std::size_t>(INT_MAX), ValueError,
                 "{} rank {}: {} bytes in one transfer; the MPI transport moves at most {}", what,
                 peer, bytes, INT_MAX);
    return static_cast<int>(bytes);
  }

  static int close_at_finalize(MPI_Comm /*comm*/, int /*keyval*/, void* transport,
                               void* /*extra*/) {
    static_cast<MpiTransport*>(transport)->close();
    return MPI_SUCCESS;
  }

  // Stops the progress thread (which completes every transfer left) and frees the
  // communicator; once.
  void close() {
    {
      const std::lock_guard lock(mutex_);
      if (stop_) return;
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    MPI_Comm_free(&comm_);
  }

  void enqueue(Transfer transfer) {
    {
      const std::lock_guard lock(mutex_);
      NUMESH_CHECK(!stop_, CancelledError, "{} rank {}, tag {}: the MPI transport is closed",
                   verb(transfer), transfer.peer, transfer.tag);
      incoming_.push_back(std::move(transfer));
    }
    wake_.notify_one();
  }

  // Posts a transfer; on failure completes it at once.
  void post(Transfer& t, MPI_Request& request) {
    const int code = t.kind == Transfer::kSend
                         ? MPI_Isend(t.data, t.count, MPI_BYTE, t.peer, t.tag, comm_, &request)
                         : MPI_Irecv(t.data, t.count, MPI_BYTE, t.peer, t.tag, comm_, &request);
    if (code != MPI_SUCCESS) {
      request = MPI_REQUEST_NULL;
      t.done(
          std::make_exception_ptr(Error(fmt::format("{} rank {}, tag {}: {} failed: {}", verb(t),
                                                    t.peer, t.tag, call(t), mpi_message(code)))));
      t.done = nullptr;
    }
  }

  // The completed transfer's error, if any (`status` is its status; `code` its error code).
  static std::exception_ptr outcome(const Transfer& t, const MPI_Status& status, int code) {
    int error_class = MPI_SUCCESS;
    if (code != MPI_SUCCESS) MPI_Error_class(code, &error_class);
    if (error_class == MPI_ERR_TRUNCATE) {
      return std::make_exception_ptr(ValueError(fmt::format(
          "recv from rank {}, tag {}: the transfer is larger than the {} bytes expected", t.peer,
          t.tag, t.count)));
    }
    if (code != MPI_SUCCESS) {
      return std::make_exception_ptr(Error(fmt::format("{} rank {}, tag {}: {} failed: {}", verb(t),
                                                       t.peer, t.tag, call(t), mpi_message(code))));
    }
    if (t.kind == Transfer::kRecv) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (received == 0 && t.count > 0) return run_stopped_error(t.peer, t.tag);
      if (received != t.count) {
        return std::make_exception_ptr(ValueError(
            fmt::format("recv from rank {}, tag {}: {} bytes arrived where {} were expected",
                        t.peer, t.tag, received, t.count)));
      }
    }
    return nullptr;
  }

  // Completes transfers that cannot finish, each with error(t). A posted request is cancelled
  // and waited for first (up to a second in all: Open MPI cannot cancel a send, and a peer
  // that never receives must not hang the exit), so that a buffer is not reported free while
  // MPI may still use it.
  static void abandon(std::vector<Transfer>& transfers, std::vector<MPI_Request>& requests,
                      const ErrorOf& error) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (std::size_t k = 0; k < transfers.size(); ++k) {
      if (k < requests.size() && requests[k] != MPI_REQUEST_NULL) {
        MPI_Cancel(&requests[k]);
        int done = 0;
        while (MPI_Test(&requests[k], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done == 0 &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        if (done == 0 && requests[k] != MPI_REQUEST_NULL) MPI_Request_free(&requests[k]);
      }
      transfers[k].done(error(transfers[k]));
    }
    transfers.clear();
    requests.clear();
  }

  // The watchdog: a bounded transfer whose peer has completed no transfer with this rank for
  // the whole patience, since the transfer started (a receive posted at a run's start waits
  // while its peer computes, as long as the peer's other transfers come and go), means the
  // peer has most likely hung. The transfer completes with TimeoutError naming it. It is
  // cancelled first (one that completed meanwhile completes as it is); one that cannot be
  // cancelled (a send, a receive the peer stopped sending halfway) is freed after 100 ms and
  // left to MPI, which may still touch its bytes: the caller is told it failed, and must end
  // the run. Returns whether any transfer completed.
  bool expire(std::vector<Transfer>& active, std::vector<MPI_Request>& requests) {
    const Clock::time_point now = Clock::now();
    bool any = false;
    for (std::size_t k = 0; k < active.size(); ++k) {
      Transfer& t = active[k];
      if (!t.done || t.wait == Patience::kUnbounded || t.patience.count() == 0) continue;
      const Clock::time_point since = std::max(t.started, heard_[static_cast<std::size_t>(t.peer)]);
      if (now - since < t.patience) continue;
      any = true;
      MPI_Cancel(&requests[k]);
      const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(100);
      MPI_Status status;
      int ended = 0;
      int code = MPI_SUCCESS;
      while ((code = MPI_Test(&requests[k], &ended, &status)) == MPI_SUCCESS && ended == 0 &&
             Clock::now() < give_up) {
        std::this_thread::yield();
      }
      if (code != MPI_SUCCESS || ended != 0) {
        int cancelled = 0;
        if (code == MPI_SUCCESS) MPI_Test_cancelled(&status, &cancelled);
        if (cancelled == 0) {  // it completed after all, or failed on its own
          if (code != MPI_SUCCESS && requests[k] != MPI_REQUEST_NULL) {
            MPI_Request_free(&requests[k]);
          }
          requests[k] = MPI_REQUEST_NULL;
          t.done(outcome(t, status, code));
          t.done = nullptr;
          continue;
        }
      } else if (requests[k] != MPI_REQUEST_NULL) {
        MPI_Request_free(&requests[k]);
      }
      requests[k] = MPI_REQUEST_NULL;
      const double seconds = std::chrono::duration<double>(t.patience).count();
      t.done(std::make_exception_ptr(TimeoutError(fmt::format(
          "{} rank {}, tag {}: nothing from rank {} for {:g} s; it has most likely hung "
          "(NUMESH_RANK_TIMEOUT sets how long ranks wait for each other)",
          verb(t), t.peer, t.tag, t.peer, seconds))));
      t.done = nullptr;
    }
    return any;
  }

  // Drops the completed transfers (done empty; their requests are MPI_REQUEST_NULL now).
  static void drop_completed(std::vector<Transfer>& active, std::vector<MPI_Request>& requests) {
    std::size_t kept = 0;
    for (std::size_t k = 0; k < active.size(); ++k) {
      if (!active[k].done) continue;
      active[kept] = std::move(active[k]);
      requests[kept] = requests[k];
      ++kept;
    }
    active.resize(kept);
    requests.resize(kept);
  }

  // Sends of at least this many bytes move in fragments that MPI advances only as it is polled
  // (Open MPI's shared-memory and TCP transports send larger messages by rendezvous).
  static constexpr int kStreamingBytes = 64 << 10;
  // How long a wait with such a send in flight is polled without sleeping. A piece of 4 MiB
  // (CollectiveArgs::piece_bytes) crosses in a few milliseconds even at 1 GB/s; a send that
  // completes nothing for this long is taken to wait for its peer (a rank that is late, or
  // stuck until the patience runs out) and backs off as any wait.
  static constexpr std::chrono::milliseconds kStreamingWait{100};

  // True while a send of at least kStreamingBytes is in flight. Its bytes are ready, and its
  // peer's receive is usually posted (graphs post theirs as a run starts), so they are likely
  // moving; MPI does not say, hence kStreamingWait.
  static bool streaming(const std::vector<Transfer>& active) {
    return std::any_of(active.begin(), active.end(), [](const Transfer& t) {
      return t.kind == Transfer::kSend && t.count >= kStreamingBytes;
    });
  }

  // The progress thread: posts new transfers, polls the active ones, completes them. It sleeps
  // while nothing is active; while transfers are in flight it polls, yielding its core between
  // polls, and after 64 empty ones, unless a large send is streaming (for up to kStreamingWait),
  // sleeps an eighth of the time the wait has lasted (20 us to 1 ms), so that a long wait does
  // not hold a core the devices need. Why not while streaming: a message of megabytes completes
  // only after many polls (on the receiving side too, which this does not cover: a rank that
  // only receives, as a broadcast's, backs off), and sleeping between them made a 64 MiB all-reduce
  // between two ranks of one host through MPI, its 32 MiB parts sent whole, take 0.8 s instead of
  // 0.05-0.16 s (docs/benchmarks.md, "Transfers across ranks in pieces"). Why an eighth: a rank
  // bound to one core shares it with this thread, and every wake-up from a short sleep is a timer
  // interrupt and a switch away from the core's device thread; sleeping 20 us throughout cost the
  // 21 M training step as two ranks 4-8 % (0.83-0.94x one process, 0.95-0.98x with the backoff),
  // while a wait's end is noticed at most an eighth later than it happened (decode steps across
  // ranks, whose waits are short, unchanged).
  void progress() {
    std::vector<Transfer> active;
    std::vector<MPI_Request> requests;
    std::vector<int> indices;
    std::vector<MPI_Status> statuses;
    int idle_polls = 0;
    Clock::time_point idle_since;  // the first of the current run of empty polls
    Clock::time_point next_check;  // of the deadlines (expire())
    while (true) {
      std::vector<Transfer> fresh;
      {
        std::unique_lock lock(mutex_);
        if (active.empty()) wake_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
        if (stop_) break;
        fresh.swap(incoming_);
      }
      for (Transfer& t : fresh) {
        MPI_Request request = MPI_REQUEST_NULL;
        post(t, request);
        if (t.done) {
          active.push_back(std::move(t));
          requests.push_back(request);
        }
      }
      if (active.empty()) continue;
      indices.resize(active.size());
      statuses.resize(active.size());
      int completed = 0;
      const int code = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed,
                                    indices.data(), statuses.data());
      if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) {
        // The poll itself failed: nothing in flight can be trusted to complete.
        abandon(active, requests, [code](const Transfer& t) {
          return std::make_exception_ptr(
              Error(fmt::format("{} rank {}, tag {}: MPI_Testsome failed with it in flight: {}",
                                verb(t), t.peer, t.tag, mpi_message(code))));
        });
        continue;
      }
      if (Clock::now() >= next_check) {  // every 10 ms, busy or not
        if (expire(active, requests)) drop_completed(active, requests);
        next_check = Clock::now() + std::chrono::milliseconds(10);
        if (active.empty()) continue;
      }
      if (completed == MPI_UNDEFINED || completed == 0) {
        if (++idle_polls == 1) idle_since = Clock::now();
        const auto waited = Clock::now() - idle_since;
        if (idle_polls > 64 && (waited >= kStreamingWait || !streaming(active))) {
          // A wait of 8 ms or more is polled every 1 ms: an idle rank (a serving follower
          // between calls, in the one receive without a time limit) takes a few percent of a
          // core where a poll every 20 us took a quarter; the 1 ms is paid once, by the first
          // call after idling.
          std::this_thread::sleep_for(std::clamp<Clock::duration>(
              waited / 8, std::chrono::microseconds(20), std::chrono::microseconds(1000)));
        } else {
          std::this_thread::yield();
        }
        continue;
      }
      idle_polls = 0;
      for (int i = 0; i < completed; ++i) {
        const auto k = static_cast<std::size_t>(indices[static_cast<std::size_t>(i)]);
        const MPI_Status& status = statuses[static_cast<std::size_t>(i)];
        const int error = code == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS;
        // A failed request may be left live by some MPI libraries (Open MPI frees it).
        if (error != MPI_SUCCESS && requests[k] != MPI_REQUEST_NULL) {
          MPI_Request_free(&requests[k]);
        }
        Transfer& t = active[k];
        heard_[static_cast<std::size_t>(t.peer)] = Clock::now();
        t.done(outcome(t, status, error));
        t.done = nullptr;
      }
      drop_completed(active, requests);
    }
    // Closing: the transfers in flight and those not yet posted end with CancelledError.
    std::vector<Transfer> unposted;
    {
      const std::lock_guard lock(mutex_);
      unposted.swap(incoming_);
    }
    const ErrorOf closed = [](const Transfer& t) {
      return std::make_exception_ptr(CancelledError(
          fmt::format("{} rank {}, tag {}: the MPI transport closed before the transfer "
                      "completed",
                      verb(t), t.peer, t.tag)));
    };
    abandon(active, requests, closed);
    std::vector<MPI_Request> not_posted;
    abandon(unposted, not_posted, closed);
  }

  bool finalize_;
  int keyval_ = MPI_KEYVAL_INVALID;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Transfer> incoming_;
  bool stop_ = false;
  std::thread thread_;
  // The progress thread's: when each peer last completed a transfer with this rank.
  std::vector<std::chrono::steady_clock::time_point> heard_;
};

}  // namespace

bool has_mpi() noexcept { return true; }

void abort_mpi_world(int code) noexcept {
  std::fflush(nullptr);
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (initialised != 0 && finalized == 0) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::shared_ptr<Transport> mpi_world() {
  // Destroyed at exit, on the thread that runs the static destructors (MPI_Finalize belongs on
  // the thread that initialised MPI: call mpi_world() first from main's thread).
  static std::mutex mutex;
  static std::shared_ptr<Transport> world;
  const std::lock_guard lock(mutex);
  if (world) return world;
  const std::chrono::milliseconds patience = patience_from_environment();  // before MPI starts
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  int provided = 0;
  if (initialised == 0) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
              "MPI_Init_thread");
  } else {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  // numesh's progress thread is then the only thread calling MPI; a program that initialised
  // MPI itself may call it too, at the same time, which needs MPI_THREAD_MULTIPLE.
  const int needed = initialised == 0 ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
  if (provided < needed) {
    if (initialised == 0) MPI_Finalize();
    throw Error(fmt::format(
        "MPI provides thread level {} where the transport's progress thread needs {} ({}{})",
        provided, needed, initialised == 0 ? "MPI_THREAD_SERIALIZED" : "MPI_THREAD_MULTIPLE",
        initialised == 0 ? "" : ": the program initialised MPI and may call it alongside"));
  }
  world = std::make_shared<MpiTransport>(/*finalize_at_end=*/initialised == 0);
  world->set_patience(patience);
  return world;
}

}  // namespace numesh::runtime
