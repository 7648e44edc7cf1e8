// find_nonfinite_weights: NaN and infinities found in every distinct shard of f32, bf16, f16 and
// block-format weights, counted once however often a shard is replicated, the first located in the
// weight's own coordinates; and weight_label's names.

#include "numesh/models/hf/nonfinite_weights.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"
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

// The scan asks runs of 1024 values at once whether any is not finite: values at the last place
// of a run, the first of the next and the last of a partial run are each found, and a run with
// none is passed over.
TEST(NonfiniteWeightsTest, FindsValuesAtTheEdgesOfTheScansRuns) {
  const runtime::DeviceMesh two = mesh_of(2, {"tp"});
  const sharding::PartitionSpec replicated({{}, {}});
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    runtime::HostTensor host = runtime::HostTensor::zeros({3, 1500});
    host.data[1023] = std::numeric_limits<float>::quiet_NaN();
    host.data[1024] = std::numeric_limits<float>::infinity();
    host.data[4499] = -std::numeric_limits<float>::infinity();
    runtime::ShardedTensor t(two, host.shape, replicated, dtype);
    runtime::scatter(host, t);
    const std::vector<NonfiniteWeight> found = find_nonfinite_weights({{"w", &t}});
    ASSERT_EQ(found.size(), 1u) << to_string(dtype);
    EXPECT_EQ(found[0].describe(),
              "w holds 3 non-finite values of 4500 (the first, nan, at [0, 1023])")
        << to_string(dtype);
  }
}

// A shard of more than 2^20 values is scanned in tasks of 2^20 over the device's threads: the
// findings of the tasks add up, and the first is the first task's that has one, in the weight's
// coordinates; for q8_0 a block whose scale is +inf in the second task (its 32 values).
TEST(NonfiniteWeightsTest, ScansOfLargeShardsAddTheirTasksFindingsInOrder) {
  const runtime::DeviceMesh one = mesh_of(1, {"tp"});
  const sharding::PartitionSpec replicated({{}, {}});
  const std::int64_t cols = std::int64_t{1} << 20;
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kQ8_0}) {
    runtime::HostTensor host = runtime::HostTensor::zeros({2, cols});
    for (float& v : host.data) v = 0.25f;
    runtime::ShardedTensor t(one, host.shape, replicated, dtype);
    if (dtype == DType::kQ8_0) {
      runtime::scatter(host, t);
      // Block 2 of row 1 (values [1, 64] .. [1, 95]): d = +inf.
      auto* block = reinterpret_cast<runtime::BlockQ8_0*>(t.shard(0).data()) + cols / 32 + 2;
      const std::uint16_t inf = 0x7C00;
      std::memcpy(&block->d, &inf, sizeof inf);
    } else {
      host.data[static_cast<std::size_t>(cols + 64)] = std::numeric_limits<float>::infinity();
      host.data[static_cast<std::size_t>(2 * cols - 1)] = std::numeric_limits<float>::quiet_NaN();
      runtime::scatter(host, t);
    }
    const std::vector<NonfiniteWeight> found = find_nonfinite_weights({{"w", &t}});
    ASSERT_EQ(found.size(), 1u) << to_string(dtype);
    EXPECT_EQ(found[0].count, dtype == DType::kQ8_0 ? 32 : 2) << to_string(dtype);
    EXPECT_EQ(found[0].first_at, "[1, 64]") << to_string(dtype);
  }
}

