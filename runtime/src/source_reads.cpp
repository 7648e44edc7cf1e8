#include "source_reads.hpp"

#include <fmt/format.h>

#include <utility>

#include "box_runs.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime::detail {

namespace {

std::vector<NodeId> after(NodeId ready) {
  return ready == kReady ? std::vector<NodeId>{} : std::vector<NodeId>{ready};
}

}  // namespace

SourceReads::SourceReads(GraphBuilder& builder, const DeviceMesh& mesh, std::string name)
    : builder_(builder), mesh_(mesh), name_(std::move(name)), windows_(mesh.shared_windows()) {}

AsyncStart SourceReads::send_node(int to, int tag, const std::byte* src, std::size_t bytes) const {
  return [transport = mesh_.transport(), to, tag, src, bytes](NodeDone done, RunState run) {
    // A stopping run's bytes may not have been computed: the peer is told so instead, and its
    // run stops too where it would have read them.
    if (run == RunState::kStopping) {
      transport->send_run_stopped(to, tag, std::move(done));
    } else {
      transport->send(to, tag, {src, bytes}, std::move(done));
    }
  };
}

namespace {

// What the source of an in-place pair tells the reader as the graph is built: where the bytes
// lie in its shared memory, or (located 0) that they come through the transport.
struct Where {
  std::int32_t located = 0;
  std::int32_t device = -1;
  std::uint64_t offset = 0;
};

}  // namespace

const SourceReads::Staged* SourceReads::shared(const Key& key, std::int64_t reader,
                                               std::int64_t source, const std::byte* src,
                                               std::size_t bytes, NodeId ready, SendStart start) {
  const int from = mesh_.rank_of(source);
  const int to = mesh_.rank_of(reader);
  const int me = mesh_.this_rank();
  auto send_bytes = [&](int to_rank, int tag) { return send_node(to_rank, tag, src, bytes); };
  if (me == from) {
    if (sent_.count(key) != 0) return nullptr;
    const int tag = builder_.transfer_tag(from, to);
    auto where = std::make_shared<Where>();
    if (const auto location = windows_->locate(src, bytes)) {
      *where = {1, location->device, location->offset};
    }
    // Sent as the graph is built; the reader's build waits for it. The message is small, so
    // the transport buffers it, and a failure shows on the reader's side.
    mesh_.transport()->send(to, tag, std::as_bytes(std::span(where.get(), 1)),
                            [where](std::exception_ptr) {});
    if (where->located == 0)
      return transfer(key, reader, source, bytes, ready, send_bytes, tag, start);
    sent_.emplace(key, true);
    // Rings are asynchronous nodes (ended at once) because those run even in a run that is
    // stopping, as transfers do: a ring left out would put the two ranks' doorbells out of step.
    builder_.add_async(
        mesh_.device(source).index(), fmt::format("{}.publish[{}->rank {}]", name_, source, to),
        [windows = windows_, to, tag](NodeDone done, RunState run) {
          windows->ring(Doorbell::kPublished, to, tag, run == RunState::kStopping);
          done(nullptr);
        },
        after(ready), NodeKind::kTransfer, 0);
    read_in_place_[source].emplace_back(to, tag);
    return nullptr;
  }
  if (me != to) return nullptr;
  if (const auto it = staged_.find(key); it != staged_.end()) return &it->second;
  const int tag = builder_.transfer_tag(from, to);
  Where where;
  recv_blocking(*mesh_.transport(), from, tag, std::as_writable_bytes(std::span(&where, 1)));
  if (where.located == 0)
    return transfer(key, reader, source, bytes, ready, send_bytes, tag, start);
  Staged staged;
  staged.in_place = windows_->at(from, {where.device, where.offset}, bytes);
  staged.received = builder_.add_async(
      mesh_.device(reader).index(), fmt::format("{}.published[{}<-{}]", name_, reader, source),
      [windows = windows_, from, tag](NodeDone done, RunState) {
        windows->await(Doorbell::kPublished, from, tag, std::move(done));
      },
      std::span<const NodeId>{}, NodeKind::kTransfer, bytes);
  consumed_[from].push_back(tag);
  return &staged_.emplace(key, std::move(staged)).first->second;
}

Frontier SourceReads::finish(Frontier next) {
  if (!consumed_.empty()) {
    std::vector<NodeId> done;
    for (const std::int64_t slot : mesh_.local_slots()) {
      const NodeId n = next[static_cast<std::size_t>(slot)];
      if (n != kReady) done.push_back(n);
    }
    const int device = mesh_.device(mesh_.local_slots().front()).index();
    for (auto& [from, tags] : consumed_) {
      builder_.add_async(
          device, fmt::format("{}.consumed[->rank {}]", name_, from),
          [windows = windows_, from = from, tags = tags](NodeDone end, RunState) {
            for (const int tag : tags) windows->ring(Doorbell::kConsumed, from, tag);
            end(nullptr);
          },
          done, NodeKind::kTransfer, 0);
    }
  }
  for (auto& [slot, bells] : read_in_place_) {
    NodeId& entry = next[static_cast<std::size_t>(slot)];
    entry = builder_.add_async(
        mesh_.device(slot).index(), fmt::format("{}.free[{}]", name_, slot),
        [windows = windows_, bells = bells](NodeDone done, RunState) {
          windows->await_all(Doorbell::kConsumed, bells, std::move(done));
        },
        after(entry), NodeKind::kTransfer, 0);
  }
  return next;
}

