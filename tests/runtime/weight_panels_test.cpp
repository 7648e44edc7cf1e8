#include "numesh/runtime/weight_panels.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/tensor.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A matrix of n rows whose every byte names its place: byte b of block t of output o holds
// (o * 31 + t * 7 + b) mod 251, so a byte out of place shows.
std::vector<std::byte> labelled_rows(DType dtype, std::int64_t n, std::int64_t k) {
  const std::int64_t block = traits(dtype).block_bytes, blocks = k / 32;
  std::vector<std::byte> rows(static_cast<std::size_t>(n * row_bytes(dtype, k)));
  for (std::int64_t o = 0; o < n; ++o) {
    for (std::int64_t t = 0; t < blocks; ++t) {
      for (std::int64_t b = 0; b < block; ++b) {
        rows[static_cast<std::size_t>((o * blocks + t) * block + b)] =
            static_cast<std::byte>((o * 31 + t * 7 + b) % 251);
      }
    }
  }
  return rows;
}

// Each kernel level's rows_to_panels (a level this CPU cannot run is a skip naming it).
class WeightPanelsLevelTest : public numesh::testing::KernelLevelTest {};

// The panel layout, as the header states it, byte by byte: for each panel and block, the 16
// scales, then unit u of output o at 32 + 64u + 4o; the last n mod 16 outputs as rows.
TEST_P(WeightPanelsLevelTest, PanelsHoldTheHeadersLayoutAndTheTailStaysRows) {
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    const std::int64_t n = 37, k = 96, blocks = 3, block = traits(dtype).block_bytes;
    const std::int64_t units = (block - 2) / 4, row = blocks * block;
    const std::vector<std::byte> rows = labelled_rows(dtype, n, k);
    std::vector<std::byte> panels(rows.size());
    rows_to_panels(dtype, n, k, rows, panels, level());
    const auto row_byte = [&](std::int64_t o, std::int64_t t, std::int64_t b) {
      return rows[static_cast<std::size_t>(o * row + t * block + b)];
    };
    for (std::int64_t p = 0; p < 2; ++p) {
      for (std::int64_t t = 0; t < blocks; ++t) {
        const std::byte* at = panels.data() + p * 16 * row + t * 16 * block;
        for (std::int64_t o = 0; o < 16; ++o) {
          EXPECT_EQ(at[2 * o], row_byte(16 * p + o, t, 0)) << to_string(dtype);
          EXPECT_EQ(at[2 * o + 1], row_byte(16 * p + o, t, 1)) << to_string(dtype);
          for (std::int64_t u = 0; u < units; ++u) {
            for (std::int64_t b = 0; b < 4; ++b) {
              ASSERT_EQ(at[32 + 64 * u + 4 * o + b], row_byte(16 * p + o, t, 2 + 4 * u + b))
                  << to_string(dtype) << " panel " << p << " block " << t << " output " << o
                  << " unit " << u;
            }
          }
        }
      }
    }
    for (std::int64_t at = 32 * row; at < n * row; ++at) {
      ASSERT_EQ(panels[static_cast<std::size_t>(at)], rows[static_cast<std::size_t>(at)]) << at;
    }
  }
}

// Random bytes in matrices of whole panels, a tail of rows, no panel at all, odd and even block
// counts: every level writes the scalar level's bytes, in place too, and they come back as rows.
TEST_P(WeightPanelsLevelTest, EqualsTheScalarLevelAndRowsComeBack) {
  std::mt19937 rng(54);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    for (std::int64_t n : {0, 5, 16, 37, 64}) {
      for (std::int64_t k : {32, 96, 800}) {
        std::vector<std::byte> rows(static_cast<std::size_t>(n * row_bytes(dtype, k)));
        for (std::byte& b : rows) b = static_cast<std::byte>(rng());
        std::vector<std::byte> want(rows.size()), panels(rows.size()), back(rows.size());
        rows_to_panels(dtype, n, k, rows, want, KernelLevel::kScalar);
        rows_to_panels(dtype, n, k, rows, panels, level());
        EXPECT_EQ(panels, want) << to_string(dtype) << " [" << n << ", " << k << "]";
        std::vector<std::byte> in_place = rows;
        rows_to_panels_in_place(dtype, n, k, in_place, level());
        EXPECT_EQ(in_place, want) << to_string(dtype) << " [" << n << ", " << k << "] in place";
        panels_to_rows(dtype, n, k, panels, back);
        EXPECT_EQ(back, rows) << to_string(dtype) << " [" << n << ", " << k << "] back";
        if (n >= 16) {
          EXPECT_NE(want, rows) << "the check must tell rows from panels";
        }
      }
    }
  }
}

