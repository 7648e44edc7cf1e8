// CausalLmWeights and CausalLm on checkpoints written by the test: a tiny Llama loads and runs
// on two meshes with the same tokens; every way a checkpoint or a call can be wrong is refused
// naming what is wrong, before any weight is read or anything runs. (The numbers themselves are
// checked against PyTorch by models_hf_match_pytorch.)

#include "numesh/models/lm/causal_lm.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "../runtime/test_devices.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/safetensors_writer.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/generation.hpp"
#include "numesh/models/lm/perplexity.hpp"
#include "numesh/runtime/cancellation.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::StoredTensor;
using ::testing::ThrowsMessage;

json tiny_llama() {
  return json{{"model_type", "llama"},      {"vocab_size", 32},
              {"hidden_size", 16},          {"intermediate_size", 24},
              {"num_hidden_layers", 2},     {"num_attention_heads", 4},
              {"num_key_value_heads", 2},   {"max_position_embeddings", 64},
              {"tie_word_embeddings", true}};
}

// Every tensor of tiny_llama() in Hugging Face's names and [out, in] layout, random F32.
std::map<std::string, std::vector<std::int64_t>> llama_shapes() {
  std::map<std::string, std::vector<std::int64_t>> s{{"model.embed_tokens.weight", {32, 16}},
                                                     {"model.norm.weight", {16}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s[p + "input_layernorm.weight"] = {16};
    s[p + "post_attention_layernorm.weight"] = {16};
    s[p + "self_attn.q_proj.weight"] = {16, 16};
    s[p + "self_attn.k_proj.weight"] = {8, 16};
    s[p + "self_attn.v_proj.weight"] = {8, 16};
    s[p + "self_attn.o_proj.weight"] = {16, 16};
    s[p + "mlp.gate_proj.weight"] = {24, 16};
    s[p + "mlp.up_proj.weight"] = {24, 16};
    s[p + "mlp.down_proj.weight"] = {16, 24};
  }
  return s;
}

// A tiny Qwen2-MoE: layer 0 MoE (4 experts of 8, top-2 raw weights, a shared expert of 12),
// layer 1 dense (mlp_only_layers, intermediate 24); q/k/v biases.
json tiny_qwen2_moe() {
  return json{{"model_type", "qwen2_moe"},  {"vocab_size", 32},
              {"hidden_size", 16},          {"intermediate_size", 24},
              {"num_hidden_layers", 2},     {"num_attention_heads", 4},
              {"num_key_value_heads", 2},   {"max_position_embeddings", 64},
              {"num_experts", 4},           {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 8}, {"shared_expert_intermediate_size", 12},
              {"norm_topk_prob", false},    {"mlp_only_layers", {1}},
              {"tie_word_embeddings", true}};
}

std::map<std::string, std::vector<std::int64_t>> qwen2_moe_shapes() {
  auto s = llama_shapes();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s[p + "self_attn.q_proj.bias"] = {16};
    s[p + "self_attn.k_proj.bias"] = {8};
    s[p + "self_attn.v_proj.bias"] = {8};
  }
  const std::string moe = "model.layers.0.mlp.";
  for (const char* name : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    s.erase(moe + name);
  s[moe + "gate.weight"] = {4, 16};
  for (int e = 0; e < 4; ++e) {
    const std::string ep = moe + "experts." + std::to_string(e) + ".";
    s[ep + "gate_proj.weight"] = {8, 16};
    s[ep + "up_proj.weight"] = {8, 16};
    s[ep + "down_proj.weight"] = {16, 8};
  }
  s[moe + "shared_expert.gate_proj.weight"] = {12, 16};
  s[moe + "shared_expert.up_proj.weight"] = {12, 16};
  s[moe + "shared_expert.down_proj.weight"] = {16, 12};
  s[moe + "shared_expert_gate.weight"] = {1, 16};
  return s;
}

// Writes config.json and model.safetensors of `shapes` into `dir`.
void write_model(const ScratchDir& dir, const json& config,
                 const std::map<std::string, std::vector<std::int64_t>>& shapes) {
  dir.file("config.json", config.dump());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<StoredTensor> tensors;
  for (const auto& [name, shape] : shapes) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& v : values) v = normal(rng);
    tensors.push_back({name, "F32", shape, testing::le_bytes(values)});
  }
  dir.file("model.safetensors", testing::layout_file(tensors, {}));
}

runtime::DeviceMesh mesh(std::int64_t n, const std::string& axis) {
  return runtime::DeviceMesh::create(
      runtime::testing::synthetic_devices(runtime::testing::nodes(static_cast<int>(n))), {n},
      {axis});
}

