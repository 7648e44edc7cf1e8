#include "numesh/runtime/collectives.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "box_runs.hpp"
#include "copy_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

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
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, n, kGrain),
                            [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                              fn(r.begin(), r.end());
                            });
}

void copy_parallel(float* dst, const float* src, std::size_t n) {
  const bool nt = detail::streams(n);
  for_range(n, [&](std::size_t b, std::size_t e) { detail::copy_floats(dst + b, src + b, e - b, nt); });
}

// dst[i] = op over k of inputs[k][i], k in order, for i in [0, n).
void reduce_block(float* dst, const std::vector<const float*>& inputs, std::size_t offset,
                  std::size_t n, ReduceOp op) {
  const float* a = inputs[0] + offset;
  if (inputs.size() == 1) {
    detail::copy_floats(dst, a, n, false);
    return;
  }
  const float* b = inputs[1] + offset;
  if (op == ReduceOp::kSum) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
    for (std::size_t k = 2; k < inputs.size(); ++k) {
      const float* c = inputs[k] + offset;
      for (std::size_t i = 0; i < n; ++i) dst[i] += c[i];
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
    for (std::size_t k = 2; k < inputs.size(); ++k) {
      const float* c = inputs[k] + offset;
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], c[i]);
    }
  }
}

// dst[0, n) = op over inputs[k][offset, offset + n).
void reduce_parallel(float* dst, const std::vector<const float*>& inputs, std::size_t offset,
                     std::size_t n, ReduceOp op) {
  for_range(n, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; i += kReduceBlock) {
      const std::size_t len = std::min(kReduceBlock, e - i);
      reduce_block(dst + i, inputs, offset + i, len, op);
    }
  });
}

bool overlaps(const BufferView& a, const BufferView& b) {
  const float* a_end = a.data + a.count;
  const float* b_end = b.data + b.count;
  return a.data < b_end && b.data < a_end && a.count > 0 && b.count > 0;
}

// The frontier is empty (nothing to wait for) or has one entry per slot.
void check_frontier(std::string_view what, const DeviceMesh& mesh, const CollectiveArgs& args) {
  NUMESH_CHECK(args.after.empty() || args.after.size() == static_cast<std::size_t>(mesh.size()),
               ValueError, "{}: the frontier has {} entries, the mesh has {} slots", what,
               args.after.size(), mesh.size());
}