NUMESH_INSTANTIATE_LEVELS(WeightPanelsLevelTest);

TEST(WeightPanelsTest, RowsComeBackAndInPlaceIsTheSame) {
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    for (std::int64_t n : {0, 5, 16, 35, 64}) {
      const std::int64_t k = 64;
      const std::vector<std::byte> rows = labelled_rows(dtype, n, k);
      std::vector<std::byte> panels(rows.size()), back(rows.size());
      rows_to_panels(dtype, n, k, rows, panels);
      panels_to_rows(dtype, n, k, panels, back);
      EXPECT_EQ(back, rows) << to_string(dtype) << " n " << n;
      std::vector<std::byte> in_place = rows;
      rows_to_panels_in_place(dtype, n, k, in_place);
      EXPECT_EQ(in_place, panels) << to_string(dtype) << " n " << n;
      if (n >= 16) {
        EXPECT_NE(panels, rows) << to_string(dtype) << " n " << n;
      }
    }
  }
}

TEST(WeightPanelsTest, RefusesOtherFormatsPartialBlocksAndWrongSizes) {
  std::vector<std::byte> a(34 * 16), b(34 * 16);
  EXPECT_THAT([&] { rows_to_panels(DType::kQ4_K, 16, 256, a, b); },
              ThrowsMessage<TypeError>(HasSubstr("rows_to_panels: q4_k weights have no panel")));
  EXPECT_THAT([&] { rows_to_panels(DType::kBF16, 16, 32, a, b); },
              ThrowsMessage<TypeError>(HasSubstr("bf16 weights have no panel layout")));
  EXPECT_THAT([&] { panels_to_rows(DType::kQ8_0, 16, 40, a, b); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("panels_to_rows: a [16, 40] q8_0 matrix: sizes must be >= 0 and each "
                            "row whole blocks of 32")));
  EXPECT_THAT([&] { rows_to_panels(DType::kQ8_0, -1, 32, a, b); },
              ThrowsMessage<ShapeError>(HasSubstr("a [-1, 32] q8_0 matrix")));
  std::vector<std::byte> short_one(34 * 15);
  EXPECT_THAT([&] { rows_to_panels(DType::kQ8_0, 16, 32, a, short_one); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "rows_to_panels: a [16, 32] q8_0 matrix takes 544 bytes; given 544 and 510")));
  EXPECT_THAT([&] { rows_to_panels_in_place(DType::kQ4_0, 16, 32, short_one); },
              ThrowsMessage<ShapeError>(HasSubstr("a [16, 32] q4_0 matrix takes 288 bytes")));
}

// A tensor of matrices stored in panels: each shard's matrices (its last two dims) in panels,
// filled from rows by scatter (fill_shards arranges them) and gathered back to the same values
// as the tensor stored as rows; experts [E, n, k] each their own panels.
TEST(WeightPanelsTest, ShardedTensorsInPanelsScatterAndGatherTheirRowsValues) {
  const DeviceMesh mesh =
      DeviceMesh::create(testing::synthetic_devices(testing::nodes(4)), {2, 2}, {"dp", "tp"});
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    for (const std::vector<std::int64_t>& shape :
         std::vector<std::vector<std::int64_t>>{{70, 64}, {3, 40, 96}}) {
      HostTensor host = HostTensor::zeros(shape);
      for (std::size_t i = 0; i < host.data.size(); ++i) {
        host.data[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
      }
      const sharding::PartitionSpec spec(
          std::vector<sharding::AxisRule>(shape.size() - 1, sharding::AxisRule()));
      std::vector<sharding::AxisRule> split(shape.size(), sharding::AxisRule());
      split[shape.size() - 2] = sharding::AxisRule("tp");  // outputs split: 35 or 20 a device
      for (const sharding::PartitionSpec& s : {spec, sharding::PartitionSpec(split)}) {
        ShardedTensor rows(mesh, shape, s, dtype);
        ShardedTensor panels(mesh, shape, s, dtype, BufferContents::kZeros, StoredOrder::kPanels);
        scatter(host, rows);
        scatter(host, panels);
        EXPECT_EQ(panels.order(), StoredOrder::kPanels);
        EXPECT_EQ(gather(panels).data, gather(rows).data) << to_string(dtype) << " " << s.repr();
        // Each shard holds its rows' bytes in the panel layout, matrix by matrix.
        const Tensor& r = rows.shard(0);
        const Tensor& p = panels.shard(0);
        ASSERT_EQ(p.size_bytes(), r.size_bytes());
        const std::size_t rank = r.shape().size();
        const std::int64_t n = r.shape()[rank - 2], k = r.shape()[rank - 1];
        const std::int64_t matrix = n * row_bytes(dtype, k);
        std::vector<std::byte> want(static_cast<std::size_t>(matrix));
        for (std::int64_t at = 0; at < static_cast<std::int64_t>(r.size_bytes()); at += matrix) {
          const auto* from = static_cast<const std::byte*>(r.data()) + at;
          rows_to_panels(dtype, n, k, std::span(from, want.size()), want);
          ASSERT_EQ(
              std::memcmp(static_cast<const std::byte*>(p.data()) + at, want.data(), want.size()),
              0)
              << to_string(dtype) << " " << s.repr() << " matrix at byte " << at;
        }
      }
    }
  }
}

