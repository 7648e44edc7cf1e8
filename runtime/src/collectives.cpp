#include "numesh/runtime/collectives.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <utility>

#include "box_runs.hpp"
#include "copy_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_buffer.hpp"
#include "numesh/runtime/shared_windows.hpp"
#include "source_reads.hpp"

namespace numesh::runtime {

using sharding::DimSlice;

namespace {

// Elements per parallel chunk inside one device: big enough that splitting over the device's
// threads pays for the fork (a two-way fork/join in a device's arena costs about 1.6-1.9 us
// beyond the work on this machine kind: docs/benchmarks.md, Scheduling, BM_ForkJoin).
constexpr std::size_t kGrain = std::size_t{64} << 10;
// Reductions walk their inputs in blocks that stay in L1/L2 while all inputs are summed.
constexpr std::size_t kReduceBlock = 4096;

// Runs fn(begin, end) over [0, n), split across the calling device's arena threads when n is
// large. Called from node bodies, which run inside the device's arena.
template <typename Fn>
void for_range(std::size_t n, Fn&& fn) {
  if (n <= kGrain) {
    if (n > 0) fn(std::size_t{0}, n);
    return;
  }
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::size_t>(0, n, kGrain),
      [&](const oneapi::tbb::blocked_range<std::size_t>& r) { fn(r.begin(), r.end()); });
}

// Element `i` of a buffer of `type`.
std::byte* element(void* data, std::size_t i, DType type) {
  return static_cast<std::byte*>(data) + i * dtype_size(type);
}
const std::byte* element(const void* data, std::size_t i, DType type) {
  return static_cast<const std::byte*>(data) + i * dtype_size(type);
}

// dst[0, n) = src[0, n), elements of `type`.
void copy_parallel(void* dst, const void* src, std::size_t n, DType type) {
  const bool nt = detail::streams_bytes(n * dtype_size(type));
  for_range(n, [&](std::size_t b, std::size_t e) {
    detail::copy_bytes(element(dst, b, type), element(src, b, type), (e - b) * dtype_size(type),
                       nt);
  });
}

// dst[i] = op over k of inputs[k][i] (fp32), k in order, for i in [0, n).
void reduce_block(float* dst, const std::vector<const void*>& inputs, std::size_t offset,
                  std::size_t n, ReduceOp op) {
  auto input = [&](std::size_t k) { return static_cast<const float*>(inputs[k]) + offset; };
  const float* a = input(0);
  if (inputs.size() == 1) {
    detail::copy_floats(dst, a, n, false);
    return;
  }
  const float* b = input(1);
  if (op == ReduceOp::kSum) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
    for (std::size_t k = 2; k < inputs.size(); ++k) {
      const float* c = input(k);
      for (std::size_t i = 0; i < n; ++i) dst[i] += c[i];
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
    for (std::size_t k = 2; k < inputs.size(); ++k) {
      const float* c = input(k);
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], c[i]);
    }
  }
}

// How a reduction's first input and its output are stored: as elements of the collective's
// type, or as fp32 partial results. A hierarchical all-reduce carries partial results between
// ranks in fp32, so that 16-bit elements are still rounded once, after the last input, as in
// one process. For fp32 collectives both are the same.
struct Widths {
  bool first_f32 = false;
  bool dst_f32 = false;
};

// reduce_block for 16-bit elements: each input block widened to fp32 (exact), combined in fp32
// in rank order, rounded once to `type` (nearest even), or stored as fp32 with widths.dst_f32.
// The same bits whichever algorithm or chunking reaches an element, as every element is
// combined once, in the same order.
void reduce_block_16bit(void* dst, const std::vector<const void*>& inputs, std::size_t offset,
                        std::size_t n, ReduceOp op, DType type, Widths widths) {
  float acc[kReduceBlock];
  float next[kReduceBlock];
  // reduce_parallel's switch sends bf16 and f16 only.
  NUMESH_DCHECK(type == DType::kBF16 || type == DType::kF16);
  const bool bf16 = type == DType::kBF16;
  auto widen = [bf16](const void* in, std::size_t at, float* out, std::size_t len) {
    const std::span<const std::uint16_t> src(static_cast<const std::uint16_t*>(in) + at, len);
    if (bf16)
      convert_bf16_to_f32(src, {out, len});
    else
      convert_f16_to_f32(src, {out, len});
  };
  if (widths.first_f32)
    std::memcpy(acc, static_cast<const float*>(inputs[0]) + offset, n * sizeof(float));
  else
    widen(inputs[0], offset, acc, n);
  for (std::size_t k = 1; k < inputs.size(); ++k) {
    widen(inputs[k], offset, next, n);
    if (op == ReduceOp::kSum) {
      for (std::size_t i = 0; i < n; ++i) acc[i] += next[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], next[i]);
    }
  }
  if (widths.dst_f32)
    std::memcpy(dst, acc, n * sizeof(float));
  else if (bf16)
    convert_f32_to_bf16({acc, n}, {static_cast<std::uint16_t*>(dst), n});
  else
    convert_f32_to_f16({acc, n}, {static_cast<std::uint16_t*>(dst), n});
}

// dst[0, n) = op over inputs[k][offset, offset + n), elements of `type` (or fp32, as `widths`
// says).
void reduce_parallel(void* dst, const std::vector<const void*>& inputs, std::size_t offset,
                     std::size_t n, ReduceOp op, DType type, Widths widths = {}) {
  // (Block formats are refused before any node is added: collectives move element types.)
  if (!is_element_dtype(type)) return;
  const std::size_t dst_item = widths.dst_f32 ? sizeof(float) : dtype_size(type);
  for_range(n, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; i += kReduceBlock) {
      const std::size_t len = std::min(kReduceBlock, e - i);
      switch (element_type(type)) {
        case ElementType::kF32:
          reduce_block(static_cast<float*>(dst) + i, inputs, offset + i, len, op);
          break;
        case ElementType::kBF16:
        case ElementType::kF16:
          reduce_block_16bit(static_cast<std::byte*>(dst) + i * dst_item, inputs, offset + i, len,
                             op, type, widths);
          break;
      }
    }
  });
}

bool overlaps(const BufferView& a, const BufferView& b) {
  const std::byte* a_begin = element(a.data, 0, a.dtype);
  const std::byte* b_begin = element(b.data, 0, b.dtype);
  const std::byte* a_end = element(a.data, a.count, a.dtype);
  const std::byte* b_end = element(b.data, b.count, b.dtype);
  return a_begin < b_end && b_begin < a_end && a.count > 0 && b.count > 0;
}

// The frontier is empty (nothing to wait for) or has one entry per slot.
void check_frontier(std::string_view what, const DeviceMesh& mesh, const CollectiveArgs& args) {
  NUMESH_CHECK(args.after.empty() || args.after.size() == static_cast<std::size_t>(mesh.size()),
               ValueError, "{}: the frontier has {} entries, the mesh has {} slots", what,
               args.after.size(), mesh.size());
}