// Validates the per-slot views of a buffer collective. `in_count(s)` / `out_count(s)` give the
// elements slot s needs.
void check_views(std::string_view what, const DeviceMesh& mesh, std::span<const BufferView> in,
                 std::span<const BufferView> out, const CollectiveArgs& args,
                 const std::function<std::size_t(std::int64_t)>& in_count,
                 const std::function<std::size_t(std::int64_t)>& out_count) {
  const auto slots = static_cast<std::size_t>(mesh.size());
  NUMESH_CHECK(in.size() == slots && out.size() == slots, ValueError,
               "{}: needs one input and one output view per mesh slot ({}), got {} and {}", what,
               slots, in.size(), out.size());
  check_frontier(what, mesh, args);
  for (std::size_t s = 0; s < slots; ++s) {
    const auto slot = static_cast<std::int64_t>(s);
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
  for (std::size_t s = 0; s < slots; ++s) {
    for (std::size_t t = 0; t < slots; ++t) {
      NUMESH_CHECK(!overlaps(out[s], in[t]), ValueError,
                   "{}: the output of slot {} overlaps the input of slot {}; collectives need "
                   "separate input and output buffers",
                   what, s, t);
      NUMESH_CHECK(s == t || !overlaps(out[s], out[t]), ValueError,
                   "{}: the outputs of slots {} and {} overlap", what, s, t);
    }
  }
}

// Collects the frontier nodes of `slots` (skipping kReady), without duplicates.
std::vector<NodeId> deps_of(const Frontier& after, std::span<const std::int64_t> slots) {
  std::vector<NodeId> deps;
  if (after.empty()) return deps;
  for (std::int64_t s : slots) {
    const NodeId n = after[static_cast<std::size_t>(s)];
    if (n != kReady && std::find(deps.begin(), deps.end(), n) == deps.end()) deps.push_back(n);
  }
  return deps;
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
  auto values = tensor.values();
  return {values.data(), values.size()};
}

std::string_view to_string(ReduceOp op) noexcept { return op == ReduceOp::kSum ? "sum" : "max"; }

Frontier all_reduce(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, ReduceOp op,
                    const CollectiveArgs& args, AllReduceAlgorithm algorithm) {
  const auto groups = mesh.groups(args.axes);
  auto needs = [count](std::int64_t) { return count; };
  check_views("all_reduce", mesh, in, out, args, needs, needs);
  const std::string name = prefix(args, "all_reduce");
  if (algorithm == AllReduceAlgorithm::kAuto) {
    algorithm = count * sizeof(float) <= kDirectAllReduceBytes
                    ? AllReduceAlgorithm::kDirect
                    : AllReduceAlgorithm::kReduceScatterAllGather;
  }
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    std::vector<const float*> inputs;
    for (std::int64_t s : group) inputs.push_back(in[static_cast<std::size_t>(s)].data);
    const std::vector<NodeId> deps = deps_of(args.after, group);
    const std::size_t ranks = group.size();
    if (algorithm == AllReduceAlgorithm::kDirect || ranks == 1) {
      for (std::int64_t s : group) {
        float* dst = out[static_cast<std::size_t>(s)].data;
        next[static_cast<std::size_t>(s)] = builder.add(
            device_of(mesh, s), fmt::format("{}[{}]", name, s),
            [dst, inputs, count, op] { reduce_parallel(dst, inputs, 0, count, op); }, deps,
            NodeKind::kCollective, (ranks - 1) * count * sizeof(float));
      }
      continue;
    }
    // Reduce-scatter: rank r reduces chunk r into its own output.
    std::vector<NodeId> rs;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::int64_t s = group[r];
      const std::size_t b = chunk_begin(count, ranks, r), e = chunk_begin(count, ranks, r + 1);
      float* dst = out[static_cast<std::size_t>(s)].data;
      rs.push_back(builder.add(
          device_of(mesh, s), fmt::format("{}.rs[{}]", name, s),
          [dst, inputs, b, e, op] { reduce_parallel(dst + b, inputs, b, e - b, op); }, deps,
          NodeKind::kCollective, (ranks - 1) * (e - b) * sizeof(float)));
    }
    // All-gather: rank r copies every other rank's reduced chunk.
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::int64_t s = group[r];
      std::vector<const float*> reduced;
      for (std::int64_t t : group) reduced.push_back(out[static_cast<std::size_t>(t)].data);
      float* dst = out[static_cast<std::size_t>(s)].data;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}.ag[{}]", name, s),
          [dst, reduced, r, ranks, count] {
            for (std::size_t j = 0; j < ranks; ++j) {
              if (j == r) continue;
              const std::size_t b = chunk_begin(count, ranks, j);
              copy_parallel(dst + b, reduced[j] + b, chunk_begin(count, ranks, j + 1) - b);
            }
          },
          rs, NodeKind::kCollective, (count - (chunk_begin(count, ranks, r + 1) - chunk_begin(count, ranks, r))) * sizeof(float));
    }
  }
  return next;
}

Frontier all_gather(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const std::size_t ranks = groups.empty() ? 1 : groups.front().size();
  check_views("all_gather", mesh, in, out, args, [count](std::int64_t) { return count; },
              [count, ranks](std::int64_t) { return count * ranks; });
  const std::string name = prefix(args, "all_gather");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    std::vector<const float*> inputs;
    for (std::int64_t s : group) inputs.push_back(in[static_cast<std::size_t>(s)].data);
    const std::vector<NodeId> deps = deps_of(args.after, group);
    for (std::int64_t s : group) {
      float* dst = out[static_cast<std::size_t>(s)].data;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [dst, inputs, count] {
            for (std::size_t j = 0; j < inputs.size(); ++j) {
              copy_parallel(dst + j * count, inputs[j], count);
            }
          },
          deps, NodeKind::kCollective, (ranks - 1) * count * sizeof(float));
    }
  }
  return next;
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
  check_views("reduce_scatter", mesh, in, out, args, [count](std::int64_t) { return count; },
              [chunk](std::int64_t) { return chunk; });
  const std::string name = prefix(args, "reduce_scatter");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    std::vector<const float*> inputs;
    for (std::int64_t s : group) inputs.push_back(in[static_cast<std::size_t>(s)].data);
    const std::vector<NodeId> deps = deps_of(args.after, group);
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::int64_t s = group[r];
      float* dst = out[static_cast<std::size_t>(s)].data;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [dst, inputs, r, chunk, op] { reduce_parallel(dst, inputs, r * chunk, chunk, op); },
          deps, NodeKind::kCollective, (ranks - 1) * chunk * sizeof(float));
    }
  }
  return next;
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
  check_views("all_to_all", mesh, in, out, args,
              [&](std::int64_t s) { return send_total[rank_of[static_cast<std::size_t>(s)]]; },
              [&](std::int64_t s) { return recv_total[rank_of[static_cast<std::size_t>(s)]]; });
  const std::string name = prefix(args, "all_to_all");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    std::vector<const float*> inputs;
    for (std::int64_t s : group) inputs.push_back(in[static_cast<std::size_t>(s)].data);
    const std::vector<NodeId> deps = deps_of(args.after, group);
    for (std::size_t j = 0; j < ranks; ++j) {
      const std::int64_t s = group[j];
      float* dst = out[static_cast<std::size_t>(s)].data;
      // (source pointer, destination offset, count) per sender, in sender order.
      struct Piece {
        const float* src;
        std::size_t dst_offset;
        std::size_t count;
      };
      std::vector<Piece> pieces;
      std::uint64_t remote = 0;
      for (std::size_t i = 0; i < ranks; ++i) {
        pieces.push_back({inputs[i] + send_offset[i][j], recv_offset[j][i], send_counts[i][j]});
        if (i != j) remote += send_counts[i][j] * sizeof(float);
      }
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [dst, pieces] {
            for (const Piece& p : pieces) copy_parallel(dst + p.dst_offset, p.src, p.count);
          },
          deps, NodeKind::kCollective, remote);
    }
  }
  return next;
}

