#pragma once

// Programs on a mesh that spans ranks give the bits of the same programs on the same mesh in
// one process: the transformer stack (attention, MLP and MoE, prefill, insert and decode) and a
// training step of a whole language model (loss, every gradient, the gradient norm and an AdamW
// step). Written once and run by each rank: by threads over make_thread_transports in ops_test,
// and by processes under mpirun in ops_mpi_test. Each rank builds the mesh from devices of its
// own and compares what it holds (the outputs whole, its own slots' shards) with one process.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "numesh/ops/lowering/lm_training.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/optimizer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/transport.hpp"
#include "test_util.hpp"

namespace numesh::ops::across_ranks {

/// A mesh split over ranks: rank r holds devices[r] of its slots.
struct RankedMesh {
  std::vector<int> devices;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

/// "dp2_tp2 as 1+3": a mesh as a failure label.
inline std::string label(const RankedMesh& m) {
  std::string s;
  for (std::size_t i = 0; i < m.dims.size(); ++i)
    s += (i > 0 ? "_" : "") + m.names[i] + std::to_string(m.dims[i]);
  s += " as ";
  for (std::size_t r = 0; r < m.devices.size(); ++r)
    s += (r > 0 ? "+" : "") + std::to_string(m.devices[r]);
  return s;
}

/// The meshes to test on `ranks` ranks: every model axis across ranks (the batch, the heads
/// and F, the experts, the sequence, the ZeRO-3 weights), ranks of unequal sizes among them.
inline std::vector<RankedMesh> ranked_meshes(int ranks) {
  switch (ranks) {
    case 1:
      return {{{4}, {2, 2}, {"dp", "tp"}}};
    case 2:
      return {{{2, 2}, {2, 2}, {"dp", "tp"}},   {{2, 2}, {2, 2}, {"tp", "dp"}},
              {{2, 2}, {2, 2}, {"ep", "tp"}},   {{1, 3}, {2, 2}, {"sp", "tp"}},
              {{2, 2}, {2, 2}, {"fsdp", "tp"}}, {{1, 1}, {2}, {"tp"}}};
    case 4:
      return {{{1, 1, 1, 1}, {2, 2}, {"dp", "tp"}},
              {{1, 1, 1, 1}, {2, 2}, {"ep", "tp"}},
              {{1, 3, 3, 1}, {2, 2, 2}, {"dp", "ep", "tp"}}};
    default:
      return {};
  }
}

/// The one-process mesh of `m`'s shape.
inline runtime::DeviceMesh one_process(const RankedMesh& m) {
  const int total = std::accumulate(m.devices.begin(), m.devices.end(), 0);
  return runtime::DeviceMesh::create(testing::devices(total), m.dims, m.names);
}

/// This rank's mesh of `m`, over `transport`.
inline runtime::DeviceMesh over_ranks(const RankedMesh& m,
                                      const std::shared_ptr<runtime::Transport>& transport) {
  return runtime::DeviceMesh::create(
      testing::devices(m.devices[static_cast<std::size_t>(transport->rank())]), transport, m.dims,
      m.names);
}

/// Whether a and b hold the same bits.
inline ::testing::AssertionResult same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " values against " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " against " << b[i] << " (one process)";
  }
  return ::testing::AssertionSuccess();
}

/// The transformer stack's prefill, insert and decode steps, on every mesh of ranked_meshes
/// for this many ranks: every rank's outputs (whole on every rank) and MoE routing statistics
/// are one process's bits, with and without a capacity (tokens dropped).
inline void transformer_matches_one_process(const std::shared_ptr<runtime::Transport>& transport) {
  const ModelAxes axes = ModelAxes::resolve(sharding::PartitionManager(), sharding::Mode::kTrain);
  const std::int64_t batch = 2, max_len = 12;
  const std::vector<RankedMesh> meshes = ranked_meshes(transport->size());
  for (std::size_t i = 0; i < meshes.size(); ++i) {
    const RankedMesh& m = meshes[i];
    TransformerConfig c = testing::small_transformer_config();
    // A capacity on every other mesh: assignments dropped, in each routing group its own.
    c.moe.capacity_factor = i % 2 == 1 ? 0.5f : 0.0f;
    const TransformerWeights w = TransformerWeights::random(c, 7);
    ShardedTransformer spread(over_ranks(m, transport), c, w, batch, max_len, axes);
    ShardedTransformer alone(one_process(m), c, w, batch, max_len, axes);
    std::int64_t position = 0, dropped = 0;
    for (const std::int64_t n : {5, 2, 1, 1}) {
      const runtime::HostTensor x = testing::random_host(
          {batch, n, c.hidden}, static_cast<std::uint32_t>(100 + position), 1.0f);
      const runtime::HostTensor got = spread.forward(x, position);
      const runtime::HostTensor want = alone.forward(x, position);
      EXPECT_TRUE(same_bits(got.data, want.data))
          << label(m) << ", rank " << transport->rank() << ", tokens [" << position << ", "
          << position + n << ")";
      // The routing statistics: each group's from the rank that holds its first slot.
      const MoeStats got_stats = spread.moe_stats(), want_stats = alone.moe_stats();
      EXPECT_EQ(got_stats.tokens_per_expert, want_stats.tokens_per_expert) << label(m);
      EXPECT_EQ(got_stats.dropped, want_stats.dropped) << label(m);
      EXPECT_EQ(got_stats.capacity, want_stats.capacity) << label(m);
      dropped += want_stats.dropped;
      position += n;
    }
    if (c.moe.capacity_factor > 0.0f) {
      EXPECT_GT(dropped, 0) << label(m) << ": the capacity must drop assignments";
    }
  }
}