// Validates the per-slot views of a buffer collective and returns their common dtype.
// `in_count(s)` / `out_count(s)` give the elements slot s needs.
DType check_views(std::string_view what, const DeviceMesh& mesh, std::span<const BufferView> in,
                  std::span<const BufferView> out, const CollectiveArgs& args,
                  const std::function<std::size_t(std::int64_t)>& in_count,
                  const std::function<std::size_t(std::int64_t)>& out_count) {
  const auto slots = static_cast<std::size_t>(mesh.size());
  NUMESH_CHECK(in.size() == slots && out.size() == slots, ValueError,
               "{}: needs one input and one output view per mesh slot ({}), got {} and {}", what,
               slots, in.size(), out.size());
  check_frontier(what, mesh, args);
  // Only this rank's views point at memory: another rank's slot is known by its sizes alone.
  const std::vector<std::int64_t>& local = mesh.local_slots();
  for (const std::int64_t slot : local) {
    const auto s = static_cast<std::size_t>(slot);
    NUMESH_CHECK(in[s].count >= in_count(slot), ValueError,
                 "{}: the input of slot {} holds {} elements, needs {}", what, s, in[s].count,
                 in_count(slot));
    NUMESH_CHECK(out[s].count >= out_count(slot), ValueError,
                 "{}: the output of slot {} holds {} elements, needs {}", what, s, out[s].count,
                 out_count(slot));
    NUMESH_CHECK((in[s].data != nullptr || in_count(slot) == 0) &&
                     (out[s].data != nullptr || out_count(slot) == 0),
                 ValueError, "{}: slot {} has a null buffer", what, s);
  }
  for (const std::int64_t s_slot : local) {
    for (const std::int64_t t_slot : local) {
      const auto s = static_cast<std::size_t>(s_slot), t = static_cast<std::size_t>(t_slot);
      NUMESH_CHECK(!overlaps(out[s], in[t]), ValueError,
                   "{}: the output of slot {} overlaps the input of slot {}; collectives need "
                   "separate input and output buffers",
                   what, s, t);
      NUMESH_CHECK(s == t || !overlaps(out[s], out[t]), ValueError,
                   "{}: the outputs of slots {} and {} overlap", what, s, t);
    }
  }
  const std::int64_t first = local.empty() ? 0 : local.front();
  const DType type = local.empty() ? DType::kF32 : in[static_cast<std::size_t>(first)].dtype;
  for (const std::int64_t slot : local) {
    const auto s = static_cast<std::size_t>(slot);
    NUMESH_CHECK(in[s].dtype == type && out[s].dtype == type, ValueError,
                 "{}: slot {} has {} input and {} output views, slot {} has {} input: one dtype "
                 "per collective",
                 what, s, to_string(in[s].dtype), to_string(out[s].dtype), first, to_string(type));
  }
  NUMESH_CHECK(is_element_dtype(type), TypeError,
               "{}: {} is not an element type; collectives move f32, bf16 or f16", what,
               to_string(type));
  return type;
}

std::string prefix(const CollectiveArgs& args, std::string_view fallback) {
  return args.name.empty() ? std::string(fallback) : args.name;
}

int device_of(const DeviceMesh& mesh, std::int64_t slot) { return mesh.device(slot).index(); }

std::size_t chunk_begin(std::size_t count, std::size_t ranks, std::size_t r) {
  return count * r / ranks;
}

}  // namespace

Frontier ready_frontier(std::int64_t mesh_size) {
  return Frontier(static_cast<std::size_t>(mesh_size), kReady);
}

BufferView view(Tensor& tensor) noexcept {
  return {tensor.data(), static_cast<std::size_t>(tensor.size()), tensor.dtype()};
}

std::string_view to_string(ReduceOp op) noexcept { return op == ReduceOp::kSum ? "sum" : "max"; }

