#include "numesh/ops/lowering/program.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/units.hpp"
#include "numesh/runtime/slot_values.hpp"

namespace numesh::ops {

std::string_view to_string(TensorRole role) noexcept {
  switch (role) {
    case TensorRole::kInput:
      return "input";
    case TensorRole::kWeight:
      return "weight";
    case TensorRole::kCache:
      return "cache";
    case TensorRole::kActivation:
      return "activation";
    case TensorRole::kOutput:
      return "output";
  }
  return "?";
}

namespace {

std::int64_t moved_bytes(const sharding::ReshardStep& step, std::int64_t g, std::int64_t payload) {
  using Kind = sharding::ReshardStep::Kind;
  switch (step.kind) {
    case Kind::kAllReduce:
      return 2 * (g - 1) * payload / g;
    case Kind::kReduceScatter:
    case Kind::kAllToAll:
      return (g - 1) * payload / g;
    case Kind::kAllGather:
      return (g - 1) * payload;
    case Kind::kLocalSlice:
      return 0;
  }
  return 0;
}

std::string gflop_text(double flops) { return fmt::format("{:.3f} GFLOP", flops / 1e9); }

// The first slot of `group` (ascending) that is this rank's, or -1.
std::int64_t first_local(const runtime::DeviceMesh& mesh, const std::vector<std::int64_t>& group) {
  for (const std::int64_t s : group) {
    if (mesh.is_local(s)) return s;
  }
  return -1;
}

// Whether every rank holds a copy of every slice of `t` (always, in one process). Decided from
// the layout alone, so that every rank decides alike.
bool every_rank_holds_every_slice(const runtime::ShardedTensor& t) {
  const runtime::DeviceMesh& mesh = t.mesh();
  for (const std::vector<std::int64_t>& group : t.layout().replica_groups()) {
    for (int rank = 0; rank < mesh.ranks(); ++rank) {
      if (std::none_of(group.begin(), group.end(),
                       [&](std::int64_t s) { return mesh.rank_of(s) == rank; }))
        return false;
    }
  }
  return true;
}

// Whether local slot `slot` is the first of this rank's copies of its slice: the one its rank
// stores (the slice's first copy, replica 0, in one process).
bool is_first_local_holder(const runtime::ShardedTensor& t, std::int64_t slot) {
  const auto& info = t.layout().device(slot);
  return first_local(t.mesh(), t.layout().replica_groups()[info.replica_group]) == slot;
}

}  // namespace

std::int64_t ProgramPlan::collective_bytes() const noexcept {
  std::int64_t total = 0;
  for (const CollectivePlan& c : collectives) total += c.moved_bytes;
  return total;
}

std::string ProgramPlan::text() const {
  std::string out;
  std::vector<std::string> axes;
  for (std::size_t a = 0; a < axis_names.size(); ++a) {
    axes.push_back(fmt::format("{}={}", axis_names[a], axis_sizes[a]));
  }
  out += fmt::format("program {}: mesh [{}], {} graph nodes\n", name, fmt::join(axes, ", "), nodes);
  std::size_t name_w = 6, spec_w = 4;
  for (const TensorPlan& t : tensors) {
    name_w = std::max(name_w, t.name.size());
    spec_w = std::max(spec_w, t.spec.repr().size());
  }
  out += fmt::format("  {:<{}}  {:<10}  {:<18}  {:<5}  {:<{}}  {:>10}\n", "tensor", name_w, "role",
                     "shape", "dtype", "spec", spec_w, "per device");
  for (const TensorPlan& t : tensors) {
    out += fmt::format("  {:<{}}  {:<10}  {:<18}  {:<5}  {:<{}}  {:>10}{}\n", t.name, name_w,
                       to_string(t.role), fmt::format("[{}]", fmt::join(t.shape, ", ")),
                       to_string(t.dtype), t.spec.repr(), spec_w,
                       human_bytes(static_cast<std::uint64_t>(t.shard_bytes)),
                       t.memory_of.empty() ? "" : "  in " + t.memory_of + "'s memory");
  }
  if (collectives.empty()) {
    out += "  collectives: none\n";
  } else {
    std::size_t cname_w = 10;
    for (const CollectivePlan& c : collectives) cname_w = std::max(cname_w, c.name.size());
    out += fmt::format("  {:<{}}  {:<40}  {:>5}  {:>10}  {:>10}\n", "collective", cname_w, "step",
                       "group", "payload", "moved");
    for (const CollectivePlan& c : collectives) {
      out += fmt::format("  {:<{}}  {:<40}  {:>5}  {:>10}  {:>10}\n", c.name, cname_w,
                         c.step.to_string(), c.group_size,
                         human_bytes(static_cast<std::uint64_t>(c.payload_bytes)),
                         human_bytes(static_cast<std::uint64_t>(c.moved_bytes)));
    }
  }
  out += fmt::format("  {:<6}  {:>14}  {:>12}\n", "slot", "flops/run", "memory");
  for (std::size_t s = 0; s < flops.size(); ++s) {
    out += fmt::format("  {:<6}  {:>14}  {:>12}\n", s, gflop_text(flops[s]),
                       human_bytes(static_cast<std::uint64_t>(memory_bytes[s])));
  }
  out += fmt::format("  collectives move {} per device per run\n",
                     human_bytes(static_cast<std::uint64_t>(collective_bytes())));
  return out;
}

nlohmann::json ProgramPlan::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  j["mesh"] = nlohmann::json::object();
  for (std::size_t a = 0; a < axis_names.size(); ++a) j["mesh"][axis_names[a]] = axis_sizes[a];
  j["nodes"] = nodes;
  j["tensors"] = nlohmann::json::array();
  for (const TensorPlan& t : tensors) {
    j["tensors"].push_back({{"name", t.name},
                            {"role", to_string(t.role)},
                            {"shape", t.shape},
                            {"dtype", to_string(t.dtype)},
                            {"spec", t.spec.repr()},
                            {"bytes_per_device", t.shard_bytes}});
    if (!t.memory_of.empty()) j["tensors"].back()["memory_of"] = t.memory_of;
  }
  j["collectives"] = nlohmann::json::array();
  for (const CollectivePlan& c : collectives) {
    j["collectives"].push_back({{"name", c.name},
                                {"step", c.step.to_string()},
                                {"group_size", c.group_size},
                                {"payload_bytes", c.payload_bytes},
                                {"moved_bytes", c.moved_bytes}});
  }
  j["flops_per_device"] = flops;
  j["memory_bytes_per_device"] = memory_bytes;
  return j;
}

