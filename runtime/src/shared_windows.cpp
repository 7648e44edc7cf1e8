// The shared memory between the ranks of one host: the set-up collective that pairs the ranks
// and maps their arenas, and the doorbells (counters in a control block of shared memory, one
// per rank, with a futex word that wakes the rank's poller thread).

#include "numesh/runtime/shared_windows.hpp"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/shared_arena.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// A rank's doorbells: counters[kind][from rank][tag], each rung by rank `from` alone. `bell`
// counts every ring (and every new await of the owner's); the owner's poller sleeps on it.
// After the counters, stopped[kind][from rank][tag]: bit n % 64 tells whether ring n came from
// a run that was stopping (ring()'s run_stopped). A doorbell is rung at most once a run and its
// source waits for the reader's consumed ring before it runs again, so a ring is read long
// before the bit is reused 64 rings later.
struct ControlHeader {
  std::atomic<std::uint32_t> bell{0};
  std::atomic<std::uint32_t> sleeping{0};
};
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kTags = kTransportTagLimit;

std::size_t control_bytes(int ranks) {
  return kHeaderBytes + 4 * static_cast<std::size_t>(ranks) * kTags * sizeof(std::uint64_t);
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// The host this process runs on: its name and the kernel's boot id (two containers of one name
// on different machines, or one machine rebooted, are not one host).
std::uint64_t host_key() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string text(name);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  text += "|" + id;
  // Ranks in separate PID namespaces (containers sharing a host name) cannot reach each other's
  // /proc/PID/fd: not one host for this purpose.
  char ns[128] = {};
  if (readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1) > 0) text += "|" + std::string(ns);
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

bool enabled_by_environment() {
  const char* v = std::getenv("NUMESH_SHARED_MEMORY");
  return v == nullptr || std::strcmp(v, "off") != 0;
}

// A device's arena spans its node's memory and half again (room for the gaps first fit leaves),
// at most the machine's memory; the machine's when the node's is not known.
std::size_t arena_capacity(const DeviceSet& set, std::size_t device) {
  const auto machine = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const int node = set.device(device).spec().numa_node;
  const auto& nodes = set.topology().numa_nodes();
  if (node < 0 || static_cast<std::size_t>(node) >= nodes.size()) return machine;
  const std::uint64_t bytes = nodes[static_cast<std::size_t>(node)].memory_bytes;
  if (bytes == 0) return machine;
  return std::min<std::size_t>(machine, bytes + bytes / 2);
}

struct Header {
  std::uint64_t host = 0;
  std::int32_t pid = 0;
  std::int32_t enabled = 0;
  std::int32_t devices = 0;
  std::int32_t padding = 0;  // all_gather moves the bytes: no uninitialised ones
  std::uint64_t in_place_min_bytes = 0;
};

struct ArenaRecord {
  std::int32_t fd = -1;
  std::int32_t padding = 0;
  std::uint64_t capacity = 0;
  FileIdentity file;
};

template <typename T>
std::vector<T> gather(Transport& transport, const T& mine) {
  std::vector<T> all(static_cast<std::size_t>(transport.size()));
  transport.all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
  return all;
}

}  // namespace

struct SharedWindows::Impl {
  std::shared_ptr<Transport> transport;
  int me = 0;
  int ranks = 1;
  std::vector<std::uint8_t> in_place;                      // [reader * ranks + source]
  std::size_t min_bytes = 0;                               // in_place_min_bytes()
  std::vector<std::shared_ptr<SharedArena>> local_arenas;  // by local device
  std::shared_ptr<SharedArena> control;                    // this rank's doorbells
  // Per rank: its control block and its devices' arenas as mapped here (null where not).
  std::vector<std::unique_ptr<ArenaMapping>> controls;
  std::vector<std::vector<std::unique_ptr<ArenaMapping>>> arenas;
  // How many times this rank has awaited each of its doorbells: [kind][from][tag].
  std::unique_ptr<std::atomic<std::uint64_t>[]> awaited;

  // The poller's watches.
  struct Watch {
    const std::atomic<std::uint64_t>* counter;
    std::size_t index;  // the doorbell's, for its stopped bits
    std::uint64_t target;
    int from;
    int tag;
    Doorbell kind;
    Clock::time_point armed;
    std::chrono::milliseconds patience;
    DoorbellDone done;
  };
  std::mutex mutex;
  std::vector<Watch> incoming;
  bool stop = false;
  std::thread poller;
  // When each rank last rang a doorbell this rank waited for (steady clock, ns): the
  // poller's deadlines count from it.
  std::unique_ptr<std::atomic<std::int64_t>[]> heard;

