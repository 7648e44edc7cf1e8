#include "numesh/runtime/collectives.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A mesh shape to test on: the synthetic topology that makes its devices, and its dims.
struct MeshCase {
  std::string topology;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

std::string case_name(const ::testing::TestParamInfo<MeshCase>& info) {
  std::string n = "mesh";
  for (std::size_t i = 0; i < info.param.dims.size(); ++i) {
    n += "_" + info.param.names[i] + std::to_string(info.param.dims[i]);
  }
  return n;
}

std::vector<MeshCase> mesh_cases() {
  return {
      {testing::nodes(1), {1}, {"dp"}},
      {testing::nodes(2), {2}, {"tp"}},
      {testing::nodes(2), {1, 2}, {"dp", "tp"}},
      {"package:2 numa:2 core:1 pu:1", {2, 2}, {"dp", "tp"}},
      {"package:2 numa:2 core:1 pu:1", {4}, {"ep"}},
      {testing::nodes(8), {2, 2, 2}, {"dp", "fsdp", "tp"}},
      {testing::nodes(8), {2, 4}, {"dp", "tp"}},
      {testing::nodes(8), {8}, {"sp"}},
  };
}

// Every subset of the mesh axes, the empty one included.
std::vector<std::vector<std::string>> axis_subsets(const std::vector<std::string>& names) {
  std::vector<std::vector<std::string>> out;
  for (unsigned mask = 0; mask < (1u << names.size()); ++mask) {
    std::vector<std::string> s;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (mask & (1u << i)) s.push_back(names[i]);
    }
    out.push_back(s);
  }
  return out;
}

// Per-slot buffers of `count` floats on the slot's device.
struct Buffers {
  std::vector<Tensor> tensors;
  std::vector<BufferView> views;
  Buffers(const DeviceMesh& mesh, std::size_t count) {
    for (std::int64_t s = 0; s < mesh.size(); ++s) {
      tensors.emplace_back(mesh.device(s),
                           std::vector<std::int64_t>{static_cast<std::int64_t>(count)});
    }
    for (auto& t : tensors) views.push_back(view(t));
  }
  std::vector<float> values(std::size_t slot) const {
    auto v = tensors[slot].values();
    return {v.begin(), v.end()};
  }
};

// A distinct, exactly representable value for (slot, element).
float input_value(std::int64_t slot, std::size_t i) {
  return static_cast<float>((slot + 1) * 1000 + static_cast<std::int64_t>(i % 977)) * 0.25f;
}

void fill_inputs(Buffers& in) {
  for (std::size_t s = 0; s < in.tensors.size(); ++s) {
    auto v = in.tensors[s].values();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = input_value(static_cast<std::int64_t>(s), i);
  }
}

class CollectivesTest : public ::testing::TestWithParam<MeshCase> {
 protected:
  DeviceMesh mesh() const {
    return DeviceMesh::create(testing::synthetic_devices(GetParam().topology), GetParam().dims,
                              GetParam().names);
  }
};

TEST_P(CollectivesTest, AllReduceSumAndMaxEqualTheHostReductionOverEveryAxisSubset) {
  const DeviceMesh m = mesh();
  for (const auto& axes : axis_subsets(GetParam().names)) {
    for (std::size_t count : {std::size_t{5}, std::size_t{40000}}) {  // direct and rs+ag
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        // kHierarchical within one process is reduce-scatter + all-gather.
        for (auto algo :
             {AllReduceAlgorithm::kAuto, AllReduceAlgorithm::kDirect,
              AllReduceAlgorithm::kReduceScatterAllGather, AllReduceAlgorithm::kHierarchical}) {
          Buffers in(m, count), out(m, count);
          fill_inputs(in);
          GraphBuilder b(m.device_set());
          all_reduce(b, m, in.views, out.views, count, op, {.axes = axes, .after = {}, .name = {}},
                     algo);
          CompiledGraph g = b.compile();
          g.run();
          g.run();  // runs again with the same result
          for (const auto& group : m.groups(axes)) {
            std::vector<float> expected(count);
            for (std::size_t i = 0; i < count; ++i) {
              float acc = input_value(group[0], i);
              for (std::size_t r = 1; r < group.size(); ++r) {
                const float x = input_value(group[r], i);
                acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
              }
              expected[i] = acc;
            }
            for (std::int64_t s : group) {
              ASSERT_EQ(out.values(static_cast<std::size_t>(s)), expected)
                  << "slot " << s << " count " << count << " op " << to_string(op);
            }
          }
        }
      }
    }
  }
}