// The host load reports its progress tensor by tensor: rising, and at the end every stored byte
// of a checkpoint that holds only the model's tensors.
TEST(CausalLmTest, TheHostLoadReportsEveryByteItReads) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir.path());
  std::uint64_t stored = 0;
  for (const std::string& name : checkpoint.names()) stored += checkpoint.stored_bytes(name);
  std::vector<std::pair<std::int64_t, std::int64_t>> calls;
  (void)CausalLmWeights::load(config, checkpoint, {}, [&](std::int64_t done, std::int64_t total) {
    calls.emplace_back(done, total);
  });
  ASSERT_FALSE(calls.empty());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, static_cast<std::int64_t>(stored)) << "call " << i;
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first) << "call " << i;
    }
  }
  EXPECT_EQ(calls.back().first, static_cast<std::int64_t>(stored));
}

TEST(CausalLmTest, ATinyLlamaLoadsAndDecodesTheSameOnEveryMesh) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  EXPECT_EQ(w.lm_head.weight.shape, (std::vector<std::int64_t>{16, 32}))
      << "the tied head: the table transposed";
  EXPECT_EQ(w.stack.blocks.size(), 2u);
  EXPECT_EQ(w.stack.blocks[0].attention.wk.shape, (std::vector<std::int64_t>{16, 8}))
      << "[in, out]";
  std::vector<std::vector<std::int64_t>> runs;
  for (const auto& [n, axis] :
       std::vector<std::pair<std::int64_t, std::string>>{{1, "tp"}, {2, "tp"}, {2, "dp"}}) {
    CausalLm lm(mesh(n, axis), config, w, 2, 8);
    std::vector<std::int64_t> tokens = lm.greedy(std::vector<std::int32_t>{3, 4, 5, 6, 7, 8}, 3, 0);
    const std::vector<std::int64_t> next =
        lm.greedy(std::vector<std::int32_t>{static_cast<std::int32_t>(tokens[0]),
                                            static_cast<std::int32_t>(tokens[1])},
                  1, 3);
    tokens.insert(tokens.end(), next.begin(), next.end());
    for (std::int64_t t : tokens) EXPECT_TRUE(t >= 0 && t < 32) << t;
    runs.push_back(tokens);
  }
  EXPECT_EQ(runs[1], runs[0]) << "tp2 picks what one device picks";
  EXPECT_EQ(runs[2], runs[0]) << "dp2 too";
}

TEST(CausalLmTest, CheckpointsThatDoNotFitTheConfigAreRefusedNamingTheTensor) {
  // One scratch directory per test: each case rewrites the checkpoint in it.
  ScratchDir dir;
  const auto refused = [&](const std::map<std::string, std::vector<std::int64_t>>& shapes,
                           const json& config, const auto& matcher) {
    write_model(dir, tiny_llama(), shapes);
    const auto checkpoint = SafetensorsCheckpoint::open(dir.path());
    EXPECT_THAT(
        [&] { (void)CausalLmWeights::load(HfConfig::parse(config, "config.json"), checkpoint); },
        matcher);
  };
  auto shapes = llama_shapes();
  shapes["model.layers.1.self_attn.k_proj.weight"] = {16, 16};
  refused(shapes, tiny_llama(),
          ThrowsMessage<ShapeError>(dir.path().string() +
                                    ": tensor model.layers.1.self_attn.k_proj.weight is [16, "
                                    "16], the config implies [8, 16]"));
  shapes = llama_shapes();
  shapes.erase("model.norm.weight");
  refused(shapes, tiny_llama(), ThrowsMessage<KeyError>(HasSubstr("model.norm.weight")));
  json untied = tiny_llama();
  untied["tie_word_embeddings"] = false;
  refused(llama_shapes(), untied, ThrowsMessage<KeyError>(HasSubstr("lm_head.weight")));
  json qwen2 = tiny_llama();  // Qwen2 adds q/k/v biases the Llama checkpoint lacks
  qwen2["model_type"] = "qwen2";
  refused(llama_shapes(), qwen2,
          ThrowsMessage<KeyError>(HasSubstr("model.layers.0.self_attn.q_proj.bias")));
  json mlp_bias = tiny_llama();  // mlp_bias asks for the MLP biases the checkpoint lacks
  mlp_bias["mlp_bias"] = true;
  refused(llama_shapes(), mlp_bias,
          ThrowsMessage<KeyError>(HasSubstr("model.layers.0.mlp.gate_proj.bias")));
  shapes = llama_shapes();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    shapes[p + "gate_proj.bias"] = {24};
    shapes[p + "up_proj.bias"] = {24};
    shapes[p + "down_proj.bias"] = {24};
  }
  refused(shapes, mlp_bias,
          ThrowsMessage<ShapeError>(dir.path().string() +
                                    ": tensor model.layers.0.mlp.down_proj.bias is [24], the "
                                    "config implies [16]"));
  shapes = qwen2_moe_shapes();
  shapes["model.layers.0.mlp.shared_expert_gate.weight"] = {16};
  refused(shapes, tiny_qwen2_moe(),
          ThrowsMessage<ShapeError>(dir.path().string() +
                                    ": tensor model.layers.0.mlp.shared_expert_gate.weight is "
                                    "[16], the config implies [1, 16]"));
  shapes = qwen2_moe_shapes();
  shapes.erase("model.layers.0.mlp.shared_expert.up_proj.weight");
  refused(shapes, tiny_qwen2_moe(),
          ThrowsMessage<KeyError>(HasSubstr("model.layers.0.mlp.shared_expert.up_proj.weight")));
  shapes = qwen2_moe_shapes();
  shapes.erase("model.layers.1.mlp.up_proj.weight");  // the dense layer of mlp_only_layers
  refused(shapes, tiny_qwen2_moe(),
          ThrowsMessage<KeyError>(HasSubstr("model.layers.1.mlp.up_proj.weight")));
}