  ControlHeader& header(std::byte* block) const { return *reinterpret_cast<ControlHeader*>(block); }
  std::atomic<std::uint64_t>* counters(std::byte* block) const {
    return reinterpret_cast<std::atomic<std::uint64_t>*>(block + kHeaderBytes);
  }
  std::atomic<std::uint64_t>* stopped(std::byte* block) const {
    return counters(block) + 2 * static_cast<std::size_t>(ranks) * kTags;
  }
  // Whether ring `n` (1, 2, ...) of this rank's doorbell `i` came from a stopping run; read
  // once the counter has reached n (acquire), which orders the bit's write first.
  bool rung_stopped(std::size_t i, std::uint64_t n) const {
    return ((stopped(control->base())[i].load(std::memory_order_relaxed) >> (n % 64)) & 1U) != 0;
  }
  // What an await matched to a ring of a stopping run completes with.
  static std::exception_ptr stopped_error(Doorbell kind, int from, int tag) {
    return std::make_exception_ptr(PeerStoppedError(fmt::format(
        "wait for rank {}'s {} doorbell, tag {}: rank {}'s run stopped before its bytes were "
        "ready (a node failed there or on a rank it waited for, or its run was cancelled)",
        from, kind == Doorbell::kPublished ? "published" : "consumed", tag, from)));
  }
  std::size_t index(Doorbell kind, int from, int tag) const {
    return (static_cast<std::size_t>(kind) * static_cast<std::size_t>(ranks) +
            static_cast<std::size_t>(from)) *
               kTags +
           static_cast<std::size_t>(tag);
  }

  void wake(std::byte* block) {
    ControlHeader& h = header(block);
    h.bell.fetch_add(1, std::memory_order_seq_cst);
    if (h.sleeping.load(std::memory_order_seq_cst) != 0)
      futex(&h.bell, FUTEX_WAKE, INT_MAX, nullptr);
  }

  void run_poller();
};