std::string_view to_string(AllReduceAlgorithm algorithm) noexcept {
  switch (algorithm) {
    case AllReduceAlgorithm::kAuto:
      return "auto";
    case AllReduceAlgorithm::kDirect:
      return "direct";
    case AllReduceAlgorithm::kReduceScatterAllGather:
      return "two-stage";
    case AllReduceAlgorithm::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

AllReduceAlgorithm parse_all_reduce_algorithm(std::string_view name) {
  for (const AllReduceAlgorithm a :
       {AllReduceAlgorithm::kAuto, AllReduceAlgorithm::kDirect,
        AllReduceAlgorithm::kReduceScatterAllGather, AllReduceAlgorithm::kHierarchical}) {
    if (name == to_string(a)) return a;
  }
  throw ValueError(fmt::format(
      "unknown all-reduce algorithm '{}' (auto, direct, two-stage or hierarchical)", name));
}

namespace {

using detail::SendStart;
using detail::SourceBuffer;
using detail::SourceReads;

// A local slot's nodes of a copying collective: what it copies into its output, and what it
// waits for.
struct CopyPlan {
  struct Piece {
    const void* src;
    std::size_t dst_offset;  // elements
    std::size_t count;       // elements
    NodeId ready = kReady;   // streamed pieces: the node their bytes are ready after
  };
  std::int64_t slot = 0;
  // Copied by one node, after `deps`.
  std::vector<Piece> pieces{};
  std::vector<NodeId> deps{};
  // Pieces of parts that cross ranks in pieces (CollectiveArgs::piece_bytes): a node each,
  // after `after` (the slot's output is free) and the piece's own bytes.
  std::vector<Piece> streamed{};
  NodeId after = kReady;
};

// A local slot's node of a reduction: the inputs it combines, in rank order (each the start of
// the part it reads), and what it waits for.
struct ReducePlan {
  std::int64_t slot = 0;
  std::vector<const void*> inputs;
  std::vector<NodeId> deps;
};

// The node slot s waits for before its buffers are used (kReady when nothing).
NodeId after_of(const CollectiveArgs& args, std::int64_t s) {
  return args.after.empty() ? kReady : args.after[static_cast<std::size_t>(s)];
}

// Adds `n` to `deps` unless it is kReady or there already.
void add_dep(std::vector<NodeId>& deps, NodeId n) {
  if (n != kReady && std::find(deps.begin(), deps.end(), n) == deps.end()) deps.push_back(n);
}

// Elements [first, second) of a buffer.
using Range = std::pair<std::size_t, std::size_t>;

// The pieces that the part [b, e) of elements of `item` bytes goes in (CollectiveArgs::
// piece_bytes): as few as hold at most args.piece_bytes each, at least one element each and at
// most kMaxPiecesPerPart, of equal sizes give or take an element; none for an empty part.
std::vector<Range> split_range(std::size_t b, std::size_t e, const CollectiveArgs& args,
                               std::size_t item) {
  const std::size_t n = e - b;
  const std::size_t per = std::max<std::size_t>(1, args.piece_bytes / item);
  const std::size_t count = std::min(kMaxPiecesPerPart, (n + per - 1) / per);
  std::vector<Range> pieces;
  for (std::size_t i = 0; i < count; ++i)
    pieces.emplace_back(b + n * i / count, b + n * (i + 1) / count);
  return pieces;
}

// Adds to `p` the part of `count` elements from element `offset` of slot `source`'s input,
// copied to element `dst_offset` of p's output, and what it waits for: in pieces (streamed,
// their sends windowed) when it crosses ranks and holds more than args.piece_bytes.
void add_input_piece(CopyPlan& p, SourceReads& reads, const DeviceMesh& mesh,
                     std::span<const BufferView> in, const CollectiveArgs& args,
                     std::int64_t source, std::size_t offset, std::size_t count,
                     std::size_t dst_offset, DType type) {
  const std::size_t item = dtype_size(type);
  const void* data = in[static_cast<std::size_t>(source)].data;
  p.after = after_of(args, p.slot);
  if (args.piece_bytes == 0 || count * item <= args.piece_bytes ||
      mesh.rank_of(source) == mesh.rank_of(p.slot)) {
    const auto read = reads.contiguous(SourceBuffer::kInput, p.slot, source, data,
                                       after_of(args, source), offset * item, count * item);
    p.pieces.push_back({read.data, dst_offset, count});
    add_dep(p.deps, read.ready);
    return;
  }
  for (const auto& [b, e] : split_range(offset, offset + count, args, item)) {
    const auto read =
        reads.contiguous(SourceBuffer::kInput, p.slot, source, data, after_of(args, source),
                         b * item, (e - b) * item, detail::SendStart::kWindowed);
    p.streamed.push_back({read.data, dst_offset + (b - offset), e - b, read.ready});
  }
}

// Makes each plan's node wait for the sends that read its slot's buffers (SourceReads::sends_of).
template <typename Plan>
void wait_for_sends(std::vector<Plan>& plans, const SourceReads& reads) {
  for (Plan& p : plans) {
    for (NodeId n : reads.sends_of(p.slot)) add_dep(p.deps, n);
  }
}

// The body of a node that copies `pieces` into `dst`.
std::function<void()> copy_body(void* dst, std::vector<CopyPlan::Piece> pieces, DType type) {
  return [dst, pieces = std::move(pieces), type] {
    for (const CopyPlan::Piece& piece : pieces)
      copy_parallel(element(dst, piece.dst_offset, type), piece.src, piece.count, type);
  };
}

// A node `name`[slot] that does nothing but wait for `deps`: the frontier entry of a slot whose
// part of a collective is several nodes.
NodeId add_join(GraphBuilder& builder, const DeviceMesh& mesh, std::int64_t slot,
                const std::string& name, const std::vector<NodeId>& deps) {
  return builder.add(
      device_of(mesh, slot), fmt::format("{}[{}]", name, slot), [] {}, deps, NodeKind::kCollective,
      0);
}

// Adds the nodes of each copy plan; entry `slot` of `next` becomes its node, or, with streamed
// pieces, the join of its nodes: `name`.k[slot] for streamed piece k and `name`.whole[slot]
// for the rest. `bytes(slot)` is what the slot's nodes move between devices.
void add_copies(GraphBuilder& builder, const DeviceMesh& mesh, std::vector<CopyPlan>& plans,
                std::span<const BufferView> out, DType type, const std::string& name,
                const std::function<std::uint64_t(std::int64_t)>& bytes, Frontier& next) {
  for (CopyPlan& p : plans) {
    void* dst = out[static_cast<std::size_t>(p.slot)].data;
    const int device = device_of(mesh, p.slot);
    NodeId& entry = next[static_cast<std::size_t>(p.slot)];
    if (p.streamed.empty()) {
      entry = builder.add(device, fmt::format("{}[{}]", name, p.slot),
                          copy_body(dst, std::move(p.pieces), type), p.deps, NodeKind::kCollective,
                          bytes(p.slot));
      continue;
    }
    std::vector<NodeId> nodes;
    std::uint64_t streamed = 0;
    for (std::size_t k = 0; k < p.streamed.size(); ++k) {
      const CopyPlan::Piece& piece = p.streamed[k];
      std::vector<NodeId> deps;
      add_dep(deps, p.after);
      add_dep(deps, piece.ready);
      const std::uint64_t moved = piece.count * dtype_size(type);
      nodes.push_back(builder.add(device, fmt::format("{}.{}[{}]", name, k, p.slot),
                                  copy_body(dst, {piece}, type), deps, NodeKind::kCollective,
                                  moved));
      streamed += moved;
    }
    // The rest also waits for the sends of the slot's input (wait_for_sends), so the join does.
    nodes.push_back(builder.add(device, fmt::format("{}.whole[{}]", name, p.slot),
                                copy_body(dst, std::move(p.pieces), type), p.deps,
                                NodeKind::kCollective, bytes(p.slot) - streamed));
    entry = add_join(builder, mesh, p.slot, name, nodes);
  }
}

// Every slot s copies the whole input of slot source_of[s] (broadcast, permute).
Frontier copy_whole(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, DType type,
                    const CollectiveArgs& args, const std::string& name,
                    const std::vector<std::int64_t>& source_of) {
  SourceReads reads(builder, mesh, name);
  std::vector<CopyPlan> plans;
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const std::int64_t from = source_of[static_cast<std::size_t>(s)];
    CopyPlan p{.slot = s};
    add_dep(p.deps, after_of(args, s));
    add_input_piece(p, reads, mesh, in, args, from, 0, count, 0, type);
    if (mesh.is_local(s)) plans.push_back(std::move(p));
  }
  wait_for_sends(plans, reads);
  Frontier next = ready_frontier(mesh.size());
  add_copies(
      builder, mesh, plans, out, type, name,
      [&](std::int64_t s) -> std::uint64_t {
        return source_of[static_cast<std::size_t>(s)] == s ? 0 : count * dtype_size(type);
      },
      next);
  return reads.finish(std::move(next));
}

// Each rank's part of a reduce-scatter stage over `group` (range_of(r) for rank r), as pieces
// in order: the whole part, unless the group spans ranks and some part holds more than
// args.piece_bytes (CollectiveArgs::piece_bytes), when every part is split (split_range; an
// empty part into none). Every rank splits alike.
template <typename RangeOf>
std::vector<std::vector<Range>> split_parts(const DeviceMesh& mesh,
                                            const std::vector<std::int64_t>& group,
                                            const CollectiveArgs& args, std::size_t item,
                                            RangeOf range_of) {
  std::vector<std::vector<Range>> parts;
  bool large = false;
  for (std::size_t r = 0; r < group.size(); ++r) {
    const Range part = range_of(r);
    parts.push_back({part});
    large = large || (part.second - part.first) * item > args.piece_bytes;
  }
  const bool spans_ranks = std::any_of(group.begin(), group.end(), [&](std::int64_t t) {
    return mesh.rank_of(t) != mesh.rank_of(group.front());
  });
  if (!spans_ranks || args.piece_bytes == 0 || !large) return parts;
  for (std::vector<Range>& pieces : parts) {
    const auto [b, e] = pieces.front();
    pieces = split_range(b, e, args, item);
  }
  return parts;
}

// Whether split_parts split the parts (into several pieces, or an empty part into none).
bool is_pipelined(const std::vector<std::vector<Range>>& parts) {
  return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.size() != 1; });
}

// The most pieces of any part.
std::size_t most_pieces(const std::vector<std::vector<Range>>& parts) {
  std::size_t most = 0;
  for (const auto& p : parts) most = std::max(most, p.size());
  return most;
}

// A node's name: `prefix`[slot], or prefix.k[slot] for piece k of a pipelined collective.
std::string piece_name(const std::string& prefix, bool pipelined, std::size_t k,
                       std::int64_t slot) {
  return pipelined ? fmt::format("{}.{}[{}]", prefix, k, slot)
                   : fmt::format("{}[{}]", prefix, slot);
}

