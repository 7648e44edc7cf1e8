#pragma once

// The ranks of one host reading each other's device memory in place (docs/distributed.md,
// "Ranks of one host"). A mesh that spans ranks opens its SharedWindows: every local device then
// allocates from a SharedArena, every rank maps the arenas of the other ranks on its host, and a
// collective's node reads another rank's buffer where it lies, as devices of one process do,
// instead of receiving a copy through the transport. The bytes need no thread to move them; what
// crosses between the processes is two doorbells a transfer: "published" (the source's bytes are
// ready) and "consumed" (the reader is done with them), counters in shared memory that the
// waiting side's poller thread watches.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace numesh::runtime {

class DeviceSet;  // device.hpp
class Transport;  // transport.hpp

/// Where bytes of a rank's shared memory lie: which of its devices' arenas (its index in the
/// rank's DeviceSet), and the offset from the arena's first byte.
struct SharedLocation {
  std::int32_t device = -1;
  std::uint64_t offset = 0;
};

/// What a doorbell says about a transfer.
enum class Doorbell : std::uint8_t {
  kPublished,  ///< source to reader: the bytes are ready to read
  kConsumed,   ///< reader to source: done reading them; the source may write them again
};

/// Called once when an awaited doorbell has rung: nullptr, or the error that ended the wait.
using DoorbellDone = std::function<void(std::exception_ptr)>;

/// This process's end of the shared memory between the ranks of a mesh. Thread-safety: all
/// methods may be called from any thread at once.
class SharedWindows {
 public:
  /// Opens the windows between the ranks of `transport` for `local`, this rank's devices.
  /// Collective: every rank calls it, in the same order as its other collectives, with a
  /// transport of more than one rank. Ranks are paired by host (the host name, boot id and PID
  /// namespace); a pair reads in place when both have it enabled (the environment variable
  /// NUMESH_SHARED_MEMORY is not `off`) and each could map the other's arenas, checked to be
  /// the files announced. When another rank shares the host, `local`'s devices allocate from
  /// shared arenas from then on (Device::share_memory), even if no mapping then succeeds.
  /// Returns nullptr when this rank reads no other rank in place and no rank reads it (ranks on
  /// different hosts, all disabled, no mapping possible); pairs that do not read in place keep
  /// the transport. Each call maps the peers' arenas anew and starts a poller thread.
  /// Throws: what the transport's all_gather throws; std::system_error when the poller thread
  /// cannot start.
  static std::shared_ptr<SharedWindows> open(const std::shared_ptr<Transport>& transport,
                                             DeviceSet& local);

  ~SharedWindows();
  SharedWindows(const SharedWindows&) = delete;
  SharedWindows& operator=(const SharedWindows&) = delete;

  /// True when rank `reader` reads rank `source`'s shared memory in place. Every rank gives
  /// the same answer for a pair.
  [[nodiscard]] bool reads_in_place(int reader, int source) const noexcept;

  /// The fewest bytes a transfer between a pair that reads in place is read in place with;
  /// smaller ones cross by the transport. The largest of the ranks' settings
  /// (in_place_min_bytes_from_environment), so every rank gives the same answer.
  [[nodiscard]] std::size_t in_place_min_bytes() const noexcept;

  /// Where `bytes` bytes at `p` (this rank's memory) lie in a local device's arena, or nullopt
  /// when they are not all in one (a buffer allocated before the windows opened, a mapped
  /// file, host memory).
  [[nodiscard]] std::optional<SharedLocation> locate(const void* p,
                                                     std::size_t bytes) const noexcept;

  /// The first of `bytes` bytes at `where` in rank `rank`'s shared memory, in this process.
  /// Throws: ValueError naming the rank, the device and the offset when this rank has no
  /// mapping of that arena or the bytes run past its end.
  [[nodiscard]] const std::byte* at(int rank, SharedLocation where, std::size_t bytes) const;

  /// Rings rank `to`'s doorbell `kind` for transfer `tag` (in [0, kTransportTagLimit)). With
  /// `run_stopped`, the ring says that the run it belongs to stopped before the bytes were
  /// ready (a node failed here, or the run was cancelled): the await it matches completes with
  /// PeerStoppedError naming this rank. One thread at a time rings a given doorbell, and at most
  /// 64 of its rings may wait for their awaits.
  void ring(Doorbell kind, int to, int tag, bool run_stopped = false);

  /// Calls `done` once rank `from` has rung doorbell `kind` of `tag` as many times as this
  /// rank has awaited it, this call included: on the calling thread when that happened already,
  /// else on this rank's poller thread. The k-th await of a doorbell matches its k-th ring, as the
  /// k-th receive under a tag matches the k-th send. When `from` rings none for the transport's
  /// patience (counted from the later of this call and the last ring of `from` that this rank
  /// saw end a wait), `done` gets a TimeoutError naming the rank, the
  /// doorbell and the tag. A ring of a stopped run (ring()'s run_stopped) completes the await
  /// it matches with PeerStoppedError naming the rank, the doorbell and the tag. A destroyed
  /// window completes what is left with CancelledError.
  void await(Doorbell kind, int from, int tag, DoorbellDone done);

  /// await() for every (rank, tag) of `bells`; `done` once all have rung, with the first error.
  void await_all(Doorbell kind, std::vector<std::pair<int, int>> bells, DoorbellDone done);

 private:
  struct Impl;
  explicit SharedWindows(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The default of in_place_min_bytes_from_environment: 1 MiB.
inline constexpr std::size_t kDefaultInPlaceMinBytes = std::size_t{1} << 20;

/// NUMESH_IN_PLACE_MIN_BYTES, the fewest bytes a transfer between ranks of one host is read in
/// place with (a whole number, 0: every transfer), or kDefaultInPlaceMinBytes when it is unset
/// or empty. Why a floor: a transfer read in place holds its source until the reader rings
/// "consumed", a second hand-over between the processes, where the transport copies a small
/// message out at once; decode steps across two ranks ran at 2x the time of one process in
/// place and at its time through the transport (docs/distributed.md, "Ranks of one host").
/// Throws: ValueError naming the value when it is not such a number.
std::size_t in_place_min_bytes_from_environment();

}  // namespace numesh::runtime
