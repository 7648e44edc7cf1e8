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
    : builder_(builder), mesh_(mesh), name_(std::move(name)) {}

template <typename MakeSend>
const SourceReads::Staged* SourceReads::transfer(const Key& key, std::int64_t reader,
                                                 std::int64_t source, std::size_t bytes,
                                                 NodeId ready, MakeSend&& make_send) {
  const int from = mesh_.rank_of(source);
  const int to = mesh_.rank_of(reader);
  const int me = mesh_.this_rank();
  if (me == from) {
    if (!sent_.emplace(key, true).second) return nullptr;
    const int tag = builder_.transfer_tag(from, to);
    const NodeId send = builder_.add_async(
        mesh_.device(source).index(), fmt::format("{}.send[{}->rank {}]", name_, source, to),
        make_send(to, tag), after(ready), NodeKind::kTransfer, bytes);
    sends_[source].push_back(send);
    return nullptr;
  }
  if (me != to) return nullptr;  // a transfer between two other ranks
  if (const auto it = staged_.find(key); it != staged_.end()) return &it->second;
  const int tag = builder_.transfer_tag(from, to);
  Staged staged;
  // On the first local reader's device: its node reads it first, and usually alone.
  staged.buffer = std::make_shared<DeviceBuffer>(mesh_.device(reader).allocate(bytes));
  staged.received = builder_.add_async(
      mesh_.device(reader).index(), fmt::format("{}.recv[{}<-{}]", name_, reader, source),
      [transport = mesh_.transport(), from, tag, buffer = staged.buffer](NodeDone done) {
        transport->recv(from, tag, buffer->bytes(), std::move(done));
      },
      std::span<const NodeId>{}, NodeKind::kTransfer, bytes);
  return &staged_.emplace(key, std::move(staged)).first->second;
}

SourceReads::Read SourceReads::contiguous(SourceBuffer buffer, std::int64_t reader,
                                          std::int64_t source, const void* data, NodeId ready,
                                          std::size_t offset, std::size_t bytes) {
  if (mesh_.rank_of(reader) == mesh_.rank_of(source) || bytes == 0) {
    if (!mesh_.is_local(reader)) return {};
    if (bytes == 0) return {nullptr, kReady};
    return {static_cast<const std::byte*>(data) + offset, ready};
  }
  const Key key{static_cast<int>(buffer), source, offset, bytes, mesh_.rank_of(reader), {}};
  const auto* src = static_cast<const std::byte*>(data) + (mesh_.is_local(source) ? offset : 0);
  const Staged* staged = transfer(key, reader, source, bytes, ready, [&](int to, int tag) {
    return [transport = mesh_.transport(), to, tag, src, bytes](NodeDone done) {
      transport->send(to, tag, {src, bytes}, std::move(done));
    };
  });
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
    return
        [transport = mesh_.transport(), to, tag, packed, data, slices, box, type](NodeDone done) {
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