// The reduce-scatter stage over `group`: rank r's slot reduces each piece [b, e) of parts[r]
// of every member's input, in rank order, into its output from element b - base(r) on. The
// reads of every piece are declared (pieces in order, ranks within) before any node is added,
// so that with `last_stage` an unpipelined node, its slot's frontier entry, waits for every
// send of its slot's input (pipelined, join_pieces' node does). Pieces' sends are windowed.
// Returns the nodes by rank and piece (kReady for another rank's slot).
template <typename Base>
std::vector<std::vector<NodeId>> reduce_pieces(
    GraphBuilder& builder, const DeviceMesh& mesh, SourceReads& reads,
    const std::vector<std::int64_t>& group, const std::vector<std::vector<Range>>& parts,
    std::span<const BufferView> in, std::span<const BufferView> out, const CollectiveArgs& args,
    ReduceOp op, DType type, const std::string& prefix, bool last_stage, Base base) {
  const bool pipelined = is_pipelined(parts);
  const SendStart start = pipelined ? SendStart::kWindowed : SendStart::kWhenReady;
  const std::size_t item = dtype_size(type);
  struct Piece {
    std::size_t r, k;
    ReducePlan plan;
  };
  std::vector<Piece> pieces;
  std::vector<std::vector<NodeId>> nodes(group.size());
  for (std::size_t k = 0; k < most_pieces(parts); ++k) {
    for (std::size_t r = 0; r < group.size(); ++r) {
      if (k >= parts[r].size()) continue;
      const auto [b, e] = parts[r][k];
      ReducePlan p{group[r], {}, {}};
      add_dep(p.deps, after_of(args, p.slot));
      for (std::int64_t t : group) {
        const auto read =
            reads.contiguous(SourceBuffer::kInput, p.slot, t, in[static_cast<std::size_t>(t)].data,
                             after_of(args, t), b * item, (e - b) * item, start);
        p.inputs.push_back(read.data);
        add_dep(p.deps, read.ready);
      }
      nodes[r].push_back(kReady);
      if (mesh.is_local(p.slot)) pieces.push_back({r, k, std::move(p)});
    }
  }
  for (Piece& piece : pieces) {
    const std::int64_t slot = piece.plan.slot;
    if (last_stage && !pipelined) {
      for (NodeId n : reads.sends_of(slot)) add_dep(piece.plan.deps, n);
    }
    const auto [b, e] = parts[piece.r][piece.k];
    void* dst = element(out[static_cast<std::size_t>(slot)].data, b - base(piece.r), type);
    nodes[piece.r][piece.k] = builder.add(
        device_of(mesh, slot), piece_name(prefix, pipelined, piece.k, slot),
        [dst, inputs = std::move(piece.plan.inputs), n = e - b, op, type] {
          reduce_parallel(dst, inputs, 0, n, op, type);
        },
        piece.plan.deps, NodeKind::kCollective, (group.size() - 1) * (e - b) * item);
  }
  return nodes;
}

// Ends an unpipelined collective over `group`: each local slot's frontier entry becomes its one
// node of `nodes` (by rank).
void end_with(const DeviceMesh& mesh, const std::vector<std::int64_t>& group,
              const std::vector<std::vector<NodeId>>& nodes, Frontier& next) {
  for (std::size_t r = 0; r < group.size(); ++r) {
    if (mesh.is_local(group[r])) next[static_cast<std::size_t>(group[r])] = nodes[r].front();
  }
}

// Ends a pipelined collective over `group`: each local slot's frontier entry, `name`[slot],
// waits for its reductions (rs), its other nodes (done) and the sends of its buffers.
void join_pieces(GraphBuilder& builder, const DeviceMesh& mesh, const SourceReads& reads,
                 const std::vector<std::int64_t>& group, const std::vector<std::vector<NodeId>>& rs,
                 const std::map<std::int64_t, std::vector<NodeId>>& done, const std::string& name,
                 Frontier& next) {
  for (std::size_t r = 0; r < group.size(); ++r) {
    const std::int64_t slot = group[r];
    if (!mesh.is_local(slot)) continue;
    std::vector<NodeId> deps;
    for (NodeId n : rs[r]) add_dep(deps, n);
    if (const auto it = done.find(slot); it != done.end()) {
      for (NodeId n : it->second) add_dep(deps, n);
    }
    for (NodeId n : reads.sends_of(slot)) add_dep(deps, n);
    next[static_cast<std::size_t>(slot)] = add_join(builder, mesh, slot, name, deps);
  }
}

// The fewest pieces a part of the hierarchical all-reduce goes in, where its pieces would hold
// kChainMinPieceBytes or more: on two ranks of two devices through MPI, a 16 MiB all-reduce in
// whole parts of 4 MiB ran at 0.71x (shared memory) and 0.98x (TCP) the two stages' speed, in
// pieces of 1 MiB at 0.98x and 1.23x (docs/benchmarks.md, "The hierarchical all-reduce").
constexpr std::size_t kChainPieces = 4;
constexpr std::size_t kChainMinPieceBytes = std::size_t{256} << 10;

// The members of `group` by process: runs of members of one rank, in group order. A rank holds
// consecutive slots of the mesh and a group lists its slots in increasing order, so each rank's
// members form one run.
std::vector<std::vector<std::int64_t>> rank_runs(const DeviceMesh& mesh,
                                                 const std::vector<std::int64_t>& group) {
  std::vector<std::vector<std::int64_t>> runs;
  for (const std::int64_t s : group) {
    if (runs.empty() || mesh.rank_of(runs.back().front()) != mesh.rank_of(s)) runs.emplace_back();
    runs.back().push_back(s);
  }
  return runs;
}

// Whether kAuto takes the hierarchical chain for a large all-reduce of `count` elements of
// `item` bytes over the group whose members are `runs` (by rank), in pieces of `piece_bytes`:
//  - the chunks' bytes cross by the transport between some two of its ranks (ranks that read
//    each other in place stage nothing: there the chain's longer path of reductions costs more
//    than the bytes it saves);
//  - parts go in pieces (whole, its stages cannot overlap: 0.71x the two stages measured);
//  - and the rank that sends most sends less in the chain than in the two stages. In units of
//    the buffer B on P ranks of k_r members (n in all): the two stages send from rank r its
//    members' chunks owned elsewhere, k_r (n - k_r) / n, and its own reduced chunks to every
//    other rank, k_r (P - 1) / n; the chain sends from each rank but the last its fp32 partials
//    (4 / item, or 1 when a first rank of one member sends its input), and from the last its
//    results to every other rank, P - 1. So it pays on 2 ranks of 2 devices in fp32 (1 against
//    1.5), not in 16 bits there (2 against 1.5), nor on 4 ranks of 2 devices (3 against 2.25).
bool chain_pays(const DeviceMesh& mesh, const std::vector<std::vector<std::int64_t>>& runs,
                std::size_t count, std::size_t item, std::size_t piece_bytes) {
  if (runs.size() < 2 || piece_bytes == 0) return false;
  const auto& windows = mesh.shared_windows();
  const std::size_t n =
      std::accumulate(runs.begin(), runs.end(), std::size_t{0},
                      [](std::size_t sum, const auto& run) { return sum + run.size(); });
  const bool in_place_floor =
      windows != nullptr && count / n * item < windows->in_place_min_bytes();
  bool staged = false;
  for (const auto& a : runs) {
    for (const auto& b : runs) {
      const int ra = mesh.rank_of(a.front()), rb = mesh.rank_of(b.front());
      staged =
          staged ||
          (ra != rb && (windows == nullptr || in_place_floor || !windows->reads_in_place(ra, rb)));
    }
  }
  if (!staged) return false;
  const auto ranks = static_cast<double>(runs.size());
  const auto members = static_cast<double>(n);
  double two_stages = 0, chain = ranks - 1;  // the chain's last rank
  for (std::size_t q = 0; q < runs.size(); ++q) {
    const auto k = static_cast<double>(runs[q].size());
    two_stages = std::max(two_stages, k * (members - k) / members + k * (ranks - 1) / members);
    if (q + 1 < runs.size())
      chain = std::max(chain, q == 0 && runs[0].size() == 1
                                  ? 1.0
                                  : static_cast<double>(sizeof(float)) / static_cast<double>(item));
  }
  return chain < two_stages;
}