// Block-format weights are scanned by their scales: a block is dequantized only when a scale is
// not finite. The counts and the first value equal those of the whole weight dequantized, with
// d set to +inf in a block of device 0's rows, to NaN in one of device 1's, Q4_K's dmin to -inf
// in another, and a block whose scale is f16's largest finite value (finite values, not counted).
TEST(NonfiniteWeightsTest, BlockFormatsCountWhatTheirDequantizedValuesHold) {
  const runtime::DeviceMesh two = mesh_of(2, {"tp"});
  const sharding::PartitionSpec split({sharding::AxisRule("tp"), {}});
  for (const DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kIQ4_NL, DType::kQ4_K,
                            DType::kQ5_K, DType::kQ6_K}) {
    const std::int64_t rows = 4, cols = 512, elements = rows * cols;
    std::vector<float> values(static_cast<std::size_t>(elements));
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 201) - 100);
    }
    const auto row = static_cast<std::size_t>(row_bytes(dtype, cols));
    std::vector<std::byte> bytes(row * static_cast<std::size_t>(rows));
    runtime::convert_elements(values.data(), DType::kF32, bytes.data(), dtype, values.size());
    const DTypeTraits& format = traits(dtype);
    const auto block_bytes = static_cast<std::size_t>(format.block_bytes);
    // The offset of d in a block, and Q4_K's dmin.
    const std::size_t d_at = dtype == DType::kQ6_K ? offsetof(runtime::BlockQ6_K, d) : 0;
    const auto put = [&](std::int64_t r, std::int64_t block, std::size_t at, std::uint16_t bits) {
      std::memcpy(bytes.data() + static_cast<std::size_t>(r) * row +
                      static_cast<std::size_t>(block) * block_bytes + at,
                  &bits, sizeof bits);
    };
    put(1, 1, d_at, 0x7C00);                                   // +inf, device 0
    put(3, 0, d_at, 0x7E00);                                   // NaN, device 1
    put(0, 0, d_at, 0x7BFF);                                   // 65504: finite
    const std::int16_t dmin_at = traits(dtype).f16_scales[1];  // Q4_K's and Q5_K's dmin
    if (dmin_at >= 0) put(2, 1, static_cast<std::size_t>(dmin_at), 0xFC00);  // -inf
    // The definition: every value dequantized.
    std::vector<float> widened(values.size());
    runtime::convert_elements(bytes.data(), dtype, widened.data(), DType::kF32, widened.size());
    std::int64_t count = 0, first_at = -1;
    for (std::size_t i = 0; i < widened.size(); ++i) {
      if (std::isfinite(widened[i])) continue;
      if (count++ == 0) first_at = static_cast<std::int64_t>(i);
    }
    ASSERT_GT(count, 0) << to_string(dtype);
    runtime::ShardedTensor t(two, {rows, cols}, split, dtype);
    for (const std::int64_t slot : two.local_slots()) {
      const auto r0 = static_cast<std::size_t>(t.layout().device(slot).slices[0].offset);
      runtime::Tensor& shard = t.shard(slot);
      std::memcpy(shard.data(), bytes.data() + r0 * row, shard.size_bytes());
    }
    const std::vector<NonfiniteWeight> found = find_nonfinite_weights({{"w", &t}});
    ASSERT_EQ(found.size(), 1u) << to_string(dtype);
    EXPECT_EQ(found[0].count, count) << to_string(dtype);
    EXPECT_EQ(found[0].elements, elements);
    EXPECT_EQ(found[0].first_at, fmt::format("[{}, {}]", first_at / cols, first_at % cols))
        << to_string(dtype);
    const float first = widened[static_cast<std::size_t>(first_at)];
    EXPECT_EQ(std::isnan(found[0].first), std::isnan(first)) << to_string(dtype);
    if (!std::isnan(first)) {
      EXPECT_EQ(found[0].first, first) << to_string(dtype);
    }
  }
}

// A scale made non-finite: `bits` in block `block` of row `row` of device `slot`'s shard.
struct ScalePut {
  std::int64_t slot, row, block;
  std::uint16_t bits;
};

