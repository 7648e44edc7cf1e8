#pragma once

// PRIVATE: where a collective's node reads another slot's bytes from, on a mesh that may span
// ranks (docs/distributed.md). A slot of this rank reads another slot of this rank in place,
// as in one process. Another rank's slot on the same host, whose bytes lie in its shared memory
// (SharedWindows), is read in place too: the source rings a "published" doorbell once they are
// ready, the reader's node waits for it, and the reader rings "consumed" once its nodes of the
// collective are done, which the source's slot waits for before its frontier entry says its
// buffers are free. Other bytes of another rank come through the mesh's transport: a send node
// on the source's rank and a receive node on the reader's, into a staging buffer that every
// local reader of those bytes shares. Nothing else about the collective changes, so its nodes
// combine their inputs in the same order, and give the same bits, in one process or many.
// In a run that is stopping (a node failed, or the run was cancelled), a send tells its peer
// so instead of sending (Transport::send_run_stopped), and a published doorbell rings marked
// so: the reader's run stops instead of reading what may never have been computed.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device_buffer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/shared_windows.hpp"
#include "numesh/sharding/shard_layout.hpp"

namespace numesh::runtime::detail {

/// Which of a slot's buffers a read is from (a collective may read several, as the all-reduce's
/// second stage reads the outputs of its first).
enum class SourceBuffer {
  kInput,
  kOutput,
  /// A hierarchical all-reduce's fp32 partial results, handed from one rank to the next (in
  /// the output of an fp32 collective, in memory of the collective's own otherwise).
  kPartial,
};

/// When the send of a read that crosses by the transport starts on the source's rank.
enum class SendStart {
  /// Once its bytes are ready.
  kWhenReady,
  /// Once its bytes are ready and the kSendWindow-th windowed send before it in this
  /// collective, from this rank to the same rank and of the same SourceBuffer, has completed.
  /// For the pieces of a pipelined collective: Open MPI progresses concurrent large sends to
  /// one peer together, so pieces all posted at once would all arrive at the end, together, and
  /// nothing would overlap. Inputs and outputs keep separate windows, so that a reduce-scatter's
  /// reduced pieces (outputs, sent on by its all-gather) do not queue behind its input pieces.
  kWindowed,
};

/// How many windowed sends from one rank to another are in flight at once: one crossing while
/// the next waits its turn in the transport.
inline constexpr std::size_t kSendWindow = 2;

/// The reads of one collective call. Every rank declares every read of the collective, the
/// other ranks' included, in the same order: the transfers are numbered (tagged) by that order,
/// so both ends of each transfer agree. Reads of bytes that another rank already receives for
/// this collective (the same source, buffer, region and receiving rank) share one transfer.
class SourceReads {
 public:
  /// Reads for the collective whose nodes are named `name`, on `mesh`, added to `builder`.
  SourceReads(GraphBuilder& builder, const DeviceMesh& mesh, std::string name);

  /// What a local reader reads: the first byte and the node to wait for (kReady: none).
  struct Read {
    const std::byte* data = nullptr;
    NodeId ready = kReady;
  };

  /// Slot `reader` reads `bytes` bytes from byte `offset` of slot `source`'s `buffer`, whose
  /// first byte is `data` (any value when `source` is another rank's) and which is ready after
  /// node `ready`. Returns, when `reader` is this rank's, where to read and what to wait for;
  /// otherwise {} (the call still numbers the transfer, and adds the send or the published
  /// doorbell when `source` is this rank's). Between two ranks that read each other in place,
  /// a transfer of at least SharedWindows::in_place_min_bytes() is read in place: the source
  /// tells the reader where the bytes lie (or that they must be sent) as the graph is built, and
  /// the reader's call waits for that message. Smaller ones are sent, when `start` says.
  Read contiguous(SourceBuffer buffer, std::int64_t reader, std::int64_t source, const void* data,
                  NodeId ready, std::size_t offset, std::size_t bytes,
                  SendStart start = SendStart::kWhenReady);

