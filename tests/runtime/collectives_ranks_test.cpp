// Collectives on meshes that span ranks, the ranks as threads (make_thread_transports): every
// collective over every axis subset gives the bits one process gives on the same mesh
// (collectives_across_ranks.hpp). The same checks run across processes under mpirun in
// tests/runtime_mpi/collectives_mpi_test.cpp.

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "collectives_across_ranks.hpp"
#include "scoped_environment.hpp"
#include "thread_ranks.hpp"

namespace numesh::runtime {
namespace {

class CollectivesAcrossRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesAcrossRanksTest, BufferCollectivesGiveTheBitsOfOneProcess) {
  testing::on_thread_ranks(GetParam(), across_ranks::buffer_collectives_match_one_process);
}

TEST_P(CollectivesAcrossRanksTest, ShardedCollectivesGiveTheBitsOfOneProcess) {
  testing::on_thread_ranks(GetParam(), across_ranks::sharded_collectives_match_one_process);
}

TEST_P(CollectivesAcrossRanksTest, AFailedRunStopsTheRanksThatNeedIt) {
  testing::on_thread_ranks(GetParam(), across_ranks::a_failed_run_stops_the_ranks_that_need_it);
}

// A collective on 1000 fp32 elements a slot, over two slots, adding its nodes.
using AddCollective = std::function<void(GraphBuilder&, const DeviceMesh&, std::span<BufferView>,
                                         std::span<BufferView>, const CollectiveArgs&)>;

// A reduce-scatter + all-gather all-reduce.
void add_all_reduce(GraphBuilder& b, const DeviceMesh& m, std::span<BufferView> in,
                    std::span<BufferView> out, const CollectiveArgs& args) {
  all_reduce(b, m, in, out, 1000, ReduceOp::kSum, args,
             AllReduceAlgorithm::kReduceScatterAllGather);
}

// An all-gather of 500 elements a slot.
void add_all_gather(GraphBuilder& b, const DeviceMesh& m, std::span<BufferView> in,
                    std::span<BufferView> out, const CollectiveArgs& args) {
  all_gather(b, m, in, out, 500, args);
}

// The nodes `add` adds (named "c"), in pieces of `piece_bytes`, on rank `rank` of `transport`
// (a mesh of `per_rank` devices on each of two ranks, over axis "dp", its slots' parts
// crossing between the ranks) or, with a null transport, in one process (a mesh of 2 x
// per_rank devices). Each slot's buffers hold `elements` elements of `dtype` (f32, bf16 or f16).
std::vector<NodeInfo> collective_nodes(const std::shared_ptr<Transport>& transport,
                                       std::size_t piece_bytes, const AddCollective& add,
                                       int per_rank = 1, std::size_t elements = 1000,
                                       DType dtype = DType::kF32) {
  // Devices of its own, not testing::synthetic_devices' (made once a process): a mesh across
  // ranks of one host makes its devices allocate from shared memory from then on, which later
  // tests of the cached devices would meet.
  PlacementOptions options;
  options.max_threads_per_device = 1;
  const std::int64_t slots = 2 * per_rank;
  const auto devices = DeviceSet::create(
      Topology::from_synthetic(testing::nodes(transport ? per_rank : 2 * per_rank)), options);
  const DeviceMesh mesh = transport ? DeviceMesh::create(devices, transport, {slots}, {"dp"})
                                    : DeviceMesh::create(devices, {slots}, {"dp"});
  const auto n = static_cast<std::size_t>(slots);
  std::vector<std::vector<float>> buffers(2 * n, std::vector<float>(elements, 1.0f));
  std::vector<BufferView> in(n), out(n);
  for (std::int64_t s = 0; s < slots; ++s) {
    const auto i = static_cast<std::size_t>(s);
    in[i] = {mesh.is_local(s) ? buffers[i].data() : nullptr, elements, dtype};
    out[i] = {mesh.is_local(s) ? buffers[n + i].data() : nullptr, elements, dtype};
  }
  GraphBuilder builder(mesh.device_set());
  add(builder, mesh, in, out,
      CollectiveArgs{.axes = {"dp"}, .after = {}, .name = "c", .piece_bytes = piece_bytes});
  const CompiledGraph graph = builder.compile();
  std::vector<NodeInfo> nodes;
  for (NodeId id = 0; id < graph.size(); ++id) nodes.push_back(graph.node(id));
  return nodes;
}

// The send nodes of `nodes`, in stages of `stages` sends (a window each): each but the first
// two of its stage waits for the one two before it, and for no other send.
void expect_sends_two_at_a_time(const std::vector<NodeInfo>& nodes,
                                const std::vector<std::size_t>& stages) {
  std::vector<NodeId> sends;
  for (NodeId id = 0; id < nodes.size(); ++id) {
    if (nodes[id].name.find(".send[") != std::string::npos) sends.push_back(id);
  }
  ASSERT_EQ(sends.size(), std::accumulate(stages.begin(), stages.end(), std::size_t{0}));
  std::size_t first = 0;  // of the stage
  for (const std::size_t stage : stages) {
    for (std::size_t i = first; i < first + stage; ++i) {
      const auto& deps = nodes[sends[i]].deps;
      for (std::size_t j = 0; j < sends.size(); ++j) {
        const bool waits = std::find(deps.begin(), deps.end(), sends[j]) != deps.end();
        EXPECT_EQ(waits, i >= first + 2 && j == i - 2) << "send " << i << " waits for send " << j;
      }
    }
    first += stage;
  }
}

std::vector<std::string> names_of(const std::vector<NodeInfo>& nodes) {
  std::vector<std::string> names;
  for (const NodeInfo& n : nodes) names.push_back(n.name);
  return names;
}

TEST(CollectivesPipelineTest, ReductionsAcrossRanksGoInPiecesWhoseSendsStartTwoAtATime) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    // Each rank's 500-element part in pieces of 100 elements (400 bytes): five reductions, five
    // gathers, and the slot's entry joining them.
    const auto nodes = collective_nodes(transport, 400, add_all_reduce);
    const std::int64_t slot = transport->rank();
    for (int k = 0; k < 5; ++k) {
      EXPECT_THAT(names_of(nodes), ::testing::Contains(fmt::format("c.rs.{}[{}]", k, slot)));
      EXPECT_THAT(names_of(nodes), ::testing::Contains(fmt::format("c.ag.{}[{}]", k, slot)));
    }
    EXPECT_THAT(names_of(nodes),
                ::testing::Not(::testing::Contains(fmt::format("c.rs.5[{}]", slot))));
    const auto join = std::find_if(nodes.begin(), nodes.end(), [&](const NodeInfo& n) {
      return n.name == fmt::format("c[{}]", slot);
    });
    ASSERT_NE(join, nodes.end());
    EXPECT_EQ(join->deps.size(), 20u) << "5 reductions, 5 gathers and 10 sends";
    // Ten sends to the peer: five input pieces, then five reduced pieces, a window each.
    expect_sends_two_at_a_time(nodes, {5, 5});
    // Parts of at most piece_bytes, or piece_bytes 0, stay whole.
    for (const std::size_t whole : {std::size_t{2000}, std::size_t{0}}) {
      const auto names = names_of(collective_nodes(transport, whole, add_all_reduce));
      EXPECT_THAT(names, ::testing::Contains(fmt::format("c.rs[{}]", slot))) << whole;
      EXPECT_THAT(names, ::testing::Contains(fmt::format("c.ag[{}]", slot))) << whole;
      EXPECT_THAT(names, ::testing::Not(::testing::Contains(fmt::format("c[{}]", slot)))) << whole;
    }
  });
}

