#include "numesh/ops/lowering/transformer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <nlohmann/json.hpp>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/transformer.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::devices;
using testing::expected_groups;
using testing::make_mesh;
using testing::matches_reference;
using testing::mesh_case_name;
using testing::MeshCase;
using testing::random_host;
using testing::small_transformer_config;

// The model's outputs stay within this relative bound of the dense reference: every sharded
// reduction (attention and MLP outputs over tp, MoE over ep x tp) re-associates fp32 sums of
// up to max(F, heads * head_dim) terms, and two blocks compound it.
constexpr double kBound = 2e-5;

class ShardedTransformerTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ShardedTransformerTest, PrefillInsertAndDecodeEqualTheDenseModel) {
  const auto mesh = make_mesh(GetParam());
  for (float capacity : {0.0f, 1.0f}) {
    TransformerConfig c = small_transformer_config();
    c.moe.capacity_factor = capacity;
    const TransformerWeights w = TransformerWeights::random(c, 7);
    const std::int64_t batch = 2, max_len = 12;
    // Axes from the PartitionManager: on the fsdp mesh the MLP weights are stored split along
    // H and gathered every run.
    const ModelAxes axes = ModelAxes::resolve(sharding::PartitionManager(), sharding::Mode::kTrain);
    ShardedTransformer model(mesh, c, w, batch, max_len, axes);
    // MoE routing groups from the mesh case: sequences over the batch axes, tokens over sp.
    const std::int64_t batch_groups = expected_groups(GetParam(), {"dp", "fsdp"}, batch);
    const std::int64_t sequence_groups = expected_groups(GetParam(), {"sp"}, 0);
    EXPECT_EQ(model.routing_groups(), batch_groups);
    EXPECT_EQ(model.sequence_groups(), sequence_groups);
    TransformerReference reference(c, w, batch, max_len, batch_groups, sequence_groups);
    // Prefill 5 tokens, insert 2 at position 5, then decode 3 tokens one by one.
    std::int64_t position = 0;
    for (std::int64_t n : {5, 2, 1, 1, 1}) {
      const runtime::HostTensor x =
          random_host({batch, n, c.hidden}, static_cast<std::uint32_t>(100 + position), 1.0f);
      const runtime::HostTensor y = model.forward(x, position);
      const runtime::HostTensor want = reference.forward(x, position);
      EXPECT_TRUE(matches_reference(y, want, kBound))
          << "capacity " << capacity << " tokens [" << position << ", " << position + n << ")";
      position += n;
    }
    const MoeStats stats = model.moe_stats();
    std::int64_t kept = 0;
    for (std::int64_t n : stats.tokens_per_expert) kept += n;
    EXPECT_EQ(kept + stats.dropped, batch * 1 * c.moe.top_k)
        << "the last decode step routed every token k times";
  }
}

// Rows [0, n) of sequence b of x [B, T, H], as a batch of one [1, n, H].
runtime::HostTensor sequence_rows(const runtime::HostTensor& x, std::int64_t b, std::int64_t n) {
  const std::int64_t t = x.shape[1], h = x.shape[2];
  runtime::HostTensor out = runtime::HostTensor::zeros({1, n, h});
  std::copy_n(x.data.begin() + b * t * h, n * h, out.data.begin());
  return out;
}

TEST_P(ShardedTransformerTest, SequencesOfDifferentLengthsEqualEachRunAlone) {
  const auto mesh = make_mesh(GetParam());
  const TransformerConfig c =
      small_transformer_config();  // dropless MoE: the padding takes no real token's place
  const TransformerWeights w = TransformerWeights::random(c, 11);
  const std::int64_t batch = 4, max_len = 12, longest = 6;
  const std::vector<std::int64_t> lengths{6, 3, 4,
                                          1};  // on dp=2, one device gets [6, 3], the other [4, 1]
  const ModelAxes axes = ModelAxes::resolve(sharding::PartitionManager(), sharding::Mode::kTrain);
  ShardedTransformer model(mesh, c, w, batch, max_len, axes);
  std::vector<TransformerReference> alone;
  for (std::int64_t b = 0; b < batch; ++b) alone.emplace_back(c, w, 1, max_len);
  // The prompts padded at their end to the longest (the padding rows are random too: whatever
  // they hold must not reach a real token), all from position 0.
  const runtime::HostTensor prompts = random_host({batch, longest, c.hidden}, 41, 1.0f);
  const runtime::HostTensor y = model.forward(prompts, std::vector<std::int64_t>(batch, 0));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = lengths[static_cast<std::size_t>(b)];
    const runtime::HostTensor want =
        alone[static_cast<std::size_t>(b)].forward(sequence_rows(prompts, b, n), 0);
    EXPECT_TRUE(matches_reference(sequence_rows(y, b, n), want, kBound))
        << "prompt of sequence " << b;
  }
  // Then three decode steps, each sequence at its own position.
  std::vector<std::int64_t> positions = lengths;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const runtime::HostTensor x = random_host({batch, 1, c.hidden}, 50 + step, 1.0f);
    const runtime::HostTensor got = model.forward(x, positions);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t p = positions[static_cast<std::size_t>(b)];
      const runtime::HostTensor want =
          alone[static_cast<std::size_t>(b)].forward(sequence_rows(x, b, 1), p);
      EXPECT_TRUE(matches_reference(sequence_rows(got, b, 1), want, kBound))
          << "decode step " << step << ", sequence " << b << " at position " << p;
    }
    for (std::int64_t& p : positions) ++p;
  }
}

