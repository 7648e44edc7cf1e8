// The MPI transport (NUMESH_WITH_MPI): the only file that includes mpi.h. One progress thread
// per process owns every MPI call after initialisation (so MPI_THREAD_SERIALIZED suffices):
// send and recv queue their transfer to it and return; it posts MPI_Isend / MPI_Irecv, polls
// them with MPI_Testsome and runs each transfer's callback as it completes. Errors are returned
// (MPI_ERRORS_RETURN on the transport's communicator), never fatal.

#include <fmt/format.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
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
    thread_ = std::thread([this] { progress(); });
  }

  ~MpiTransport() override {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    MPI_Comm_free(&comm_);
    if (finalize_) MPI_Finalize();
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "mpi"; }

 protected:
  void start_send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done) override {
    enqueue({Transfer::kSend, peer, tag, const_cast<std::byte*>(bytes.data()),
             checked_count("send to", peer, bytes.size()), std::move(done)});
  }
  void start_recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done) override {
    enqueue({Transfer::kRecv, peer, tag, bytes.data(),
             checked_count("recv from", peer, bytes.size()), std::move(done)});
  }

 private:
  struct Transfer {
    enum Kind { kSend, kRecv } kind;
    int peer;
    int tag;
    std::byte* data;  // a send's bytes are only read (MPI_Isend takes a const pointer)
    int count;
    TransferDone done;
  };

  static int checked_count(std::string_view what, int peer, std::size_t bytes) {
    NUMESH_CHECK(bytes <= static_cast<std::size_t>(INT_MAX), ValueError,
                 "{} rank {}: {} bytes in one transfer; the MPI transport moves at most {}", what,
                 peer, bytes, INT_MAX);
    return static_cast<int>(bytes);
  }

  void enqueue(Transfer transfer) {
    {
      const std::lock_guard lock(mutex_);
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
      t.done(std::make_exception_ptr(Error(
          fmt::format("{} rank {}, tag {}: {} failed: {}",
                      t.kind == Transfer::kSend ? "send to" : "recv from", t.peer, t.tag,
                      t.kind == Transfer::kSend ? "MPI_Isend" : "MPI_Irecv", mpi_message(code)))));
      t.done = nullptr;
    }
  }

  // The completed transfer's error, if any (`status` is its status; `code` its error code).
  std::exception_ptr outcome(const Transfer& t, const MPI_Status& status, int code) const {
    const char* what = t.kind == Transfer::kSend ? "send to" : "recv from";
    if (code == MPI_ERR_TRUNCATE) {
      return std::make_exception_ptr(ValueError(fmt::format(
          "recv from rank {}, tag {}: the transfer is larger than the {} bytes expected", t.peer,
          t.tag, t.count)));
    }
    if (code != MPI_SUCCESS) {
      return std::make_exception_ptr(
          Error(fmt::format("{} rank {}, tag {}: {}", what, t.peer, t.tag, mpi_message(code))));
    }
    if (t.kind == Transfer::kRecv) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (received != t.count) {
        return std::make_exception_ptr(ValueError(
            fmt::format("recv from rank {}, tag {}: {} bytes arrived where {} were expected",
                        t.peer, t.tag, received, t.count)));
      }
    }
    return nullptr;
  }

  // The progress thread: posts new transfers, polls the active ones, completes them. It sleeps
  // while nothing is active; while transfers are in flight it polls, yielding its core between
  // polls and sleeping 20 us after 64 empty ones, so that a long wait does not hold a core
  // the devices need.
  void progress() {
    std::vector<Transfer> active;
    std::vector<MPI_Request> requests;
    std::vector<int> indices;
    std::vector<MPI_Status> statuses;
    int idle_polls = 0;
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
        for (Transfer& t : active)
          t.done(std::make_exception_ptr(Error(fmt::format(
              "MPI_Testsome failed with this transfer in flight: {}", mpi_message(code)))));
        active.clear();
        requests.clear();
        continue;
      }
      if (completed == MPI_UNDEFINED || completed == 0) {
        if (++idle_polls > 64) {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
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
        Transfer& t = active[k];
        t.done(outcome(t, status, error));
        t.done = nullptr;
      }
      // Drop the completed transfers (Testsome set their requests to MPI_REQUEST_NULL).
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
    // Closing with transfers in flight: cancel them and say so.
    for (std::size_t k = 0; k < active.size(); ++k) {
      MPI_Cancel(&requests[k]);
      MPI_Request_free(&requests[k]);
      active[k].done(std::make_exception_ptr(CancelledError(
          fmt::format("{} rank {}, tag {}: the MPI transport closed before the transfer completed",
                      active[k].kind == Transfer::kSend ? "send to" : "recv from", active[k].peer,
                      active[k].tag))));
    }
  }

  bool finalize_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Transfer> incoming_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

bool has_mpi() noexcept { return true; }

std::shared_ptr<Transport> mpi_world() {
  // Destroyed at exit, on the thread that runs the static destructors (MPI_Finalize belongs on
  // the thread that initialised MPI: call mpi_world() first from main's thread).
  static std::mutex mutex;
  static std::shared_ptr<Transport> world;
  const std::lock_guard lock(mutex);
  if (world) return world;
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  int provided = 0;
  if (initialised == 0) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
              "MPI_Init_thread");
  } else {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (initialised == 0) MPI_Finalize();
    throw Error(
        fmt::format("MPI provides thread level {} where the transport's progress thread needs "
                    "MPI_THREAD_SERIALIZED ({})",
                    provided, MPI_THREAD_SERIALIZED));
  }
  world = std::make_shared<MpiTransport>(/*finalize_at_end=*/initialised == 0);
  return world;
}

}  // namespace numesh::runtime