// A host tensor the caller binds (inputs: `source`) or the program fills (outputs: `result`).
struct ProgramBuilder::Binding {
  std::string name;
  bool is_input = true;
  std::vector<std::int64_t> shape;
  const runtime::HostTensor* source = nullptr;
  runtime::HostTensor result;
};

namespace {

std::vector<sharding::DimSlice> whole(const std::vector<std::int64_t>& shape) {
  std::vector<sharding::DimSlice> box;
  for (std::int64_t e : shape) box.push_back({.offset = 0, .extent = e});
  return box;
}

}  // namespace

ProgramBuilder::ProgramBuilder(runtime::DeviceMesh mesh, std::string name)
    : mesh_(std::move(mesh)), name_(std::move(name)), graph_(mesh_.device_set()) {
  plan_.name = name_;
  plan_.axis_names = mesh_.mesh().names();
  plan_.axis_sizes = mesh_.mesh().sizes();
  plan_.flops.assign(static_cast<std::size_t>(mesh_.size()), 0.0);
  plan_.memory_bytes.assign(static_cast<std::size_t>(mesh_.size()), 0);
}

ProgramBuilder::ProgramBuilder(runtime::DeviceMesh mesh, std::string name,
                               CollectiveOps collectives)
    : ProgramBuilder(std::move(mesh), std::move(name)) {
  NUMESH_CHECK(collectives.all_reduce && collectives.reduce_scatter && collectives.redistribute,
               ValueError, "program {}: the CollectiveOps leave a collective unset", name_);
  collectives_ = std::move(collectives);
}