// AllReduceAlgorithm::kHierarchical over `group`, whose members span ranks (runs: rank_runs).
// Part j (chunk j of the group's n, in pieces as split_parts splits them) is reduced on run q by
// its member j mod k_q: into fp32 partial results on every run but the last, from the previous
// run's partials and the run's inputs in order; into the output on the last run. A first run of
// one member reduces nothing: the second reads its input as the first term. Then every member
// copies each part it does not hold from the last run's holder. Each local slot's frontier entry
// is `name`[slot], after its nodes and the sends of its buffers.
void chain_all_reduce(GraphBuilder& builder, const DeviceMesh& mesh, SourceReads& reads,
                      const std::vector<std::int64_t>& group,
                      const std::vector<std::vector<std::int64_t>>& runs,
                      std::span<const BufferView> in, std::span<const BufferView> out,
                      std::size_t count, ReduceOp op, DType type, const CollectiveArgs& args,
                      const std::string& name, Frontier& next) {
  const std::size_t n = group.size(), last = runs.size() - 1;
  const std::size_t item = dtype_size(type);
  // The chain's stages run one after another for a given piece, so it needs more pieces in
  // flight than the two stages do to overlap them: each part in kChainPieces pieces or more
  // (none under kChainMinPieceBytes) where its pieces would be fewer.
  CollectiveArgs chain_args = args;
  if (args.piece_bytes != 0) {
    const std::size_t part_bytes = (count + n - 1) / n * item;
    chain_args.piece_bytes =
        std::min(args.piece_bytes, std::max(kChainMinPieceBytes, part_bytes / kChainPieces));
  }
  const auto parts = split_parts(mesh, group, chain_args, item, [&](std::size_t j) {
    return Range{chunk_begin(count, n, j), chunk_begin(count, n, j + 1)};
  });
  const bool pipelined = is_pipelined(parts);
  const SendStart start = pipelined ? SendStart::kWindowed : SendStart::kWhenReady;
  const auto holder = [&](std::size_t q, std::size_t j) { return runs[q][j % runs[q].size()]; };
  const std::size_t first = runs[0].size() == 1 ? 1 : 0;
  // Where the partial results of part j on run q lie: in an fp32 collective, in the holder's
  // output (the part's own elements, which the last run's results overwrite later); otherwise
  // in fp32 memory of the holder's own, its parts one after another.
  const bool in_output = type == DType::kF32;
  std::vector<std::vector<std::size_t>> partial_at(runs.size(), std::vector<std::size_t>(n, 0));
  std::map<std::int64_t, std::size_t> partial_count;
  for (std::size_t q = first; q < last; ++q) {
    for (std::size_t j = 0; j < n; ++j) {
      std::size_t& at = partial_count[holder(q, j)];
      partial_at[q][j] = at;
      at += parts[j].empty() ? 0 : parts[j].back().second - parts[j].front().first;
    }
  }
  std::map<std::int64_t, std::shared_ptr<DeviceBuffer>> partials;
  if (!in_output) {
    for (const auto& [slot, elements] : partial_count) {
      if (mesh.is_local(slot) && elements > 0) {
        partials[slot] = std::make_shared<DeviceBuffer>(
            mesh.device(slot).allocate(elements * sizeof(float), BufferContents::kUnspecified));
      }
    }
  }
  // Piece [b, e) of part j's partial results on run q: the buffer's first byte (null for
  // another rank's slot) and the piece's byte offset in it.
  const auto partial = [&](std::size_t q, std::size_t j, std::size_t b) {
    const std::int64_t s = holder(q, j);
    if (in_output)
      return std::pair<void*, std::size_t>{out[static_cast<std::size_t>(s)].data,
                                           b * sizeof(float)};
    const auto it = partials.find(s);
    return std::pair<void*, std::size_t>{
        it == partials.end() ? nullptr : it->second->data(),
        (partial_at[q][j] + b - parts[j].front().first) * sizeof(float)};
  };
  // nodes[q][j][k]: run q's node for piece k of part j (kReady on another rank).
  std::vector<std::vector<std::vector<NodeId>>> nodes(runs.size(),
                                                      std::vector<std::vector<NodeId>>(n));
  std::map<std::int64_t, std::vector<NodeId>> done;  // each local slot's nodes
  for (std::size_t k = 0; k < most_pieces(parts); ++k) {
    for (std::size_t q = first; q <= last; ++q) {
      for (std::size_t j = 0; j < n; ++j) {
        if (k >= parts[j].size()) continue;
        const auto [b, e] = parts[j][k];
        const std::int64_t s = holder(q, j);
        std::vector<const void*> inputs;
        std::vector<NodeId> deps;
        add_dep(deps, after_of(args, s));
        Widths widths{.first_f32 = false, .dst_f32 = q != last};
        if (q == 1 && first == 1) {
          // The first run's one member: its input is the first term.
          const std::int64_t t = runs[0][0];
          const auto read =
              reads.contiguous(SourceBuffer::kInput, s, t, in[static_cast<std::size_t>(t)].data,
                               after_of(args, t), b * item, (e - b) * item, start);
          inputs.push_back(read.data);
          add_dep(deps, read.ready);
        } else if (q > 0) {
          const auto [data, offset] = partial(q - 1, j, b);
          const auto read =
              reads.contiguous(SourceBuffer::kPartial, s, holder(q - 1, j), data,
                               nodes[q - 1][j][k], offset, (e - b) * sizeof(float), start);
          inputs.push_back(read.data);
          add_dep(deps, read.ready);
          widths.first_f32 = true;
        }
        for (const std::int64_t t : runs[q]) {
          const auto read =
              reads.contiguous(SourceBuffer::kInput, s, t, in[static_cast<std::size_t>(t)].data,
                               after_of(args, t), b * item, (e - b) * item);
          inputs.push_back(read.data);
          add_dep(deps, read.ready);
        }
        nodes[q][j].resize(parts[j].size(), kReady);
        if (!mesh.is_local(s)) continue;
        void* dst = q == last
                        ? element(out[static_cast<std::size_t>(s)].data, b, type)
                        : static_cast<std::byte*>(partial(q, j, b).first) + partial(q, j, b).second;
        // Widths matter for 16-bit elements only; fp32 partials are fp32 elements.
        if (in_output) widths = {};
        const std::uint64_t moved = (inputs.size() - 1) * (e - b) * item;
        // The node that writes into the slot's partial results holds them (and the sends and
        // reads of them come after it, in the same graph).
        std::shared_ptr<DeviceBuffer> holds;
        if (const auto it = partials.find(s); q != last && it != partials.end()) holds = it->second;
        const NodeId node = builder.add(
            device_of(mesh, s),
            piece_name(fmt::format("{}.{}", name, q == last ? "rs" : "partial"), pipelined, k, s),
            [dst, inputs = std::move(inputs), n = e - b, op, type, widths, holds] {
              static_cast<void>(holds);  // kept alive, not read
              reduce_parallel(dst, inputs, 0, n, op, type, widths);
            },
            deps, NodeKind::kCollective, moved);
        nodes[q][j][k] = node;
        done[s].push_back(node);
      }
    }
    // Every member copies the pieces k of the parts it does not hold on the last run.
    for (const std::int64_t s : group) {
      CopyPlan plan{.slot = s};
      add_dep(plan.deps, after_of(args, s));
      std::uint64_t moved = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const std::int64_t h = holder(last, j);
        if (k >= parts[j].size() || h == s) continue;
        const auto [b, e] = parts[j][k];
        const auto read =
            reads.contiguous(SourceBuffer::kOutput, s, h, out[static_cast<std::size_t>(h)].data,
                             nodes[last][j][k], b * item, (e - b) * item, start);
        plan.pieces.push_back({read.data, b, e - b});
        add_dep(plan.deps, read.ready);
        moved += (e - b) * item;
      }
      if (!mesh.is_local(s) || plan.pieces.empty()) continue;
      // The copies overwrite the slot's partial results (fp32): the last run's results come
      // after every partial was read, and the ends of the sends that read them come first too.
      if (in_output && mesh.rank_of(s) != mesh.rank_of(runs[last].front())) {
        for (const NodeId send : reads.sends_of(s)) add_dep(plan.deps, send);
      }
      const NodeId node = builder.add(
          device_of(mesh, s), piece_name(name + ".ag", pipelined, k, s),
          copy_body(out[static_cast<std::size_t>(s)].data, std::move(plan.pieces), type), plan.deps,
          NodeKind::kCollective, moved);
      done[s].push_back(node);
    }
  }
  const std::vector<std::vector<NodeId>> none(n);
  join_pieces(builder, mesh, reads, group, none, done, name, next);
}

}  // namespace