Frontier broadcast(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                   std::span<const BufferView> out, std::size_t count, std::int64_t root,
                   const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  const auto ranks = static_cast<std::int64_t>(groups.empty() ? 1 : groups.front().size());
  NUMESH_CHECK(root >= 0 && root < ranks, ValueError,
               "broadcast: root rank {} is outside the groups of {} devices", root, ranks);
  check_views("broadcast", mesh, in, out, args, [count](std::int64_t) { return count; },
              [count](std::int64_t) { return count; });
  const std::string name = prefix(args, "broadcast");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    const std::int64_t root_slot = group[static_cast<std::size_t>(root)];
    const float* src = in[static_cast<std::size_t>(root_slot)].data;
    for (std::int64_t s : group) {
      const std::int64_t reads[] = {root_slot, s};
      float* dst = out[static_cast<std::size_t>(s)].data;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [dst, src, count] { copy_parallel(dst, src, count); }, deps_of(args.after, reads),
          NodeKind::kCollective, s == root_slot ? 0 : count * sizeof(float));
    }
  }
  return next;
}

Frontier permute(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                 std::span<const BufferView> out, std::size_t count, std::int64_t shift,
                 const CollectiveArgs& args) {
  const auto groups = mesh.groups(args.axes);
  check_views("permute", mesh, in, out, args, [count](std::int64_t) { return count; },
              [count](std::int64_t) { return count; });
  const std::string name = prefix(args, "permute");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    const auto ranks = static_cast<std::int64_t>(group.size());
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::int64_t s = group[static_cast<std::size_t>(r)];
      const std::int64_t from = group[static_cast<std::size_t>(((r - shift) % ranks + ranks) % ranks)];
      const std::int64_t reads[] = {from, s};
      const float* src = in[static_cast<std::size_t>(from)].data;
      float* dst = out[static_cast<std::size_t>(s)].data;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [dst, src, count] { copy_parallel(dst, src, count); }, deps_of(args.after, reads),
          NodeKind::kCollective, from == s ? 0 : count * sizeof(float));
    }
  }
  return next;
}

// ---- Sharded tensors ------------------------------------------------------------------------