TEST(CollectivesPipelineTest, CopiesFromOtherRanksGoInPieces) {
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    // The other rank's 500 elements in pieces of 100 (400 bytes): a node each, the own part
    // copied whole, and the slot's entry joining them.
    const auto nodes = collective_nodes(transport, 400, add_all_gather);
    const std::int64_t slot = transport->rank();
    const auto names = names_of(nodes);
    for (int k = 0; k < 5; ++k)
      EXPECT_THAT(names, ::testing::Contains(fmt::format("c.{}[{}]", k, slot)));
    EXPECT_THAT(names, ::testing::Not(::testing::Contains(fmt::format("c.5[{}]", slot))));
    EXPECT_THAT(names, ::testing::IsSupersetOf(
                           {fmt::format("c.whole[{}]", slot), fmt::format("c[{}]", slot)}));
    expect_sends_two_at_a_time(nodes, {5});
    // As few pieces as hold 1800 bytes (450 elements) each, of equal sizes: two of 250.
    const auto two = collective_nodes(transport, 1800, add_all_gather);
    for (int k = 0; k < 3; ++k) {
      const auto it = std::find_if(two.begin(), two.end(), [&](const NodeInfo& n) {
        return n.name == fmt::format("c.{}[{}]", k, slot);
      });
      ASSERT_EQ(it != two.end(), k < 2) << k;
      if (k < 2) {
        EXPECT_EQ(it->bytes, 1000u) << k;
      }
    }
    // At most kMaxPiecesPerPart pieces: the 500 elements in pieces of 1 byte make 256.
    const auto most = names_of(collective_nodes(transport, 1, add_all_gather));
    EXPECT_THAT(most, ::testing::Contains(fmt::format("c.{}[{}]", kMaxPiecesPerPart - 1, slot)));
    EXPECT_THAT(most, ::testing::Not(
                          ::testing::Contains(fmt::format("c.{}[{}]", kMaxPiecesPerPart, slot))));
    const auto whole = names_of(collective_nodes(transport, 2000, add_all_gather));
    EXPECT_THAT(whole, ::testing::Contains(fmt::format("c[{}]", slot)));
    EXPECT_THAT(whole, ::testing::Not(::testing::Contains(fmt::format("c.0[{}]", slot))));
  });
}