// One ragged step's tokens: for each (sequence, first position, count) of the step, its tokens
// in order, then `padding` tokens (block 0, position 0, one key); block tables by sequence.
RaggedBatch ragged_batch(const std::vector<std::vector<std::int32_t>>& tables,
                         const std::vector<std::array<std::int64_t, 3>>& parts,
                         std::int64_t padding, std::int64_t block_size, std::int64_t max_context) {
  RaggedBatch r;
  r.max_context = max_context;
  std::vector<std::int64_t> table_start;
  for (const auto& t : tables) {
    table_start.push_back(static_cast<std::int64_t>(r.tables.size()));
    r.tables.insert(r.tables.end(), t.begin(), t.end());
  }
  const auto padding_table = static_cast<std::int64_t>(r.tables.size());
  r.tables.push_back(0);
  for (const auto& [seq, first, count] : parts) {
    const std::vector<std::int32_t>& table = tables[static_cast<std::size_t>(seq)];
    for (std::int64_t p = first; p < first + count; ++p) {
      r.positions.push_back(p);
      r.slots.push_back(table[static_cast<std::size_t>(p / block_size)] * block_size +
                        p % block_size);
      r.context.push_back(p + 1);
      r.table_of.push_back(table_start[static_cast<std::size_t>(seq)]);
    }
  }
  for (std::int64_t i = 0; i < padding; ++i) {
    r.positions.push_back(0);
    r.slots.push_back(i % block_size);
    r.context.push_back(1);
    r.table_of.push_back(padding_table);
  }
  return r;
}

// Runs each ragged step of `steps` (its (sequence, first position, count) parts, then
// padding[s] padding tokens; random inputs seeded from `seed` + s) through `model` and expects
// every part's rows to equal the dense reference of that sequence alone, fed the same rows.
void expect_ragged_steps_equal_alone(
    ShardedTransformer& model, const std::vector<std::vector<std::int32_t>>& tables,
    const std::vector<std::vector<std::array<std::int64_t, 3>>>& steps,
    const std::vector<std::int64_t>& padding, std::int64_t block, std::int64_t context,
    std::uint32_t seed, std::vector<TransformerReference>& alone) {
  const std::int64_t h = model.config().hidden;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const RaggedBatch batch = ragged_batch(tables, steps[s], padding[s], block, context);
    const auto n = static_cast<std::int64_t>(batch.positions.size());
    const runtime::HostTensor x =
        random_host({1, n, h}, seed + static_cast<std::uint32_t>(s), 1.0f);
    const runtime::HostTensor y = model.forward_ragged(x, batch);
    std::int64_t row = 0;
    for (const auto& [seq, first, count] : steps[s]) {
      runtime::HostTensor rows = runtime::HostTensor::zeros({1, count, h});
      std::copy_n(x.data.begin() + row * h, count * h, rows.data.begin());
      const runtime::HostTensor want = alone[static_cast<std::size_t>(seq)].forward(rows, first);
      runtime::HostTensor got = runtime::HostTensor::zeros({1, count, h});
      std::copy_n(y.data.begin() + row * h, count * h, got.data.begin());
      EXPECT_TRUE(matches_reference(got, want, kBound))
          << "step " << s << ", sequence " << seq << " at [" << first << ", " << first + count
          << ")";
      row += count;
    }
  }
}

