#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

// Collectives as graph structure. Each function adds, for every mesh slot, the node(s) that
// slot's device runs to take part, wired to the nodes that produce their inputs, and returns
// the new frontier. Nothing waits inside a node: a node runs once every input it reads is
// ready. Reductions combine shards in rank order (the order of DeviceMesh::groups), so results
// are bitwise deterministic from run to run.
//
// Groups: a collective "over axes A" runs independently in each group of DeviceMesh::groups(A);
// rank r of a group is its r-th slot.
//
// Buffers: inputs and outputs are views (fp32, bf16 or f16; one dtype per collective) that must
// stay valid while the compiled graph is used; outputs must not overlap any input (checked). Inputs
// are read by other devices (remote reads); each device writes only its own output, so writes stay
// on the writer's node.

namespace numesh::runtime {

/// Per mesh slot, a node to wait for, or kReady when nothing needs to come first. Index = mesh
/// slot.
///  - Given to a collective (CollectiveArgs::after): slot s's node of the collective waits for
///    after[t] of every slot t of its group, so after[t] must be the node that finishes t's
///    input, and after[s] the last node that uses s's output buffer before it is overwritten.
///  - Returned by a collective: entry s is the node that completes s's output.
/// Reuse of buffers: a collective's nodes read the inputs of every member of their group (and,
/// for reduce-scatter + all-gather, every member's output) until they finish, so before
/// overwriting slot s's input or output, wait for the returned entries of *every* slot of s's
/// group, not just entry s.
using Frontier = std::vector<NodeId>;

/// "Nothing to wait for" in a Frontier.
inline constexpr NodeId kReady = static_cast<NodeId>(-1);

/// A frontier of `mesh_size` kReady entries.
Frontier ready_frontier(std::int64_t mesh_size);

/// A view of one slot's buffer: fp32, or bf16 / f16 (the copying collectives move half the bytes;
/// reductions widen to fp32, combine in fp32 in rank order and round once, to nearest even).
/// All views of one collective share a dtype.
struct BufferView {
  /// First element.
  void* data = nullptr;
  /// Number of elements.
  std::size_t count = 0;
  /// Element type.
  DType dtype = DType::kF32;
};

/// The whole of a tensor's storage as a view.
BufferView view(Tensor& tensor) noexcept;

/// How elements combine in reductions.
enum class ReduceOp { kSum, kMax };

/// "sum" or "max".
std::string_view to_string(ReduceOp op) noexcept;

/// All-reduce algorithms. All of them combine every element's inputs in group order, so they
/// give the same bits, in one process or on many ranks.
enum class AllReduceAlgorithm {
  /// kDirect up to kDirectAllReduceBytes per slot; above it kHierarchical for a group whose
  /// chunks cross by the transport between some two of its ranks (ranks on different hosts,
  /// NUMESH_SHARED_MEMORY=off, or chunks under the in-place floor), whose parts go in pieces
  /// (CollectiveArgs::piece_bytes not 0), and whose busiest rank sends fewer bytes in the chain
  /// than in the two stages (as on two ranks of two or more devices in fp32; not in 16 bits
  /// there, whose partials cross in fp32, nor on many ranks of two devices, where the last
  /// rank sends its results to each other rank); kReduceScatterAllGather otherwise.
  kAuto,
  kDirect,                  ///< one stage: every rank reduces all inputs into its output
  kReduceScatterAllGather,  ///< rank r reduces chunk r, then every rank gathers all chunks
  /// For a group that spans processes: a chain through the processes in group order. The
  /// group's members in the first process reduce its chunks (chunk j by its member j mod k,
  /// k members) into fp32 partial results, which go to the next process, whose members add
  /// their own inputs in order, and so on; the last process's results go to every other, and
  /// each process's members copy them from one another. On P processes of k members each, the
  /// buffer crosses between processes 2 (P - 1) times in all, where kReduceScatterAllGather
  /// crosses it (k + 1) (P - 1) times (each member's input chunks go to their owners). A group
  /// within one process runs kReduceScatterAllGather.
  kHierarchical,
};

/// "auto", "direct", "two-stage" (kReduceScatterAllGather) or "hierarchical".
std::string_view to_string(AllReduceAlgorithm algorithm) noexcept;

/// The algorithm named `name` as to_string names it.
/// Throws: ValueError naming `name` and the names there are.
AllReduceAlgorithm parse_all_reduce_algorithm(std::string_view name);

/// kAuto's switch point (bytes per slot): below it one stage of G reads beats two stages
/// (latency); above it reduce-scatter + all-gather moves less memory (docs/benchmarks.md).
inline constexpr std::size_t kDirectAllReduceBytes = std::size_t{64} << 10;

/// CollectiveArgs::piece_bytes' default: pieces large enough that a piece's own nodes and
/// transfers (tens of microseconds) cost a few percent of moving and reducing it.
inline constexpr std::size_t kPipelinePieceBytes = std::size_t{4} << 20;

/// The most pieces a part is split into (larger pieces beyond it): each piece takes a transfer
/// tag of its pair of ranks, of which a graph has kGraphTagLimit.
inline constexpr std::size_t kMaxPiecesPerPart = 256;

/// Common arguments of the buffer collectives.
struct CollectiveArgs {
  /// Mesh axes the collective runs over (empty = each slot alone).
  std::vector<std::string> axes;
  /// Per slot, the node after which its input is ready and its output free.
  Frontier after;
  /// Prefix of the node names ("all_reduce" by default per function).
  std::string name;
  /// Pipelining across processes: parts larger than this many bytes go in pieces, as few as
  /// hold at most this many bytes each (at least one element, at most kMaxPiecesPerPart, equal
  /// give or take an element), each with its own transfers and nodes, so that a piece is reduced
  /// or copied while the next ones cross. Within the collective, the sends of pieces from this
  /// rank to another start at most two at a time per stage (inputs; a reduce-scatter's reduced
  /// outputs), in order. Split are: in a group whose members are not all of one rank, each rank's
  /// part of the reduce-scatter stages (of all_reduce's kReduceScatterAllGather, and of
  /// reduce_scatter on buffers); and each part that the copying collectives on buffers (all_gather,
  /// all_to_all, broadcast, permute) copy from another rank. The bits do not change: every
  /// element is still combined once, in rank order. 0: never split. Within one process
  /// nothing is split, nor are the direct all-reduce and the box reads of the collectives on
  /// sharded tensors other than all_reduce.
  std::size_t piece_bytes = kPipelinePieceBytes;
};

/// out[s] = op over the group of s of in[g] (all `count` elements), for every slot s.
/// Throws: KeyError for an unknown axis; ValueError for views of the wrong number or size,
/// null data, overlapping input/output or mixed dtypes (naming the slot), or a frontier of the
/// wrong size.
Frontier all_reduce(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, ReduceOp op,
                    const CollectiveArgs& args,
                    AllReduceAlgorithm algorithm = AllReduceAlgorithm::kAuto);

/// out[s] = concat over ranks r of in[group[r]] (`count` each; out holds count * group size).
Frontier all_gather(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out, std::size_t count, const CollectiveArgs& args);

/// out[group[r]] = chunk r of (op over the group of in), chunks of count / G elements.
/// Throws additionally: ValueError when count is not divisible by the group size.
Frontier reduce_scatter(GraphBuilder& builder, const DeviceMesh& mesh,
                        std::span<const BufferView> in, std::span<const BufferView> out,
                        std::size_t count, ReduceOp op, const CollectiveArgs& args);

/// All-to-all with per-pair counts: rank i sends send_counts[i][j] elements to rank j, taken
/// in j order from in[group[i]]; rank j's output is what it receives, concatenated in i order.
/// `send_counts` is G x G (G = group size) and applies to every group. Even splits are the
/// special case of all counts equal.
/// Throws additionally: ValueError when send_counts is not G x G or a buffer is too small.
Frontier all_to_all(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                    std::span<const BufferView> out,
                    const std::vector<std::vector<std::size_t>>& send_counts,
                    const CollectiveArgs& args);

/// out[s] = in[group[root]] for every slot s of each group (`count` elements).
/// Throws additionally: ValueError when root is not a rank of the groups.
Frontier broadcast(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                   std::span<const BufferView> out, std::size_t count, std::int64_t root,
                   const CollectiveArgs& args);

/// Ring shift: out[group[r]] = in[group[(r - shift) mod G]] (`count` elements): with shift 1
/// every rank receives from its predecessor.
Frontier permute(GraphBuilder& builder, const DeviceMesh& mesh, std::span<const BufferView> in,
                 std::span<const BufferView> out, std::size_t count, std::int64_t shift,
                 const CollectiveArgs& args);

// ---- Sharded tensors ------------------------------------------------------------------------

/// Sums (or maxes) `in` over `axes` into `out`: both hold the same layout, and each slot's
/// shard is a partial value to combine with the other shards of its group, by `algorithm`
/// (as the buffer all_reduce).
/// Throws: ShapeError when the layouts differ; KeyError for unknown axes; ValueError when in
/// and out are the same tensor, live on different meshes, or the frontier has the wrong size.
Frontier all_reduce(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out, ReduceOp op,
                    const CollectiveArgs& args,
                    AllReduceAlgorithm algorithm = AllReduceAlgorithm::kAuto);

/// Moves `in` into `out`'s layout by copying, within each group over `axes`, every part of a
/// destination shard from the group member holding it (the destination itself when it can):
/// all-gather (out unshards a dim over axes), all-to-all (out shards another dim), broadcast
/// and local slicing are all this one operation. Every part of every output shard must be held
/// by some member of its group.
/// Throws: ShapeError when the global shapes differ or an output part is held by no member of
/// its group (naming the slot); KeyError for unknown axes; ValueError as all_reduce.
Frontier redistribute(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out,
                      const CollectiveArgs& args);

/// Reduce-scatter on sharded tensors: each slot's shard of `in` is a partial value of the
/// group's sum; out[s] = op over the group of the part of in that out's layout gives s. Each
/// input shard must cover every output part of its group.
/// Throws: ShapeError as redistribute; KeyError for unknown axes; ValueError as all_reduce.
Frontier reduce_scatter(GraphBuilder& builder, ShardedTensor& in, ShardedTensor& out, ReduceOp op,
                        const CollectiveArgs& args);

}  // namespace numesh::runtime