// Llama with mlp_bias and a Qwen2-MoE with its shared expert and a dense layer, checkpoints of
// the test's own shapes and ones write_random_model writes: each loads, its optional tensors
// where the config puts them, and decodes the same tokens on every mesh. (PyTorch checks the
// numbers: models_hf_match_pytorch.)
TEST(CausalLmTest, MlpBiasesSharedExpertsAndDenseLayersLoadAndDecodeTheSameOnEveryMesh) {
  json llama_bias = tiny_llama();
  llama_bias["mlp_bias"] = true;
  auto bias_shapes = llama_shapes();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    bias_shapes[p + "gate_proj.bias"] = {24};
    bias_shapes[p + "up_proj.bias"] = {24};
    bias_shapes[p + "down_proj.bias"] = {16};
  }
  for (const auto& [config, shapes] :
       {std::pair{llama_bias, bias_shapes}, std::pair{tiny_qwen2_moe(), qwen2_moe_shapes()}}) {
    for (const bool written_by_numesh : {false, true}) {
      ScratchDir dir;
      if (written_by_numesh) {
        write_random_model(dir.path(), config, DType::kF32, 5);
      } else {
        write_model(dir, config, shapes);
      }
      const std::string label = config["model_type"].get<std::string>() +
                                (written_by_numesh ? " (write_random_model)" : "");
      const HfConfig c = HfConfig::load(dir.path());
      const CausalLmWeights w = CausalLmWeights::load(c, SafetensorsCheckpoint::open(dir.path()));
      if (c.mlp_bias) {
        EXPECT_EQ(w.stack.blocks[1].mlp.up_bias.shape, (std::vector<std::int64_t>{24})) << label;
        EXPECT_EQ(w.stack.blocks[1].mlp.down_bias.shape, (std::vector<std::int64_t>{16})) << label;
      } else {
        EXPECT_EQ(w.stack.blocks[0].moe.shared_expert.down.shape,
                  (std::vector<std::int64_t>{12, 16}))
            << label << ": [in, out]";
        EXPECT_EQ(w.stack.blocks[0].moe.shared_expert_gate.shape,
                  (std::vector<std::int64_t>{16, 1}))
            << label;
        EXPECT_EQ(w.stack.blocks[1].mlp.up.shape, (std::vector<std::int64_t>{16, 24}))
            << label << ": the dense layer";
        EXPECT_TRUE(w.stack.blocks[1].moe.router.shape.empty()) << label;
      }
      std::vector<std::vector<std::int64_t>> runs;
      for (const auto& [n, axis] :
           std::vector<std::pair<std::int64_t, std::string>>{{1, "tp"}, {2, "tp"}, {2, "ep"}}) {
        CausalLm lm(mesh(n, axis), c, w, 2, 8);
        std::vector<std::int64_t> tokens =
            lm.greedy(std::vector<std::int32_t>{3, 4, 5, 6, 7, 8}, 3, 0);
        const std::vector<std::int32_t> fed{static_cast<std::int32_t>(tokens[0]),
                                            static_cast<std::int32_t>(tokens[1])};
        const std::vector<std::int64_t> next = lm.greedy(fed, 1, 3);
        tokens.insert(tokens.end(), next.begin(), next.end());
        runs.push_back(tokens);
      }
      EXPECT_EQ(runs[1], runs[0]) << label << ": tp2 picks what one device picks";
      EXPECT_EQ(runs[2], runs[0]) << label << ": ep2 too";
    }
  }
}