// Ragged steps over paged caches: three sequences in shuffled blocks, prefill chunks and
// decode tokens of different sequences in one step, padding at the end; every real token's
// output equals the dense model's for its sequence alone.
TEST_P(ShardedTransformerTest, RaggedStepsOverPagedCachesEqualEachSequenceAlone) {
  const auto mesh = make_mesh(GetParam());
  const TransformerConfig c = small_transformer_config();  // dropless MoE: tokens do not compete
  const TransformerWeights w = TransformerWeights::random(c, 13);
  constexpr std::int64_t kBlock = 4, kContext = 12;
  const ModelAxes axes = ModelAxes::resolve(sharding::PartitionManager(), sharding::Mode::kTrain);
  ShardedTransformer model(
      mesh, c, w, PagedCacheOptions{.blocks = 12, .block_size = kBlock, .max_context = kContext},
      axes);
  EXPECT_TRUE(model.paged());
  std::vector<TransformerReference> alone;
  for (int b = 0; b < 3; ++b) alone.emplace_back(c, w, 1, kContext);
  const std::vector<std::vector<std::int32_t>> tables{{3, 7, 1}, {2, 9}, {5, 4, 11}};
  // (sequence, first position, tokens) per step: two prompts (one in two chunks), then a third
  // prompt beside two decodes, then three decodes.
  const std::vector<std::vector<std::array<std::int64_t, 3>>> steps{
      {{0, 0, 5}, {1, 0, 3}},
      {{0, 5, 1}, {1, 3, 1}, {2, 0, 4}},
      {{2, 4, 2}, {0, 6, 1}, {1, 4, 1}},
      {{0, 7, 1}, {1, 5, 1}, {2, 6, 1}}};
  expect_ragged_steps_equal_alone(model, tables, steps, {2, 0, 3, 1}, kBlock, kContext, 300, alone);
}

// 16-bit KV caches, dense and paged: every output equals the dense model's whose caches hold
// each key and value rounded as they do (bf16 or f16, to nearest even). A cache read at the
// wrong place or not rounded as said would be off by far more than the bound: the keys and
// values' own rounding moves outputs by up to ~1e-2 (bf16) against an fp32 cache.
TEST_P(ShardedTransformerTest, SixteenBitCachesEqualTheDenseModelCachingAsTheyDo) {
  TransformerConfig c = small_transformer_config();
  c.attention.head_dim = 16;  // 16-bit caches take heads of whole 16-lane chunks
  const TransformerWeights w = TransformerWeights::random(c, 17);
  const MeshCase& mesh_case = GetParam();
  for (const DType kv : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(to_string(kv));
    const std::int64_t batch = 2, max_len = 8;
    ShardedTransformer model(make_mesh(mesh_case), c, w, batch, max_len, {}, KvLayout::kBTHD, kv);
    TransformerReference reference(c, w, batch, max_len,
                                   expected_groups(mesh_case, {"dp", "fsdp"}, batch),
                                   expected_groups(mesh_case, {"sp"}, 0), kv);
    std::int64_t position = 0;
    for (std::int64_t n : {4, 1, 1}) {
      const runtime::HostTensor x =
          random_host({batch, n, c.hidden}, 70 + static_cast<std::uint32_t>(position), 1.0f);
      EXPECT_TRUE(
          matches_reference(model.forward(x, position), reference.forward(x, position), kBound))
          << "tokens [" << position << ", " << position + n << ")";
      position += n;
    }
    // Paged: two sequences' prompts in one ragged step, then a decode token of each.
    constexpr std::int64_t kBlock = 4, kContext = 8;
    const ModelAxes axes = ModelAxes::resolve(sharding::PartitionManager(), sharding::Mode::kTrain);
    ShardedTransformer paged(
        make_mesh(mesh_case), c, w,
        PagedCacheOptions{
            .blocks = 6, .block_size = kBlock, .max_context = kContext, .kv_dtype = kv},
        axes);
    std::vector<TransformerReference> alone;
    for (int b = 0; b < 2; ++b) alone.emplace_back(c, w, 1, kContext, 1, 1, kv);
    const std::vector<std::vector<std::int32_t>> tables{{3, 1}, {2, 5}};
    const std::vector<std::vector<std::array<std::int64_t, 3>>> steps{{{0, 0, 5}, {1, 0, 3}},
                                                                      {{0, 5, 1}, {1, 3, 1}}};
    expect_ragged_steps_equal_alone(paged, tables, steps, {1, 1}, kBlock, kContext, 400, alone);
  }
}

TEST(ShardedTransformerTest, SixteenBitCachesRefuseOtherDtypesAndHeadSizesOutsideWholeChunks) {
  const auto mesh = make_mesh(MeshCase{{1}, {"tp"}});
  TransformerConfig c = small_transformer_config();
  const TransformerWeights w = TransformerWeights::random(c, 17);
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 1, 8, {}, KvLayout::kBTHD, DType::kQ8_0); },
              ThrowsMessage<TypeError>(HasSubstr(
                  "kv cache: keys and values stored as q8_0: expected f32, bf16 or f16")));
  ASSERT_EQ(c.attention.head_dim, 8);
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 1, 8, {}, KvLayout::kBTHD, DType::kBF16); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "kv cache: a bf16 KV cache needs a head size that is a multiple of 16, not 8")));
  EXPECT_THAT(
      [&] {
        ShardedTransformer(
            mesh, c, w,
            PagedCacheOptions{
                .blocks = 4, .block_size = 4, .max_context = 8, .kv_dtype = DType::kF16});
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("kv cache: a f16 KV cache needs a head size that is a multiple of 16, not 8")));
}

