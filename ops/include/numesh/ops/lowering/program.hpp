#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "numesh/ops/lowering/reshard.hpp"
#include "numesh/ops/matmul_precision.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/placement.hpp"
#include "numesh/sharding/reshard_plan.hpp"

// A program is a compiled graph plus everything its nodes touch (weights, activations, caches,
// scratch) and a description of itself: every tensor with its spec and bytes per device, every
// collective with its bytes, FLOPs and memory per device. Operators emit into a ProgramBuilder;
// the builder owns what they allocate, so nothing a node references can die before the graph.

namespace numesh::ops {

/// What a tensor is for, in a plan.
enum class TensorRole : std::uint8_t {
  kInput,       ///< written by the caller before each run
  kWeight,      ///< laid out once, read by every run (may be shared between programs)
  kCache,       ///< state kept between runs (KV caches; shared between programs)
  kActivation,  ///< produced and consumed inside a run
  kOutput,      ///< read by the caller after each run
};

/// "input", "weight", "cache", "activation" or "output".
std::string_view to_string(TensorRole role) noexcept;

/// One tensor of a plan.
struct TensorPlan {
  std::string name;
  TensorRole role = TensorRole::kActivation;
  std::vector<std::int64_t> shape;
  sharding::PartitionSpec spec;
  /// Element type.
  DType dtype = DType::kF32;
  /// Bytes of the shard on each mesh slot.
  std::int64_t shard_bytes = 0;
  /// The earlier tensor whose memory this one took over (ProgramBuilder::begin_stage), or
  /// empty when it has memory of its own.
  std::string memory_of;
};

/// One collective of a plan.
struct CollectivePlan {
  /// The node-name prefix it was emitted under (e.g. "block0.mlp.out").
  std::string name;
  sharding::ReshardStep step;
  /// Devices per group (product of the step's axes).
  std::int64_t group_size = 1;
  /// Bytes of the tensor shard each device contributes.
  std::int64_t payload_bytes = 0;
  /// Bytes each device reads from other devices: (g-1)/g of the payload for all-to-all and
  /// reduce-scatter, 2(g-1)/g for all-reduce (reduce-scatter then all-gather), (g-1) times
  /// the payload for all-gather, 0 for a local slice.
  std::int64_t moved_bytes = 0;
};

/// What a compiled program does on each device.
struct ProgramPlan {
  std::string name;
  /// The mesh: axis names and sizes.
  std::vector<std::string> axis_names;
  std::vector<std::int64_t> axis_sizes;
  std::vector<TensorPlan> tensors;
  std::vector<CollectivePlan> collectives;
  /// FLOPs per run on each mesh slot (multiply-add = 2).
  std::vector<double> flops;
  /// Bytes allocated on each mesh slot by this program's tensors and scratch (tensors shared
  /// with other programs included). Memory a stage takes over from an earlier one
  /// (ProgramBuilder::begin_stage) counts once, so this is the program's peak.
  std::vector<std::int64_t> memory_bytes;
  /// Graph nodes (this rank's, on a mesh over ranks).
  std::size_t nodes = 0;

  /// Total bytes moved by collectives per device per run (sum of moved_bytes).
  std::int64_t collective_bytes() const noexcept;
  /// The plan as aligned text tables (tensors, collectives, per-device totals).
  std::string text() const;
  /// The plan as JSON.
  nlohmann::json to_json() const;
};

class Program;

/// Collects a program: a graph builder over a mesh, the tensors and scratch its nodes use,
/// the collectives and the FLOPs. Operators' emit functions take one. Not thread-safe.
class ProgramBuilder {
 public:
  /// A builder for a program called `name` over `mesh`.
  ProgramBuilder(runtime::DeviceMesh mesh, std::string name);
  /// A builder whose reshard() emits its collectives through `collectives` (counted, recorded
  /// or faked by a test; an all-reduce algorithm pinned). Throws: ValueError when a member of
  /// `collectives` is unset.
  ProgramBuilder(runtime::DeviceMesh mesh, std::string name, CollectiveOps collectives);

  /// The mesh.
  const runtime::DeviceMesh& mesh() const noexcept { return mesh_; }
  /// The graph under construction.
  runtime::GraphBuilder& graph() noexcept { return graph_; }