Frontier all_reduce(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, ReduceOp op,
                    const CollectiveArgs& args, AllReduceAlgorithm algorithm) {
  const auto groups = mesh.groups(args.axes);
  auto needs = [count](std::int64_t) { return count; };
  const DType type = check_views("all_reduce", mesh, in, out, args, needs, needs);
  const std::size_t item = dtype_size(type);
  const std::string name = prefix(args, "all_reduce");
  // kAuto stays kAuto above the direct algorithm's bytes: each group then chooses between the
  // two stages and the chain (chain_pays).
  if (algorithm == AllReduceAlgorithm::kAuto && count * item <= kDirectAllReduceBytes)
    algorithm = AllReduceAlgorithm::kDirect;
  SourceReads reads(builder, mesh, name);
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    const std::size_t ranks = group.size();
    const auto zero = [](std::size_t) { return std::size_t{0}; };
    if (algorithm != AllReduceAlgorithm::kDirect && ranks > 1) {
      const auto runs = rank_runs(mesh, group);
      if (runs.size() > 1 && (algorithm == AllReduceAlgorithm::kHierarchical ||
                              (algorithm == AllReduceAlgorithm::kAuto &&
                               chain_pays(mesh, runs, count, item, args.piece_bytes)))) {
        chain_all_reduce(builder, mesh, reads, group, runs, in, out, count, op, type, args, name,
                         next);
        continue;
      }
    }
    if (algorithm == AllReduceAlgorithm::kDirect || ranks == 1) {
      // Every rank reduces all of every member's input into its output.
      const std::vector<std::vector<Range>> whole(ranks, {Range{0, count}});
      end_with(mesh, group,
               reduce_pieces(builder, mesh, reads, group, whole, in, out, args, op, type, name,
                             true, zero),
               next);
      continue;
    }
    // Reduce-scatter: rank r reduces chunk r into its own output, piece by piece when the
    // group spans ranks (pipelined); then all-gather: rank r copies every other rank's reduced
    // chunk, the same pieces.
    const auto parts = split_parts(mesh, group, args, item, [&](std::size_t r) {
      return Range{chunk_begin(count, ranks, r), chunk_begin(count, ranks, r + 1)};
    });
    const bool pipelined = is_pipelined(parts);
    // Not the last stage: the all-gather's nodes wait for the sends.
    const auto rs = reduce_pieces(builder, mesh, reads, group, parts, in, out, args, op, type,
                                  name + ".rs", false, zero);
    const SendStart start = pipelined ? SendStart::kWindowed : SendStart::kWhenReady;
    struct Gather {
      std::size_t k;
      CopyPlan plan;
      std::uint64_t moved;
    };
    std::vector<Gather> gathers;
    for (std::size_t k = 0; k < most_pieces(parts); ++k) {
      for (std::size_t r = 0; r < ranks; ++r) {
        Gather g{k, CopyPlan{.slot = group[r]}, 0};
        add_dep(g.plan.deps, after_of(args, g.plan.slot));
        // Unpipelined, the one node of slot r is its frontier entry: after its own reduction.
        if (!pipelined) add_dep(g.plan.deps, rs[r][0]);
        for (std::size_t j = 0; j < ranks; ++j) {
          if (j == r || k >= parts[j].size()) continue;
          const auto [b, e] = parts[j][k];
          const std::int64_t t = group[j];
          const auto read = reads.contiguous(SourceBuffer::kOutput, g.plan.slot, t,
                                             out[static_cast<std::size_t>(t)].data, rs[j][k],
                                             b * item, (e - b) * item, start);
          g.plan.pieces.push_back({read.data, b, e - b});
          add_dep(g.plan.deps, read.ready);
          g.moved += (e - b) * item;
        }
        if (mesh.is_local(g.plan.slot) && (!pipelined || !g.plan.pieces.empty()))
          gathers.push_back(std::move(g));
      }
    }
    std::map<std::int64_t, std::vector<NodeId>> done;  // pipelined: each local slot's nodes
    for (Gather& g : gathers) {
      const std::int64_t slot = g.plan.slot;
      if (!pipelined) {
        for (NodeId n : reads.sends_of(slot)) add_dep(g.plan.deps, n);
      }
      void* dst = out[static_cast<std::size_t>(slot)].data;
      const NodeId node =
          builder.add(device_of(mesh, slot), piece_name(name + ".ag", pipelined, g.k, slot),
                      copy_body(dst, std::move(g.plan.pieces), type), g.plan.deps,
                      NodeKind::kCollective, g.moved);
      if (pipelined)
        done[slot].push_back(node);
      else
        next[static_cast<std::size_t>(slot)] = node;
    }
    if (pipelined) join_pieces(builder, mesh, reads, group, rs, done, name, next);
  }
  return reads.finish(std::move(next));
}

Frontier all_gather(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count,
                    const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const std::size_t ranks = groups.empty() ? 1 : groups.front().size();
  const DType type = check_views(
      "all_gather", mesh, in, out, args, [count](std::int64_t) { return count; },
      [count, ranks](std::int64_t) { return count * ranks; });
  const std::size_t item = dtype_size(type);
  const std::string name = prefix(args, "all_gather");
  SourceReads reads(builder, mesh, name);
  std::vector<CopyPlan> plans;
  for (const auto& group : groups) {
    for (std::int64_t s : group) {
      CopyPlan p{.slot = s};
      add_dep(p.deps, after_of(args, s));
      for (std::size_t j = 0; j < group.size(); ++j) {
        add_input_piece(p, reads, mesh, in, args, group[j], 0, count, j * count, type);
      }
      if (mesh.is_local(s)) plans.push_back(std::move(p));
    }
  }
  wait_for_sends(plans, reads);
  Frontier next = ready_frontier(mesh.size());
  add_copies(
      builder, mesh, plans, out, type, name,
      [&](std::int64_t) { return (ranks - 1) * count * item; }, next);
  return reads.finish(std::move(next));
}

Frontier reduce_scatter(GraphBuilder& builder, const DeviceMesh& mesh,
                        std::span<const BufferView> in, std::span<const BufferView> out,
                        std::size_t count, ReduceOp op, const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const std::size_t ranks = groups.empty() ? 1 : groups.front().size();
  NUMESH_CHECK(count % ranks == 0, ValueError,
               "reduce_scatter: {} elements do not split evenly over groups of {} devices", count,
               ranks);
  const std::size_t chunk = count / ranks;
  const DType type = check_views(
      "reduce_scatter", mesh, in, out, args, [count](std::int64_t) { return count; },
      [chunk](std::int64_t) { return chunk; });
  const std::size_t item = dtype_size(type);
  const std::string name = prefix(args, "reduce_scatter");
  SourceReads reads(builder, mesh, name);
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    const auto parts = split_parts(mesh, group, args, item, [chunk](std::size_t r) {
      return Range{r * chunk, (r + 1) * chunk};
    });
    const auto rs = reduce_pieces(builder, mesh, reads, group, parts, in, out, args, op, type, name,
                                  true, [chunk](std::size_t r) { return r * chunk; });
    if (is_pipelined(parts))
      join_pieces(builder, mesh, reads, group, rs, {}, name, next);
    else
      end_with(mesh, group, rs, next);
  }
  return reads.finish(std::move(next));
}