// Runs 4 tokens, then 2 single ones, of 2 sequences (inputs seeded from `seed`) through the
// model on `mesh_case` and expects each output to equal the dense reference's. Returns the
// decode program's plan.
std::string prefill_and_decode_equal_the_dense_model(const MeshCase& mesh_case,
                                                     const TransformerConfig& c,
                                                     const TransformerWeights& w,
                                                     std::uint32_t seed) {
  const std::int64_t batch = 2, max_len = 8;
  ShardedTransformer model(make_mesh(mesh_case), c, w, batch, max_len);
  TransformerReference reference(c, w, batch, max_len,
                                 expected_groups(mesh_case, {"dp", "fsdp"}, batch),
                                 expected_groups(mesh_case, {"sp"}, 0));
  std::int64_t position = 0;
  for (std::int64_t n : {4, 1, 1}) {
    const runtime::HostTensor x =
        random_host({batch, n, c.hidden}, seed + static_cast<std::uint32_t>(position), 1.0f);
    EXPECT_TRUE(
        matches_reference(model.forward(x, position), reference.forward(x, position), kBound))
        << "tokens [" << position << ", " << position + n << ")";
    position += n;
  }
  return model.program(1).plan().text();
}

// Qwen2-MoE's layout: MoE layers with a shared expert and raw top-k weights, a dense layer
// among them (mlp_only_layers), and Llama's MLP biases on that dense layer.
TEST_P(ShardedTransformerTest, DenseLayersAmongMoeOnesSharedExpertsAndMlpBiasesEqualTheDenseModel) {
  TransformerConfig c = small_transformer_config();
  c.layers = 3;
  c.moe_every = 1;
  c.dense_layers = {1};
  c.shared_expert_ffn = 24;
  c.moe.renormalize = false;
  TransformerWeights w = TransformerWeights::random(c, 11);
  ASSERT_FALSE(w.blocks[0].moe.shared_expert.up.shape.empty());
  ASSERT_TRUE(w.blocks[1].moe.router.shape.empty()) << "block 1 is dense";
  BlockWeights& dense = w.blocks[1];
  dense.mlp.gate_bias = random_host({c.ffn}, 12, 0.5f);
  dense.mlp.up_bias = random_host({c.ffn}, 13, 0.5f);
  dense.mlp.down_bias = random_host({c.hidden}, 14, 0.5f);
  const std::string plan = prefill_and_decode_equal_the_dense_model(GetParam(), c, w, 200);
  EXPECT_THAT(plan, HasSubstr("block1.mlp.w_up"));
  EXPECT_THAT(plan, HasSubstr("block2.moe.shared_w_up"));
  EXPECT_THAT(plan, ::testing::Not(HasSubstr("block1.moe")));
}

// TransformerConfig::mlp_kind reaches the dense layers: a stack of GELU MLPs (no gate) equals
// the dense model, whose oracle runs the same kind.
TEST_P(ShardedTransformerTest, GeluMlpsEqualTheDenseModel) {
  TransformerConfig c = small_transformer_config();
  c.moe_every = 0;
  c.mlp_kind = MlpKind::kGelu;
  const TransformerWeights w = TransformerWeights::random(c, 17);
  ASSERT_TRUE(w.blocks[1].mlp.gate.shape.empty()) << "a GELU MLP has no gate";
  const std::string plan = prefill_and_decode_equal_the_dense_model(GetParam(), c, w, 300);
  EXPECT_THAT(plan, HasSubstr("block1.mlp.w_up"));
  EXPECT_THAT(plan, ::testing::Not(HasSubstr("w_gate")));
}

// Gemma's block: GeGLU MLPs and RMSNorms that scale by 1 + w (norm_weight_offset), the stored
// w near 0, equal the dense model, which the offset changes.
TEST_P(ShardedTransformerTest, GemmasGegluAndNormOffsetEqualTheDenseModel) {
  TransformerConfig c = small_transformer_config();
  c.moe_every = 0;
  c.mlp_kind = MlpKind::kGeGLU;
  c.norm_weight_offset = 1.0f;
  TransformerWeights w = TransformerWeights::random(c, 19);
  std::uint32_t seed = 90;
  for (BlockWeights& b : w.blocks) {
    b.attn_norm = random_host(b.attn_norm.shape, seed++, 0.1f);
    b.ffn_norm = random_host(b.ffn_norm.shape, seed++, 0.1f);
  }
  w.final_norm = random_host(w.final_norm.shape, seed++, 0.1f);
  const std::string plan = prefill_and_decode_equal_the_dense_model(GetParam(), c, w, 400);
  EXPECT_THAT(plan, HasSubstr("block1.mlp.w_gate"));
  // Without the offset the norms scale by w alone: another model.
  TransformerConfig plain = c;
  plain.norm_weight_offset = 0.0f;
  const runtime::HostTensor x = random_host({2, 3, c.hidden}, 401, 1.0f);
  TransformerReference with(c, w, 2, 8), without(plain, w, 2, 8);
  EXPECT_FALSE(matches_reference(with.forward(x, 0), without.forward(x, 0), 1e-2));
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShardedTransformerTest,
    ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}}, MeshCase{{2}, {"dp"}},
                      MeshCase{{2}, {"ep"}}, MeshCase{{4}, {"tp"}}, MeshCase{{2, 2}, {"dp", "tp"}},
                      MeshCase{{2, 2}, {"ep", "tp"}}, MeshCase{{2, 2, 2}, {"dp", "ep", "tp"}},
                      MeshCase{{2, 2}, {"fsdp", "tp"}}, MeshCase{{2}, {"sp"}},
                      MeshCase{{2, 2}, {"sp", "tp"}}, MeshCase{{2, 2, 2}, {"dp", "sp", "tp"}}),
    mesh_case_name);