  /// A new sharded tensor of `dtype` owned by the program, laid out by `spec` as given (callers
  /// correct it first when it comes from user input); inside a stage, an activation may come
  /// with an earlier stage's memory (begin_stage). Throws: what ShardedTensor throws.
  runtime::ShardedTensor& tensor(std::string name, TensorRole role, std::vector<std::int64_t> shape,
                                 sharding::PartitionSpec spec, DType dtype = DType::kF32);
  /// Registers a tensor the program shares with others (weights, caches): kept alive by the
  /// program, listed in its plan.
  runtime::ShardedTensor& use(std::string name, TensorRole role,
                              std::shared_ptr<runtime::ShardedTensor> tensor);
  /// use() for an optional tensor (a layer's bias or norm weight): null stays null.
  runtime::ShardedTensor* use_if_present(std::string name, TensorRole role,
                                         const std::shared_ptr<runtime::ShardedTensor>& tensor) {
    return tensor != nullptr ? &use(std::move(name), role, tensor) : nullptr;
  }
  /// Scratch on mesh slot `slot`'s device, owned by the program (zero-filled when new; inside
  /// a stage it may be an earlier stage's, holding what that stage left: begin_stage). Throws:
  /// ValueError when `slot` is another rank's.
  runtime::Tensor& scratch(std::int64_t slot, std::vector<std::int64_t> shape);
  /// Starts a stage called `prefix` (a model's layer), ending the one before. The nodes added
  /// until the next begin_stage() or compile() are the stage's, and so are the kActivation
  /// tensors named `prefix` + suffix and the scratch it asks for meanwhile.
  /// REQUIRES: a stage's activations are read by its own nodes and the next stage's only, its
  /// scratch by its own nodes only, and both are written whole by their stage before being
  /// read (as a layer's are: the next layer reads its output, nothing reads older ones, a
  /// layer's temporaries are its own, and no run reads what the run before it left). Then the
  /// builder gives a stage, instead of new memory, an activation of a stage three or more back
  /// of the same suffix, shape, spec and dtype, and scratch of a stage two or more back of the
  /// same slot and shape (in the order asked). Every node of a stage waits for every node two
  /// stages back and before (one fence node a stage), so no node writes memory a node of an
  /// older stage may still read. Many like layers thus hold three layers' activations and two
  /// layers' scratch instead of all of them (reshard temporaries keep their own).
  /// Not for programs whose activations outlive their stage (training's saved activations).
  void begin_stage(std::string prefix);
  /// An input the caller provides per run (Program::set_input): a new program tensor laid out
  /// by `spec`, filled at the start of every run by one load node per local slot that copies
  /// the slot's slice from the caller's host tensor (on a mesh over ranks, every rank passes
  /// the whole input). `loaded` becomes the frontier of those nodes.
  /// No graph is built per run, so a decode step pays no staging overhead.
  /// Throws: KeyError when an input or output called `name` exists; what ShardedTensor throws.
  runtime::ShardedTensor& input(const std::string& name, std::vector<std::int64_t> shape,
                                sharding::PartitionSpec spec, runtime::Frontier& loaded);
  /// An output read by the caller after each run (Program::output): one store node per
  /// distinct slice, after `after`, copies `tensor`'s shards into a host tensor the program
  /// owns. On a mesh over ranks every rank gets the whole output: when some rank holds no copy
  /// of a slice, `tensor` is first all-gathered over the axes its spec uses, on every rank.
  /// Throws: KeyError when an input or output called `name` exists.
  void output(const std::string& name, runtime::ShardedTensor& tensor,
              const runtime::Frontier& after);

  /// A host object (routing tables, statistics) owned by the program, constructed from `args`.
  template <typename T, typename... Args>
  T& make(Args&&... args) {
    auto p = std::make_shared<T>(std::forward<Args>(args)...);
    T& ref = *p;
    objects_.push_back(std::move(p));
    return ref;
  }
  /// Counts `flops` per run on mesh slot `slot`.
  void add_flops(std::int64_t slot, double flops);
  /// The precision the operators' fp32 products take in the nodes emitted after this call
  /// (every lowering passes it to device_gemm; kF32 unless set): kBF16 is training's bf16
  /// compute on fp32 master weights.
  void set_matmul_precision(MatmulPrecision precision) noexcept { matmul_precision_ = precision; }
  /// The precision set_matmul_precision() last set.
  MatmulPrecision matmul_precision() const noexcept { return matmul_precision_; }