// CausalLm::load reads every matrix's shards straight from the file into the devices, or reads
// the file's mapping in place where a shard is one run of it; the model must be the one the host
// path builds, bit for bit, whatever the mesh, the dtype and the mapping.
TEST(CausalLmTest, ReadingShardsStraightIntoTheDevicesGivesTheSameModel) {
  json untied = tiny_llama();
  untied["tie_word_embeddings"] = false;
  auto untied_shapes = llama_shapes();
  untied_shapes["lm_head.weight"] = {32, 16};
  const auto four = runtime::DeviceMesh::create(
      runtime::testing::synthetic_devices(runtime::testing::nodes(4)), {2, 2}, {"ep", "tp"});
  for (const auto& [config, shapes] :
       {std::pair{tiny_llama(), llama_shapes()}, std::pair{untied, untied_shapes},
        std::pair{tiny_qwen2_moe(), qwen2_moe_shapes()}}) {
    ScratchDir dir;
    write_model(dir, config, shapes);
    const HfConfig c = HfConfig::load(dir.path());
    const auto checkpoint = SafetensorsCheckpoint::open(dir.path());
    const std::string label = config["model_type"].get<std::string>() +
                              (config["tie_word_embeddings"].get<bool>() ? " (tied)" : " (untied)");
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      const CausalLmWeights host = CausalLmWeights::load(c, checkpoint, dtype);
      for (const runtime::DeviceMesh& m :
           {mesh(1, "tp"), mesh(2, "tp"), mesh(2, "ep"), mesh(2, "dp"), four}) {
        for (const WeightMapping mapping :
             {WeightMapping::kAuto, WeightMapping::kInPlace, WeightMapping::kCopied}) {
          std::vector<std::pair<std::int64_t, std::int64_t>> reports;
          CausalLm direct = CausalLm::load(
              m, c, checkpoint, 2, 8, dtype, {},
              [&](std::int64_t done, std::int64_t total) { reports.emplace_back(done, total); },
              mapping);
          CausalLm reference(m, c, host, 2, 8);
          const std::vector<std::int32_t> ids{3, 4, 5, 6, 7, 8};
          EXPECT_EQ(direct.logits(ids, 3, 0), reference.logits(ids, 3, 0))
              << label << " " << to_string(dtype) << " on " << m.mesh().repr() << ", --mmap "
              << to_string(mapping);
          // The file is f32: only f32 matrices can read it in place. kAuto maps on one node only.
          const bool maps =
              dtype == DType::kF32 && (mapping == WeightMapping::kInPlace ||
                                       (mapping == WeightMapping::kAuto && m.size() == 1));
          EXPECT_EQ(direct.mapped_bytes() > 0, maps)
              << label << " " << to_string(dtype) << " on " << m.mesh().repr() << ", --mmap "
              << to_string(mapping);
          std::int64_t shards_mapped = 0;
          for (const NamedTensor& w : direct.weights()) {
            for (const std::int64_t slot : w.tensor->mesh().local_slots()) {
              const runtime::Tensor& shard = w.tensor->shard(slot);
              if (shard.buffer().is_mapped()) {
                shards_mapped += static_cast<std::int64_t>(shard.size_bytes());
              }
            }
          }
          EXPECT_EQ(shards_mapped, direct.mapped_bytes()) << label;
          ASSERT_FALSE(reports.empty());
          for (std::size_t i = 1; i < reports.size(); ++i)
            EXPECT_GT(reports[i].first, reports[i - 1].first);
          EXPECT_EQ(reports.back().first, reports.back().second)
              << label << ": progress ends at the total";
        }
      }
    }
  }
}