TEST(ShardedTransformerTest, BhtdCachesGiveTheSameOutputs) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  const TransformerConfig c = small_transformer_config();
  const TransformerWeights w = TransformerWeights::random(c, 3);
  ShardedTransformer bthd(mesh, c, w, 2, 8, {}, KvLayout::kBTHD);
  ShardedTransformer bhtd(mesh, c, w, 2, 8, {}, KvLayout::kBHTD);
  for (std::int64_t position : {0, 4, 5}) {
    const std::int64_t n = position == 0 ? 4 : 1;
    const runtime::HostTensor x =
        random_host({2, n, c.hidden}, static_cast<std::uint32_t>(position), 1.0f);
    EXPECT_EQ(bthd.forward(x, position), bhtd.forward(x, position)) << "position " << position;
  }
}

TEST(ShardedTransformerTest, ABareBlockWithoutFinalNormEqualsTheDenseBlock) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  TransformerConfig c = small_transformer_config();
  c.layers = 1;
  TransformerWeights w = TransformerWeights::random(c, 5);
  w.final_norm = {};
  ShardedTransformer model(mesh, c, w, 2, 4);
  TransformerReference reference(c, w, 2, 4);
  const runtime::HostTensor x = random_host({2, 4, c.hidden}, 9, 1.0f);
  const runtime::HostTensor y = model.forward(x, 0);
  EXPECT_TRUE(matches_reference(y, reference.forward(x, 0), kBound));
  // Without the final norm, y = h + mlp(norm(h)) keeps x's scale: not unit RMS rows.
  EXPECT_GT(compare(y, x).relative_error, 0.01) << "the block changed its input";
}

TEST(ShardedTransformerTest, TheProgramDescribesItself) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  const TransformerConfig c = small_transformer_config();
  ShardedTransformer model(mesh, c, TransformerWeights::random(c, 3), 2, 8);
  const ProgramPlan& plan = model.program(1).plan();
  // One all-reduce per attention, per MLP and per MoE layer: 4 for 2 blocks.
  ASSERT_EQ(plan.collectives.size(), 4u);
  for (const CollectivePlan& coll : plan.collectives) {
    EXPECT_EQ(coll.step.kind, sharding::ReshardStep::Kind::kAllReduce) << coll.name;
    EXPECT_EQ(coll.payload_bytes, 2 * 1 * 32 * 4) << coll.name << ": the [2, 1, 32] output";
  }
  EXPECT_EQ(plan.collectives[0].name, "block0.attn.out");
  EXPECT_GT(plan.flops[0], 0.0);
  EXPECT_EQ(plan.flops[0], plan.flops[1]) << "tp splits the work evenly";
  const auto cache =
      std::find_if(plan.tensors.begin(), plan.tensors.end(),
                   [](const TensorPlan& t) { return t.name == "block0.attn.cache_k"; });
  ASSERT_NE(cache, plan.tensors.end());
  EXPECT_EQ(cache->spec.repr(), "P(None, None, 'tp', None)") << "kv heads split over tp";
  EXPECT_EQ(cache->shard_bytes, 2 * 8 * 1 * 8 * 4) << "[2, 8, 1 of 2 kv heads, 8] per device";
  EXPECT_THAT(plan.text(), HasSubstr("block1.moe.out"));
}

TEST(ShardedTransformerTest, AxesComeFromThePartitionManager) {
  const sharding::PartitionManager pm;
  const ModelAxes axes = ModelAxes::resolve(pm, sharding::Mode::kTrain);
  EXPECT_EQ(axes.batch, (std::vector<std::string>{"fsdp", "dp"}));
  EXPECT_EQ(axes.heads, "tp");
  EXPECT_EQ(axes.mlp, "tp");
  EXPECT_EQ(axes.expert, "ep");
  EXPECT_EQ(axes.expert_tensor, "tp");
  EXPECT_EQ(axes.sequence, "sp");
  EXPECT_EQ(axes.weights, (std::vector<std::string>{"fsdp", "sp"}))
      << "ColumnWise ((fsdp, sp), tp)";
}