Frontier all_to_all(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out,
                    const std::vector<std::vector<std::size_t>>& send_counts,
                    const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const std::size_t ranks = groups.empty() ? 1 : groups.front().size();
  NUMESH_CHECK(send_counts.size() == ranks, ValueError,
               "all_to_all: send_counts has {} rows, the groups have {} devices",
               send_counts.size(), ranks);
  for (std::size_t i = 0; i < ranks; ++i) {
    NUMESH_CHECK(send_counts[i].size() == ranks, ValueError,
                 "all_to_all: row {} of send_counts has {} entries, the groups have {} devices", i,
                 send_counts[i].size(), ranks);
  }
  // Per rank: where its sends start in its input, where its receives start in its output.
  std::vector<std::vector<std::size_t>> send_offset(ranks, std::vector<std::size_t>(ranks, 0));
  std::vector<std::vector<std::size_t>> recv_offset(ranks, std::vector<std::size_t>(ranks, 0));
  std::vector<std::size_t> send_total(ranks, 0), recv_total(ranks, 0);
  for (std::size_t i = 0; i < ranks; ++i) {
    for (std::size_t j = 0; j < ranks; ++j) {
      send_offset[i][j] = send_total[i];
      send_total[i] += send_counts[i][j];
      recv_offset[j][i] = recv_total[j];
      recv_total[j] += send_counts[i][j];
    }
  }
  std::vector<std::size_t> rank_of(static_cast<std::size_t>(mesh.size()), 0);
  for (const auto& group : groups) {
    for (std::size_t r = 0; r < group.size(); ++r) rank_of[static_cast<std::size_t>(group[r])] = r;
  }
  const DType type = check_views(
      "all_to_all", mesh, in, out, args,
      [&](std::int64_t s) { return send_total[rank_of[static_cast<std::size_t>(s)]]; },
      [&](std::int64_t s) { return recv_total[rank_of[static_cast<std::size_t>(s)]]; });
  const std::size_t item = dtype_size(type);
  const std::string name = prefix(args, "all_to_all");
  SourceReads reads(builder, mesh, name);
  std::vector<CopyPlan> plans;
  for (const auto& group : groups) {
    for (std::size_t j = 0; j < ranks; ++j) {
      CopyPlan p{.slot = group[j]};
      add_dep(p.deps, after_of(args, p.slot));
      for (std::size_t i = 0; i < ranks; ++i) {
        add_input_piece(p, reads, mesh, in, args, group[i], send_offset[i][j], send_counts[i][j],
                        recv_offset[j][i], type);
      }
      if (mesh.is_local(p.slot)) plans.push_back(std::move(p));
    }
  }
  wait_for_sends(plans, reads);
  Frontier next = ready_frontier(mesh.size());
  add_copies(
      builder, mesh, plans, out, type, name,
      [&](std::int64_t s) {
        const std::size_t j = rank_of[static_cast<std::size_t>(s)];
        std::uint64_t remote = 0;
        for (std::size_t i = 0; i < ranks; ++i) {
          if (i != j) remote += send_counts[i][j] * item;
        }
        return remote;
      },
      next);
  return reads.finish(std::move(next));
}

Frontier broadcast(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                   std::span<const BufferView> out, std::size_t count, std::int64_t root,
                   const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const auto ranks = static_cast<std::int64_t>(groups.empty() ? 1 : groups.front().size());
  NUMESH_CHECK(root >= 0 && root < ranks, ValueError,
               "broadcast: root rank {} is outside the groups of {} devices", root, ranks);
  const DType type = check_views(
      "broadcast", mesh, in, out, args, [count](std::int64_t) { return count; },
      [count](std::int64_t) { return count; });
  std::vector<std::int64_t> source_of(static_cast<std::size_t>(mesh.size()), 0);
  for (const auto& group : groups) {
    for (std::int64_t s : group) {
      source_of[static_cast<std::size_t>(s)] = group[static_cast<std::size_t>(root)];
    }
  }
  return copy_whole(builder, mesh, in, out, count, type, args, prefix(args, "broadcast"),
                    source_of);
}

Frontier permute(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                 std::span<const BufferView> out, std::size_t count, std::int64_t shift,
                 const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const DType type = check_views(
      "permute", mesh, in, out, args, [count](std::int64_t) { return count; },
      [count](std::int64_t) { return count; });
  std::vector<std::int64_t> source_of(static_cast<std::size_t>(mesh.size()), 0);
  for (const auto& group : groups) {
    const auto ranks = static_cast<std::int64_t>(group.size());
    for (std::int64_t r = 0; r < ranks; ++r) {
      source_of[static_cast<std::size_t>(group[static_cast<std::size_t>(r)])] =
          group[static_cast<std::size_t>(((r - shift) % ranks + ranks) % ranks)];
    }
  }
  return copy_whole(builder, mesh, in, out, count, type, args, prefix(args, "permute"), source_of);
}

// ---- Sharded tensors ------------------------------------------------------------------------

namespace {

using detail::volume;

void check_same_mesh(std::string_view what, const ShardedTensor& in, const ShardedTensor& out,
                     const CollectiveArgs& args) {
  NUMESH_CHECK(&in != &out, ValueError,
               "{}: input and output are the same tensor; collectives need separate ones", what);
  NUMESH_CHECK(is_element_dtype(in.dtype()) && is_element_dtype(out.dtype()), TypeError,
               "{}: {} to {}: collectives move element types (f32, bf16, f16), not blocks", what,
               to_string(in.dtype()), to_string(out.dtype()));
  check_frontier(what, out.mesh(), args);
  NUMESH_CHECK(
      in.mesh().mesh() == out.mesh().mesh() && in.mesh().device_set() == out.mesh().device_set(),
      ValueError, "{}: input and output live on different meshes ({} and {})", what,
      in.mesh().to_string(), out.mesh().to_string());
  NUMESH_CHECK(in.shape() == out.shape(), ShapeError,
               "{}: input shape ({}) differs from output shape ({})", what,
               fmt::join(in.shape(), ", "), fmt::join(out.shape(), ", "));
  NUMESH_CHECK(in.dtype() == out.dtype(), ValueError,
               "{}: input is {} and output is {}; collectives keep the dtype", what,
               to_string(in.dtype()), to_string(out.dtype()));
}

// One view per slot; another rank's shard is known by its size alone.
std::vector<BufferView> shard_views(ShardedTensor& t) {
  std::vector<BufferView> views;
  for (std::int64_t s = 0; s < t.mesh().size(); ++s) {
    views.push_back(t.has_shard(s)
                        ? view(t.shard(s))
                        : BufferView{nullptr,
                                     static_cast<std::size_t>(t.layout().elements_per_device()),
                                     t.dtype()});
  }
  return views;
}

// The first element of slot s's shard, or nullptr when another rank holds it.
const void* shard_data(const ShardedTensor& t, std::int64_t s) {
  return t.has_shard(s) ? t.shard(s).data() : nullptr;
}

}  // namespace

Frontier all_reduce(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out, ReduceOp op,
                    const CollectiveArgs& args, AllReduceAlgorithm algorithm) {
  check_same_mesh("all_reduce", in, out, args);
  // Same layout, not the same spec text: P('ep',) and P('ep', None) place data identically.
  bool same_layout = in.shape() == out.shape();
  for (std::int64_t s = 0; same_layout && s < in.mesh().size(); ++s) {
    same_layout = in.layout().device(s).slices == out.layout().device(s).slices;
  }
  NUMESH_CHECK(same_layout, ShapeError, "all_reduce: input spec {} differs from output spec {}",
               in.spec().repr(), out.spec().repr());
  const auto in_views = shard_views(in);
  const auto out_views = shard_views(out);
  return all_reduce(builder, in.mesh(), in_views, out_views,
                    static_cast<std::size_t>(in.layout().elements_per_device()), op, args,
                    algorithm);
}

