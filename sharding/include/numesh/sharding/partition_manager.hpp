#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <vector>

#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/presets.hpp"

namespace numesh::sharding {

/// The arguments of PartitionManager::resolve, each optional as in eformer
/// (`resolve(axes=NOT_GIVEN, mode=NOT_GIVEN, dynamic_axes=NOT_GIVEN, shape=NOT_GIVEN)`).
/// `dynamic_axes_is_none` models eformer's `dynamic_axes=None`.
struct ResolveArgs {
  std::optional<std::vector<AxisRule>> axes = std::nullopt;
  std::optional<ModeArg> mode = std::nullopt;
  std::optional<DynamicShardingAxes> dynamic_axes = std::nullopt;
  bool dynamic_axes_is_none = false;
  std::optional<std::vector<std::int64_t>> shape = std::nullopt;
};

/// Resolves semantic axes into partition specs with one PartitionAxis: eformer's
/// PartitionManager.
///
///   PartitionManager pm(PartitionAxis{});
///   pm.resolve(presets::kHiddenStateSharding, {{8, 1, 4096}});  // decode: dim 1 is 1
///   PartitionManager::Scope scope(pm);       // `with pm:` on this thread
///   apply_logical_sharding(...) then finds pm via current().
///
/// Creating a manager makes it the process-wide "last created" manager (eformer's fallback
/// for apply_logical_sharding). Thread-safety: resolve and the other const methods are safe
/// to call concurrently; current() is per thread; last_created() is process-wide and
/// thread-safe.
class PartitionManager {
 public:
  /// A manager over `paxis` (default: PartitionAxis{}). Becomes the last-created manager.
  explicit PartitionManager(PartitionAxis paxis = {});

  /// The PartitionAxis.
  const PartitionAxis& paxis() const noexcept { return paxis_; }

  /// Resolves `axes` in `mode`. With a dimension mode, `shape` decides: decode when
  /// shape[dim] == 1, else train. Throws: ValueError "when using dynamic mode detection shape
  /// should be provided" (dimension mode without a shape); IndexError "tuple index out of
  /// range" (dim outside the shape); anything PartitionAxis::resolve_spec throws.
  [[nodiscard]] PartitionSpec resolve(
      const std::vector<AxisRule>& axes, ModeArg mode,
      const std::optional<std::vector<std::int64_t>>& shape = std::nullopt) const;
  /// Resolves a preset or DynamicShardingAxes (its own mode always wins).
  [[nodiscard]] PartitionSpec resolve(
      const DynamicShardingAxes& dynamic_axes,
      const std::optional<std::vector<std::int64_t>>& shape = std::nullopt) const;
  /// eformer's full precedence: when axes or mode is missing, dynamic_axes supplies both.
  /// Throws: ValueError "if axes or mode is empty you should provide dynamic axes";
  /// TypeError "'NoneType' object has no attribute 'axes'" for dynamic_axes_is_none; and as
  /// above.
  [[nodiscard]] PartitionSpec resolve(const ResolveArgs& args) const;

  /// eformer's shard(x, ...) for an array of `shape`: resolves `args` with that shape, corrects
  /// the spec against the current mesh when `auto_correct` (get_corrected_named_sharding), and
  /// applies with_sharding_constraint. Returns the sharding the constraint applies, or nullopt
  /// when none is applied (quirk: with auto_correct, a spec corrected to all-None applies none,
  /// while without it a replicate constraint is applied).
  /// Throws: as resolve; NoMeshError when auto_correct and no mesh is current;
  /// DuplicateSpecError when the applied spec uses a mesh axis twice.
  [[nodiscard]] std::optional<NamedSharding> shard(const std::vector<std::int64_t>& shape,
                                                   ResolveArgs args,
                                                   bool auto_correct = true) const;

  /// Makes a manager current on this thread for the scope's lifetime (eformer's `with pm:`),
  /// and the last-created manager. Scopes nest and restore the previous current manager.
  class Scope {
   public:
    /// Enters `manager`. REQUIRES: `manager` outlives the scope.
    explicit Scope(const PartitionManager& manager);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const PartitionManager* previous_;
  };

  /// The current manager of this thread (innermost Scope), or nullptr. Valid while that
  /// scope lives.
  static const PartitionManager* current() noexcept;
  /// A copy of the most recently created or entered manager, or nullopt. Thread-safe.
  static std::optional<PartitionManager> last_created();

  /// Forgets the last-created manager, so apply_logical_sharding needs an explicit or current
  /// manager again. (eformer cannot do this.) Thread-safe.
  static void reset_last_created() noexcept;

  /// {"paxis": PartitionAxis::to_json()}.
  nlohmann::json to_json() const;
  /// Inverse of to_json. Throws: TypeError "Expected PartitionAxis, got <class 'str'>" (the
  /// Python class of the value) when "paxis" is missing or not an object; as
  /// PartitionAxis::from_json.
  [[nodiscard]] static PartitionManager from_json(const nlohmann::json& j);

  friend bool operator==(const PartitionManager& a, const PartitionManager& b) noexcept {
    return a.paxis_ == b.paxis_;
  }

 private:
  PartitionAxis paxis_;
};

/// eformer's apply_logical_sharding: shard() with `partition_manager` if given, else the
/// current manager of this thread, else the last-created one.
/// Throws: ValueError "No PartitionManager is available. Provide `partition_manager` or use
/// `with PartitionManager(...)`." when there is none; as PartitionManager::shard.
[[nodiscard]] std::optional<NamedSharding> apply_logical_sharding(
    const std::vector<std::int64_t>& shape, ResolveArgs args,
    const PartitionManager* partition_manager = nullptr, bool auto_correct = true);

}  // namespace numesh::sharding