TEST(TransformerConfigTest, EveryBadSizeIsNamed) {
  struct Case {
    std::function<void(TransformerConfig&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](TransformerConfig& c) { c.hidden = 0; },
       "hidden 0, layers 2, ffn 64, heads 4, kv heads 2, head_dim 8 must all be positive"},
      {[](TransformerConfig& c) { c.attention.num_kv_heads = 3; },
       "kv heads 3 must divide heads 4"},
      {[](TransformerConfig& c) { c.layers = 8888888888882; },
       "8888888888882 layers; at most 65536 (no model has more)"},
      {[](TransformerConfig& c) { c.attention.head_dim = 7; },
       "head_dim 7 is odd, RoPE needs it even"},
      {[](TransformerConfig& c) { c.moe_every = -1; }, "moe_every -1 is negative"},
      {[](TransformerConfig& c) { c.moe.top_k = 0; },
       "top_k 0 must be between 1 and the 4 experts"},
      {[](TransformerConfig& c) { c.moe_ffn = 0; },
       "moe_ffn 0 must be positive and capacity_factor 0 not negative"},
      {[](TransformerConfig& c) { c.norm_eps = -1.0f; }, "norm_eps -1 is negative"},
      {[](TransformerConfig& c) { c.norm_weight_offset = std::nanf(""); },
       "norm_weight_offset nan is not finite"},
      {[](TransformerConfig& c) { c.shared_expert_ffn = -1; }, "shared_expert_ffn -1 is negative"},
      {[](TransformerConfig& c) {
         c.dense_layers = {0, 2};
       },
       "dense layer 2 is outside the 2 layers"},
      {[](TransformerConfig& c) { c.dense_layers = {-1}; },
       "dense layer -1 is outside the 2 layers"},
      {[](TransformerConfig& c) {
         c.dense_layers = {1, 0, 1};
       },
       "dense layer 1 is listed twice"},
  };
  for (const Case& cs : cases) {
    TransformerConfig c = small_transformer_config();
    cs.change(c);
    EXPECT_THAT([&] { c.validate(); }, ThrowsMessage<ValueError>(HasSubstr(cs.message)));
  }
  EXPECT_NO_THROW(small_transformer_config().validate());
}

// MoE experts are SwiGLU only: another mlp_kind with a MoE layer is refused by name, by the
// config and so by everything built from it; a dense stack counts GELU's two matrices.
TEST(TransformerConfigTest, AnMlpKindTheExpertsLackIsRefusedByName) {
  TransformerConfig c = small_transformer_config();  // layer 1 is MoE
  c.mlp_kind = MlpKind::kGelu;
  const char* message =
      "transformer: layer 1 is MoE and mlp_kind is gelu: MoE experts are SwiGLU only";
  EXPECT_THAT([&] { c.validate(); }, ThrowsMessage<NotImplementedError>(message));
  TransformerConfig swiglu = small_transformer_config();
  const TransformerWeights w = TransformerWeights::random(swiglu, 3);
  const auto mesh = runtime::DeviceMesh::create(devices(1), {1}, {"tp"});
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 1, 4); },
              ThrowsMessage<NotImplementedError>(message));
  EXPECT_THAT([&] { TransformerReference(c, w, 1, 4); },
              ThrowsMessage<NotImplementedError>(message));

  c.moe_every = 0;  // dense: 2 x 2 GELU matrices of 32 x 64 instead of SwiGLU's 3
  swiglu.moe_every = 0;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(swiglu.parameters() - c.parameters(), 2 * 32 * 64);
  EXPECT_DOUBLE_EQ(swiglu.flops(1, 1, 0) - c.flops(1, 1, 0), 2 * 2.0 * 32 * 64);
}

// Which layers are MoE, and what parameters() and flops() count, follow dense_layers and the
// shared expert.
TEST(TransformerConfigTest, DenseLayersAndTheSharedExpertAreCounted) {
  TransformerConfig c =
      small_transformer_config();  // hidden 32, 4 experts of 16, ffn 64, attention 4/2 x 8
  c.layers = 3;
  c.moe_every = 1;
  c.dense_layers = {1};
  EXPECT_TRUE(c.is_moe(0));
  EXPECT_FALSE(c.is_moe(1));
  EXPECT_TRUE(c.is_moe(2));
  const std::int64_t attention =
      2 * 32 + 32 * 8 * (2 * 4 + 2 * 2);  // two norms and four projections
  const std::int64_t moe = 32 * 4 + 3 * 4 * 32 * 16, mlp = 3 * 32 * 64;
  EXPECT_EQ(c.parameters(), 32 + 3 * attention + 2 * moe + mlp);
  const double moe_flops = 2.0 * 32 * 4 + 2.0 * 3.0 * 2.0 * 32 * 16,
               mlp_flops = 3.0 * 2.0 * 32 * 64;
  const double attention_flops_1 = attention_flops(c.attention, 32, 1, 1, 0);
  EXPECT_DOUBLE_EQ(c.flops(1, 1, 0), 3 * attention_flops_1 + 2 * moe_flops + mlp_flops);
  c.shared_expert_ffn = 24;
  EXPECT_EQ(c.parameters(), 32 + 3 * attention + 2 * (moe + 3 * 32 * 24 + 32) + mlp)
      << "the shared expert and its gate in each MoE layer";
  EXPECT_DOUBLE_EQ(
      c.flops(1, 1, 0),
      3 * attention_flops_1 + 2 * (moe_flops + 3.0 * 2.0 * 32 * 24 + 2.0 * 32) + mlp_flops);
}