/// Ids of a fixed pseudo-random sequence of `n` tokens below `vocab`.
inline std::vector<std::int32_t> token_ids(std::size_t n, std::int64_t vocab, std::uint32_t seed) {
  std::vector<std::int32_t> v(n);
  std::uint32_t s = seed;
  for (auto& id : v) {
    s = s * 1664525u + 1013904223u;
    id = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
  }
  return v;
}

/// A training step of a small language model (MoE with the router's aux loss, and dense), then
/// the gradient norm and an AdamW step with it, on every mesh of ranked_meshes: the loss, the
/// aux loss and the norm on every rank, and this rank's shards of every gradient and updated
/// parameter, are one process's bits.
inline void training_step_matches_one_process(
    const std::shared_ptr<runtime::Transport>& transport) {
  constexpr std::int64_t kVocab = 64, kBatch = 4, kTokens = 8;
  const EmbeddingWeights embedding{.table = testing::random_host({kVocab, 32}, 11, 1.0f)};
  const LmHeadWeights head{.weight = testing::random_host({32, kVocab}, 13, 0.2f)};
  const auto n = static_cast<std::size_t>(kBatch * kTokens);
  const std::vector<std::int32_t> inputs = token_ids(n, kVocab, 1),
                                  targets = token_ids(n, kVocab, 2);
  for (const bool moe : {true, false}) {
    const TransformerConfig c = moe ? testing::tiny_moe_lm_config() : testing::tiny_lm_config();
    const TransformerWeights stack = TransformerWeights::random(c, 12);
    const double coef = moe ? 0.05 : 0.0;
    for (const RankedMesh& m : ranked_meshes(transport->size())) {
      ModelAxes axes;
      for (const std::string& name : m.names) {
        if (name == "fsdp") axes.weights = {"fsdp"};
      }
      const std::string where =
          label(m) + (moe ? ", moe" : ", dense") + ", rank " + std::to_string(transport->rank());
      LmTrainingStep spread(over_ranks(m, transport), c, embedding, stack, &head, kBatch, kTokens,
                            axes, MatmulPrecision::kF32, coef);
      LmTrainingStep alone(one_process(m), c, embedding, stack, &head, kBatch, kTokens, axes,
                           MatmulPrecision::kF32, coef);
      const double loss = spread.run(inputs, targets);
      EXPECT_EQ(loss, alone.run(inputs, targets)) << where;
      EXPECT_EQ(spread.router_aux_loss(), alone.router_aux_loss()) << where;
      ASSERT_EQ(spread.parameters().size(), alone.parameters().size()) << where;
      std::vector<const runtime::ShardedTensor*> spread_grads, alone_grads;
      std::vector<runtime::ShardedTensor*> spread_values, alone_values;
      for (std::size_t i = 0; i < spread.parameters().size(); ++i) {
        const TrainableParameter& p = spread.parameters()[i];
        const TrainableParameter& q = alone.parameters()[i];
        for (const std::int64_t s : p.grad->mesh().local_slots()) {
          EXPECT_TRUE(same_bits(p.grad->shard(s).values(), q.grad->shard(s).values()))
              << where << ": the gradient of " << p.name << " on slot " << s;
        }
        spread_grads.push_back(p.grad.get()), alone_grads.push_back(q.grad.get());
        spread_values.push_back(p.value.get()), alone_values.push_back(q.value.get());
      }
      const double norm = grad_norm(spread_grads);
      EXPECT_EQ(norm, grad_norm(alone_grads)) << where;
      AdamW spread_adamw(spread_values, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
      AdamW alone_adamw(alone_values, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
      const double scale = clip_coefficient(norm, 0.5);
      spread_adamw.step(spread_grads, 1e-2, scale);
      alone_adamw.step(alone_grads, 1e-2, scale);
      for (std::size_t i = 0; i < spread_values.size(); ++i) {
        for (const std::int64_t s : spread_values[i]->mesh().local_slots()) {
          EXPECT_TRUE(
              same_bits(spread_values[i]->shard(s).values(), alone_values[i]->shard(s).values()))
              << where << ": " << spread.parameters()[i].name << " after AdamW, slot " << s;
        }
      }
    }
  }
}

}  // namespace numesh::ops::across_ranks