TEST_P(CollectivesTest, AllGatherConcatenatesInRankOrder) {
  const DeviceMesh m = mesh();
  for (const auto& axes : axis_subsets(GetParam().names)) {
    const auto groups = m.groups(axes);
    const std::size_t ranks = groups.front().size();
    // 300000 floats (1.2 MB) takes the non-temporal copy path.
    const std::size_t count = m.size() <= 2 ? 300000 : 33;
    Buffers in(m, count), out(m, count * ranks);
    fill_inputs(in);
    GraphBuilder b(m.device_set());
    all_gather(b, m, in.views, out.views, count, {.axes = axes, .after = {}, .name = {}});
    b.compile().run();
    for (const auto& group : groups) {
      std::vector<float> expected;
      for (std::int64_t t : group) {
        for (std::size_t i = 0; i < count; ++i) expected.push_back(input_value(t, i));
      }
      for (std::int64_t s : group) EXPECT_EQ(out.values(static_cast<std::size_t>(s)), expected);
    }
  }
}

TEST_P(CollectivesTest, ReduceScatterGivesRankRItsChunkOfTheSum) {
  const DeviceMesh m = mesh();
  for (const auto& axes : axis_subsets(GetParam().names)) {
    const auto groups = m.groups(axes);
    const std::size_t ranks = groups.front().size();
    const std::size_t chunk = 7, count = chunk * ranks;
    Buffers in(m, count), out(m, chunk);
    fill_inputs(in);
    GraphBuilder b(m.device_set());
    reduce_scatter(b, m, in.views, out.views, count, ReduceOp::kSum,
                   {.axes = axes, .after = {}, .name = {}});
    b.compile().run();
    for (const auto& group : groups) {
      for (std::size_t r = 0; r < ranks; ++r) {
        std::vector<float> expected(chunk);
        for (std::size_t i = 0; i < chunk; ++i) {
          float acc = input_value(group[0], r * chunk + i);
          for (std::size_t k = 1; k < ranks; ++k) acc += input_value(group[k], r * chunk + i);
          expected[i] = acc;
        }
        EXPECT_EQ(out.values(static_cast<std::size_t>(group[r])), expected);
      }
    }
  }
}

TEST_P(CollectivesTest, AllToAllEvenAndUnevenDeliverEveryPiece) {
  const DeviceMesh m = mesh();
  for (const auto& axes : axis_subsets(GetParam().names)) {
    const auto groups = m.groups(axes);
    const std::size_t ranks = groups.front().size();
    for (bool uneven : {false, true}) {
      std::vector<std::vector<std::size_t>> counts(ranks, std::vector<std::size_t>(ranks, 3));
      if (uneven) {
        for (std::size_t i = 0; i < ranks; ++i) {
          for (std::size_t j = 0; j < ranks; ++j) counts[i][j] = (i * 3 + j * 5) % 4;  // zeros too
        }
      }
      std::size_t max_total = 1;
      for (std::size_t i = 0; i < ranks; ++i) {
        std::size_t send = 0, recv = 0;
        for (std::size_t j = 0; j < ranks; ++j) {
          send += counts[i][j];
          recv += counts[j][i];
        }
        max_total = std::max({max_total, send, recv});
      }
      Buffers in(m, max_total), out(m, max_total);
      fill_inputs(in);
      GraphBuilder b(m.device_set());
      all_to_all(b, m, in.views, out.views, counts, {.axes = axes, .after = {}, .name = {}});
      b.compile().run();
      for (const auto& group : groups) {
        for (std::size_t j = 0; j < ranks; ++j) {
          std::vector<float> expected;
          for (std::size_t i = 0; i < ranks; ++i) {
            std::size_t offset = 0;
            for (std::size_t k = 0; k < j; ++k) offset += counts[i][k];
            for (std::size_t e = 0; e < counts[i][j]; ++e) {
              expected.push_back(input_value(group[i], offset + e));
            }
          }
          auto got = out.values(static_cast<std::size_t>(group[j]));
          got.resize(expected.size());
          EXPECT_EQ(got, expected) << "rank " << j << (uneven ? " uneven" : " even");
        }
      }
    }
  }
}

TEST_P(CollectivesTest, BroadcastAndPermuteMoveWholeBuffers) {
  const DeviceMesh m = mesh();
  for (const auto& axes : axis_subsets(GetParam().names)) {
    const auto groups = m.groups(axes);
    const auto ranks = static_cast<std::int64_t>(groups.front().size());
    const std::size_t count = 19;
    const std::int64_t root = ranks - 1;
    Buffers in(m, count), bcast(m, count), perm(m, count);
    fill_inputs(in);
    GraphBuilder b(m.device_set());
    broadcast(b, m, in.views, bcast.views, count, root, {.axes = axes, .after = {}, .name = {}});
    permute(b, m, in.views, perm.views, count, 1, {.axes = axes, .after = {}, .name = {}});
    b.compile().run();
    for (const auto& group : groups) {
      for (std::int64_t r = 0; r < ranks; ++r) {
        const auto s = static_cast<std::size_t>(group[static_cast<std::size_t>(r)]);
        EXPECT_EQ(bcast.values(s),
                  in.values(static_cast<std::size_t>(group[static_cast<std::size_t>(root)])));
        const auto from = group[static_cast<std::size_t>((r - 1 + ranks) % ranks)];
        EXPECT_EQ(perm.values(s), in.values(static_cast<std::size_t>(from)));
      }
    }
  }
}