TEST(ModelAxesTest, AHeadAxisThatResolvesToSeveralMeshAxesIsRefused) {
  const sharding::PartitionAxis paxis =
      sharding::PartitionAxis::from_json({{"head_axis", {"tp", "sp"}}});
  EXPECT_THAT(
      [&] { (void)ModelAxes::resolve(sharding::PartitionManager(paxis), sharding::Mode::kTrain); },
      ThrowsMessage<ValueError>(HasSubstr("__HEAD__ resolves to the axes (tp, sp) in mode "
                                          "__train__; numesh splits that dim over one mesh axis")));
}

TEST(ModelAxesTest, AnIntegerModeOnTTakesTrainAxesWhenDecodeAgrees) {
  const sharding::PartitionManager pm;
  const ModelAxes train = ModelAxes::resolve(pm, sharding::Mode::kTrain);
  for (const std::int64_t dim : {1, -2}) {
    const ModelAxes axes = ModelAxes::resolve(pm, sharding::ModeArg::from_dim(dim), 4, 64);
    EXPECT_EQ(axes.batch, train.batch) << dim;
    EXPECT_EQ(axes.heads, train.heads) << dim;
    EXPECT_EQ(axes.mlp, train.mlp) << dim;
    EXPECT_EQ(axes.expert, train.expert) << dim;
    EXPECT_EQ(axes.sequence, "sp") << "prompts are train calls and keep sequence parallelism";
    EXPECT_EQ(axes.weights, train.weights) << dim;
  }
}

TEST(ModelAxesTest, AnIntegerModeOnAnotherDimIsInferredOnceFromItsExtent) {
  const sharding::PartitionManager pm(
      sharding::PartitionAxis::from_json({{"decode_head_axis", "sp"}}));
  EXPECT_EQ(ModelAxes::resolve(pm, sharding::ModeArg::from_dim(0), 1, 64).heads, "sp")
      << "batch 1: decode";
  EXPECT_EQ(ModelAxes::resolve(pm, sharding::ModeArg::from_dim(0), 4, 64).heads, "tp")
      << "batch 4: train";
  EXPECT_EQ(ModelAxes::resolve(pm, sharding::Mode::kDecode).heads, "sp");
}

TEST(ModelAxesTest, AnIntegerModeOnTRefusesAxesThatDifferBetweenTrainAndDecode) {
  const sharding::PartitionManager pm(
      sharding::PartitionAxis::from_json({{"decode_head_axis", "sp"}}));
  EXPECT_THAT([&] { (void)ModelAxes::resolve(pm, sharding::ModeArg::from_dim(1), 4, 64); },
              ThrowsMessage<ValueError>(
                  HasSubstr("mode dim:1: a model lays its weights and KV caches out once, but its "
                            "prefill (train) and decode "
                            "calls resolve different axes: heads: tp in train, sp in decode")));
}

TEST(ModelAxesTest, AnIntegerModeOutsideTheActivationsRankIsAnIndexError) {
  for (const std::int64_t dim : {3, -4}) {
    EXPECT_THAT(
        [&] {
          (void)ModelAxes::resolve(sharding::PartitionManager(), sharding::ModeArg::from_dim(dim),
                                   4, 64);
        },
        ThrowsMessage<IndexError>(HasSubstr("tuple index out of range")))
        << dim;
  }
}

