#pragma once

// Moving bytes between the processes (ranks) of one run: the seam under the collectives for a
// mesh that spans processes (docs/distributed.md). A Transport is this process's end of it:
// its rank, the number of ranks, point-to-point transfers that complete through a callback
// (so that a graph node never blocks on one), and the blocking set-up collectives built on them.
//
// Implementations:
//  - SingleProcessTransport: one rank, nothing to send (every run that is not under mpirun);
//  - make_thread_transports(n): n ranks as endpoints in one process (tests; runs ranks as
//    threads);
//  - mpi_world(): Open MPI's world, in the runtime's only file that includes mpi.h (built with
//    NUMESH_WITH_MPI).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace numesh::runtime {

/// Called once when a transfer started by Transport::send or Transport::recv has completed:
/// with nullptr on success, or with the error (a receive's buffer then holds unspecified
/// bytes). It runs on a thread of the transport (its progress thread, or the thread whose call
/// matched the transfer), so it must return quickly and must not wait for another transfer.
using TransferDone = std::function<void(std::exception_ptr)>;

/// Tags a caller may use: [0, kTransportTagLimit). Tags from the limit up are the transport's
/// own (its set-up collectives).
inline constexpr int kTransportTagLimit = 1 << 14;

/// How long a receive may wait for its peer.
enum class Patience : std::uint8_t {
  /// At most the transport's patience() without news from the peer: a peer silent that long
  /// is taken as hung, and the receive fails with TimeoutError naming it. Every transfer inside
  /// a run or a collective.
  kBounded,
  /// As long as it takes: a rank that waits for work (a serving engine's follower waiting for
  /// its leader's next call) may wait for hours.
  kUnbounded,
};

/// The patience mpi_world() starts with: NUMESH_RANK_TIMEOUT seconds when set (0: without
/// limit), else 600 s.
inline constexpr std::chrono::milliseconds kDefaultPatience{600'000};

/// One process's end of the transport between the ranks of a run. send and recv check their
/// arguments and hand the transfer to the implementation; all_gather and barrier are built on
/// them. Thread-safety: send, recv and the accessors may be called from any thread at once;
/// all_gather and barrier are collective: every rank calls them in the same order, one at a
/// time per rank.
class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// This process's rank, in [0, size()).
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// The number of ranks.
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// What moves the bytes: "single process", "threads" or "mpi".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;

  /// Starts sending `bytes` to rank `peer` under `tag`; `done` runs when the bytes may be
  /// reused. The bytes must stay valid and unchanged until then. Transfers between two ranks
  /// under one tag are received in the order they were sent. A send whose peer completes no
  /// transfer with this rank for patience() completes `done` with TimeoutError naming the
  /// peer (the MPI transport; MPI may still read the bytes then: end the run).
  /// Throws (before anything is sent): ValueError naming a peer outside [0, size()) or equal
  /// to rank(), a tag outside [0, kTransportTagLimit), or an empty `done`;
  /// NotImplementedError when the transport moves no data.
  void send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done);

  /// Sends `peer`, in place of this rank's next transfer to it under `tag`, word that the run
  /// it belonged to stopped before its bytes were ready (a node failed here, or the run was
  /// cancelled): the peer's receive of it completes with PeerStoppedError (a CancelledError) naming
  /// this rank and the tag, and the transfers after it under the tag arrive as usual. It crosses as
  /// a transfer of no bytes, so a receive of no bytes completes without error either way. Throws:
  /// as send.
  void send_run_stopped(int peer, int tag, TransferDone done);

  /// Starts receiving the next transfer from `peer` under `tag` into `bytes`; `done` runs when
  /// it has arrived. A transfer of another size than bytes.size() completes `done` with a
  /// ValueError naming the peer, the tag and both sizes (or, when it is larger, the size
  /// expected). A kBounded receive whose peer completes no transfer with this rank for
  /// patience() completes `done` with TimeoutError naming the peer, the tag and the time (the
  /// MPI transport, where MPI may still write the bytes of a transfer its peer stopped
  /// halfway: end the run; ranks as threads wait without limit). A transfer the peer replaced
  /// by send_run_stopped completes `done` with PeerStoppedError naming the peer and the tag, the
  /// bytes left as they were.
  /// Throws: as send.
  void recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done,
            Patience patience = Patience::kBounded);

  /// How long a send or a kBounded receive waits while its peer completes no transfer with
  /// this rank; zero: without limit.
  [[nodiscard]] std::chrono::milliseconds patience() const noexcept {
    return std::chrono::milliseconds(patience_ms_.load(std::memory_order_relaxed));
  }
  /// Sets patience() for the transfers started from now on. Thread-safe.
  /// Throws: ValueError for a negative limit.
  void set_patience(std::chrono::milliseconds limit);

  /// Every rank's `mine` (the same size on every rank), in rank order, into `all`
  /// (size() * mine.size() bytes); blocks until this rank's part is done. Collective.
  /// Throws: ValueError when `all` has the wrong size; what a transfer failed with.
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all);

  /// Returns once every rank has called it. Collective.
  /// Throws: what a transfer failed with.
  void barrier();

  /// The error a receive from `peer` under `tag` completes with when the peer sent
  /// send_run_stopped in place of its transfer (a PeerStoppedError naming both). For
  /// implementations: a receive expecting bytes that gets none.
  [[nodiscard]] static std::exception_ptr run_stopped_error(int peer, int tag);

 protected:
  /// The implementation of send, with arguments checked (the transport's own tags allowed).
  /// The default throws NotImplementedError naming the transport.
  virtual void start_send(int peer, int tag, std::span<const std::byte> bytes, TransferDone done);
  /// The implementation of recv, with arguments checked. The default throws
  /// NotImplementedError.
  virtual void start_recv(int peer, int tag, std::span<std::byte> bytes, TransferDone done,
                          Patience patience);
  /// The tag of the built-in all_gather's transfers.
  static constexpr int kAllGatherTag = kTransportTagLimit;

 private:
  void check_transfer(std::string_view what, int peer, int tag, const TransferDone& done) const;

  std::atomic<std::int64_t> patience_ms_{kDefaultPatience.count()};
};