// Fused tensors (Phi-3's qkv_proj and gate_up_proj: q, k and v are row ranges of one tensor) and
// 16-bit weights read in place give the model the copies give, on one device and over tp.
TEST(CausalLmTest, FusedAnd16BitMatricesReadInPlaceGiveTheCopiesModel) {
  json llama = small_llama_config(128, 2);  // two heads of 64
  llama["vocab_size"] = 96;
  llama["num_key_value_heads"] = 2;
  json phi3 = llama;
  phi3["model_type"] = "phi3";
  phi3["architectures"] = {"Phi3ForCausalLM"};
  phi3["rope_scaling"] = nullptr;
  for (const auto& [config, stored] : {std::pair{phi3, DType::kBF16}, std::pair{phi3, DType::kF16},
                                       std::pair{llama, DType::kBF16}}) {
    ScratchDir dir;
    write_random_model(dir.path(), config, stored, 11);
    const HfConfig c = HfConfig::load(dir.path());
    const auto checkpoint = SafetensorsCheckpoint::open(dir.path());
    for (const runtime::DeviceMesh& m : {mesh(1, "tp"), mesh(2, "tp")}) {
      const std::string label = config["model_type"].get<std::string>() + " " +
                                std::string(to_string(stored)) + " on " + m.mesh().repr();
      CausalLm copied =
          CausalLm::load(m, c, checkpoint, 1, 8, stored, {}, {}, WeightMapping::kCopied);
      CausalLm mapped =
          CausalLm::load(m, c, checkpoint, 1, 8, stored, {}, {}, WeightMapping::kInPlace);
      EXPECT_GT(mapped.mapped_bytes(), 0) << label;
      const std::vector<std::int32_t> ids{3, 4, 5, 6};
      EXPECT_EQ(mapped.logits(ids, 4, 0), copied.logits(ids, 4, 0)) << label;
    }
  }
}

// A model reading its file in place keeps the mapping: it answers the same after its checkpoint
// is closed and after the file is written again (numesh's writers replace a file whole, so the
// old bytes stay with whoever maps them), and a new load sees the new file.
TEST(CausalLmTest, AModelReadInPlaceOutlivesItsCheckpointAndAFileWrittenOverIt) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig c = HfConfig::load(dir.path());
  const std::vector<std::int32_t> ids{3, 4, 5, 6, 7, 8};
  std::optional<CausalLm> lm;
  runtime::HostTensor before;
  {
    const auto checkpoint = SafetensorsCheckpoint::open(dir.path());
    lm.emplace(CausalLm::load(mesh(2, "tp"), c, checkpoint, 2, 8, DType::kF32, {}, {},
                              WeightMapping::kInPlace));
    before = lm->logits(ids, 3, 0);
  }
  ASSERT_GT(lm->mapped_bytes(), 0);
  EXPECT_EQ(lm->logits(ids, 3, 0), before) << "the checkpoint is closed";
  // The same tensors, every value doubled, written by numesh's writer over the file.
  const auto checkpoint = SafetensorsCheckpoint::open(dir.path());
  std::vector<runtime::HostTensor> values;
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : checkpoint.names()) {
    runtime::HostTensor t = runtime::HostTensor::zeros(checkpoint.shape(name));
    checkpoint.read(name, DType::kF32, std::as_writable_bytes(std::span<float>(t.data)));
    for (float& v : t.data) v *= 2.0f;
    values.push_back(std::move(t));
  }
  for (std::size_t i = 0; i < values.size(); ++i)
    tensors.push_back({checkpoint.names()[i], &values[i], DType::kF32});
  write_safetensors(dir.path() / "model.safetensors", tensors);
  EXPECT_EQ(lm->logits(ids, 3, 0), before) << "the old file's bytes, still mapped";
  const auto rewritten = SafetensorsCheckpoint::open(dir.path());
  CausalLm fresh = CausalLm::load(mesh(2, "tp"), c, rewritten, 2, 8, DType::kF32, {}, {},
                                  WeightMapping::kInPlace);
  EXPECT_NE(fresh.logits(ids, 3, 0), before) << "a new load reads the new file";
}

TEST(CausalLmTest, CallsThatDoNotFitAreRefusedBeforeAnythingRuns) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  EXPECT_THAT([&] { CausalLm(mesh(1, "tp"), config, w, 1, 65); },
              ThrowsMessage<ShapeError>(
                  "llama model: a context of 65 tokens is longer than the 64 it runs over "
                  "(max_position_embeddings, or the sliding window)"));
  CausalLm lm(mesh(1, "tp"), config, w, 2, 8);
  EXPECT_THAT(
      [&] {
        lm.greedy(std::vector<std::int32_t>{1, 2, 3}, 2, 0);
      },
      ThrowsMessage<ShapeError>("model: 3 ids for 2 sequences of 2 tokens (expected 4)"));
  EXPECT_THAT(
      [&] {
        lm.logits(std::vector<std::int32_t>{1, 32}, 1, 0);
      },
      ThrowsMessage<IndexError>(
          "embedding: token 32 at position 1 is outside the vocabulary [0, 32)"));
  EXPECT_THAT(
      [&] {
        lm.greedy(std::vector<std::int32_t>{1, 2}, 1, 8);
      },
      ThrowsMessage<IndexError>(HasSubstr("8")));
}