TEST(ShardedTransformerTest, RaggedStepsAndDenseCallsAreRefusedWhereTheyDoNotBelong) {
  const auto mesh = make_mesh(MeshCase{{2}, {"tp"}});
  const TransformerConfig c = small_transformer_config();
  const TransformerWeights w = TransformerWeights::random(c, 13);
  ShardedTransformer dense(mesh, c, w, 1, 8);
  ShardedTransformer paged(mesh, c, w,
                           PagedCacheOptions{.blocks = 4, .block_size = 4, .max_context = 8});
  const RaggedBatch one = ragged_batch({{1, 2}}, {{0, 0, 2}}, 0, 4, 8);
  const runtime::HostTensor x = random_host({1, 2, c.hidden}, 1, 1.0f);
  EXPECT_THAT([&] { (void)dense.forward_ragged(x, one); },
              ThrowsMessage<ValueError>(HasSubstr("ragged steps need paged caches")));
  EXPECT_THAT([&] { (void)paged.forward(x, 0); },
              ThrowsMessage<ValueError>(HasSubstr("runs ragged steps (forward_ragged)")));
  EXPECT_THAT(
      [&] {
        ShardedTransformer(mesh, c, w,
                           PagedCacheOptions{.blocks = 1, .block_size = 4, .max_context = 8});
      },
      ThrowsMessage<ShapeError>(HasSubstr("paged caches of 1 blocks of 4 positions")));
  RaggedBatch bad = one;
  bad.slots[1] = 16;
  EXPECT_THAT([&] { (void)paged.forward_ragged(x, bad); },
              ThrowsMessage<IndexError>(HasSubstr("ragged token 1 at position 1 (slot 16")));
  bad = one;
  bad.tables[0] = 4;
  EXPECT_THAT([&] { (void)paged.forward_ragged(x, bad); },
              ThrowsMessage<IndexError>(HasSubstr("block table names block 4 of 4")));
  bad = one;
  bad.context[0] = 9;
  EXPECT_THAT(
      [&] { (void)paged.forward_ragged(x, bad); },
      ThrowsMessage<IndexError>(HasSubstr("ragged token 0 at position 0 (slot 4, context 9")));
  bad = one;
  bad.max_context = 7;
  EXPECT_THAT([&] { (void)paged.forward_ragged(x, bad); },
              ThrowsMessage<ShapeError>(HasSubstr("a ragged batch for contexts of 7")));
  EXPECT_NO_THROW((void)paged.forward_ragged(x, one)) << "the good batch still runs";
}

TEST(ShardedTransformerTest, BadInputIsRejectedBeforeAnythingRuns) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  TransformerConfig c = small_transformer_config();
  const TransformerWeights w = TransformerWeights::random(c, 3);
  c.moe.top_k = 5;
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 2, 8); },
              ThrowsMessage<ValueError>(HasSubstr("top_k 5 must be between 1 and the 4 experts")));
  c = small_transformer_config();
  c.attention.num_kv_heads = 3;
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 2, 8); },
              ThrowsMessage<ValueError>(HasSubstr("kv heads 3 must divide heads 4")));
  c = small_transformer_config();
  c.layers = 3;
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 2, 8); },
              ThrowsMessage<ShapeError>(HasSubstr("2 blocks of weights for 3 layers")));
  // A shared expert the config does not have, and one it has that the weights lack.
  c = small_transformer_config();
  c.shared_expert_ffn = 24;
  EXPECT_THAT([&] { ShardedTransformer(mesh, c, w, 2, 8); },
              ThrowsMessage<ShapeError>("transformer: block 1 has a shared expert of intermediate "
                                        "size 0 (0: none), the config says 24"));
  EXPECT_THAT([&] { TransformerReference(c, w, 2, 8); },
              ThrowsMessage<ShapeError>(
                  "transformer reference: block 1 shared expert up is [], expected [32, 24]"));
  const TransformerWeights shared = TransformerWeights::random(c, 3);
  EXPECT_THAT([&] { ShardedTransformer(mesh, small_transformer_config(), shared, 2, 8); },
              ThrowsMessage<ShapeError>("transformer: block 1 has a shared expert of intermediate "
                                        "size 24 (0: none), the config says 0"));
  ShardedTransformer model(mesh, small_transformer_config(), w, 2, 8);
  EXPECT_THAT(
      [&] {
        model.forward(random_host({2, 4, 32}, 1, 1.0f), 6);
      },
      ThrowsMessage<IndexError>(
          HasSubstr("4 tokens at position 6 (sequence 0) do not fit the KV cache of 8 positions")));
  EXPECT_THAT(
      [&] {
        model.forward(random_host({2, 1, 32}, 1, 1.0f), std::vector<std::int64_t>{3, 8});
      },
      ThrowsMessage<IndexError>(
          HasSubstr("1 tokens at position 8 (sequence 1) do not fit the KV cache of 8 positions")));
  EXPECT_THAT(
      [&] {
        model.forward(random_host({2, 1, 32}, 1, 1.0f), std::vector<std::int64_t>{3});
      },
      ThrowsMessage<ShapeError>(HasSubstr("transformer: 1 positions for 2 sequences")));
  EXPECT_THAT(
      [&] {
        model.forward(random_host({3, 4, 32}, 1, 1.0f), 0);
      },
      ThrowsMessage<ShapeError>(HasSubstr("input is [3, 4, 32] but the model takes [2, T, 32]")));
}

}  // namespace
}  // namespace numesh::ops