template <typename MakeSend>
const SourceReads::Staged* SourceReads::transfer(const Key& key, std::int64_t reader,
                                                 std::int64_t source, std::size_t bytes,
                                                 NodeId ready, MakeSend&& make_send, int tag,
                                                 SendStart start) {
  const int from = mesh_.rank_of(source);
  const int to = mesh_.rank_of(reader);
  const int me = mesh_.this_rank();
  if (me == from) {
    if (!sent_.emplace(key, true).second) return nullptr;
    if (tag < 0) tag = builder_.transfer_tag(from, to);
    const NodeId send = builder_.add_async(
        mesh_.device(source).index(), fmt::format("{}.send[{}->rank {}]", name_, source, to),
        make_send(to, tag), after(ready), NodeKind::kTransfer, bytes);
    sends_[source].push_back(send);
    if (start == SendStart::kWindowed) {
      std::vector<NodeId>& window = windowed_[{to, std::get<0>(key)}];
      if (window.size() >= kSendWindow) builder_.depend(window[window.size() - kSendWindow], send);
      window.push_back(send);
    }
    return nullptr;
  }
  if (me != to) return nullptr;  // a transfer between two other ranks
  if (const auto it = staged_.find(key); it != staged_.end()) return &it->second;
  if (tag < 0) tag = builder_.transfer_tag(from, to);
  Staged staged;
  // On the first local reader's device: its node reads it first, and usually alone.
  staged.buffer = std::make_shared<DeviceBuffer>(mesh_.device(reader).allocate(bytes));
  staged.received = builder_.add_async(
      mesh_.device(reader).index(), fmt::format("{}.recv[{}<-{}]", name_, reader, source),
      [transport = mesh_.transport(), from, tag, buffer = staged.buffer](NodeDone done, RunState) {
        transport->recv(from, tag, buffer->bytes(), std::move(done));
      },
      std::span<const NodeId>{}, NodeKind::kTransfer, bytes);
  return &staged_.emplace(key, std::move(staged)).first->second;
}

SourceReads::Read SourceReads::contiguous(SourceBuffer buffer, std::int64_t reader,
                                          std::int64_t source, const void* data, NodeId ready,
                                          std::size_t offset, std::size_t bytes, SendStart start) {
  if (mesh_.rank_of(reader) == mesh_.rank_of(source) || bytes == 0) {
    if (!mesh_.is_local(reader)) return {};
    if (bytes == 0) return {nullptr, kReady};
    return {static_cast<const std::byte*>(data) + offset, ready};
  }
  const Key key{static_cast<int>(buffer), source, offset, bytes, mesh_.rank_of(reader), {}};
  const auto* src = static_cast<const std::byte*>(data) + (mesh_.is_local(source) ? offset : 0);
  if (windows_ != nullptr && bytes >= windows_->in_place_min_bytes() &&
      windows_->reads_in_place(mesh_.rank_of(reader), mesh_.rank_of(source))) {
    const Staged* staged = shared(key, reader, source, src, bytes, ready, start);
    if (staged == nullptr) return {};
    return {staged->in_place != nullptr ? staged->in_place : staged->buffer->data(),
            staged->received};
  }
  const Staged* staged = transfer(
      key, reader, source, bytes, ready,
      [&](int to, int tag) { return send_node(to, tag, src, bytes); }, -1, start);
  if (staged == nullptr) return {};
  return {staged->buffer->data(), staged->received};
}

SourceReads::BoxRead SourceReads::box(std::int64_t reader, std::int64_t source, const void* data,
                                      const std::vector<sharding::DimSlice>* slices, NodeId ready,
                                      const std::vector<sharding::DimSlice>& box, DType type) {
  const auto bytes = static_cast<std::size_t>(volume(box)) * dtype_size(type);
  if (mesh_.rank_of(reader) == mesh_.rank_of(source)) {
    if (!mesh_.is_local(reader)) return {};
    // Aliasing an empty owner: a pointer to the tensor's own layout, owning nothing.
    return {data,
            std::shared_ptr<const std::vector<sharding::DimSlice>>(std::shared_ptr<void>(), slices),
            ready};
  }
  std::vector<std::int64_t> corners;
  for (const sharding::DimSlice& d : box) {
    corners.push_back(d.offset);
    corners.push_back(d.extent);
  }
  const Key key{static_cast<int>(SourceBuffer::kInput),
                source,
                0,
                bytes,
                mesh_.rank_of(reader),
                std::move(corners)};
  const Staged* staged = transfer(key, reader, source, bytes, ready, [&](int to, int tag) {
    // The box's elements, packed on the source's device when the send starts.
    auto packed = std::make_shared<DeviceBuffer>(mesh_.device(source).allocate(bytes));
    return [transport = mesh_.transport(), to, tag, packed, data, slices, box, type](NodeDone done,
                                                                                     RunState run) {
      if (run == RunState::kStopping) {
        transport->send_run_stopped(to, tag, std::move(done));
        return;
      }
      copy_box(box, data, *slices, packed->data(), box, type);
      transport->send(to, tag, packed->bytes(), std::move(done));
    };
  });
  if (staged == nullptr) return {};
  auto& entry = staged_.at(key);
  if (!entry.slices) entry.slices = std::make_shared<const std::vector<sharding::DimSlice>>(box);
  return {entry.buffer->data(), entry.slices, entry.received};
}

std::vector<NodeId> SourceReads::sends_of(std::int64_t slot) const {
  const auto it = sends_.find(slot);
  return it == sends_.end() ? std::vector<NodeId>{} : it->second;
}

}  // namespace numesh::runtime::detail