// The largest |a - b| over max |b| (0 for two empty rows).
double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::abs(b[i])));
  }
  return m > 0 ? d / m : d;
}

// A call of more tokens than the prefill chunk runs the stack chunk after chunk (each writing
// its keys and values before the next reads them): the logits of one run, and caches that
// give the next step the same logits, on every mesh; a call that does not fit is refused
// whole, before any chunk runs.
TEST(CausalLmTest, ACallLongerThanAChunkRunsInChunksAndGivesTheLogitsOfOneRun) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  std::vector<std::int32_t> ids(2 * 13);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 7 % 32);
  const std::vector<std::int32_t> next{5, 9};
  for (const auto& [n, axis] :
       std::vector<std::pair<std::int64_t, std::string>>{{1, "tp"}, {2, "tp"}, {2, "dp"}}) {
    CausalLm lm(mesh(n, axis), config, w, 2, 24);
    EXPECT_EQ(lm.prefill_chunk(), CausalLm::kDefaultPrefillChunk);
    const std::vector<float> whole = lm.logits(ids, 13, 2).data;
    const std::vector<float> whole_next = lm.logits(next, 1, 15).data;
    // 13 tokens in chunks of at most 5: three of 5, 5 and 3 (two more programs of the stack),
    // and the head over the 26 rows in runs of 10, 10 and 6 (two more heads, each with its
    // greedy and logits programs); in chunks of 1, every token alone (the decode step's).
    for (const auto& [chunk, stack_programs, programs] :
         std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {5, 2, 2 + 2 * 2}, {1, 0, 0}, {13, 0, 0}}) {
      lm.set_prefill_chunk(chunk);
      const std::int64_t stack = lm.stack().compiled_programs(), all = lm.compiled_programs();
      const std::vector<float> chunked = lm.logits(ids, 13, 2).data;
      EXPECT_EQ(lm.stack().compiled_programs() - stack, stack_programs) << "chunks of " << chunk;
      EXPECT_EQ(lm.compiled_programs() - all, programs) << "chunks of " << chunk;
      ASSERT_EQ(chunked.size(), whole.size());
      EXPECT_LT(relative(chunked, whole), 1e-5) << "chunks of " << chunk << " on " << n << axis;
      EXPECT_LT(relative(lm.logits(next, 1, 15).data, whole_next), 1e-5)
          << "the caches the chunks wrote, chunks of " << chunk << " on " << n << axis;
    }
    lm.set_prefill_chunk(5);
    const std::vector<std::int64_t> chunked_picks = lm.greedy(ids, 13, 2);
    lm.set_prefill_chunk(512);
    EXPECT_EQ(chunked_picks, lm.greedy(ids, 13, 2));
  }
  CausalLm lm(mesh(1, "tp"), config, w, 1, 24);
  EXPECT_EQ(lm.run_tokens(2000), 500) << "four equal chunks of the default 512";
  EXPECT_EQ(lm.run_tokens(513), 257);
  EXPECT_EQ(lm.run_tokens(512), 512);
  lm.set_prefill_chunk(5);
  EXPECT_EQ(lm.run_tokens(13), 5);
  EXPECT_EQ(lm.run_tokens(4), 4);
  EXPECT_THAT([&] { lm.set_prefill_chunk(0); },
              ThrowsMessage<ValueError>("model: chunks of 0 tokens; a chunk takes at least one"));
  lm.set_prefill_chunk(4);
  const std::int64_t before = lm.stack().compiled_programs();
  EXPECT_THAT(
      [&] { lm.logits(std::vector<std::int32_t>(20, 1), 20, 5); },
      ThrowsMessage<IndexError>("transformer: 20 tokens at position 5 (sequence 0) do not fit the "
                                "KV cache of 24 positions"));
  EXPECT_EQ(lm.stack().compiled_programs(), before) << "no chunk ran";
}