namespace {

using detail::volume;

void check_same_mesh(std::string_view what, const ShardedTensor& in, const ShardedTensor& out,
                     const CollectiveArgs& args) {
  NUMESH_CHECK(&in != &out, ValueError,
               "{}: input and output are the same tensor; collectives need separate ones", what);
  check_frontier(what, out.mesh(), args);
  NUMESH_CHECK(in.mesh().mesh() == out.mesh().mesh() &&
                   in.mesh().device_set() == out.mesh().device_set(),
               ValueError, "{}: input and output live on different meshes ({} and {})", what,
               in.mesh().to_string(), out.mesh().to_string());
  NUMESH_CHECK(in.shape() == out.shape(), ShapeError,
               "{}: input shape ({}) differs from output shape ({})", what,
               fmt::join(in.shape(), ", "), fmt::join(out.shape(), ", "));
}

std::vector<BufferView> shard_views(ShardedTensor& t) {
  std::vector<BufferView> views;
  for (std::int64_t s = 0; s < t.mesh().size(); ++s) views.push_back(view(t.shard(s)));
  return views;
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
  NUMESH_CHECK(same_layout, ShapeError,
               "all_reduce: input spec {} differs from output spec {}", in.spec().repr(),
               out.spec().repr());
  const auto in_views = shard_views(in);
  const auto out_views = shard_views(out);
  return all_reduce(builder, in.mesh(), in_views, out_views,
                    static_cast<std::size_t>(in.layout().elements_per_device()), op, args, algorithm);
}

Frontier redistribute(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out,
                      const CollectiveArgs& args) {
  check_same_mesh("redistribute", in, out, args);
  const DeviceMesh& mesh = out.mesh();
  const auto groups = mesh.groups(args.axes);
  const std::string name = prefix(args, "redistribute");
  Frontier next = ready_frontier(mesh.size());
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
      std::vector<std::int64_t> reads{s};
      std::uint64_t remote = 0;
      for (const Part& p : parts) {
        reads.push_back(p.from);
        if (p.from != s) remote += static_cast<std::uint64_t>(volume(p.box)) * sizeof(float);
      }
      // Pointers and slices are bound now: shards never move once allocated.
      struct Copy {
        std::vector<DimSlice> box;
        const float* src;
        const std::vector<DimSlice>* src_slices;
      };
      std::vector<Copy> copies;
      for (Part& p : parts) {
        copies.push_back({std::move(p.box), in.shard(p.from).values().data(),
                          &in.layout().device(p.from).slices});
      }
      float* dst = out.shard(s).values().data();
      const std::vector<DimSlice>* dst_layout = &dst_slices;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [copies, dst, dst_layout] {
            for (const Copy& c : copies) copy_box(c.box, c.src, *c.src_slices, dst, *dst_layout);
          },
          deps_of(args.after, reads), NodeKind::kCollective, remote);
    }
  }
  return next;
}

Frontier reduce_scatter(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out, ReduceOp op,
                        const CollectiveArgs& args) {
  check_same_mesh("reduce_scatter", in, out, args);
  const DeviceMesh& mesh = out.mesh();
  const auto groups = mesh.groups(args.axes);
  const std::string name = prefix(args, "reduce_scatter");
  Frontier next = ready_frontier(mesh.size());
  for (const auto& group : groups) {
    for (std::int64_t s : group) {
      const auto& dst_slices = out.layout().device(s).slices;
      struct Source {
        const float* data;
        const std::vector<DimSlice>* slices;
      };
      std::vector<Source> sources;
      for (std::int64_t t : group) {
        const auto& src_slices = in.layout().device(t).slices;
        const auto box = intersect_boxes(src_slices, dst_slices);
        NUMESH_CHECK(box && *box == dst_slices, ShapeError,
                     "reduce_scatter {} -> {} over ({}): the input shard of slot {} does not "
                     "cover the output shard of slot {}",
                     in.spec().repr(), out.spec().repr(), fmt::join(args.axes, ", "), t, s);
        sources.push_back({in.shard(t).values().data(), &src_slices});
      }
      float* dst = out.shard(s).values().data();
      const std::vector<DimSlice>* dst_layout = &dst_slices;
      next[static_cast<std::size_t>(s)] = builder.add(
          device_of(mesh, s), fmt::format("{}[{}]", name, s),
          [sources, dst, dst_layout, op] {
            const auto& box = *dst_layout;
            copy_box(box, sources[0].data, *sources[0].slices, dst, box);
            for (std::size_t k = 1; k < sources.size(); ++k) {
              const float* src = sources[k].data;
              detail::for_each_run(box, *sources[k].slices, box,
                                   [src, dst, op](std::int64_t a, std::int64_t b, std::int64_t n) {
                                     float* d = dst + b;
                                     const float* x = src + a;
                                     if (op == ReduceOp::kSum) {
                                       for (std::int64_t i = 0; i < n; ++i) d[i] += x[i];
                                     } else {
                                       for (std::int64_t i = 0; i < n; ++i) d[i] = std::max(d[i], x[i]);
                                     }
                                   });
            }
          },
          deps_of(args.after, group), NodeKind::kCollective,
          (group.size() - 1) * static_cast<std::uint64_t>(volume(dst_slices)) * sizeof(float));
    }
  }
  return next;
}

}  // namespace numesh::runtime