  /// What a local reader reads of a box: its elements, laid out as `*slices` describes (the
  /// source's shard in place, the box itself when staged), and the node to wait for. The node
  /// that reads keeps the BoxRead: `slices` owns a staged box's layout (and does not own the
  /// layout of a shard read in place, which its tensor keeps).
  struct BoxRead {
    const void* data = nullptr;
    std::shared_ptr<const std::vector<sharding::DimSlice>> slices;
    NodeId ready = kReady;
  };

  /// Slot `reader` reads the part `box` (global coordinates) of slot `source`'s shard `data`
  /// (elements of `type`, laid out as `*slices`), ready after node `ready`. A staged box
  /// crosses as its own elements only: the send node packs it first. A box of another rank
  /// always crosses through the transport, shared windows or not (the source's layout is
  /// known only on its rank); one of this rank is read in place.
  BoxRead box(std::int64_t reader, std::int64_t source, const void* data,
              const std::vector<sharding::DimSlice>* slices, NodeId ready,
              const std::vector<sharding::DimSlice>& box, DType type);

  /// The send nodes that read local slot `slot`'s buffers. Its last node of the collective
  /// waits for them, so that its frontier entry still means "its buffers are free".
  std::vector<NodeId> sends_of(std::int64_t slot) const;

  /// Ends the collective whose last node of each local slot is `next`'s entry: rings the
  /// consumed doorbells of this rank's in-place reads once those nodes are done, and makes the
  /// entry of each local slot that another rank reads in place a node that also waits for that
  /// rank's consumed doorbell. Returns the frontier to hand on. Every collective ends with it.
  Frontier finish(Frontier next);

 private:
  // A staged read: where it lands on this rank and the receive that fills it.
  struct Staged {
    std::shared_ptr<DeviceBuffer> buffer;  // null when read in place
    const std::byte* in_place = nullptr;   // the source's bytes in this process, when so
    NodeId received = kReady;              // the receive, or the published doorbell's wait
    std::shared_ptr<const std::vector<sharding::DimSlice>> slices;  // box reads: the box
  };
  // (buffer, source slot, offset, bytes, receiving rank, box as offset-extent pairs).
  using Key =
      std::tuple<int, std::int64_t, std::size_t, std::size_t, int, std::vector<std::int64_t>>;

  // Numbers the transfer of `bytes` from `source` to `reader`'s rank; adds the send (by `send`)
  // on the source's rank or the receive on the reader's. Returns the staged read on the
  // reader's rank.
  template <typename MakeSend>
  const Staged* transfer(const Key& key, std::int64_t reader, std::int64_t source,
                         std::size_t bytes, NodeId ready, MakeSend&& send, int tag = -1,
                         SendStart start = SendStart::kWhenReady);

  // The start of a send node of `bytes` bytes at `src` to rank `to` under `tag`.
  AsyncStart send_node(int to, int tag, const std::byte* src, std::size_t bytes) const;

  // contiguous() between two ranks that read each other in place; nullptr on a rank that does
  // not read the bytes.
  const Staged* shared(const Key& key, std::int64_t reader, std::int64_t source,
                       const std::byte* src, std::size_t bytes, NodeId ready, SendStart start);

  GraphBuilder& builder_;
  const DeviceMesh& mesh_;
  std::string name_;
  std::map<Key, Staged> staged_;
  std::map<Key, bool> sent_;
  std::map<std::int64_t, std::vector<NodeId>> sends_;
  // This rank's windowed sends, per receiving rank and SourceBuffer, in the order declared.
  std::map<std::pair<int, int>, std::vector<NodeId>> windowed_;
  std::shared_ptr<SharedWindows> windows_;
  // This rank's in-place reads: per source rank, the transfers to ring consumed for.
  std::map<int, std::vector<int>> consumed_;
  // Other ranks' in-place reads of local slots: per slot, (reader rank, transfer).
  std::map<std::int64_t, std::vector<std::pair<int, int>>> read_in_place_;
};

}  // namespace numesh::runtime::detail