runtime::ShardedTensor& ProgramBuilder::tensor(std::string name, TensorRole role,
                                               std::vector<std::int64_t> shape,
                                               sharding::PartitionSpec spec, DType dtype) {
  Stage* stage = stages_.empty() ? nullptr : &stages_.back();
  if (role != TensorRole::kActivation || stage == nullptr || !name.starts_with(stage->prefix)) {
    return use(
        std::move(name), role,
        std::make_shared<runtime::ShardedTensor>(mesh_, std::move(shape), std::move(spec), dtype));
  }
  std::string suffix = name.substr(stage->prefix.size());
  for (auto it = free_tensors_.begin(); it != free_tensors_.end(); ++it) {
    const runtime::ShardedTensor& t = *it->tensor;
    if (it->suffix != suffix || t.shape() != shape || t.spec() != spec || t.dtype() != dtype ||
        t.order() != runtime::StoredOrder::kRows)
      continue;
    StageTensor taken = std::move(*it);
    free_tensors_.erase(it);
    plan_.tensors.push_back(TensorPlan{.name = std::move(name),
                                       .role = role,
                                       .shape = std::move(shape),
                                       .spec = std::move(spec),
                                       .dtype = dtype,
                                       .shard_bytes = t.shard_bytes(),
                                       .memory_of = taken.origin});
    stage->tensors.push_back(std::move(taken));
    return *stage->tensors.back().tensor;
  }
  std::string origin = name;
  runtime::ShardedTensor& t = use(
      std::move(name), role,
      std::make_shared<runtime::ShardedTensor>(mesh_, std::move(shape), std::move(spec), dtype));
  stage->tensors.push_back(StageTensor{
      .suffix = std::move(suffix), .origin = std::move(origin), .tensor = tensors_.back()});
  return t;
}

runtime::ShardedTensor& ProgramBuilder::use(std::string name, TensorRole role,
                                            std::shared_ptr<runtime::ShardedTensor> tensor) {
  NUMESH_CHECK(tensor != nullptr, ValueError, "program {}: tensor '{}' is null", name_, name);
  const std::int64_t bytes = tensor->shard_bytes();
  plan_.tensors.push_back(TensorPlan{.name = std::move(name),
                                     .role = role,
                                     .shape = tensor->shape(),
                                     .spec = tensor->spec(),
                                     .dtype = tensor->dtype(),
                                     .shard_bytes = bytes,
                                     .memory_of = {}});
  for (auto& m : plan_.memory_bytes) m += bytes;
  tensors_.push_back(std::move(tensor));
  return *tensors_.back();
}

runtime::Tensor& ProgramBuilder::scratch(std::int64_t slot, std::vector<std::int64_t> shape) {
  if (!stages_.empty()) {
    for (auto it = free_scratch_.begin(); it != free_scratch_.end(); ++it) {
      if (it->first != slot || it->second->shape() != shape) continue;
      runtime::Tensor* taken = it->second;
      free_scratch_.erase(it);
      stages_.back().scratch.emplace_back(slot, taken);
      return *taken;
    }
  }
  auto t = std::make_unique<runtime::Tensor>(mesh_.device(slot), std::move(shape));
  plan_.memory_bytes[static_cast<std::size_t>(slot)] += t->size() * 4;
  if (!stages_.empty()) stages_.back().scratch.emplace_back(slot, t.get());
  scratch_.push_back(std::move(t));
  return *scratch_.back();
}

void ProgramBuilder::begin_stage(std::string prefix) {
  end_stage();
  const std::size_t j = stages_.size();  // the new stage
  // Stage j - 2's scratch is read by its own nodes alone, and stage j - 3's activations by its
  // nodes and stage j - 2's, all behind the fence that stage j's nodes will wait for: stage j
  // may take them.
  if (j >= 3) {
    Stage& old = stages_[j - 3];
    std::move(old.tensors.begin(), old.tensors.end(), std::back_inserter(free_tensors_));
    old.tensors.clear();
  }
  if (j >= 2) {
    Stage& back = stages_[j - 2];
    free_scratch_.insert(free_scratch_.end(), back.scratch.begin(), back.scratch.end());
    back.scratch.clear();
    std::vector<runtime::NodeId> deps;
    for (runtime::NodeId n = back.first_node; n < back.end_node; ++n) deps.push_back(n);
    if (j >= 3 && stages_[j - 3].fence != runtime::kReady) deps.push_back(stages_[j - 3].fence);
    back.fence = graph_.add(
        mesh_.device(mesh_.local_slots().front()).index(), back.prefix + "fence", [] {}, deps);
  }
  Stage stage;
  stage.prefix = std::move(prefix);
  stage.first_node = static_cast<runtime::NodeId>(graph_.size());
  stages_.push_back(std::move(stage));
}

