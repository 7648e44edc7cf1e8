#include "numesh/sharding/presets.hpp"

#include <array>

namespace numesh::sharding {

namespace presets {
namespace {
using T = AxisRule;
// eformer's ColumnWise/RowWise composite [FSDP, SP] is a Python list.
const AxisRule kFsdpSp =
    AxisRule::list({T(tokens::kFullyShardedDataParallel), T(tokens::kSequenceParallel)});
const AxisRule kFsdpSpEp =
    AxisRule::list({T(tokens::kFullyShardedDataParallel), T(tokens::kSequenceParallel),
                    T(tokens::kExpertParallel)});
}  // namespace

const DynamicShardingAxes kHiddenStateSharding{
    {T(tokens::kBatch), T(tokens::kQueryLength), T(tokens::kEmbed)}, ModeArg::from_dim(1)};
const DynamicShardingAxes kAttnQSharding{
    {T(tokens::kBatch), T(tokens::kQueryLength), T(tokens::kHead), T(tokens::kHeadDim)},
    ModeArg::from_dim(1)};
const DynamicShardingAxes kAttnKVSharding{
    {T(tokens::kBatch), T(tokens::kKvLength), T(tokens::kKvHead), T(tokens::kKvHeadDim)},
    ModeArg::from_dim(1)};
const DynamicShardingAxes kRowWise{{T(tokens::kTensorParallel), kFsdpSp}, Mode::kTrain};
const DynamicShardingAxes kSRowWise{{T(tokens::kTensorParallel)}, Mode::kTrain};
const DynamicShardingAxes kColumnWise{{kFsdpSp, T(tokens::kTensorParallel)}, Mode::kTrain};
const DynamicShardingAxes kSColumnWise{{kFsdpSp}, Mode::kTrain};
const DynamicShardingAxes kReplicated{{T(tokens::kEmpty)}, Mode::kTrain};
const DynamicShardingAxes kExpertColumnWise{
    {T(tokens::kExpertParallel), T(tokens::kFullyShardedDataParallel), T(tokens::kTensorParallel)},
    Mode::kTrain};
const DynamicShardingAxes kExpertRowWise{
    {T(tokens::kExpertParallel), T(tokens::kTensorParallel), T(tokens::kFullyShardedDataParallel)},
    Mode::kTrain};
const DynamicShardingAxes kExpertColumnWiseAlt{
    {T(tokens::kExpertParallel), kFsdpSp, T(tokens::kTensorParallel)}, Mode::kTrain};
const DynamicShardingAxes kExpertRowWiseAlt{
    {T(tokens::kExpertParallel), T(tokens::kTensorParallel), kFsdpSp}, Mode::kTrain};
const DynamicShardingAxes kUnifiedExpertColumnWise{
    {kFsdpSpEp, T(tokens::kEmpty), T(tokens::kTensorParallel)}, Mode::kTrain};
const DynamicShardingAxes kUnifiedExpertRowWise{
    {kFsdpSpEp, T(tokens::kTensorParallel), T(tokens::kEmpty)}, Mode::kTrain};
const DynamicShardingAxes kExpertActivations{
    {T(tokens::kDataParallel), T(tokens::kSequenceParallel), T(tokens::kExpertParallel),
     T(tokens::kTensorParallel)},
    Mode::kTrain};
const DynamicShardingAxes kExpertActivationsAlt{
    {T(tokens::kDataParallel), T(tokens::kSequenceParallel),
     AxisRule::list({T(tokens::kTensorParallel), T(tokens::kFullyShardedDataParallel)})},
    Mode::kTrain};
const DynamicShardingAxes kExpertTensorParallel{
    {T(tokens::kTensorParallel), T(tokens::kEmpty), T(tokens::kEmpty)}, Mode::kTrain};
}  // namespace presets

namespace {
// Defined after the presets in this translation unit, so it is initialised after them.
const std::array<NamedPreset, 17> kAll = {{
    {"HiddenStateSharding", &presets::kHiddenStateSharding},
    {"AttnQSharding", &presets::kAttnQSharding},
    {"AttnKVSharding", &presets::kAttnKVSharding},
    {"RowWise", &presets::kRowWise},
    {"SRowWise", &presets::kSRowWise},
    {"ColumnWise", &presets::kColumnWise},
    {"SColumnWise", &presets::kSColumnWise},
    {"Replicated", &presets::kReplicated},
    {"ExpertColumnWise", &presets::kExpertColumnWise},
    {"ExpertRowWise", &presets::kExpertRowWise},
    {"ExpertColumnWiseAlt", &presets::kExpertColumnWiseAlt},
    {"ExpertRowWiseAlt", &presets::kExpertRowWiseAlt},
    {"UnifiedExpertColumnWise", &presets::kUnifiedExpertColumnWise},
    {"UnifiedExpertRowWise", &presets::kUnifiedExpertRowWise},
    {"ExpertActivations", &presets::kExpertActivations},
    {"ExpertActivationsAlt", &presets::kExpertActivationsAlt},
    {"ExpertTensorParallel", &presets::kExpertTensorParallel},
}};
}  // namespace

std::span<const NamedPreset> all_presets() noexcept { return kAll; }

const DynamicShardingAxes* find_preset(std::string_view name) noexcept {
  for (const NamedPreset& p : kAll) {
    if (p.name == name) return p.axes;
  }
  return nullptr;
}

}  // namespace numesh::sharding
