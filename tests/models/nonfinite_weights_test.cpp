// find_nonfinite_weights: NaN and infinities found in every distinct shard of f32, bf16 and f16
// weights, counted once however often a shard is replicated, the first located in the weight's
// own coordinates; and weight_label's names.

#include "numesh/models/hf/nonfinite_weights.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/device_mesh.hpp"

namespace numesh::models {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::mesh_of;

// A [4, 6] tensor of `dtype` laid out by `spec`, holding 0.5 everywhere but NaN at [3, 4] and
// +inf at [1, 1] (in device 0's rows when rows are split over two devices, the NaN in device 1's).
runtime::ShardedTensor poisoned(const runtime::DeviceMesh& mesh,
                                const sharding::PartitionSpec& spec, DType dtype) {
  runtime::HostTensor host = runtime::HostTensor::zeros({4, 6});
  for (float& v : host.data) v = 0.5f;
  host.data[3 * 6 + 4] = std::numeric_limits<float>::quiet_NaN();
  host.data[1 * 6 + 1] = std::numeric_limits<float>::infinity();
  runtime::ShardedTensor t(mesh, host.shape, spec, dtype);
  runtime::scatter(host, t);
  return t;
}

TEST(NonfiniteWeightsTest, CountsEachDistinctValueOnceAndLocatesTheFirst) {
  const runtime::DeviceMesh two = mesh_of(2, {"tp"});
  const sharding::PartitionSpec split({sharding::AxisRule("tp"), {}}), replicated({{}, {}});
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const runtime::ShardedTensor rows = poisoned(two, split, dtype),
                                 copies = poisoned(two, replicated, dtype);
    runtime::HostTensor clean_host = runtime::HostTensor::zeros({4, 6});
    runtime::ShardedTensor clean(two, clean_host.shape, split, dtype);
    runtime::scatter(clean_host, clean);
    const std::vector<NonfiniteWeight> found =
        find_nonfinite_weights({{"rows", &rows}, {"clean", &clean}, {"copies", &copies}});
    ASSERT_EQ(found.size(), 2u) << to_string(dtype);
    EXPECT_EQ(found[0].name, "rows");
    EXPECT_EQ(found[0].count, 2) << "one inf in device 0's rows, one NaN in device 1's";
    EXPECT_EQ(found[0].elements, 24);
    EXPECT_EQ(found[0].first_at, "[1, 1]");
    EXPECT_EQ(found[0].first, std::numeric_limits<float>::infinity());
    EXPECT_EQ(found[1].name, "copies");
    EXPECT_EQ(found[1].count, 2) << "a replicated weight counted once";
    EXPECT_EQ(found[1].describe(),
              "copies holds 2 non-finite values of 24 (the first, inf, at [1, 1])");
  }
  // The NaN alone, in device 1's half: its coordinates are the weight's, not the shard's.
  runtime::HostTensor host = runtime::HostTensor::zeros({4, 6});
  host.data[3 * 6 + 4] = std::numeric_limits<float>::quiet_NaN();
  runtime::ShardedTensor t(two, host.shape, split);
  runtime::scatter(host, t);
  const std::vector<NonfiniteWeight> nan = find_nonfinite_weights({{"w", &t}});
  ASSERT_EQ(nan.size(), 1u);
  EXPECT_EQ(nan[0].describe(), "w holds 1 non-finite value of 24 (the first, nan, at [3, 4])");
}

TEST(NonfiniteWeightsTest, RefusesANullTensor) {
  EXPECT_THAT(
      [] {
        find_nonfinite_weights({{"w", nullptr}});
      },
      ThrowsMessage<ValueError>(HasSubstr("the weight w is null")));
}

TEST(NonfiniteWeightsTest, LabelsAreHuggingFaceNamesWhereThereAreSuch) {
  EXPECT_EQ(weight_label("layers.0.attention.wq", Architecture::kLlama, 0),
            "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(weight_label("layers.1.attention.bk", Architecture::kQwen2, 0),
            "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(weight_label("layers.2.moe.up", Architecture::kMixtral, 4),
            "layers.2.moe.up (model.layers.2.block_sparse_moe.experts.0.w3.weight, ...)");
  EXPECT_EQ(weight_label("layers.0.moe.shared_expert.gate", Architecture::kQwen2Moe, 4),
            "model.layers.0.mlp.shared_expert.gate_proj.weight");
  EXPECT_EQ(weight_label("layers.1.moe.shared_expert_gate", Architecture::kQwen2Moe, 4),
            "model.layers.1.mlp.shared_expert_gate.weight");
  // A slot with no Hugging Face name keeps numesh's own.
  EXPECT_EQ(weight_label("layers.0.moe.shared_expert.gate", Architecture::kMixtral, 4),
            "layers.0.moe.shared_expert.gate");
  // A slice of a fused tensor names itself and the tensor: its positions count from its rows.
  EXPECT_EQ(weight_label("layers.3.attention.wv", Architecture::kPhi3, 0),
            "layers.3.attention.wv (v's rows of model.layers.3.self_attn.qkv_proj.weight)");
  EXPECT_EQ(weight_label("layers.0.mlp.up", Architecture::kPhi3, 0),
            "layers.0.mlp.up (up's rows of model.layers.0.mlp.gate_up_proj.weight)");
}

}  // namespace
}  // namespace numesh::models
