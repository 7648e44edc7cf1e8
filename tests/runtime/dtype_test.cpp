// 16-bit tensors in the runtime: storage, scatter and gather with rounding, and every collective
// on bf16 and f16 buffers and sharded tensors (copies move the 16-bit bits; reductions widen,
// combine in fp32 in rank order and round once).

#include "numesh/core/dtype.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/tensor.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr DType k16BitTypes[] = {DType::kBF16, DType::kF16};

std::uint16_t round_to(DType t, float x) {
  return t == DType::kBF16 ? bf16_from_f32(x) : f16_from_f32(x);
}
float widen(DType t, std::uint16_t h) {
  return t == DType::kBF16 ? f32_from_bf16(h) : f32_from_f16(h);
}

DeviceMesh mesh_of(const std::string& topology, std::vector<std::int64_t> dims,
                   std::vector<std::string> names) {
  return DeviceMesh::create(testing::synthetic_devices(topology), std::move(dims),
                            std::move(names));
}

// Values that do not fit 16 bits exactly, in f16's range, so rounding matters.
std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(DTypeTensorTest, SixteenBitTensorsHoldBitsAndRefuseTheFloatView) {
  const DeviceMesh m = mesh_of(testing::nodes(1), {1}, {"dp"});
  for (DType t : k16BitTypes) {
    Tensor x(m.device(0), {3, 5}, t);
    EXPECT_EQ(x.dtype(), t);
    EXPECT_EQ(x.size_bytes(), 30u);
    EXPECT_EQ(x.bits16().size(), 15u);
    EXPECT_EQ(x.buffer().size_bytes(), 30u) << "16-bit storage is half the bytes of fp32";
    EXPECT_THAT([&] { (void)x.values(); },
                ThrowsMessage<TypeError>(HasSubstr(
                    fmt::format("tensor of shape (3, 5) holds {} values, not f32", to_string(t)))));
  }
  Tensor f(m.device(0), {4});
  EXPECT_EQ(f.size_bytes(), 16u);
  EXPECT_THAT(
      [&] { (void)f.bits16(); },
      ThrowsMessage<TypeError>(HasSubstr("tensor of shape (4) holds f32 values, not 16-bit ones")));
}

TEST(DTypeTensorTest, ScatterRoundsToNearestEvenAndGatherWidensExactly) {
  const DeviceMesh m = mesh_of(testing::nodes(8), {2, 4}, {"dp", "tp"});
  const std::vector<std::int64_t> shape{6, 40};
  HostTensor host{shape, random_values(240, 7)};
  // A tie (exactly halfway between two bf16 values, odd lower neighbour): rounds up to even.
  host.data[3] = std::bit_cast<float>(0x3F818000u);
  for (DType t : k16BitTypes) {
    for (const auto& spec :
         {sharding::PartitionSpec({"dp", "tp"}),
          sharding::PartitionSpec({sharding::AxisRule(), "tp"}), sharding::PartitionSpec()}) {
      ShardedTensor x(m, shape, spec, t);
      EXPECT_EQ(x.dtype(), t);
      scatter(host, x);
      for (std::int64_t s = 0; s < m.size(); ++s) EXPECT_EQ(x.shard(s).dtype(), t);
      const HostTensor back = gather(x);
      ASSERT_EQ(back.shape, shape);
      for (std::size_t i = 0; i < host.data.size(); ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(back.data[i]),
                  std::bit_cast<std::uint32_t>(widen(t, round_to(t, host.data[i]))))
            << to_string(t) << " " << spec.repr() << " element " << i;
      }
    }
  }
  EXPECT_EQ(bf16_from_f32(std::bit_cast<float>(0x3F818000u)), 0x3F82u) << "the tie case is a tie";
}