TEST_P(CollectivesTest, ChainedCollectivesFollowTheirFrontier) {
  // all_reduce over every axis, then an all_gather of the result: the second stage must see
  // the first stage's output.
  const DeviceMesh m = mesh();
  const std::size_t count = 11;
  const auto n = static_cast<std::size_t>(m.size());
  Buffers in(m, count), mid(m, count), out(m, count * n);
  fill_inputs(in);
  GraphBuilder b(m.device_set());
  Frontier f = all_reduce(b, m, in.views, mid.views, count, ReduceOp::kSum,
                          {.axes = GetParam().names, .after = {}, .name = {}});
  all_gather(b, m, mid.views, out.views, count,
             {.axes = GetParam().names, .after = f, .name = "ag"});
  b.compile().run();
  std::vector<float> sum(count, 0.0f);
  for (std::size_t i = 0; i < count; ++i) {
    float acc = input_value(0, i);
    for (std::int64_t s = 1; s < m.size(); ++s) acc += input_value(s, i);
    sum[i] = acc;
  }
  std::vector<float> expected;
  for (std::size_t k = 0; k < n; ++k) expected.insert(expected.end(), sum.begin(), sum.end());
  for (std::size_t s = 0; s < n; ++s) EXPECT_EQ(out.values(s), expected);
}

INSTANTIATE_TEST_SUITE_P(Meshes, CollectivesTest, ::testing::ValuesIn(mesh_cases()), case_name);

TEST(CollectivesErrorsTest, BadArgumentsNameWhatIsWrong) {
  const DeviceMesh m = testing::mesh_2x2();
  Buffers in(m, 8), out(m, 8), small(m, 4);
  GraphBuilder b(m.device_set());
  const CollectiveArgs tp{.axes = {"tp"}, .after = {}, .name = {}};
  EXPECT_THAT(
      [&] {
        all_reduce(b, m, in.views, out.views, 8, ReduceOp::kSum,
                   {.axes = {"xp"}, .after = {}, .name = {}});
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'xp' is not in the mesh (axes: dp, tp)")));
  EXPECT_THAT([&] { all_reduce(b, m, in.views, small.views, 8, ReduceOp::kSum, tp); },
              ThrowsMessage<ValueError>(
                  HasSubstr("all_reduce: the output of slot 0 holds 4 elements, needs 8")));
  EXPECT_THAT([&] { all_reduce(b, m, in.views, in.views, 8, ReduceOp::kSum, tp); },
              ThrowsMessage<ValueError>(HasSubstr("overlaps the input of slot 0")));
  std::vector<BufferView> three(in.views.begin(), in.views.begin() + 3);
  EXPECT_THAT([&] { all_gather(b, m, three, out.views, 4, tp); },
              ThrowsMessage<ValueError>(
                  HasSubstr("one input and one output view per mesh slot (4), got 3 and 4")));
  EXPECT_THAT([&] { reduce_scatter(b, m, in.views, small.views, 7, ReduceOp::kSum, tp); },
              ThrowsMessage<ValueError>(
                  HasSubstr("7 elements do not split evenly over groups of 2 devices")));
  EXPECT_THAT(
      [&] {
        all_to_all(b, m, in.views, out.views, {{1, 1}}, tp);
      },
      ThrowsMessage<ValueError>(HasSubstr("send_counts has 1 rows, the groups have 2 devices")));
  EXPECT_THAT(
      [&] { broadcast(b, m, in.views, out.views, 8, 2, tp); },
      ThrowsMessage<ValueError>(HasSubstr("root rank 2 is outside the groups of 2 devices")));
  EXPECT_THAT(
      [&] {
        all_reduce(b, m, in.views, out.views, 8, ReduceOp::kSum,
                   {.axes = {"tp", "tp"}, .after = {}, .name = {}});
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh axis 'tp' is given twice")));
  EXPECT_THAT(
      [&] {
        all_reduce(b, m, in.views, out.views, 8, ReduceOp::kSum,
                   {.axes = {"tp"}, .after = {0}, .name = {}});
      },
      ThrowsMessage<ValueError>(HasSubstr("the frontier has 1 entries, the mesh has 4 slots")));
  EXPECT_EQ(b.size(), 0u) << "a rejected collective adds no node";
}

}  // namespace
}  // namespace numesh::runtime