// A logits call (its embedding, stack and head graphs) cancelled part-way through its first
// graph, or before it, stops with CancelledError; the next call gives the uncancelled bits.
TEST(CausalLmTest, ACancelledCallStopsAndLeavesTheModelWhole) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  const runtime::DeviceMesh two = mesh(2, "tp");
  CausalLm lm(two, config, w, 1, 64);
  std::vector<std::int32_t> ids(48);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 5 % 32);
  const std::vector<float> want = lm.logits(ids, 48, 0).data;
  {
    runtime::CancelSource source;
    source.cancel();
    const runtime::CancelScope scope(source);
    EXPECT_THAT([&] { lm.logits(ids, 48, 0); },
                ThrowsMessage<CancelledError>(HasSubstr("before it began")));
    EXPECT_EQ(source.runs_begun(), 1);
  }
  EXPECT_EQ(lm.logits(ids, 48, 0).data, want);
  for (int round = 0; round < 3; ++round) {
    runtime::CancelSource source;
    {
      const runtime::testing::CancelMidRun cancel(two.device(round % 2), source);
      const runtime::CancelScope scope(source);
      EXPECT_THAT([&] { lm.logits(ids, 48, 0); },
                  ThrowsMessage<CancelledError>("graph run cancelled by the caller"));
    }
    EXPECT_EQ(source.runs_begun(), 1) << "the stack and the head never began";
    EXPECT_EQ(lm.logits(ids, 48, 0).data, want) << "after round " << round;
  }
}

TEST(GenerationTest, PromptsOfDifferentLengthsGiveWhatEachGivesAlone) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  const std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5, 6, 7}, {9, 2}, {11, 12, 13}, {30}};
  for (const bool keep_logits : {false, true}) {
    GenerationOptions options{.max_new_tokens = 6, .keep_logits = keep_logits};
    std::mt19937_64 rng(1);
    // Each prompt alone, on one device.
    std::vector<GenerationResult> alone;
    for (const auto& p : prompts) {
      CausalLm one(mesh(1, "tp"), config, w, 1, 16);
      alone.push_back(generate(one, {p}, options, rng));
    }
    // A stop id that ends sequence 1 at its second token, and nothing else before the end.
    const std::int64_t stop = alone[1].ids[0][1];
    bool stop_elsewhere = alone[1].ids[0][0] == stop;
    for (std::size_t b : {0u, 2u, 3u}) {
      for (std::int64_t id : alone[b].ids[0]) stop_elsewhere |= id == stop;
    }
    EXPECT_FALSE(stop_elsewhere)
        << "the seed gives a stop id only sequence 1 makes (else pick another seed)";
    // Prefilled whole, and in chunks of 2 (the prompts padded to 5: chunks of 2, 2 and 1).
    for (const auto& [n, axis, chunk] : std::vector<std::tuple<std::int64_t, std::string, int>>{
             {1, "tp", 512}, {2, "tp", 512}, {2, "dp", 512}, {1, "tp", 2}, {2, "dp", 2}}) {
      CausalLm lm(mesh(n, axis), config, w, 4, 16);
      lm.set_prefill_chunk(chunk);
      std::vector<std::int64_t> steps;
      const GenerationResult all = generate(
          lm, prompts, options, rng, [&](std::int64_t step, std::span<const std::int64_t> tokens) {
            steps.push_back(step);
            EXPECT_EQ(tokens.size(), 4u);
          });
      EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}))
          << "the prefill, then five decode steps";
      EXPECT_EQ(all.decode_steps, 5);
      EXPECT_EQ(all.decoded_tokens, 4 * 5);
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        EXPECT_EQ(all.ids[b], alone[b].ids[0])
            << "sequence " << b << " on " << n << " " << axis << ", chunks of " << chunk;
        EXPECT_EQ(all.stopped[b], StopReason::kMaxNewTokens);
        if (keep_logits) {
          ASSERT_EQ(all.logits[b].size(), (prompts[b].size() + 5) * 32) << "[P + N - 1, V]";
          EXPECT_LT(relative(all.logits[b], alone[b].logits[0]), 1e-5) << "sequence " << b;
        }
      }
      options.stop_ids = {stop};
      const GenerationResult stopped = generate(lm, prompts, options, rng);
      options.stop_ids.clear();
      EXPECT_EQ(stopped.ids[1], (std::vector<std::int64_t>{alone[1].ids[0][0], stop}));
      EXPECT_EQ(stopped.stopped[1], StopReason::kStopId);
      for (std::size_t b : {0u, 2u, 3u}) {
        EXPECT_EQ(stopped.ids[b], alone[b].ids[0])
            << "the others run on past sequence 1's stop: " << b;
      }
      EXPECT_EQ(stopped.decoded_tokens, 3 * 5 + 1);
    }
  }
}