// Per-slot 16-bit buffers.
struct Buffers16 {
  DType type;
  std::vector<Tensor> tensors;
  std::vector<BufferView> views;
  Buffers16(const DeviceMesh& mesh, std::size_t count, DType t) : type(t) {
    for (std::int64_t s = 0; s < mesh.size(); ++s) {
      tensors.emplace_back(mesh.device(s),
                           std::vector<std::int64_t>{static_cast<std::int64_t>(count)}, t);
    }
    for (auto& x : tensors) views.push_back(view(x));
  }
  void fill(std::uint32_t seed) {
    for (std::size_t s = 0; s < tensors.size(); ++s) {
      const auto v =
          random_values(tensors[s].bits16().size(), seed + static_cast<std::uint32_t>(s));
      auto bits = tensors[s].bits16();
      for (std::size_t i = 0; i < v.size(); ++i) bits[i] = round_to(type, v[i]);
    }
  }
  std::uint16_t at(std::int64_t slot, std::size_t i) const {
    return tensors[static_cast<std::size_t>(slot)].bits16()[i];
  }
};

TEST(DTypeCollectivesTest, AllReduceWidensSumsInRankOrderAndRoundsOnceWithEitherAlgorithm) {
  const DeviceMesh m = mesh_of(testing::nodes(8), {2, 4}, {"dp", "tp"});
  for (DType t : k16BitTypes) {
    for (std::size_t count : {std::size_t{5}, std::size_t{40000}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (auto algo :
             {AllReduceAlgorithm::kDirect, AllReduceAlgorithm::kReduceScatterAllGather}) {
          Buffers16 in(m, count, t), out(m, count, t);
          in.fill(11);
          GraphBuilder b(m.device_set());
          all_reduce(b, m, in.views, out.views, count, op,
                     {.axes = {"tp"}, .after = {}, .name = {}}, algo);
          b.compile().run();
          for (const auto& group : m.groups(std::vector<std::string>{"tp"})) {
            for (std::size_t i = 0; i < count; ++i) {
              float acc = widen(t, in.at(group[0], i));
              for (std::size_t r = 1; r < group.size(); ++r) {
                const float x = widen(t, in.at(group[r], i));
                acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
              }
              for (std::int64_t s : group) {
                ASSERT_EQ(out.at(s, i), round_to(t, acc))
                    << to_string(t) << " count " << count << " slot " << s << " element " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DTypeCollectivesTest, CopyingCollectivesMoveTheBitsAndHalfTheBytes) {
  const DeviceMesh m = mesh_of(testing::nodes(4), {4}, {"tp"});
  const std::size_t count = 1000;
  for (DType t : k16BitTypes) {
    Buffers16 in(m, count, t), gathered(m, 4 * count, t), scattered(m, count / 4, t),
        swapped(m, count, t), sent(m, count, t), shifted(m, count, t);
    in.fill(3);
    GraphBuilder b(m.device_set());
    const CollectiveArgs tp{.axes = {"tp"}, .after = {}, .name = {}};
    const Frontier ag = all_gather(b, m, in.views, gathered.views, count, tp);
    reduce_scatter(b, m, in.views, scattered.views, count, ReduceOp::kSum, tp);
    all_to_all(b, m, in.views, swapped.views,
               std::vector<std::vector<std::size_t>>(4, std::vector<std::size_t>(4, 250)), tp);
    broadcast(b, m, in.views, sent.views, count, 2, tp);
    permute(b, m, in.views, shifted.views, count, 1, tp);
    EXPECT_EQ(b.node(ag[0]).bytes, 3 * count * 2) << "a 16-bit all-gather moves 2 bytes an element";
    b.compile().run();
    for (std::int64_t s = 0; s < 4; ++s) {
      for (std::size_t i = 0; i < count; ++i) {
        for (std::int64_t r = 0; r < 4; ++r) {
          ASSERT_EQ(gathered.at(s, static_cast<std::size_t>(r) * count + i), in.at(r, i));
        }
        ASSERT_EQ(sent.at(s, i), in.at(2, i));
        ASSERT_EQ(shifted.at(s, i), in.at((s + 3) % 4, i));
        // all_to_all: slot s receives piece s (250 elements) of every rank, in rank order.
        ASSERT_EQ(swapped.at(s, i), in.at(static_cast<std::int64_t>(i / 250),
                                          static_cast<std::size_t>(s) * 250 + i % 250));
      }
      for (std::size_t i = 0; i < count / 4; ++i) {
        float acc = 0.0f;
        for (std::int64_t r = 0; r < 4; ++r)
          acc += widen(t, in.at(r, static_cast<std::size_t>(s) * (count / 4) + i));
        ASSERT_EQ(scattered.at(s, i), round_to(t, acc));
      }
    }
  }
}

TEST(DTypeCollectivesTest, ShardedCollectivesKeepTheDtype) {
  const DeviceMesh m = mesh_of(testing::nodes(4), {2, 2}, {"dp", "tp"});
  const std::vector<std::int64_t> shape{8, 12};
  const HostTensor host{shape, random_values(96, 5)};
  for (DType t : k16BitTypes) {
    // All-gather over tp: the gathered tensor holds the same 16-bit values.
    ShardedTensor split(m, shape, sharding::PartitionSpec({"dp", "tp"}), t);
    ShardedTensor rows(m, shape, sharding::PartitionSpec({"dp"}), t);
    scatter(host, split);
    GraphBuilder b(m.device_set());
    redistribute(b, split, rows, {.axes = {"tp"}, .after = {}, .name = {}});
    // Partial sums: every slot holds the whole tensor; the sum over tp is twice each value.
    ShardedTensor partial(m, shape, sharding::PartitionSpec(), t),
        summed(m, shape, sharding::PartitionSpec(), t),
        reduced(m, shape, sharding::PartitionSpec({sharding::AxisRule(), "tp"}), t);
    scatter(host, partial);
    all_reduce(b, partial, summed, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
    reduce_scatter(b, partial, reduced, ReduceOp::kSum, {.axes = {"tp"}, .after = {}, .name = {}});
    b.compile().run();
    const HostTensor g = gather(rows), s = gather(summed), r = gather(reduced);
    for (std::size_t i = 0; i < host.data.size(); ++i) {
      const float v = widen(t, round_to(t, host.data[i]));
      ASSERT_EQ(g.data[i], v) << to_string(t) << " element " << i;
      ASSERT_EQ(s.data[i], widen(t, round_to(t, v + v)));
      ASSERT_EQ(r.data[i], widen(t, round_to(t, v + v)));
    }
    ShardedTensor f32(m, shape, sharding::PartitionSpec({"dp"}));
    GraphBuilder b2(m.device_set());
    EXPECT_THAT([&] { redistribute(b2, split, f32, {.axes = {"tp"}, .after = {}, .name = {}}); },
                ThrowsMessage<ValueError>(HasSubstr(fmt::format(
                    "redistribute: input is {} and output is f32; collectives keep the dtype",
                    to_string(t)))));
  }
}

TEST(DTypeCollectivesTest, MixedDtypesAreRefusedNamingTheSlot) {
  const DeviceMesh m = mesh_of(testing::nodes(2), {2}, {"tp"});
  Buffers16 in(m, 8, DType::kBF16), out(m, 8, DType::kBF16);
  std::vector<Tensor> f32;
  for (std::int64_t s = 0; s < 2; ++s) f32.emplace_back(m.device(s), std::vector<std::int64_t>{8});
  std::vector<BufferView> mixed = out.views;
  mixed[1] = view(f32[1]);
  GraphBuilder b(m.device_set());
  EXPECT_THAT(
      [&] { all_gather(b, m, in.views, mixed, 4, {.axes = {"tp"}, .after = {}, .name = {}}); },
      ThrowsMessage<ValueError>(HasSubstr("all_gather: slot 1 has bf16 input and f32 output views, "
                                          "slot 0 has bf16 input: one dtype per collective")));
  EXPECT_EQ(b.size(), 0u);
}

}  // namespace
}  // namespace numesh::runtime