Frontier redistribute(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out,
                      const CollectiveArgs& args) {
  check_same_mesh("redistribute", in, out, args);
  const DeviceMesh& mesh = out.mesh();
  const auto groups = mesh.groups(args.axes);
  const std::string name = prefix(args, "redistribute");
  const DType type = in.dtype();
  SourceReads reads(builder, mesh, name);
  // A local slot's node: the boxes it copies, from where.
  struct Copy {
    std::vector<DimSlice> box;
    SourceReads::BoxRead read;
  };
  struct Plan {
    std::int64_t slot;
    std::vector<Copy> copies;
    std::vector<NodeId> deps;
    std::uint64_t remote;
  };
  std::vector<Plan> plans;
  struct Part {
    std::vector<DimSlice> box;
    std::int64_t from;
  };
  for (const auto& group : groups) {
    for (std::int64_t s : group) {
      const auto& dst_slices = out.layout().device(s).slices;
      // Sources in preference order: the slot itself (a local slice), then the group in rank
      // order. Sources' slices are equal or disjoint (block layouts), so a part already taken
      // from an equal slice is skipped.
      std::vector<std::int64_t> order{s};
      for (std::int64_t t : group) {
        if (t != s) order.push_back(t);
      }
      std::vector<Part> parts;
      std::vector<std::vector<DimSlice>> used;
      std::int64_t covered = 0;
      for (std::int64_t t : order) {
        const auto& src_slices = in.layout().device(t).slices;
        if (std::find(used.begin(), used.end(), src_slices) != used.end()) continue;
        auto box = intersect_boxes(src_slices, dst_slices);
        if (!box) continue;
        used.push_back(src_slices);
        covered += volume(*box);
        parts.push_back({std::move(*box), t});
      }
      NUMESH_CHECK(covered == volume(dst_slices), ShapeError,
                   "redistribute {} -> {} over ({}): part of slot {}'s output is held by no "
                   "device of its group",
                   in.spec().repr(), out.spec().repr(), fmt::join(args.axes, ", "), s);
      // Pointers and slices are bound now: shards never move once allocated.
      Plan plan{s, {}, {}, 0};
      add_dep(plan.deps, after_of(args, s));
      for (Part& p : parts) {
        if (p.from != s)
          plan.remote += static_cast<std::uint64_t>(volume(p.box)) * dtype_size(type);
        auto read = reads.box(s, p.from, shard_data(in, p.from), &in.layout().device(p.from).slices,
                              after_of(args, p.from), p.box, type);
        add_dep(plan.deps, read.ready);
        plan.copies.push_back({std::move(p.box), std::move(read)});
      }
      if (mesh.is_local(s)) plans.push_back(std::move(plan));
    }
  }
  wait_for_sends(plans, reads);
  Frontier next = ready_frontier(mesh.size());
  for (Plan& p : plans) {
    void* dst = out.shard(p.slot).data();
    const std::vector<DimSlice>* dst_layout = &out.layout().device(p.slot).slices;
    next[static_cast<std::size_t>(p.slot)] = builder.add(
        device_of(mesh, p.slot), fmt::format("{}[{}]", name, p.slot),
        [copies = std::move(p.copies), dst, dst_layout, type] {
          for (const Copy& c : copies)
            copy_box(c.box, c.read.data, *c.read.slices, dst, *dst_layout, type);
        },
        p.deps, NodeKind::kCollective, p.remote);
  }
  return reads.finish(std::move(next));
}

Frontier reduce_scatter(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out, ReduceOp op,
                        const CollectiveArgs& args) {
  check_same_mesh("reduce_scatter", in, out, args);
  const DeviceMesh& mesh = out.mesh();
  const auto groups = mesh.groups(args.axes);
  const std::string name = prefix(args, "reduce_scatter");
  const DType type = in.dtype();
  SourceReads reads(builder, mesh, name);
  struct Plan {
    std::int64_t slot;
    // Each member's part, in rank order.
    std::vector<SourceReads::BoxRead> sources;
    std::vector<NodeId> deps;
    std::uint64_t remote;
  };
  std::vector<Plan> plans;
  for (const auto& group : groups) {
    for (std::int64_t s : group) {
      const auto& dst_slices = out.layout().device(s).slices;
      Plan plan{s, {}, {}, 0};
      add_dep(plan.deps, after_of(args, s));
      for (std::int64_t t : group) {
        const auto& src_slices = in.layout().device(t).slices;
        const auto box = intersect_boxes(src_slices, dst_slices);
        NUMESH_CHECK(box && *box == dst_slices, ShapeError,
                     "reduce_scatter {} -> {} over ({}): the input shard of slot {} does not "
                     "cover the output shard of slot {}",
                     in.spec().repr(), out.spec().repr(), fmt::join(args.axes, ", "), t, s);
        auto read =
            reads.box(s, t, shard_data(in, t), &src_slices, after_of(args, t), dst_slices, type);
        add_dep(plan.deps, read.ready);
        plan.sources.push_back(std::move(read));
      }
      plan.remote =
          (group.size() - 1) * static_cast<std::uint64_t>(volume(dst_slices)) * dtype_size(type);
      if (mesh.is_local(s)) plans.push_back(std::move(plan));
    }
  }
  wait_for_sends(plans, reads);
  Frontier next = ready_frontier(mesh.size());
  for (Plan& p : plans) {
    const auto& dst_slices = out.layout().device(p.slot).slices;
    void* dst_data = out.shard(p.slot).data();
    const std::vector<DimSlice>* dst_layout = &dst_slices;
    // 16-bit: fp32 buffers for the sum and one source, made once with the graph (not per run).
    const auto widened = type == DType::kF32
                             ? nullptr
                             : std::make_shared<std::vector<float>>(
                                   2 * static_cast<std::size_t>(volume(dst_slices)));
    next[static_cast<std::size_t>(p.slot)] = builder.add(
        device_of(mesh, p.slot), fmt::format("{}[{}]", name, p.slot),
        [sources = std::move(p.sources), dst_data, dst_layout, op, type, widened] {
          const auto& box = *dst_layout;
          if (type != DType::kF32) {
            // 16-bit: each source widened to fp32 (exact), combined in fp32 in rank order,
            // rounded once into the output.
            const auto n = static_cast<std::size_t>(volume(box));
            const std::span<float> acc(widened->data(), n), part(widened->data() + n, n);
            copy_box(box, sources[0].data, type, *sources[0].slices, acc.data(), DType::kF32, box);
            for (std::size_t k = 1; k < sources.size(); ++k) {
              copy_box(box, sources[k].data, type, *sources[k].slices, part.data(), DType::kF32,
                       box);
              for (std::size_t i = 0; i < n; ++i) {
                acc[i] = op == ReduceOp::kSum ? acc[i] + part[i] : std::max(acc[i], part[i]);
              }
            }
            copy_box(box, acc.data(), DType::kF32, box, dst_data, type, box);
            return;
          }
          auto* dst = static_cast<float*>(dst_data);
          copy_box(box, static_cast<const float*>(sources[0].data), *sources[0].slices, dst, box);
          for (std::size_t k = 1; k < sources.size(); ++k) {
            const auto* src = static_cast<const float*>(sources[k].data);
            detail::for_each_run(box, *sources[k].slices, box,
                                 [src, dst, op](std::int64_t a, std::int64_t b, std::int64_t n) {
                                   float* d = dst + b;
                                   const float* x = src + a;
                                   if (op == ReduceOp::kSum) {
                                     for (std::int64_t i = 0; i < n; ++i) d[i] += x[i];
                                   } else {
                                     for (std::int64_t i = 0; i < n; ++i)
                                       d[i] = std::max(d[i], x[i]);
                                   }
                                 });
          }
        },
        p.deps, NodeKind::kCollective, p.remote);
  }
  return reads.finish(std::move(next));
}

}  // namespace numesh::runtime