  /// One node per mesh slot of this process, the step every lowering repeats: node s is named
  /// "name[s]", runs on slot s's device the body `make_body(s)` returns (called once per local
  /// slot, now, so the body binds that slot's shards and scratch), and starts after entry s of
  /// every frontier in `after` (an empty frontier, or a kReady entry, imposes nothing). Returns
  /// the frontier of the new nodes; another rank's slots (a mesh over ranks) have no node here
  /// and their entries are kReady, so make_body must not keep host state that every slot adds
  /// to. Throws: what GraphBuilder::add throws.
  template <typename MakeBody>
  runtime::Frontier per_device(const std::string& name,
                               const std::vector<const runtime::Frontier*>& after,
                               MakeBody&& make_body) {
    runtime::Frontier done(static_cast<std::size_t>(mesh_.size()), runtime::kReady);
    for (const std::int64_t s : mesh_.local_slots()) {
      const auto i = static_cast<std::size_t>(s);
      done[i] =
          graph_.add(mesh_.device(s).index(), name + "[" + std::to_string(s) + "]", make_body(s));
      for (const runtime::Frontier* f : after) {
        if (f != nullptr && !f->empty() && (*f)[i] != runtime::kReady)
          graph_.depend((*f)[i], done[i]);
      }
    }
    return done;
  }

  /// One empty node per mesh slot, node s after entry s of every frontier in `after`: the
  /// frontier at which all of them are complete (a result made of several parts, each with
  /// its own collectives). Throws: what GraphBuilder::add throws.
  runtime::Frontier join(const std::string& name,
                         const std::vector<const runtime::Frontier*>& after) {
    return per_device(name, after, [](std::int64_t) { return [] {}; });
  }

  /// reshard() recorded in the plan: emits the collectives taking `in` (placed `from`) to
  /// `out` (placed `to`) after `after`, keeps the intermediates. Returns the frontier after
  /// which `out` is complete. Throws: as reshard().
  runtime::Frontier reshard(runtime::ShardedTensor& in,
                            const std::vector<sharding::Placement>& from,
                            runtime::ShardedTensor& out, const std::vector<sharding::Placement>& to,
                            const runtime::Frontier& after, const std::string& name);

  /// `in` with `axes` gathered: when in's spec uses any of them, a new program tensor `name`
  /// laid out without them, filled by an all-gather over them that starts after `ready`; else
  /// `in` itself. `ready` becomes the frontier after which the returned tensor is complete.
  /// Throws: as reshard().
  runtime::ShardedTensor& gather_over(runtime::ShardedTensor& in,
                                      const std::vector<std::string>& axes, TensorRole role,
                                      const std::string& name, runtime::Frontier& ready);

  /// Compiles the graph; the builder is spent afterwards. On a mesh over ranks, a collective
  /// (the plan's per-slot FLOPs and memory are gathered from each slot's rank): every rank
  /// compiles its programs in the same order. Throws: what the transport throws.
  Program compile() &&;