void ProgramBuilder::end_stage() {
  if (stages_.empty()) return;
  Stage& stage = stages_.back();
  stage.end_node = static_cast<runtime::NodeId>(graph_.size());
  const std::size_t j = stages_.size() - 1;
  if (j < 2 || stages_[j - 2].fence == runtime::kReady) return;
  for (runtime::NodeId n = stage.first_node; n < stage.end_node; ++n)
    graph_.depend(stages_[j - 2].fence, n);
}

void ProgramBuilder::add_flops(std::int64_t slot, double flops) {
  plan_.flops[static_cast<std::size_t>(slot)] += flops;
}

runtime::Frontier ProgramBuilder::reshard(runtime::ShardedTensor& in,
                                          const std::vector<sharding::Placement>& from,
                                          runtime::ShardedTensor& out,
                                          const std::vector<sharding::Placement>& to,
                                          const runtime::Frontier& after, const std::string& name) {
  ReshardResult r = ops::reshard(graph_, in, from, out, to, after, name, collectives_);
  const std::int64_t payload = in.shard_bytes();
  for (const sharding::ReshardStep& step : r.plan) {
    std::int64_t g = 1;
    for (const std::string& axis : step.axes) g *= mesh_.mesh().axis_size(axis);
    plan_.collectives.push_back(CollectivePlan{.name = name,
                                               .step = step,
                                               .group_size = g,
                                               .payload_bytes = payload,
                                               .moved_bytes = moved_bytes(step, g, payload)});
  }
  for (auto& t : r.temporaries) {
    const std::int64_t bytes = t->shard_bytes();
    for (auto& m : plan_.memory_bytes) m += bytes;
    tensors_.push_back(std::move(t));
  }
  return std::move(r.frontier);
}

runtime::ShardedTensor& ProgramBuilder::input(const std::string& name,
                                              std::vector<std::int64_t> shape,
                                              sharding::PartitionSpec spec,
                                              runtime::Frontier& loaded) {
  for (const auto& b : bindings_) {
    if (b->name == name)
      throw KeyError(name,
                     fmt::format("program {}: '{}' is already an input or output", name_, name));
  }
  runtime::ShardedTensor& t = tensor(name, TensorRole::kInput, shape, std::move(spec));
  auto binding = std::make_shared<Binding>();
  binding->name = name;
  binding->shape = shape;
  Binding* b = binding.get();
  bindings_.push_back(std::move(binding));
  const auto global = std::make_shared<std::vector<sharding::DimSlice>>(whole(shape));
  objects_.push_back(global);
  loaded.assign(static_cast<std::size_t>(mesh_.size()), runtime::kReady);
  for (const std::int64_t s : mesh_.local_slots()) {
    const auto& slices = t.layout().device(s).slices;
    runtime::Tensor& shard = t.shard(s);
    loaded[static_cast<std::size_t>(s)] = graph_.add(
        mesh_.device(s).index(), fmt::format("{}.load[{}]", name, s), [b, &slices, &shard, global] {
          runtime::copy_box(slices, b->source->data.data(), *global, shard.values().data(), slices);
        });
  }
  return t;
}