// The bytes that `nodes` send to another rank.
std::uint64_t bytes_sent(const std::vector<NodeInfo>& nodes) {
  std::uint64_t sent = 0;
  for (const NodeInfo& n : nodes) {
    if (n.name.find(".send[") != std::string::npos) sent += n.bytes;
  }
  return sent;
}

// An all-reduce of `elements` fp32 elements a slot by `algorithm`.
AddCollective all_reduce_by(AllReduceAlgorithm algorithm, std::size_t elements = 1000) {
  return [algorithm, elements](GraphBuilder& b, const DeviceMesh& m, std::span<BufferView> in,
                               std::span<BufferView> out, const CollectiveArgs& args) {
    all_reduce(b, m, in, out, elements, ReduceOp::kSum, args, algorithm);
  };
}

TEST(CollectivesHierarchicalTest, EachByteCrossesOnceEachWay) {
  // Every byte through the transport, as between hosts: the ranks (threads of one process)
  // would read each other in place otherwise.
  const testing::ScopedEnvironment transport_only("NUMESH_SHARED_MEMORY", "off");
  testing::on_thread_ranks(2, [](const std::shared_ptr<Transport>& transport) {
    // Two devices a rank, a group of four: the chain sends rank 0's partial results of all
    // 1000 elements to rank 1 (4000 bytes) and rank 1's results back (4000 bytes). The two
    // stages send each member's input chunks to their owners (2 x 2 chunks of 250 elements,
    // 4000 bytes) and the two reduced chunks once to the other rank (2000 bytes).
    const auto chain =
        collective_nodes(transport, 0, all_reduce_by(AllReduceAlgorithm::kHierarchical), 2);
    EXPECT_EQ(bytes_sent(chain), 4000u);
    const auto stages = collective_nodes(
        transport, 0, all_reduce_by(AllReduceAlgorithm::kReduceScatterAllGather), 2);
    EXPECT_EQ(bytes_sent(stages), 6000u);
    // Each rank's two devices hold two of the four chunks each: partial results on rank 0, the
    // results on rank 1; every member then copies what it does not hold, and joins.
    const std::int64_t a = 2 * transport->rank(), b = a + 1;
    const std::string stage = transport->rank() == 0 ? "partial" : "rs";
    EXPECT_THAT(names_of(chain),
                ::testing::IsSupersetOf({fmt::format("c.{}[{}]", stage, a),
                                         fmt::format("c.{}[{}]", stage, b),
                                         fmt::format("c.ag[{}]", a), fmt::format("c.ag[{}]", b),
                                         fmt::format("c[{}]", a), fmt::format("c[{}]", b)}));
    // Above kDirectAllReduceBytes, kAuto takes the chain here (the ranks do not read each other
    // in place, and in fp32 the busiest rank sends the buffer once where the two stages send
    // it 1.5 times). Not with one device a rank (the chain would only make the reductions wait
    // for one another while as many bytes cross), not in bf16 (its fp32 partials are twice the
    // buffer's bytes), not with parts sent whole (the chain's stages would not overlap).
    const std::size_t large = kDirectAllReduceBytes / sizeof(float) + 4;
    const auto automatic = all_reduce_by(AllReduceAlgorithm::kAuto, large);
    // The bytes each rank sends tell the two apart on either rank: the chain sends the buffer
    // once (partials, then results), the two stages 1.5 times. With one device a rank, the
    // first rank of the chain reduces nothing (no .rs node there).
    const auto chosen = collective_nodes(transport, kPipelinePieceBytes, automatic, 2, large);
    EXPECT_EQ(bytes_sent(chosen), large * sizeof(float));
    EXPECT_THAT(names_of(chosen), ::testing::Contains(fmt::format("c.{}[{}]", stage, a)));
    EXPECT_THAT(names_of(collective_nodes(transport, kPipelinePieceBytes, automatic, 1, large)),
                ::testing::Contains(fmt::format("c.rs[{}]", transport->rank())));
    EXPECT_EQ(bytes_sent(collective_nodes(transport, kPipelinePieceBytes,
                                          all_reduce_by(AllReduceAlgorithm::kAuto, 2 * large), 2,
                                          2 * large, DType::kBF16)),
              3 * (2 * large) * 2 / 2)
        << "bf16: the two stages";
    EXPECT_EQ(bytes_sent(collective_nodes(transport, 0, automatic, 2, large)),
              3 * large * sizeof(float) / 2)
        << "whole parts: the two stages";
    // In pieces of 400 bytes: rank 0's member a holds chunks 0 and 2 (250 elements, 1000 bytes
    // each) in three pieces each; a chain of pieces, each reduced as it arrives.
    const auto pieces = names_of(
        collective_nodes(transport, 400, all_reduce_by(AllReduceAlgorithm::kHierarchical), 2));
    for (int k = 0; k < 3; ++k) {
      EXPECT_THAT(pieces, ::testing::Contains(fmt::format("c.{}.{}[{}]", stage, k, a))) << k;
      EXPECT_THAT(pieces, ::testing::Contains(fmt::format("c.ag.{}[{}]", k, a))) << k;
    }
    EXPECT_THAT(pieces, ::testing::Not(::testing::Contains(fmt::format("c.{}.3[{}]", stage, a))));
    // With the default pieces (4 MiB), parts of 1 MiB still go in four (kChainPieces), of
    // 256 KiB each, so that the chain's stages overlap.
    const std::size_t mib = 4 * (std::size_t{1} << 18);  // four parts of 2^18 elements
    const auto quarters =
        names_of(collective_nodes(transport, kPipelinePieceBytes,
                                  all_reduce_by(AllReduceAlgorithm::kHierarchical, mib), 2, mib));
    EXPECT_THAT(quarters, ::testing::Contains(fmt::format("c.{}.3[{}]", stage, a)));
    EXPECT_THAT(quarters, ::testing::Not(::testing::Contains(fmt::format("c.{}.4[{}]", stage, a))));
  });
}

