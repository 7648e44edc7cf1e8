#include "numesh/sharding/partition_manager.hpp"

#include <fmt/format.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

namespace {

// eformer's module-level _LAST: the most recently created or entered manager. Kept as a copy
// (a manager is a small value), so it never dangles.
struct LastManager {
  std::mutex mutex;
  std::optional<PartitionManager> manager;
};

LastManager& last() {
  static LastManager l;
  return l;
}

void set_last(const PartitionManager& pm) {
  LastManager& l = last();
  std::lock_guard lock(l.mutex);
  l.manager = pm;
}

// eformer's contextvar: per thread, not inherited by new threads.
thread_local const PartitionManager* t_current = nullptr;

}  // namespace

PartitionManager::PartitionManager(PartitionAxis paxis) : paxis_(std::move(paxis)) {
  set_last(*this);
}

PartitionSpec PartitionManager::resolve(
    const std::vector<AxisRule>& axes, ModeArg mode,
    const std::optional<std::vector<std::int64_t>>& shape) const {
  if (mode.is_dim() && !shape)
    throw ValueError("when using dynamic mode detection shape should be provided");
  return paxis_.resolve_spec(axes, shape ? infer_mode(mode, *shape) : mode.mode());
}

PartitionSpec PartitionManager::resolve(
    const DynamicShardingAxes& dynamic_axes,
    const std::optional<std::vector<std::int64_t>>& shape) const {
  return resolve(dynamic_axes.axes, dynamic_axes.mode, shape);
}

PartitionSpec PartitionManager::resolve(const ResolveArgs& args) const {
  if (args.axes && args.mode) return resolve(*args.axes, *args.mode, args.shape);
  if (args.dynamic_axes_is_none) throw TypeError("'NoneType' object has no attribute 'axes'");
  if (!args.dynamic_axes) {
    throw ValueError("if axes or mode is empty you should provide dynamic axes");
  }
  return resolve(*args.dynamic_axes, args.shape);
}

std::optional<NamedSharding> PartitionManager::shard(const std::vector<std::int64_t>& shape,
                                                     ResolveArgs args, bool auto_correct) const {
  args.shape = shape;
  PartitionSpec spec = resolve(args);
  if (auto_correct) spec = get_corrected_named_sharding(shape, spec).spec();
  return with_sharding_constraint(shape, spec);
}

PartitionManager::Scope::Scope(const PartitionManager& manager) : previous_(t_current) {
  t_current = &manager;
  set_last(manager);
}

PartitionManager::Scope::~Scope() { t_current = previous_; }

const PartitionManager* PartitionManager::current() noexcept { return t_current; }

std::optional<PartitionManager> PartitionManager::last_created() {
  LastManager& l = last();
  std::lock_guard lock(l.mutex);
  return l.manager;
}

void PartitionManager::reset_last_created() noexcept {
  LastManager& l = last();
  std::lock_guard lock(l.mutex);
  l.manager.reset();
}

nlohmann::json PartitionManager::to_json() const { return {{"paxis", paxis_.to_json()}}; }

namespace {
// The Python class a JSON value would be, for eformer's "Expected PartitionAxis, got <class>".
std::string_view python_class(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return "<class 'NoneType'>";
    case nlohmann::json::value_t::string:
      return "<class 'str'>";
    case nlohmann::json::value_t::boolean:
      return "<class 'bool'>";
    case nlohmann::json::value_t::number_float:
      return "<class 'float'>";
    case nlohmann::json::value_t::array:
      return "<class 'list'>";
    case nlohmann::json::value_t::object:
      return "<class 'dict'>";
    default:
      return "<class 'int'>";
  }
}
}  // namespace

PartitionManager PartitionManager::from_json(const nlohmann::json& j) {
  const nlohmann::json paxis = j.is_object() ? j.value("paxis", nlohmann::json()) : j;
  if (!paxis.is_object()) {
    throw TypeError(fmt::format("Expected PartitionAxis, got {}", python_class(paxis)));
  }
  return PartitionManager(PartitionAxis::from_json(paxis));
}

std::optional<NamedSharding> apply_logical_sharding(const std::vector<std::int64_t>& shape,
                                                    ResolveArgs args,
                                                    const PartitionManager* partition_manager,
                                                    bool auto_correct) {
  if (partition_manager) return partition_manager->shard(shape, std::move(args), auto_correct);
  if (const PartitionManager* current = PartitionManager::current()) {
    return current->shard(shape, std::move(args), auto_correct);
  }
  if (auto last = PartitionManager::last_created()) {
    return last->shard(shape, std::move(args), auto_correct);
  }
  throw ValueError(
      "No PartitionManager is available. Provide `partition_manager` or use `with "
      "PartitionManager(...)`.");
}

}  // namespace numesh::sharding
