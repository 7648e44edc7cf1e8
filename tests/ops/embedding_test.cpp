// The token embedding (lowering/embedding.hpp): lookups against the reference on meshes that
// split the vocabulary (an all-reduce sums the devices' parts), the tokens, both or neither,
// for every table dtype; ids at the edges of the slices; and the errors.

#include "numesh/ops/lowering/embedding.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/embedding.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using testing::MeshCase;
using ::testing::ThrowsMessage;

class EmbeddingTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(EmbeddingTest, LookupsEqualTheTableRowsOnEveryMesh) {
  const MeshCase& c = GetParam();
  const runtime::DeviceMesh mesh = testing::make_mesh(c);
  // Ids at both ends of every quarter of V = 100 (the slices' edges on tp4), and repeats.
  const std::vector<std::int32_t> ids{0, 24, 25, 49, 50, 74, 75, 99, 0, 99, 37, 37};
  for (std::int64_t vocab : {std::int64_t{100}, std::int64_t{102}}) {  // 102 does not divide tp4
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const EmbeddingWeights w{.table = testing::random_host({vocab, 48}, 9, 1.0f), .stored_as = t};
      ShardedEmbedding embedding(mesh, w, static_cast<std::int64_t>(ids.size()));
      const runtime::HostTensor got = embedding.forward(ids);
      // A lookup moves stored values and the all-reduce adds zeros to them: exact.
      EXPECT_EQ(got.data, embedding_reference(ids, w).data)
          << testing::mesh_label(c) << " V=" << vocab << " " << to_string(t);
      const bool split = c.names.back() == "tp" && c.dims.back() > 1 && vocab % c.dims.back() == 0;
      EXPECT_EQ(embedding.program().plan().collectives.empty(), !split)
          << testing::mesh_label(c) << " V=" << vocab;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, EmbeddingTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2}, {"dp"}},
                                           MeshCase{{2, 2}, {"dp", "tp"}}),
                         testing::mesh_case_name);

TEST(EmbeddingTest, OneProgramServesEveryCall) {
  const EmbeddingWeights w{.table = testing::random_host({64, 16}, 2, 1.0f)};
  ShardedEmbedding embedding(testing::make_mesh({{2}, {"tp"}}), w, 3);
  for (const std::vector<std::int32_t>& ids :
       {std::vector<std::int32_t>{1, 2, 3}, {63, 0, 32}, {31, 31, 31}}) {
    EXPECT_EQ(embedding.forward(ids).data, embedding_reference(ids, w).data);
  }
}

TEST(EmbeddingTest, BadIdsAndShapesAreRefusedBeforeAnythingRuns) {
  const runtime::DeviceMesh mesh = testing::make_mesh({{2}, {"tp"}});
  const EmbeddingWeights w{.table = testing::random_host({10, 4}, 1, 1.0f)};
  ShardedEmbedding embedding(mesh, w, 2);
  EXPECT_THAT(
      [&] {
        embedding.forward(std::vector<std::int32_t>{3, 10});
      },
      ThrowsMessage<IndexError>(
          "embedding: token 10 at position 1 is outside the vocabulary [0, 10)"));
  EXPECT_THAT(
      [&] {
        embedding.forward(std::vector<std::int32_t>{-1, 0});
      },
      ThrowsMessage<IndexError>(
          "embedding: token -1 at position 0 is outside the vocabulary [0, 10)"));
  EXPECT_THAT(
      [&] {
        embedding.forward(std::vector<std::int32_t>{1, 2, 3});
      },
      ThrowsMessage<ShapeError>("embedding: 3 ids but the program was compiled for 2 tokens"));
  EXPECT_THAT(
      [&] {
        ShardedEmbedding(mesh, EmbeddingWeights{.table = runtime::HostTensor::zeros({10})}, 2);
      },
      ThrowsMessage<ShapeError>("embedding: table [10] must be [V, H] with V, H >= 1"));
  EXPECT_THAT([&] { ShardedEmbedding(mesh, w, 0); },
              ThrowsMessage<ShapeError>("embedding: 0 tokens; need at least one"));
  EXPECT_THAT([&] { embedding_reference(std::vector<std::int32_t>{12}, w); },
              ThrowsMessage<IndexError>(
                  "embedding: token 12 at position 0 is outside the vocabulary [0, 10)"));
}

}  // namespace
}  // namespace numesh::ops