TEST(CollectivesHierarchicalTest, RanksThatReadInPlaceKeepTwoStagesUnlessAsked) {
  const std::size_t large = kDirectAllReduceBytes / sizeof(float) + 4;
  const auto automatic = all_reduce_by(AllReduceAlgorithm::kAuto, large);
  {
    // Every transfer read in place (the threads' ranks share a host): nothing is staged, kAuto
    // keeps the two stages; asked, the chain runs.
    const testing::ScopedEnvironment every("NUMESH_IN_PLACE_MIN_BYTES", "0");
    testing::on_thread_ranks(2, [&](const std::shared_ptr<Transport>& transport) {
      const std::int64_t a = 2 * transport->rank();
      const auto chosen =
          names_of(collective_nodes(transport, kPipelinePieceBytes, automatic, 2, large));
      EXPECT_THAT(chosen, ::testing::Contains(fmt::format("c.rs[{}]", a)));
      EXPECT_THAT(chosen, ::testing::Not(::testing::Contains(::testing::HasSubstr("partial"))));
      const auto asked = names_of(
          collective_nodes(transport, kPipelinePieceBytes,
                           all_reduce_by(AllReduceAlgorithm::kHierarchical, large), 2, large));
      EXPECT_THAT(asked, ::testing::Contains(fmt::format(
                             "c.{}[{}]", transport->rank() == 0 ? "partial" : "rs", a)));
    });
  }
  // With the default floor (1 MiB), parts of 16 KiB take the transport even between ranks
  // that read each other in place: the chain.
  testing::on_thread_ranks(2, [&](const std::shared_ptr<Transport>& transport) {
    EXPECT_EQ(bytes_sent(collective_nodes(transport, kPipelinePieceBytes, automatic, 2, large)),
              large * sizeof(float));
  });
}

TEST(CollectivesPipelineTest, CollectivesWithinOneProcessStayWhole) {
  EXPECT_THAT(names_of(collective_nodes(nullptr, 400, add_all_reduce)),
              ::testing::UnorderedElementsAre("c.rs[0]", "c.rs[1]", "c.ag[0]", "c.ag[1]"));
  EXPECT_THAT(names_of(collective_nodes(nullptr, 400, add_all_gather)),
              ::testing::UnorderedElementsAre("c[0]", "c[1]"));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesAcrossRanksTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "_ranks";
                         });

}  // namespace
}  // namespace numesh::runtime
