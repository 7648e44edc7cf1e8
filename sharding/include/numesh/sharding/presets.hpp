#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::sharding {

/// A named sharding intent: semantic axes plus the mode to resolve them in (eformer's
/// DynamicShardingAxes NamedTuple). The presets below are eformer's subclasses.
struct DynamicShardingAxes {
  std::vector<AxisRule> axes;
  ModeArg mode = Mode::kTrain;
  friend bool operator==(const DynamicShardingAxes&, const DynamicShardingAxes&) = default;
};

/// eformer's DynamicShardingAxes presets, with eformer's names. With the default PartitionAxis:
///   kHiddenStateSharding -> P(('fsdp', 'dp'), 'sp', 'tp')   (mode from dim 1: decode if 1)
///   kColumnWise          -> P(('fsdp', 'sp'), 'tp')
///   kRowWise             -> P('tp', ('fsdp', 'sp'))
///   kReplicated          -> P(None,)                        (length 1, not P())
namespace presets {
extern const DynamicShardingAxes kHiddenStateSharding;
extern const DynamicShardingAxes kAttnQSharding;
extern const DynamicShardingAxes kAttnKVSharding;
extern const DynamicShardingAxes kRowWise;
extern const DynamicShardingAxes kSRowWise;
extern const DynamicShardingAxes kColumnWise;
extern const DynamicShardingAxes kSColumnWise;
extern const DynamicShardingAxes kReplicated;
extern const DynamicShardingAxes kExpertColumnWise;
extern const DynamicShardingAxes kExpertRowWise;
extern const DynamicShardingAxes kExpertColumnWiseAlt;
extern const DynamicShardingAxes kExpertRowWiseAlt;
extern const DynamicShardingAxes kUnifiedExpertColumnWise;
extern const DynamicShardingAxes kUnifiedExpertRowWise;
extern const DynamicShardingAxes kExpertActivations;
extern const DynamicShardingAxes kExpertActivationsAlt;
extern const DynamicShardingAxes kExpertTensorParallel;
}  // namespace presets

/// A preset and its eformer class name.
struct NamedPreset {
  std::string_view name;
  const DynamicShardingAxes* axes;
};

/// Every preset in eformer's order.
std::span<const NamedPreset> all_presets() noexcept;

/// The preset called `name` (eformer's class name, e.g. "ColumnWise"), or nullptr.
const DynamicShardingAxes* find_preset(std::string_view name) noexcept;

}  // namespace numesh::sharding