std::shared_ptr<SharedWindows> SharedWindows::open(const std::shared_ptr<Transport>& transport,
                                                   DeviceSet& local) {
  NUMESH_CHECK(transport != nullptr, ValueError, "SharedWindows::open needs a transport");
  auto impl = std::make_unique<Impl>();
  impl->transport = transport;
  impl->me = transport->rank();
  impl->ranks = transport->size();
  const auto n = static_cast<std::size_t>(impl->ranks);
  const auto me = static_cast<std::size_t>(impl->me);

  Header mine;
  mine.host = host_key();
  mine.pid = static_cast<std::int32_t>(getpid());
  mine.enabled = enabled_by_environment() ? 1 : 0;
  mine.devices = static_cast<std::int32_t>(local.size());
  mine.in_place_min_bytes = in_place_min_bytes_from_environment();
  const std::vector<Header> headers = gather(*transport, mine);
  for (const Header& h : headers) {
    impl->min_bytes = std::max<std::size_t>(impl->min_bytes, h.in_place_min_bytes);
  }
  auto shares_host = [&](std::size_t r) {
    return r != me && headers[r].enabled != 0 && mine.enabled != 0 && headers[r].host == mine.host;
  };
  bool any_peer = false;
  for (std::size_t r = 0; r < n; ++r) any_peer = any_peer || shares_host(r);

  // This rank's arenas and doorbells, made only when a peer may map them. A failure leaves
  // them out (the rank's pairs then fall back to the transport).
  std::int32_t max_devices = 0;
  for (const Header& h : headers) max_devices = std::max(max_devices, h.devices);
  std::vector<ArenaRecord> records(static_cast<std::size_t>(max_devices) + 1);
  if (any_peer) {
    try {
      impl->control = SharedArena::create(fmt::format("numesh-doorbells-rank{}", me),
                                          control_bytes(impl->ranks));
      records[0] = {impl->control->fd(), 0, impl->control->capacity(), impl->control->identity()};
      for (std::size_t d = 0; d < local.size(); ++d) {
        std::shared_ptr<SharedArena> arena = local.device(d).shared_arena();
        if (arena == nullptr) {
          local.device(d).share_memory(
              SharedArena::create(fmt::format("numesh-rank{}-device{}", me, d),
                                  arena_capacity(local, d)),
              impl->min_bytes);
          arena = local.device(d).shared_arena();
        }
        impl->local_arenas.push_back(arena);
        records[d + 1] = {arena->fd(), 0, arena->capacity(), arena->identity()};
      }
    } catch (const Error&) {
      impl->control.reset();
      records.assign(records.size(), ArenaRecord{});
    }
  }
  std::vector<ArenaRecord> all(n * records.size());
  transport->all_gather(std::as_bytes(std::span(records)), std::as_writable_bytes(std::span(all)));

  // Map the arenas of the ranks of this host.
  impl->controls.resize(n);
  impl->arenas.resize(n);
  std::vector<std::uint8_t> mapped(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    const ArenaRecord* rec = &all[r * records.size()];
    if (!shares_host(r) || impl->control == nullptr || rec[0].fd < 0) continue;
    try {
      impl->controls[r] = std::make_unique<ArenaMapping>(headers[r].pid, rec[0].fd, rec[0].capacity,
                                                         rec[0].file, /*writable=*/true);
      for (std::int32_t d = 0; d < headers[r].devices; ++d) {
        const ArenaRecord& a = rec[static_cast<std::size_t>(d) + 1];
        impl->arenas[r].push_back(std::make_unique<ArenaMapping>(headers[r].pid, a.fd, a.capacity,
                                                                 a.file, /*writable=*/false));
      }
      mapped[r] = 1;
    } catch (const Error&) {
      impl->controls[r].reset();
      impl->arenas[r].clear();
    }
  }
  // Both ends of a pair must agree: reader R reads S in place when R mapped S's arenas and S
  // mapped R's doorbells (the consumed bell is rung into S's block by R, published into R's by
  // S).
  std::vector<std::uint8_t> every(n * n);
  transport->all_gather(std::as_bytes(std::span(mapped)), std::as_writable_bytes(std::span(every)));
  impl->in_place.assign(n * n, 0);
  bool any = false;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t s = 0; s < n; ++s) {
      const bool yes = r != s && every[r * n + s] != 0 && every[s * n + r] != 0;
      impl->in_place[r * n + s] = yes ? 1 : 0;
      any = any || (yes && (r == me || s == me));
    }
  }
  if (!any) return nullptr;
  impl->awaited = std::make_unique<std::atomic<std::uint64_t>[]>(2 * n * kTags);
  impl->heard = std::make_unique<std::atomic<std::int64_t>[]>(n);
  return std::shared_ptr<SharedWindows>(new SharedWindows(std::move(impl)));
}

SharedWindows::SharedWindows(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->poller = std::thread([impl = impl_.get()] { impl->run_poller(); });
}