void ProgramBuilder::output(const std::string& name, runtime::ShardedTensor& stored,
                            const runtime::Frontier& stored_after) {
  for (const auto& b : bindings_) {
    if (b->name == name)
      throw KeyError(name,
                     fmt::format("program {}: '{}' is already an input or output", name_, name));
  }
  // Across ranks, a slice held by other ranks only comes by an all-gather: every slot then
  // holds the whole tensor. Every rank adds it when any rank lacks a slice.
  runtime::Frontier after = stored_after;
  runtime::ShardedTensor* held = &stored;
  if (!every_rank_holds_every_slice(stored)) {
    std::vector<std::string> axes;
    for (std::size_t d = 0; d < stored.spec().size(); ++d) {
      for (const std::string& axis : stored.spec().entry_names(d)) axes.push_back(axis);
    }
    held = &gather_over(stored, axes, TensorRole::kActivation, name + ".gathered", after);
  }
  runtime::ShardedTensor& t = *held;
  auto binding = std::make_shared<Binding>();
  binding->name = name;
  binding->is_input = false;
  binding->shape = t.shape();
  binding->result = runtime::HostTensor::zeros(t.shape());
  Binding* b = binding.get();
  bindings_.push_back(std::move(binding));
  const auto global = std::make_shared<std::vector<sharding::DimSlice>>(whole(t.shape()));
  objects_.push_back(global);
  for (const std::int64_t s : mesh_.local_slots()) {
    const auto& info = t.layout().device(s);
    if (!is_first_local_holder(t, s)) continue;  // one copy of each slice
    const runtime::Tensor& shard = t.shard(s);
    const runtime::NodeId store = graph_.add(
        mesh_.device(s).index(), fmt::format("{}.store[{}]", name, s), [b, &info, &shard, global] {
          runtime::copy_box(info.slices, shard.values().data(), info.slices, b->result.data.data(),
                            *global);
        });
    if (!after.empty() && after[static_cast<std::size_t>(s)] != runtime::kReady) {
      graph_.depend(after[static_cast<std::size_t>(s)], store);
    }
  }
}

runtime::ShardedTensor& ProgramBuilder::gather_over(runtime::ShardedTensor& in,
                                                    const std::vector<std::string>& axes,
                                                    TensorRole role, const std::string& name,
                                                    runtime::Frontier& ready) {
  const std::size_t rank = in.shape().size();
  const sharding::PartitionSpec gathered = detail::without_axes(in.spec(), axes, rank);
  if (sharding::to_placements(gathered, mesh_.mesh(), rank) ==
      sharding::to_placements(in.spec(), mesh_.mesh(), rank)) {
    return in;
  }
  runtime::ShardedTensor& out = tensor(name, role, in.shape(), gathered, in.dtype());
  ready = reshard(in, sharding::to_placements(in.spec(), mesh_.mesh(), rank), out,
                  sharding::to_placements(gathered, mesh_.mesh(), rank), ready, name);
  return out;
}

Program ProgramBuilder::compile() && {
  end_stage();
  Program p;
  plan_.nodes = graph_.size();
  // Each rank counted the FLOPs and scratch of its own slots: the plan gives every slot's.
  if (mesh_.ranks() > 1) {
    plan_.flops = runtime::values_of_every_slot(mesh_, std::move(plan_.flops));
    plan_.memory_bytes = runtime::values_of_every_slot(mesh_, std::move(plan_.memory_bytes));
  }
  p.graph_ = std::make_unique<runtime::CompiledGraph>(graph_.compile());
  p.tensors_ = std::move(tensors_);
  p.scratch_ = std::move(scratch_);
  p.objects_ = std::move(objects_);
  p.bindings_ = std::move(bindings_);
  p.plan_ = std::move(plan_);
  return p;
}

Program::Program(Program&&) noexcept = default;
Program& Program::operator=(Program&&) noexcept = default;
Program::~Program() = default;

void Program::set_input(const std::string& name, const runtime::HostTensor& host) {
  for (const auto& b : bindings_) {
    if (b->is_input && b->name == name) {
      NUMESH_CHECK(host.shape == b->shape, ShapeError, "program {}: input '{}' is [{}], got [{}]",
                   plan_.name, name, fmt::join(b->shape, ", "), fmt::join(host.shape, ", "));
      b->source = &host;
      return;
    }
  }
  throw KeyError(name, fmt::format("program {} has no input '{}'", plan_.name, name));
}

const runtime::HostTensor& Program::output(const std::string& name) const {
  for (const auto& b : bindings_) {
    if (!b->is_input && b->name == name) return b->result;
  }
  throw KeyError(name, fmt::format("program {} has no output '{}'", plan_.name, name));
}

void Program::run() {
  for (const auto& b : bindings_) {
    NUMESH_CHECK(!b->is_input || b->source != nullptr, ValueError,
                 "program {}: input '{}' was never set", plan_.name, b->name);
  }
  graph_->run();
}

const runtime::HostTensor& Program::run(const std::string& input, const runtime::HostTensor& host,
                                        const std::string& output) {
  set_input(input, host);
  run();
  return this->output(output);
}

}  // namespace numesh::ops