TEST(GenerationTest, SamplingFromTheTopOneIsGreedyAndBadCallsAreRefused) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  CausalLm lm(mesh(2, "tp"), config, w, 2, 8);
  const std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5}, {6}};
  std::mt19937_64 rng(5);
  const GenerationResult greedy = generate(lm, prompts, {.max_new_tokens = 4}, rng);
  for (const bool keep_logits : {false, true}) {
    const GenerationResult top1 =
        generate(lm, prompts,
                 {.max_new_tokens = 4,
                  .sampling = ops::SamplingOptions{.temperature = 0.7, .top_k = 1},
                  .keep_logits = keep_logits},
                 rng);
    EXPECT_EQ(top1.ids, greedy.ids) << "keep_logits " << keep_logits;
  }
  EXPECT_THAT(
      [&] {
        generate(lm, {{1, 2}}, {}, rng);
      },
      ThrowsMessage<ShapeError>("generate: 1 prompts for a model of 2 sequences"));
  EXPECT_THAT(
      [&] {
        generate(lm, {{1, 2}, {}}, {}, rng);
      },
      ThrowsMessage<ShapeError>("generate: prompt 1 is empty"));
  EXPECT_THAT([&] { generate(lm, prompts, {.max_new_tokens = 0}, rng); },
              ThrowsMessage<ValueError>("generate: max_new_tokens 0 must be at least 1"));
  EXPECT_THAT([&] { generate(lm, prompts, {.max_new_tokens = 7}, rng); },
              ThrowsMessage<IndexError>("generate: the longest prompt (3 tokens) and 7 new tokens "
                                        "do not fit the model's 8 positions"));
  EXPECT_THAT(
      [&] {
        generate(lm, {{1, 2}, {32}}, {.max_new_tokens = 2}, rng);
      },
      ThrowsMessage<IndexError>(HasSubstr("token 32")));
  EXPECT_NO_THROW(generate(lm, prompts, {.max_new_tokens = 6}, rng))
      << "the last new token is not fed: 3 + 6 - 1 fit 8";
}

TEST(PerplexityTest, ChunksBosAndTheScoredHalfFollowLlamaCpp) {
  ScratchDir dir;
  write_model(dir, tiny_llama(), llama_shapes());
  const HfConfig config = HfConfig::load(dir.path());
  const CausalLmWeights w = CausalLmWeights::load(config, SafetensorsCheckpoint::open(dir.path()));
  std::vector<std::int32_t> tokens(21);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % 32);
  CausalLm lm(mesh(2, "tp"), config, w, 1, 8);
  std::vector<std::int64_t> progress;
  const PerplexityResult r =
      perplexity(lm, tokens, 8, 1, [&](std::int64_t c, double) { progress.push_back(c); });
  EXPECT_EQ(r.chunks, 2) << "21 tokens hold two chunks of 8; the rest is left out";
  EXPECT_EQ(r.scored, 6) << "tokens 5, 6, 7 of each chunk, from the logits at 4, 5, 6";
  EXPECT_EQ(progress, (std::vector<std::int64_t>{1, 2}));
  // The same sum from the logits of each chunk run by itself, BOS first.
  CausalLm check(mesh(1, "tp"), config, w, 1, 8);
  double sum = 0.0;
  for (int c = 0; c < 2; ++c) {
    std::vector<std::int32_t> chunk(tokens.begin() + c * 8, tokens.begin() + c * 8 + 8);
    chunk[0] = 1;
    const runtime::HostTensor logits = check.logits(chunk, 8, 0);
    for (int j = 4; j < 7; ++j) sum += token_nll(logits, j, chunk[static_cast<std::size_t>(j + 1)]);
  }
  EXPECT_NEAR(r.mean_nll, sum / 6.0, 1e-5);
  EXPECT_NEAR(r.perplexity, std::exp(sum / 6.0), 1e-4 * r.perplexity);
  EXPECT_GT(r.standard_error, 0.0);
  EXPECT_THAT([&] { (void)perplexity(lm, std::span<const std::int32_t>(tokens).first(7), 8, 1); },
              ThrowsMessage<ValueError>(
                  "perplexity: the text has 7 tokens; a context of 8 needs at least 4 and that "
                  "many tokens (one chunk)"));
  CausalLm two(mesh(1, "tp"), config, w, 2, 8);
  EXPECT_THAT([&] { (void)perplexity(two, tokens, 8, 1); },
              ThrowsMessage<ValueError>(
                  "perplexity: the model runs 2 sequences of up to 8 tokens; it needs 1 of at "
                  "least 8"));
}

TEST(PerplexityTest, TokenNllIsTheLogSoftmax) {
  runtime::HostTensor logits = runtime::HostTensor::zeros({1, 3});
  logits.data = {0.0f, std::log(2.0f), std::log(3.0f)};
  EXPECT_NEAR(token_nll(logits, 0, 2), -std::log(0.5), 1e-7);
  EXPECT_NEAR(token_nll(logits, 0, 0), -std::log(1.0 / 6.0), 1e-7);
}

}  // namespace
}  // namespace numesh::models