 private:
  friend class Program;
  struct Binding;
  // An activation's memory as stages hand it on: the name suffix it is matched by, the name
  // of the tensor that allocated it.
  struct StageTensor {
    std::string suffix;
    std::string origin;
    std::shared_ptr<runtime::ShardedTensor> tensor;
  };
  // One stage of begin_stage(): its nodes [first_node, end_node), the memory it holds, and
  // the node that waits for it and every stage before it.
  struct Stage {
    std::string prefix;
    runtime::NodeId first_node = 0;
    runtime::NodeId end_node = 0;
    runtime::NodeId fence = runtime::kReady;
    std::vector<StageTensor> tensors;
    std::vector<std::pair<std::int64_t, runtime::Tensor*>> scratch;  // (slot, scratch)
  };
  // Ends the open stage: its nodes wait for the fence two stages back.
  void end_stage();
  runtime::DeviceMesh mesh_;
  std::string name_;
  runtime::GraphBuilder graph_;
  std::vector<std::shared_ptr<Binding>> bindings_;
  std::vector<std::shared_ptr<runtime::ShardedTensor>> tensors_;
  std::vector<std::unique_ptr<runtime::Tensor>> scratch_;
  std::vector<std::shared_ptr<void>> objects_;
  ProgramPlan plan_;
  CollectiveOps collectives_ = CollectiveOps::runtime_collectives();
  MatmulPrecision matmul_precision_ = MatmulPrecision::kF32;
  std::vector<Stage> stages_;
  // Memory the stages three back gave up, for the open stage to take.
  std::vector<StageTensor> free_tensors_;
  std::vector<std::pair<std::int64_t, runtime::Tensor*>> free_scratch_;
};

/// A compiled program: run it many times; it owns what its nodes use. Movable, not copyable.
/// Not thread-safe: one thread runs it at a time.
class Program {
 public:
  Program(Program&&) noexcept;
  Program& operator=(Program&&) noexcept;
  ~Program();

  /// Binds the input `name` to `host` for the next runs (the load nodes read it while the
  /// program runs; no copy is made). REQUIRES: `host` outlives those runs.
  /// Throws: KeyError for an unknown input; ShapeError when host's shape is not the input's.
  void set_input(const std::string& name, const runtime::HostTensor& host);
  /// The output `name` as the last run left it. Throws: KeyError for an unknown output.
  const runtime::HostTensor& output(const std::string& name) const;
  /// Runs the graph once. Throws: ValueError when an input was never bound; what a node
  /// throws (see CompiledGraph::run).
  void run();
  /// The usual run of a one-input, one-output program: binds `input` to `host`, runs, and
  /// returns `output`. Throws: as set_input, run and output.
  const runtime::HostTensor& run(const std::string& input, const runtime::HostTensor& host,
                                 const std::string& output);
  /// The compiled graph (timing, traces, DOT).
  runtime::CompiledGraph& graph() noexcept { return *graph_; }
  /// What the program does.
  const ProgramPlan& plan() const noexcept { return plan_; }

 private:
  friend class ProgramBuilder;
  Program() = default;
  // Every tensor and scratch buffer a node references (heap objects: moving the program
  // does not move them).
  std::vector<std::shared_ptr<runtime::ShardedTensor>> tensors_;
  std::vector<std::unique_ptr<runtime::Tensor>> scratch_;
  std::vector<std::shared_ptr<void>> objects_;
  std::vector<std::shared_ptr<ProgramBuilder::Binding>> bindings_;
  ProgramPlan plan_;
  std::unique_ptr<runtime::CompiledGraph> graph_;
};

/// The programs of one layer or model, compiled on first use, one per key (the number of new
/// tokens T: prefill, insert chunks and decode steps each get theirs, all sharing the weights
/// and caches). `Extra` is what a compile step records beside the program (routing tables).
/// Not thread-safe.
template <typename Extra = std::monostate>
class ProgramCache {
 public:
  /// A compiled program and what its compile step recorded.
  struct Entry {
    std::int64_t key = 0;
    std::unique_ptr<Program> program;
    Extra extra{};
  };

  /// The entry for `key`, compiled first by `compile(key, extra)` (returning the Program and
  /// filling `extra`) when there is none. Throws: what `compile` throws (nothing is cached).
  template <typename Compile>
  Entry& get(std::int64_t key, Compile&& compile) {
    if (Entry* e = find(key)) return *e;
    auto e = std::make_unique<Entry>();
    e->key = key;
    e->program = std::make_unique<Program>(compile(key, e->extra));
    entries_.push_back(std::move(e));
    return *entries_.back();
  }
  /// Programs compiled so far.
  std::size_t size() const noexcept { return entries_.size(); }
  /// The entry for `key`, or nullptr when none was compiled.
  Entry* find(std::int64_t key) noexcept {
    for (auto& e : entries_) {
      if (e->key == key) return e.get();
    }
    return nullptr;
  }

 private:
  std::vector<std::unique_ptr<Entry>> entries_;  // entries keep their addresses
};

}  // namespace numesh::ops
