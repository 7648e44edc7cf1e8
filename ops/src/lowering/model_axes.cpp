#include "numesh/ops/lowering/model_axes.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/presets.hpp"

namespace numesh::ops {

using sharding::AxisRule;
using sharding::PartitionSpec;

ModelAxes ModelAxes::resolve(const sharding::PartitionManager& pm, sharding::Mode mode) {
  auto names_of = [&](std::string_view token) {
    const PartitionSpec spec = pm.resolve({AxisRule(token)}, mode);
    return spec.empty() ? std::vector<std::string>{} : spec.entry_names(0);
  };
  auto one_of = [&](std::string_view token) {
    const std::vector<std::string> names = names_of(token);
    NUMESH_CHECK(
        names.size() <= 1, ValueError,
        "{} resolves to the axes ({}) in mode {}; numesh splits that dim over one mesh axis", token,
        fmt::join(names, ", "), sharding::mode_string(mode));
    return names.empty() ? std::string() : names.front();
  };
  ModelAxes axes;
  axes.batch = names_of(sharding::tokens::kBatch);
  axes.heads = one_of(sharding::tokens::kHead);
  axes.mlp = one_of(sharding::tokens::kMlpIntermediate);
  axes.expert = one_of(sharding::tokens::kExpert);
  axes.expert_tensor = one_of(sharding::tokens::kTensorParallel);
  const std::vector<std::string> seq = names_of(sharding::tokens::kQueryLength);
  axes.sequence = seq.empty() ? std::string() : seq.front();
  const PartitionSpec column = pm.resolve(sharding::presets::kColumnWise);
  axes.weights = column.empty() ? std::vector<std::string>{} : column.entry_names(0);
  return axes;
}

ModelAxes ModelAxes::resolve(const sharding::PartitionManager& pm, sharding::ModeArg mode,
                             std::int64_t batch, std::int64_t hidden) {
  // A prompt call (any T but 1) and a decode step; infer_mode also checks the dim.
  const std::array<std::int64_t, 3> prompt{batch, 2, hidden}, step{batch, 1, hidden};
  const sharding::Mode prompt_mode = sharding::infer_mode(mode, prompt);
  if (prompt_mode == sharding::infer_mode(mode, step))
    return resolve(pm, prompt_mode);  // one mode for all calls
  const ModelAxes train = resolve(pm, prompt_mode);
  const ModelAxes decode = resolve(pm, sharding::infer_mode(mode, step));
  std::vector<std::string> differ;
  auto compare = [&](std::string_view field, const std::vector<std::string>& a,
                     const std::vector<std::string>& b) {
    const auto text = [](const std::vector<std::string>& v) {
      return v.empty()       ? std::string("none")
             : v.size() == 1 ? v.front()
                             : fmt::format("({})", fmt::join(v, ", "));
    };
    if (a != b)
      differ.push_back(fmt::format("{}: {} in train, {} in decode", field, text(a), text(b)));
  };
  const auto one = [](const std::string& axis) {
    return axis.empty() ? std::vector<std::string>{} : std::vector<std::string>{axis};
  };
  compare("batch", train.batch, decode.batch);
  compare("heads", one(train.heads), one(decode.heads));
  compare("mlp", one(train.mlp), one(decode.mlp));
  compare("experts", one(train.expert), one(decode.expert));
  compare("expert ffn", one(train.expert_tensor), one(decode.expert_tensor));
  NUMESH_CHECK(differ.empty(), ValueError,
               "mode dim:{}: a model lays its weights and KV caches out once, but its prefill "
               "(train) and decode "
               "calls resolve different axes: {}",
               mode.dim(), fmt::join(differ, "; "));
  return train;
}

std::int64_t split_count(const sharding::Mesh& mesh, const std::vector<std::string>& axes,
                         std::int64_t extent) {
  std::int64_t n = 1;
  for (const std::string& a : axes) {
    if (mesh.has_axis(a)) n *= mesh.axis_size(a);
  }
  return extent % n == 0 ? n : 1;
}

std::int64_t sequence_groups(const sharding::Mesh& mesh, const std::string& sequence_axis) {
  return !sequence_axis.empty() && mesh.has_axis(sequence_axis) ? mesh.axis_size(sequence_axis) : 1;
}

}  // namespace numesh::ops