// fill_shards' callback writes a panel-stored shard's rows (FillWrites::kRows, which
// fill_shards then arranges in panels) or its panels (kStoredOrder, kept as written: how a
// model's load writes each block of rows once).
TEST(WeightPanelsTest, FillShardsArrangesRowsOrKeepsPanelsAsWritten) {
  const DeviceMesh mesh =
      DeviceMesh::create(testing::synthetic_devices(testing::nodes(2)), {2}, {"tp"});
  const std::vector<std::int64_t> shape{70, 64};  // 35 outputs a device: two panels and 3 rows
  const sharding::PartitionSpec split({sharding::AxisRule("tp"), sharding::AxisRule()});
  for (const FillWrites writes : {FillWrites::kRows, FillWrites::kStoredOrder}) {
    ShardedTensor panels(mesh, shape, split, DType::kQ8_0, BufferContents::kUnspecified,
                         StoredOrder::kPanels);
    ShardedTensor* const tensors[] = {&panels};
    const auto bytes_of = [](std::int64_t slot, std::size_t size) {
      std::vector<std::byte> b(size);
      for (std::size_t i = 0; i < size; ++i)
        b[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(slot) * 7) % 251);
      return b;
    };
    fill_shards(
        tensors,
        [&](std::size_t, std::int64_t slot, Tensor& shard) {
          const std::vector<std::byte> b = bytes_of(slot, shard.size_bytes());
          std::memcpy(shard.data(), b.data(), b.size());
        },
        writes);
    for (std::int64_t slot = 0; slot < 2; ++slot) {
      const Tensor& shard = panels.shard(slot);
      const std::vector<std::byte> written = bytes_of(slot, shard.size_bytes());
      std::vector<std::byte> arranged(written.size());
      rows_to_panels(DType::kQ8_0, 35, 64, written, arranged);
      ASSERT_NE(arranged, written) << "the check must tell the two apart";
      const std::vector<std::byte>& want = writes == FillWrites::kRows ? arranged : written;
      EXPECT_EQ(std::memcmp(shard.data(), want.data(), want.size()), 0)
          << "slot " << slot << (writes == FillWrites::kRows ? ", rows" : ", panels");
    }
  }
}

TEST(WeightPanelsTest, TensorsInPanelsRefuseOtherFormatsAndVectors) {
  const DeviceMesh mesh =
      DeviceMesh::create(testing::synthetic_devices(testing::nodes(1)), {1}, {"dp"});
  const sharding::PartitionSpec none;
  EXPECT_THAT(
      [&] {
        ShardedTensor(mesh, {16, 256}, none, DType::kQ4_K, BufferContents::kZeros,
                      StoredOrder::kPanels);
      },
      ThrowsMessage<TypeError>(
          HasSubstr("a tensor of q4_k stored in panels: only q8_0 and q4_0 weights have panels")));
  EXPECT_THAT(
      [&] {
        ShardedTensor(mesh, {64}, none, DType::kQ8_0, BufferContents::kZeros, StoredOrder::kPanels);
      },
      ThrowsMessage<ShapeError>(HasSubstr(
          "a tensor of shape (64) stored in panels: panels are of matrices (rank 2 or more)")));
  ShardedTensor rows(mesh, {16, 32}, none, DType::kQ8_0);
  EXPECT_THAT([&] { arrange_in_panels(rows.shard(0)); },
              ThrowsMessage<TypeError>(HasSubstr(
                  "arrange_in_panels: a tensor of shape (16, 32) whose order is not panels")));
}

}  // namespace
}  // namespace numesh::runtime