SharedWindows::~SharedWindows() {
  {
    const std::lock_guard lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->wake(impl_->control->base());
  impl_->poller.join();
}

bool SharedWindows::reads_in_place(int reader, int source) const noexcept {
  const auto n = static_cast<std::size_t>(impl_->ranks);
  if (reader < 0 || source < 0 || static_cast<std::size_t>(reader) >= n ||
      static_cast<std::size_t>(source) >= n)
    return false;
  return impl_->in_place[static_cast<std::size_t>(reader) * n + static_cast<std::size_t>(source)] !=
         0;
}

std::size_t SharedWindows::in_place_min_bytes() const noexcept { return impl_->min_bytes; }

std::optional<SharedLocation> SharedWindows::locate(const void* p,
                                                    std::size_t bytes) const noexcept {
  for (std::size_t d = 0; d < impl_->local_arenas.size(); ++d) {
    if (const auto offset = impl_->local_arenas[d]->offset_of(p, bytes)) {
      return SharedLocation{static_cast<std::int32_t>(d), *offset};
    }
  }
  return std::nullopt;
}

const std::byte* SharedWindows::at(int rank, SharedLocation where, std::size_t bytes) const {
  const bool known =
      rank >= 0 && rank < impl_->ranks && where.device >= 0 &&
      static_cast<std::size_t>(where.device) < impl_->arenas[static_cast<std::size_t>(rank)].size();
  NUMESH_CHECK(known, ValueError, "shared memory: rank {} device {} is not mapped on rank {}", rank,
               where.device, impl_->me);
  const ArenaMapping& m =
      *impl_->arenas[static_cast<std::size_t>(rank)][static_cast<std::size_t>(where.device)];
  NUMESH_CHECK(where.offset <= m.size() && bytes <= m.size() - where.offset, ValueError,
               "shared memory: {} bytes at offset {} run past the {} bytes of rank {} device {}",
               bytes, where.offset, m.size(), rank, where.device);
  return m.base() + where.offset;
}

void SharedWindows::ring(Doorbell kind, int to, int tag, bool run_stopped) {
  NUMESH_CHECK(to >= 0 && to < impl_->ranks && impl_->controls[static_cast<std::size_t>(to)],
               ValueError, "shared memory: no doorbells of rank {} on rank {}", to, impl_->me);
  NUMESH_CHECK(tag >= 0 && static_cast<std::size_t>(tag) < kTags, ValueError,
               "shared memory: tag {} is outside [0, {})", tag, kTags);
  std::byte* block = impl_->controls[static_cast<std::size_t>(to)]->base();
  const std::size_t i = impl_->index(kind, impl_->me, tag);
  std::atomic<std::uint64_t>& counter = impl_->counters(block)[i];
  // This rank alone rings the doorbell, so the next ring's number is known before it rings.
  const std::uint64_t bit = std::uint64_t{1}
                            << ((counter.load(std::memory_order_relaxed) + 1) % 64);
  std::atomic<std::uint64_t>& stopped = impl_->stopped(block)[i];
  if (run_stopped) {
    stopped.fetch_or(bit, std::memory_order_relaxed);
  } else if ((stopped.load(std::memory_order_relaxed) & bit) != 0) {
    stopped.fetch_and(~bit, std::memory_order_relaxed);
  }
  // Release: what this rank wrote before the ring (the published bytes, or its reads' end, and
  // the stopped bit) is seen by the reader that sees the count.
  counter.fetch_add(1, std::memory_order_release);
  impl_->wake(block);
}

void SharedWindows::await(Doorbell kind, int from, int tag, DoorbellDone done) {
  NUMESH_CHECK(from >= 0 && from < impl_->ranks && from != impl_->me, ValueError,
               "shared memory: no doorbells from rank {} on rank {}", from, impl_->me);
  NUMESH_CHECK(tag >= 0 && static_cast<std::size_t>(tag) < kTags, ValueError,
               "shared memory: tag {} is outside [0, {})", tag, kTags);
  const std::size_t i = impl_->index(kind, from, tag);
  const std::uint64_t target = impl_->awaited[i].fetch_add(1, std::memory_order_relaxed) + 1;
  const std::atomic<std::uint64_t>& counter = impl_->counters(impl_->control->base())[i];
  // A ring that came already completes here, on the caller's thread: the poller would cost
  // two thread wake-ups. (Spinning 4 us more for a ring about to come made small collectives
  // across two ranks 3-4 us slower, 4 rounds alternated: the peer's ring seldom came so soon.)
  if (counter.load(std::memory_order_acquire) >= target) {
    impl_->heard[static_cast<std::size_t>(from)].store(Clock::now().time_since_epoch().count(),
                                                       std::memory_order_relaxed);
    done(impl_->rung_stopped(i, target) ? Impl::stopped_error(kind, from, tag) : nullptr);
    return;
  }
  Impl::Watch watch{
      &counter,       i, target, from, tag, kind, Clock::now(), impl_->transport->patience(),
      std::move(done)};
  {
    const std::lock_guard lock(impl_->mutex);
    NUMESH_CHECK(!impl_->stop, CancelledError, "shared memory: the windows are closed");
    impl_->incoming.push_back(std::move(watch));
  }
  impl_->wake(impl_->control->base());
}

void SharedWindows::await_all(Doorbell kind, std::vector<std::pair<int, int>> bells,
                              DoorbellDone done) {
  if (bells.empty()) {
    done(nullptr);
    return;
  }
  struct State {
    std::mutex mutex;
    std::size_t left;
    std::exception_ptr error;
    DoorbellDone done;
  };
  auto state = std::make_shared<State>();
  state->left = bells.size();
  state->done = std::move(done);
  const DoorbellDone one = [state](std::exception_ptr error) {
    std::unique_lock lock(state->mutex);
    if (error && !state->error) state->error = std::move(error);
    if (--state->left != 0) return;
    lock.unlock();
    state->done(state->error);
  };
  for (const auto& [from, tag] : bells) {
    // An await that throws counts as ended with its error: `done` still comes once, after the
    // ones registered before it.
    try {
      await(kind, from, tag, one);
    } catch (...) {
      one(std::current_exception());
    }
  }
}

// Polls the watches against their counters. With none ready it yields a few times (a ring is
// often microseconds away inside a collective), then sleeps on the bell, which every ring and
// every new await bumps; a wait with watches sleeps at most 10 ms, for the deadlines.
void SharedWindows::Impl::run_poller() {
  std::vector<Watch> watches;
  ControlHeader& h = header(control->base());
  int empty_polls = 0;
  while (true) {
    const std::uint32_t seen = h.bell.load(std::memory_order_seq_cst);
    bool stopping = false;
    {
      const std::lock_guard lock(mutex);
      stopping = stop;
      for (Watch& w : incoming) watches.push_back(std::move(w));
      incoming.clear();
    }
    if (stopping) break;
    bool any = false;
    const Clock::time_point now = Clock::now();
    for (Watch& w : watches) {
      if (w.counter->load(std::memory_order_acquire) >= w.target) {
        heard[static_cast<std::size_t>(w.from)].store(now.time_since_epoch().count(),
                                                      std::memory_order_relaxed);
        std::exchange(w.done, nullptr)(
            rung_stopped(w.index, w.target) ? stopped_error(w.kind, w.from, w.tag) : nullptr);
        any = true;
        continue;
      }
      const Clock::time_point since = std::max(
          w.armed, Clock::time_point(Clock::duration(
                       heard[static_cast<std::size_t>(w.from)].load(std::memory_order_relaxed))));
      if (w.patience.count() > 0 && now - since >= w.patience) {
        const double seconds = std::chrono::duration<double>(w.patience).count();
        std::exchange(w.done, nullptr)(std::make_exception_ptr(TimeoutError(fmt::format(
            "wait for rank {}'s {} doorbell, tag {}: nothing from rank {} for {:g} s; it has most "
            "likely hung (NUMESH_RANK_TIMEOUT sets how long ranks wait for each other)",
            w.from, w.kind == Doorbell::kPublished ? "published" : "consumed", w.tag, w.from,
            seconds))));
        any = true;
      }
    }
    if (any) {
      std::erase_if(watches, [](const Watch& w) { return !w.done; });
      empty_polls = 0;
      continue;
    }
    if (!watches.empty() && ++empty_polls <= 64) {
      std::this_thread::yield();
      continue;
    }
    empty_polls = 0;
    h.sleeping.store(1, std::memory_order_seq_cst);
    if (h.bell.load(std::memory_order_seq_cst) == seen) {
      const timespec ten_ms{0, 10'000'000};
      futex(&h.bell, FUTEX_WAIT, seen, watches.empty() ? nullptr : &ten_ms);
    }
    h.sleeping.store(0, std::memory_order_seq_cst);
  }
  // Closing: what is left waits for nothing more.
  for (Watch& w : watches) {
    std::exchange(w.done, nullptr)(std::make_exception_ptr(
        CancelledError(fmt::format("shared memory: the windows closed while transfer {} waited "
                                   "for rank {}",
                                   w.tag, w.from))));
  }
  for (Watch& w : incoming) {
    std::exchange(w.done, nullptr)(std::make_exception_ptr(
        CancelledError(fmt::format("shared memory: the windows closed while transfer {} waited "
                                   "for rank {}",
                                   w.tag, w.from))));
  }
}

std::size_t in_place_min_bytes_from_environment() {
  const char* text = std::getenv("NUMESH_IN_PLACE_MIN_BYTES");
  if (text == nullptr || *text == '\0') return kDefaultInPlaceMinBytes;
  char* end = nullptr;
  errno = 0;
  const unsigned long long bytes = std::strtoull(text, &end, 10);
  NUMESH_CHECK(end != text && *end == '\0' && errno == 0 && text[0] != '-', ValueError,
               "NUMESH_IN_PLACE_MIN_BYTES='{}' is not a whole number of bytes (0 or more; 0: "
               "every transfer between ranks of one host is read in place)",
               text);
  return static_cast<std::size_t>(bytes);
}

}  // namespace numesh::runtime