/// send, then wait for its completion. Throws: as send; what the transfer failed with.
void send_blocking(Transport& transport, int peer, int tag, std::span<const std::byte> bytes);
/// recv, then wait for its completion. Throws: as recv; what the transfer failed with.
void recv_blocking(Transport& transport, int peer, int tag, std::span<std::byte> bytes,
                   Patience patience = Patience::kBounded);

/// The transport of a run of one process: rank 0 of 1. It has no peer, so send and recv refuse
/// every call; all_gather copies `mine` and barrier returns at once.
class SingleProcessTransport final : public Transport {
 public:
  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int size() const noexcept override { return 1; }
  [[nodiscard]] std::string_view name() const noexcept override { return "single process"; }
};

/// `ranks` endpoints of one in-process transport: element r is rank r. Transfers are matched
/// by (sender, receiver, tag) in order and copied by the thread whose send or recv finds its
/// match, which also runs both callbacks. For tests of code that runs on several ranks, each
/// rank a thread.
/// Throws: ValueError when ranks < 1.
std::vector<std::shared_ptr<Transport>> make_thread_transports(int ranks);

/// True when this process was started by mpirun (Open MPI's, or any launcher setting PMI or
/// PMIx variables), read from the environment without initialising MPI.
[[nodiscard]] bool launched_by_mpi() noexcept;

/// The number of ranks mpirun started, read from the launcher's environment
/// (OMPI_COMM_WORLD_SIZE, or PMI_SIZE) without initialising MPI; 0 when not started by a
/// launcher that says.
[[nodiscard]] int launched_ranks() noexcept;

/// True when this build has the MPI transport (NUMESH_WITH_MPI).
[[nodiscard]] bool has_mpi() noexcept;

/// The process's MPI transport over MPI_COMM_WORLD (a duplicate of it), made on the first
/// call, which should come from the main thread. Its patience() is NUMESH_RANK_TIMEOUT
/// seconds when that is set (a number, 0 for no limit), else kDefaultPatience. MPI is initialised
/// here unless the program already did (asking for MPI_THREAD_SERIALIZED: only the transport's
/// progress thread calls MPI; a program that initialised MPI itself must have MPI_THREAD_MULTIPLE)
/// and finalised at exit only if numesh initialised it. A program that finalises MPI itself closes
/// the transport then. Closing completes every transfer left with CancelledError. MPI errors are
/// returned, not fatal: a failed transfer completes its callback with an Error naming the MPI
/// call, the peer, the tag and MPI's message.
/// Throws: NotImplementedError when the build has no MPI (has_mpi() false); Error when MPI
/// cannot start or lacks the thread level; ValueError naming NUMESH_RANK_TIMEOUT when it is
/// not a number of seconds >= 0.
std::shared_ptr<Transport> mpi_world();

/// The patience NUMESH_RANK_TIMEOUT sets: its seconds (fractions allowed; 0: no limit), or
/// kDefaultPatience when it is unset or empty.
/// Throws: ValueError naming the variable and its value when that is not a number >= 0.
[[nodiscard]] std::chrono::milliseconds patience_from_environment();

/// Ends every rank of the run at once with exit status `code`; never returns. With MPI
/// initialised and not finalised, by MPI_Abort on MPI's world: a rank that failed alone and
/// returned would leave the others waiting in their next collective, and its own MPI_Finalize
/// waiting for them. Otherwise (one process, a build without MPI) the process exits with
/// `code`. The C streams are flushed first; destructors and atexit handlers do not run.
[[noreturn]] void abort_mpi_world(int code) noexcept;

}  // namespace numesh::runtime