// What find_nonfinite_weights reports for a [rows, cols] weight of `dtype` split by `spec` over
// `mesh`, with the scales of `puts` made non-finite: stored by rows, and the same rows arranged
// in panels as fill_shards arranges them ({by rows, in panels}).
std::array<std::vector<NonfiniteWeight>, 2> found_by_rows_and_in_panels(
    const runtime::DeviceMesh& mesh, const sharding::PartitionSpec& spec, std::int64_t rows,
    std::int64_t cols, DType dtype, std::span<const ScalePut> puts) {
  runtime::HostTensor host = runtime::HostTensor::zeros({rows, cols});
  for (std::size_t i = 0; i < host.data.size(); ++i) {
    host.data[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 201) - 100);
  }
  runtime::ShardedTensor by_rows(mesh, host.shape, spec, dtype);
  runtime::ShardedTensor in_panels(mesh, host.shape, spec, dtype, runtime::BufferContents::kZeros,
                                   runtime::StoredOrder::kPanels);
  runtime::scatter(host, by_rows);
  const auto row = static_cast<std::size_t>(row_bytes(dtype, cols));
  const auto block_bytes = static_cast<std::size_t>(traits(dtype).block_bytes);
  for (const ScalePut& p : puts) {
    std::memcpy(static_cast<std::byte*>(by_rows.shard(p.slot).data()) +
                    static_cast<std::size_t>(p.row) * row +
                    static_cast<std::size_t>(p.block) * block_bytes,
                &p.bits, sizeof p.bits);
  }
  for (const std::int64_t slot : mesh.local_slots()) {
    runtime::Tensor& shard = in_panels.shard(slot);
    std::memcpy(shard.data(), by_rows.shard(slot).data(), shard.size_bytes());
    runtime::arrange_in_panels(shard);
  }
  return {find_nonfinite_weights({{"w", &by_rows}}), find_nonfinite_weights({{"w", &in_panels}})};
}

// Weights stored in panels (runtime/weight_panels.hpp) are reported as their rows are: the same
// count, first position and value, with non-finite scales in blocks inside panels (two in one
// panel, the later output's earlier in the rows, so the first found is not the first) and in
// the rows after them, on each device's share.
TEST(NonfiniteWeightsTest, WeightsInPanelsAreReportedAsTheirRows) {
  const runtime::DeviceMesh two = mesh_of(2, {"tp"});
  const sharding::PartitionSpec split({sharding::AxisRule("tp"), {}});
  const std::vector<ScalePut> puts{
      {0, 9, 2, 0x7C00},   // +inf in device 0's first panel
      {0, 4, 1, 0x7E00},   // NaN, earlier in the rows, later in the panel's blocks
      {1, 33, 0, 0xFC00},  // -inf in device 1's rows after its panels
      {1, 20, 2, 0x7E00},  // NaN in device 1's second panel
  };
  for (const DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    // 35 rows a device: two panels and 3 rows.
    const auto [want, got] = found_by_rows_and_in_panels(two, split, 70, 96, dtype, puts);
    ASSERT_EQ(want.size(), 1u) << to_string(dtype);
    ASSERT_EQ(got.size(), 1u) << to_string(dtype);
    EXPECT_EQ(got[0].count, want[0].count) << to_string(dtype);
    EXPECT_EQ(got[0].count, 4 * 32) << to_string(dtype);
    EXPECT_EQ(got[0].first_at, want[0].first_at) << to_string(dtype);
    EXPECT_EQ(got[0].first_at, "[4, 32]") << to_string(dtype);
    EXPECT_TRUE(std::isnan(got[0].first)) << to_string(dtype);
  }
}

// A shard of many panels is scanned in tasks of 64 panels over the device's threads: the count
// and the first (the lowest in the rows, whichever task finds it) are those of the rows.
TEST(NonfiniteWeightsTest, PanelsScannedInManyTasksReportTheFirstInTheRows) {
  const std::int64_t rows = 16 * 200 + 5;  // 200 panels (4 tasks) and 5 rows
  const std::vector<ScalePut> puts{
      {0, 16 * 150 + 2, 0, 0x7E00},  // NaN in the third task
      {0, 16 * 10 + 7, 1, 0x7C00},   // +inf in the first: the first in the rows
      {0, 16 * 70, 0, 0x7C00},       // +inf in the second
      {0, rows - 2, 1, 0xFC00},      // -inf in the rows after the panels
  };
  const auto [want, got] = found_by_rows_and_in_panels(
      mesh_of(1, {"tp"}), sharding::PartitionSpec({{}, {}}), rows, 64, DType::kQ8_0, puts);
  ASSERT_EQ(want.size(), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].count, 4 * 32);
  EXPECT_EQ(got[0].count, want[0].count);
  EXPECT_EQ(got[0].first_at, "[167, 32]");
  EXPECT_EQ(got[0].first_at, want[0].first_at);
  EXPECT_EQ(got[0].first, std::numeric_limits<float>::infinity());
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
