#include "numesh/models/hf/gguf_checkpoint.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/gguf_export.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/formats/gguf_writer.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/hf/weight_formats.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/trainer.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/ops/kernels/weight_order.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models {
namespace {

using ::testing::HasSubstr;
using testing::mesh_of;
using testing::ScratchDir;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

// A random Llama (4 heads of `head_dim` 16, 2 kv heads, 2 layers, vocabulary 64, no RoPE
// scaling, an MLP `intermediate` wide) in dir/hf, and numesh's GGUF of it in `format`.
std::filesystem::path llama_gguf(const ScratchDir& dir, DType format = DType::kF32,
                                 std::int64_t intermediate = 128, std::int64_t head_dim = 16) {
  nlohmann::json c = small_llama_config(64, 2);
  c["vocab_size"] = 64;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 2;
  c["head_dim"] = head_dim;
  c["intermediate_size"] = intermediate;
  c["rope_scaling"] = nullptr;
  write_random_model(dir.path() / "hf", c, DType::kF32, 3);
  const std::filesystem::path file = dir.path() / "model.gguf";
  (void)write_gguf(ModelSource::open(dir.path() / "hf"), file, format);
  return file;
}

std::vector<float> read_all(const Checkpoint& c, const std::string& name) {
  std::int64_t n = 1;
  for (const std::int64_t e : c.shape(name)) n *= e;
  std::vector<float> out(static_cast<std::size_t>(n));
  c.read(name, DType::kF32, std::as_writable_bytes(std::span<float>(out)));
  return out;
}

// Whether logits `got` are `want`'s within 1e-5 of want's largest magnitude, each of them (a
// NaN is never near): the same quantized operands, fp32 sums rounded in another order.
::testing::AssertionResult near_logits(const runtime::HostTensor& got,
                                       const runtime::HostTensor& want) {
  if (got.shape != want.shape) return ::testing::AssertionFailure() << "other shapes";
  float largest = 0.0f;
  for (const float w : want.data) largest = std::max(largest, std::abs(w));
  for (std::size_t i = 0; i < want.data.size(); ++i) {
    if (!(std::abs(got.data[i] - want.data[i]) <= 1e-5f * largest)) {
      return ::testing::AssertionFailure() << "logit " << i << " is " << got.data[i] << ", not "
                                           << want.data[i] << " (largest " << largest << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(GgufCheckpointTest, AWrittenLlamaReadsBackUnderItsHuggingFaceNamesWithQkRowsInOrder) {
  const ScratchDir dir;
  const auto file = llama_gguf(dir);
  const GgufCheckpoint g = GgufCheckpoint::open(file);
  const auto st = SafetensorsCheckpoint::open(dir.path() / "hf");
  const HfConfig want = HfConfig::load(dir.path() / "hf");
  EXPECT_EQ(g.config().architecture, Architecture::kLlama);
  EXPECT_EQ(g.config().num_attention_heads, 4);
  EXPECT_EQ(g.config().num_key_value_heads, 2);
  EXPECT_EQ(g.config().head_dim, 16);
  EXPECT_EQ(g.config().vocab_size, 64);
  EXPECT_EQ(g.config().tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_EQ(g.stored_dtype(), DType::kF32);
  EXPECT_EQ(g.location(), file);
  EXPECT_THAT(g.weight_files(), ::testing::ElementsAre(file));
  // Every tensor of the safetensors checkpoint, the same values (q and k permuted in the file).
  std::vector<std::string> names = g.names(), st_names = st.names();
  std::sort(names.begin(), names.end());
  std::sort(st_names.begin(), st_names.end());
  EXPECT_EQ(names, st_names);
  for (const std::string& name : st_names) {
    EXPECT_EQ(g.shape(name), st.shape(name)) << name;
    EXPECT_EQ(read_all(g, name), read_all(st, name)) << name;
  }
  // A box of rows inside a head of k_proj (rows 3-6 of head 0, columns 8-24).
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  const std::array<std::int64_t, 2> at{3, 8}, size{4, 16};
  std::vector<float> a(64), b(64);
  g.read_box(k, at, size, DType::kF32, std::as_writable_bytes(std::span<float>(a)));
  st.read_box(k, at, size, DType::kF32, std::as_writable_bytes(std::span<float>(b)));
  EXPECT_EQ(a, b);
  // The heads a box touches are read at once and its rows taken from them: the second head of
  // k_proj whole (rows 16-31), and rows 12-19 across the boundary of its two heads.
  for (const std::array<std::int64_t, 2> rows : {std::array<std::int64_t, 2>{16, 16}, {12, 8}}) {
    const std::array<std::int64_t, 2> box_at{rows[0], 8}, box_size{rows[1], 16};
    std::vector<float> from_gguf(static_cast<std::size_t>(rows[1] * 16)), from_st(from_gguf);
    g.read_box(k, box_at, box_size, DType::kF32,
               std::as_writable_bytes(std::span<float>(from_gguf)));
    st.read_box(k, box_at, box_size, DType::kF32,
                std::as_writable_bytes(std::span<float>(from_st)));
    EXPECT_EQ(from_gguf, from_st) << "rows from " << rows[0];
  }
  // So a loader reads q and k in blocks of whole heads; other tensors' rows are read alone.
  EXPECT_EQ(g.rows_read_together(k), 16);
  EXPECT_EQ(g.rows_read_together("model.layers.1.self_attn.q_proj.weight"), 16);
  EXPECT_EQ(g.rows_read_together("model.layers.1.self_attn.v_proj.weight"), 1);
  EXPECT_EQ(st.rows_read_together(k), 1);
  EXPECT_THROW((void)g.rows_read_together("model.nope"), KeyError);
  EXPECT_THROW((void)st.rows_read_together("model.nope"), KeyError);
  EXPECT_THAT([&] { (void)g.shape("model.layers.1.self_attn.k_proj.weights"); },
              ThrowsMessage<KeyError>(HasSubstr(
                  "has no tensor 'model.layers.1.self_attn.k_proj.weights'; the closest")));
  EXPECT_THAT(
      [&] {
        g.read_box(k, std::array<std::int64_t, 1>{0}, std::array<std::int64_t, 1>{1}, DType::kF32,
                   std::as_writable_bytes(std::span<float>(a)));
      },
      ThrowsMessage<ShapeError>(HasSubstr(
          "the box has 1 offsets and 1 sizes but the tensor (shape [32, 64]) has rank 2")));
}

// A GGUF box is read in place when read_box() would copy one run of the file as it is: whole
// rows of a tensor stored in the format asked for, not permuted. Models loaded in place and
// copied give the same logits, and the one in place maps the matrices that allow it.
TEST(GgufCheckpointTest, BoxesReadInPlaceAreTheBytesReadBoxCopiesButNeverPermutedRows) {
  const ScratchDir dir;
  const GgufCheckpoint q8 = GgufCheckpoint::open(llama_gguf(dir, DType::kQ8_0));
  const std::string v = "model.layers.0.self_attn.v_proj.weight";  // [32, 64]
  const std::array<std::int64_t, 2> rows_at{4, 0}, rows{8, 64};
  const std::shared_ptr<const std::byte> p = q8.box_in_place(v, rows_at, rows, DType::kQ8_0);
  ASSERT_NE(p, nullptr);
  std::vector<std::byte> copied(8 * 2 * 34);  // 8 rows of two Q8_0 blocks
  q8.read_box(v, rows_at, rows, DType::kQ8_0, copied);
  EXPECT_EQ(std::memcmp(p.get(), copied.data(), copied.size()), 0);
  const std::array<std::int64_t, 2> cols_at{0, 32}, cols{32, 32};
  EXPECT_EQ(q8.box_in_place(v, cols_at, cols, DType::kQ8_0), nullptr) << "every row's 2nd block";
  EXPECT_EQ(q8.box_in_place(v, rows_at, rows, DType::kF32), nullptr) << "dequantized, not mapped";
  EXPECT_EQ(q8.box_in_place("model.layers.0.self_attn.q_proj.weight", rows_at, rows, DType::kQ8_0),
            nullptr)
      << "llama.cpp's converter permuted q's rows: read_box puts them back";
  EXPECT_THROW(
      (void)q8.box_in_place("model.layers.0.self_attn.v_proj.weights", rows_at, rows, DType::kQ8_0),
      KeyError);

  const ScratchDir f32_dir;
  const GgufCheckpoint f32 = GgufCheckpoint::open(llama_gguf(f32_dir, DType::kF32));
  for (const GgufCheckpoint* g : {&f32, &q8}) {
    const WeightFormats formats = WeightFormats::as_stored(*g, g->stored_dtype());
    CausalLm copied_lm = CausalLm::load(testing::mesh_of(1, {"tp"}), g->config(), *g, 1, 8, formats,
                                        {}, {}, WeightMapping::kCopied);
    CausalLm mapped_lm = CausalLm::load(testing::mesh_of(1, {"tp"}), g->config(), *g, 1, 8, formats,
                                        {}, {}, WeightMapping::kInPlace);
    const std::vector<std::int32_t> ids{3, 4, 5, 6};
    const auto copied_logits = copied_lm.logits(ids, 4, TokenPositions::level(1, 0, 4));
    const auto mapped_logits = mapped_lm.logits(ids, 4, TokenPositions::level(1, 0, 4));
    if (ops::out_in_order(g->stored_dtype()) == runtime::StoredOrder::kRows) {
      EXPECT_EQ(mapped_logits, copied_logits) << to_string(g->stored_dtype());
    } else {
      // Copied into panels, q8_0 products take the VNNI tile's order at every row count; the
      // file's rows, the dot kernels' (docs/ops.md).
      EXPECT_TRUE(near_logits(mapped_logits, copied_logits));
    }
    EXPECT_EQ(copied_lm.mapped_bytes(), 0);
    // Every matrix but q and k (permuted): the embedding, the head, and in each of the two
    // layers v, o and the MLP's three; q8_0 ones too where the kernel level would store them in
    // panels (in place asked for outright keeps the file's rows).
    std::uint64_t want =
        g->stored_bytes("model.embed_tokens.weight") + g->stored_bytes("lm_head.weight");
    for (int layer = 0; layer < 2; ++layer) {
      for (const char* m : {"self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                            "mlp.down_proj"}) {
        want += g->stored_bytes(fmt::format("model.layers.{}.{}.weight", layer, m));
      }
    }
    EXPECT_EQ(mapped_lm.mapped_bytes(), static_cast<std::int64_t>(want))
        << to_string(g->stored_dtype());
    if (g == &f32) {
      EXPECT_EQ(want, (2 * 64 * 64 + 2 * (32 * 64 + 64 * 64 + 128 * 64 * 3)) * 4);
    }
    // kAuto on one NUMA node maps what kInPlace maps, but for matrices the kernel level stores
    // in panels: those it copies (into the faster order).
    CausalLm auto_lm = CausalLm::load(testing::mesh_of(1, {"tp"}), g->config(), *g, 1, 8, formats,
                                      {}, {}, WeightMapping::kAuto);
    // What auto copied into panels that in place read as rows: the difference of the two, and
    // nothing from the other loads.
    EXPECT_EQ(copied_lm.panel_copied_bytes(), 0);
    EXPECT_EQ(mapped_lm.panel_copied_bytes(), 0);
    if (ops::out_in_order(g->stored_dtype()) == runtime::StoredOrder::kRows) {
      EXPECT_EQ(auto_lm.mapped_bytes(), mapped_lm.mapped_bytes()) << to_string(g->stored_dtype());
      EXPECT_EQ(auto_lm.panel_copied_bytes(), 0) << to_string(g->stored_dtype());
    } else {
      EXPECT_EQ(auto_lm.mapped_bytes(),
                static_cast<std::int64_t>(g->stored_bytes("model.embed_tokens.weight")))
          << "only the embedding (stored in-out, in rows) maps";
      EXPECT_EQ(auto_lm.panel_copied_bytes(), mapped_lm.mapped_bytes() - auto_lm.mapped_bytes());
    }
    EXPECT_EQ(auto_lm.logits(ids, 4, TokenPositions::level(1, 0, 4)),
              copied_lm.logits(ids, 4, TokenPositions::level(1, 0, 4)))
        << to_string(g->stored_dtype());
  }
}

// The loader reads a matrix in blocks of 64 rows, each written as its panels of 16 rows where the
// kernel level keeps q8_0 in panels: gate and up of an MLP 320 wide, 160 rows a device on two
// (blocks of 64 + 64 + 32 rows; a range halved down to 64 rows would end in blocks of 40, cutting
// panels), give the logits of the file's rows read in place. Where this level keeps q8_0 in
// rows the two loads are the same: skipped (scripts/test.sh runs the scalar level with
// NUMESH_WEIGHT_PANELS=1, so every machine runs it).
TEST(GgufCheckpointTest, PanelsFilledInBlocksOfRowsHoldTheMatrixWhereItsRowsDoNotHalveEvenly) {
  if (ops::out_in_order(DType::kQ8_0) != runtime::StoredOrder::kPanels)
    GTEST_SKIP() << "this kernel level keeps q8_0 in rows (NUMESH_WEIGHT_PANELS=1 takes panels)";
  const ScratchDir dir;
  const GgufCheckpoint g = GgufCheckpoint::open(llama_gguf(dir, DType::kQ8_0, 320));
  const WeightFormats formats = WeightFormats::as_stored(g, g.stored_dtype());
  const std::vector<std::int32_t> ids{3, 4, 5, 6};
  for (const int devices : {1, 2}) {
    const auto mesh = mesh_of(devices, {"tp"});
    CausalLm copied =
        CausalLm::load(mesh, g.config(), g, 1, 8, formats, {}, {}, WeightMapping::kCopied);
    CausalLm mapped =
        CausalLm::load(mesh, g.config(), g, 1, 8, formats, {}, {}, WeightMapping::kInPlace);
    EXPECT_TRUE(near_logits(copied.logits(ids, 4, TokenPositions::level(1, 0, 4)),
                            mapped.logits(ids, 4, TokenPositions::level(1, 0, 4))))
        << devices << " devices";
  }
}

// A checkpoint read through another, recording the rows of each box read_box() is asked for.
class RecordingCheckpoint final : public Checkpoint {
 public:
  explicit RecordingCheckpoint(const Checkpoint& inner) : inner_(inner) {}
  const std::filesystem::path& location() const noexcept override { return inner_.location(); }
  std::vector<std::filesystem::path> weight_files() const override { return inner_.weight_files(); }
  std::vector<std::string> names() const override { return inner_.names(); }
  bool contains(std::string_view name) const noexcept override { return inner_.contains(name); }
  std::vector<std::int64_t> shape(std::string_view name) const override {
    return inner_.shape(name);
  }
  std::uint64_t stored_bytes(std::string_view name) const override {
    return inner_.stored_bytes(name);
  }
  std::optional<DType> stored_format(std::string_view name) const override {
    return inner_.stored_format(name);
  }
  void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                std::span<const std::int64_t> sizes, DType target,
                std::span<std::byte> out) const override {
    if (!offsets.empty()) {
      const std::lock_guard lock(mutex_);
      rows_[std::string(name)].push_back({offsets[0], offsets[0] + sizes[0]});
    }
    inner_.read_box(name, offsets, sizes, target, out);
  }
  std::shared_ptr<const std::byte> box_in_place(std::string_view name,
                                                std::span<const std::int64_t> offsets,
                                                std::span<const std::int64_t> sizes,
                                                DType target) const override {
    return inner_.box_in_place(name, offsets, sizes, target);
  }
  std::int64_t rows_read_together(std::string_view name) const override {
    return inner_.rows_read_together(name);
  }
  // The [first, end) rows of every box read of tensor `name`, in order.
  std::vector<std::array<std::int64_t, 2>> rows(const std::string& name) const {
    const std::lock_guard lock(mutex_);
    std::vector<std::array<std::int64_t, 2>> out = rows_[name];
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  const Checkpoint& inner_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::vector<std::array<std::int64_t, 2>>> rows_;
};

// The loader reads GGUF's permuted q and k in blocks of whole heads and whole panels of 16 rows,
// the least such multiple of at least 64 rows (heads of 48: 96; of 24: 96, where whole heads
// alone would take 72; of 16: 64; of 128: 128), and the matrices whose rows are read alone in
// blocks of 64.
TEST(GgufCheckpointTest, TheLoaderReadsPermutedRowsInBlocksOfWholeHeadsAndPanels) {
  using Rows = std::vector<std::array<std::int64_t, 2>>;
  struct Case {
    std::int64_t head_dim;
    Rows q, k, v;  // q: 4 heads; k and v: 2 kv heads, v not permuted
  };
  for (const Case& c :
       {Case{48, {{0, 96}, {96, 192}}, {{0, 96}}, {{0, 64}, {64, 96}}},
        Case{24, {{0, 96}}, {{0, 48}}, {{0, 48}}}, Case{16, {{0, 64}}, {{0, 32}}, {{0, 32}}},
        Case{128,
             {{0, 128}, {128, 256}, {256, 384}, {384, 512}},
             {{0, 128}, {128, 256}},
             {{0, 64}, {64, 128}, {128, 192}, {192, 256}}}}) {
    const ScratchDir dir;
    const GgufCheckpoint g = GgufCheckpoint::open(llama_gguf(dir, DType::kQ8_0, 128, c.head_dim));
    const RecordingCheckpoint recorded(g);
    (void)CausalLm::load(mesh_of(1, {"tp"}), g.config(), recorded, 1, 8,
                         WeightFormats::as_stored(g, g.stored_dtype()), {}, {},
                         WeightMapping::kCopied);
    EXPECT_EQ(recorded.rows("model.layers.0.self_attn.q_proj.weight"), c.q)
        << "heads of " << c.head_dim;
    EXPECT_EQ(recorded.rows("model.layers.1.self_attn.k_proj.weight"), c.k)
        << "heads of " << c.head_dim;
    EXPECT_EQ(recorded.rows("model.layers.0.self_attn.v_proj.weight"), c.v)
        << "heads of " << c.head_dim;
  }
}

// Heads of 48 rows (blocks of 96 for q and k, a head and a half of 64 for the others): f32 and
// q8_0 (rows, or panels where the level takes them) give the logits of the same weights loaded
// from the folder (quantized at load as numesh's converter quantized the file) on 1 and 2
// devices.
TEST(GgufCheckpointTest, HeadsOf48GiveTheSafetensorsFoldersLogits) {
  for (const DType format : {DType::kF32, DType::kQ8_0}) {
    const ScratchDir dir;
    const GgufCheckpoint g = GgufCheckpoint::open(llama_gguf(dir, format, 128, 48));
    const auto st = SafetensorsCheckpoint::open(dir.path() / "hf");
    const HfConfig config = HfConfig::load(dir.path() / "hf");
    ASSERT_EQ(g.rows_read_together("model.layers.0.self_attn.q_proj.weight"), 48);
    const std::vector<std::int32_t> ids{3, 4, 5, 6};
    for (const int devices : {1, 2}) {
      const auto mesh = mesh_of(devices, {"tp"});
      CausalLm from_gguf =
          CausalLm::load(mesh, g.config(), g, 1, 8, format, {}, {}, WeightMapping::kCopied);
      CausalLm from_folder =
          CausalLm::load(mesh, config, st, 1, 8, format, {}, {}, WeightMapping::kCopied);
      EXPECT_EQ(from_gguf.logits(ids, 4, TokenPositions::level(1, 0, 4)),
                from_folder.logits(ids, 4, TokenPositions::level(1, 0, 4)))
          << to_string(format) << ", " << devices << " devices";
    }
  }
}

TEST(GgufCheckpointTest, ABlockFileLoadsAsItsFormatAndModelSourceReadsIt) {
  const ScratchDir dir;
  const auto file = llama_gguf(dir, DType::kQ8_0);
  const GgufCheckpoint g = GgufCheckpoint::open(file);
  EXPECT_EQ(g.stored_dtype(), DType::kQ8_0);
  const ModelSource s = ModelSource::open(file);
  EXPECT_EQ(s.stored_dtype(), DType::kQ8_0);
  EXPECT_EQ(s.tokenizer(), nullptr);  // the random model has no tokenizer
  EXPECT_EQ(s.chat_template(), nullptr);
  // A folder holding the one file opens it.
  std::filesystem::create_directories(dir.path() / "only");
  std::filesystem::copy_file(file, dir.path() / "only" / "m.gguf");
  EXPECT_TRUE(GgufCheckpoint::is_gguf(dir.path() / "only"));
  EXPECT_FALSE(GgufCheckpoint::is_gguf(dir.path() / "hf"));
  EXPECT_EQ(GgufCheckpoint::open(dir.path() / "only").config().hidden_size, 64);
}

// A load keeps each matrix in the format its checkpoint stores it in (WeightFormats::as_stored),
// or stores every matrix in one format; an Engine asked for none loads a GGUF file as stored.
TEST(GgufCheckpointTest, WeightFormatsAreEachMatrixsStoredFormatOrOneForAll) {
  const ScratchDir dir;
  const auto file = llama_gguf(dir, DType::kQ8_0);
  const GgufCheckpoint g = GgufCheckpoint::open(file);
  const std::string v = "model.layers.0.self_attn.v_proj.weight", norm = "model.norm.weight";
  EXPECT_EQ(g.stored_format(v), DType::kQ8_0);
  EXPECT_EQ(g.stored_format(norm), DType::kF32);
  EXPECT_EQ(SafetensorsCheckpoint::open(dir.path() / "hf").stored_format(v), DType::kF32);
  EXPECT_THAT([&] { (void)g.stored_format("model.nope"); },
              ThrowsMessage<KeyError>(HasSubstr("has no tensor 'model.nope'")));
  const WeightFormats as_stored = WeightFormats::as_stored(g, DType::kBF16);
  EXPECT_FALSE(as_stored.uniform());
  EXPECT_EQ(as_stored.of(std::vector<std::string>{v}), DType::kQ8_0);
  // Tensors in differing formats (experts stored a tensor each), or a name the checkpoint does
  // not have, take the fallback.
  EXPECT_EQ(as_stored.of(std::vector<std::string>{v, norm}), DType::kBF16);
  EXPECT_EQ(as_stored.of(std::vector<std::string>{"model.nope"}), DType::kBF16);
  EXPECT_EQ(to_string(as_stored), "q8_0");  // the matrices' formats; the norms are vectors
  const WeightFormats one = DType::kQ4_0;
  EXPECT_TRUE(one.uniform());
  EXPECT_EQ(one.of(std::vector<std::string>{v}), DType::kQ4_0);
  EXPECT_EQ(to_string(one), "q4_0");
  const Engine stored = Engine::load(ModelSource::open(file), mesh_of(1, {"tp"}), {.context = 8});
  EXPECT_EQ(stored.dtype(), DType::kQ8_0);
  EXPECT_EQ(stored.formats(), "q8_0");
  const Engine asked = Engine::load(ModelSource::open(file), mesh_of(1, {"tp"}),
                                    {.dtype = DType::kBF16, .context = 8});
  EXPECT_EQ(asked.dtype(), DType::kBF16);
  EXPECT_EQ(asked.formats(), "bf16");
  // A Hugging Face folder asked for nothing loads as f32.
  EXPECT_EQ(Engine::load(ModelSource::open(dir.path() / "hf"), mesh_of(1, {"tp"}), {.context = 8})
                .formats(),
            "f32");
}

// A GGUF file of `writer`'s metadata plus the minimal llama tensors `tensors` lists, written
// to `file`.
void write(const GgufWriter& writer, const std::filesystem::path& file) { writer.write(file); }

GgufWriter llama_metadata(std::string_view arch = "llama") {
  GgufWriter w;
  w.add_string("general.architecture", std::string(arch));
  const auto key = [&](std::string_view k) { return fmt::format("{}.{}", arch, k); };
  w.add_uint32(key("block_count"), 1);
  w.add_uint32(key("embedding_length"), 32);
  w.add_uint32(key("feed_forward_length"), 64);
  w.add_uint32(key("attention.head_count"), 2);
  return w;
}

void add_zeros(GgufWriter& w, const std::string& name, std::vector<std::int64_t> shape) {
  w.add_tensor(name, std::move(shape), GgufType::kF32,
               [](std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
}

TEST(GgufCheckpointTest, MetadataAndTensorsNumeshCannotReadAreRefusedNamingThem) {
  const ScratchDir dir;
  const auto f = dir.path() / "bad.gguf";
  {
    GgufWriter w;
    add_zeros(w, "token_embd.weight", {16, 32});
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(
                    StrEq(f.string() + ": the GGUF metadata has no general.architecture")));
  }
  {
    GgufWriter w = llama_metadata("phi2");
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(StrEq(
                    f.string() + ": GGUF architecture 'phi2' is not one numesh reads (it "
                                 "reads llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma, phi3)")));
  }
  {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_uint32("llama.embedding_length", 32);
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(
                    StrEq(f.string() + ": the GGUF metadata has no llama.block_count")));
  }
  {
    GgufWriter w = llama_metadata();
    add_zeros(w, "blk.0.attn_norm.weight", {32});
    write(w, f);
    EXPECT_THAT(
        [&] { (void)GgufCheckpoint::open(f); },
        ThrowsMessage<ValueError>(HasSubstr("the file has no token_embd.weight [vocab, hidden]")));
  }
  {
    GgufWriter w = llama_metadata();
    add_zeros(w, "token_embd.weight", {16, 32});
    add_zeros(w, "rope_freqs.weight", {5});
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(StrEq("gguf: rope_freqs.weight of '" + f.string() +
                                                "' is [5]; with head_dim 16 it must be [8], and "
                                                "the metadata must name no other RoPE scaling")));
  }
  {
    GgufWriter w = llama_metadata();
    w.add_uint32("llama.rope.dimension_count", 8);
    w.add_uint32("llama.attention.key_length", 16);
    add_zeros(w, "token_embd.weight", {16, 32});
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<NotImplementedError>(
                    HasSubstr("llama.rope.dimension_count is 8 but head_dim is 16")));
  }
  {
    GgufWriter w = llama_metadata();
    w.add_string("llama.block_count_typo", "x");
    w.add_uint32("llama.context_length", 64);
    add_zeros(w, "token_embd.weight", {16, 32});
    add_zeros(w, "blk.0.attn_norm.weight", {32});
    add_zeros(w, "blk.0.mystery.weight", {32});
    write(w, f);
    EXPECT_THAT(
        [&] { (void)GgufCheckpoint::open(f); },
        ThrowsMessage<ValueError>(StrEq("gguf: tensor 'blk.0.mystery.weight' of '" + f.string() +
                                        "' is not a weight of a llama model as numesh reads it")));
  }
  {
    GgufWriter w = llama_metadata();
    w.add_string("llama.attention.head_count_kv", "two");
    add_zeros(w, "token_embd.weight", {16, 32});
    write(w, f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(HasSubstr("llama.attention.head_count_kv")));
  }
}

TEST(GgufCheckpointTest, ASplitSetLoadsFromAnyOfItsPartsOrItsFolder) {
  const ScratchDir dir;
  // A one-layer Llama of zeros (hidden 32, 2 heads of 16, ffn 64, vocabulary 16) in two parts:
  // the metadata and the embedding in the first, the rest in the second (gguf-split's layout).
  GgufWriter first = llama_metadata(), second;
  first.add_uint32("split.no", 0);
  first.add_uint32("split.count", 2);
  second.add_uint32("split.no", 1);
  second.add_uint32("split.count", 2);
  add_zeros(first, "token_embd.weight", {16, 32});
  for (const char* name : {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"})
    add_zeros(second, name, {32});
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                           "blk.0.attn_output.weight"})
    add_zeros(second, name, {32, 32});
  add_zeros(second, "blk.0.ffn_gate.weight", {64, 32});
  add_zeros(second, "blk.0.ffn_up.weight", {64, 32});
  add_zeros(second, "blk.0.ffn_down.weight", {32, 64});
  add_zeros(second, "output.weight", {16, 32});
  std::filesystem::create_directories(dir.path() / "set");
  first.write(dir.path() / "set" / "m-00001-of-00002.gguf");
  second.write(dir.path() / "set" / "m-00002-of-00002.gguf");
  for (const auto& path : {dir.path() / "set", dir.path() / "set" / "m-00002-of-00002.gguf"}) {
    const GgufCheckpoint g = GgufCheckpoint::open(path);
    EXPECT_EQ(g.files().size(), 2U);
    EXPECT_EQ(g.location(), dir.path() / "set" / "m-00001-of-00002.gguf");
    EXPECT_EQ(g.config().vocab_size, 16);
    EXPECT_EQ(g.names().size(), 12U);
    EXPECT_EQ(g.shape("model.layers.0.mlp.down_proj.weight"), (std::vector<std::int64_t>{32, 64}));
    const CausalLmWeights w = CausalLmWeights::load(g.config(), g);
    EXPECT_EQ(w.stack.blocks.size(), 1U);
  }
  // A part whose metadata disagrees with its name.
  GgufWriter wrong = llama_metadata();
  wrong.add_uint32("split.no", 1);
  add_zeros(wrong, "token_embd.weight", {16, 32});
  wrong.write(dir.path() / "set" / "m-00001-of-00002.gguf");
  const auto part = (dir.path() / "set" / "m-00001-of-00002.gguf").string();
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(dir.path() / "set"); },
              ThrowsMessage<ValueError>(StrEq(
                  "gguf: '" + part +
                  "' is part 1 of 2 by its name but its metadata says split.no 1, split.count 2")));
}

// A one-layer Llama of zeros (hidden 32, 2 heads of 16, ffn 64, vocabulary 16): every tensor
// but the embedding, added to `w`.
void add_llama_layer(GgufWriter& w) {
  for (const char* name : {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"})
    add_zeros(w, name, {32});
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                           "blk.0.attn_output.weight"})
    add_zeros(w, name, {32, 32});
  add_zeros(w, "blk.0.ffn_gate.weight", {64, 32});
  add_zeros(w, "blk.0.ffn_up.weight", {64, 32});
  add_zeros(w, "blk.0.ffn_down.weight", {32, 64});
  add_zeros(w, "output.weight", {16, 32});
}

TEST(GgufCheckpointTest, EndOfGenerationTokensAndATokenizerTravelThroughAConversion) {
  const ScratchDir dir;
  GgufWriter w = llama_metadata();
  // A SentencePiece vocabulary of 16 with ChatML's <|im_end|> as a control token.
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>", "<|im_end|>"};
  for (char c = 'a'; tokens.size() < 16; ++c) tokens.emplace_back(1, c);
  std::vector<std::int32_t> types(16, 1);
  types[0] = 2;
  types[1] = types[2] = types[3] = 3;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_float32s("tokenizer.ggml.scores", std::vector<float>(16, 0.0f));
  w.add_int32s("tokenizer.ggml.token_type", types);
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  add_zeros(w, "token_embd.weight", {16, 32});
  add_llama_layer(w);
  const auto file = dir.path() / "chat.gguf";
  w.write(file);
  const ModelSource source = ModelSource::open(file);
  // Generation stops at eos and at <|im_end|>, known by its text as llama.cpp knows it.
  EXPECT_EQ(source.config().eos_token_ids, (std::vector<std::int64_t>{2, 3}));
  ASSERT_NE(source.tokenizer(), nullptr);
  EXPECT_EQ(source.tokenizer()->encode("abc", true).front(), 1);  // BOS
  // A GGUF source converted keeps its tokenizer; the copy loads to the same ids.
  const auto out = dir.path() / "chat.q8_0.gguf";
  const GgufExportReport r = write_gguf(source, out, DType::kQ8_0);
  EXPECT_TRUE(r.tokenizer);
  const GgufFile copy = GgufFile::open(out);
  EXPECT_EQ(copy.get_strings("tokenizer.ggml.tokens"), tokens);
  const ModelSource again = ModelSource::open(out);
  EXPECT_EQ(again.config().eos_token_ids, source.config().eos_token_ids);
  EXPECT_EQ(again.tokenizer()->encode("a bad cab", true),
            source.tokenizer()->encode("a bad cab", true));
  EXPECT_EQ(again.stored_dtype(), DType::kQ8_0);
  // Converting onto the source itself is refused before anything is written (numesh convert).
}

// A rope_freqs tensor goes into the config.json document as the llama3 scaling that gives its
// factors; factors no llama3 scaling gives leave the model without one, and a trainer (which
// saves a Hugging Face folder) refuses it by name.
TEST(GgufCheckpointTest, RopeFreqsBecomeALlama3ScalingInTheConfigDocumentOrNone) {
  const ScratchDir dir;
  GgufWriter w = llama_metadata();
  w.add_uint32("llama.context_length", 64);
  add_zeros(w, "token_embd.weight", {16, 32});
  add_llama_layer(w);
  // head_dim 16: 8 pairs, none of which a llama3 band would blend this way.
  w.add_tensor("rope_freqs.weight", {8}, GgufType::kF32, [](std::span<std::byte> b) {
    const std::array<float, 8> odd{1.0f, 3.0f, 1.0f, 5.0f, 2.0f, 7.0f, 1.5f, 4.0f};
    std::memcpy(b.data(), odd.data(), b.size());
  });
  const auto file = dir.path() / "odd.gguf";
  w.write(file);
  const GgufCheckpoint c = GgufCheckpoint::open(file);
  EXPECT_EQ(c.config().rope_scaling.kind, ops::RopeScaling::Kind::kFactors);
  EXPECT_FALSE(c.config_document().has_value());
  TrainingOptions o;
  o.batch = 1;
  o.tokens = 4;
  EXPECT_THAT(
      [&] { (void)CausalLmTrainer::load(mesh_of(1, {"tp"}), file, o); },
      ThrowsMessage<NotImplementedError>(StrEq(
          file.string() + ": its RoPE frequency factors (rope_freqs.weight) are not a llama3 "
                          "scaling's, and a config.json has no form for others, while training "
                          "saves a Hugging Face folder: train from the model's Hugging Face folder "
                          "instead")));
  // Without rope_freqs the document is the metadata's, read as the same config.
  GgufWriter plain = llama_metadata();
  add_zeros(plain, "token_embd.weight", {16, 32});
  add_llama_layer(plain);
  plain.write(dir.path() / "plain.gguf");
  const GgufCheckpoint p = GgufCheckpoint::open(dir.path() / "plain.gguf");
  ASSERT_TRUE(p.config_document().has_value());
  EXPECT_EQ(HfConfig::parse(*p.config_document(), "config.json").hidden_size, 32);
  EXPECT_EQ((*p.config_document())["model_type"], "llama");
}

TEST(GgufCheckpointTest, CorruptLayerCountsAndPartialBiasesAreRefused) {
  const ScratchDir dir;
  const auto f = dir.path() / "bad.gguf";
  {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_uint32("llama.block_count", 4000000000U);
    w.add_uint32("llama.embedding_length", 32);
    w.add_uint32("llama.attention.head_count", 2);
    add_zeros(w, "token_embd.weight", {16, 32});
    w.write(f);
    EXPECT_THAT(
        [&] { (void)GgufCheckpoint::open(f); },
        ThrowsMessage<ValueError>(
            StrEq(f.string() +
                  ": llama.block_count is 4000000000, more layers than the file has tensors (1)")));
  }
  {
    GgufWriter w = llama_metadata();
    add_zeros(w, "token_embd.weight", {16, 32});
    add_llama_layer(w);
    add_zeros(w, "blk.0.attn_q.bias", {32});
    w.write(f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<NotImplementedError>(StrEq(
                    f.string() + ": the file has biases on attn_q but not on attn_output; numesh's "
                                 "llama attention has them on all four projections or none")));
  }
  {
    // 2 heads of 15 rows: llama.cpp's converter interleaves the halves of heads of an even size.
    GgufWriter w = llama_metadata();
    add_zeros(w, "token_embd.weight", {16, 32});
    add_zeros(w, "blk.0.attn_q.weight", {30, 32});
    w.write(f);
    EXPECT_THAT([&] { (void)GgufCheckpoint::open(f); },
                ThrowsMessage<ValueError>(StrEq(
                    "gguf: tensor 'blk.0.attn_q.weight' of '" + f.string() +
                    "' has 30 rows, not 2 heads of an even number of rows (llama.cpp's converter "
                    "permutes q and k rows within such heads)")));
  }
}

TEST(GgufCheckpointTest, FoldersAndSplitSetsAreFoundOrRefusedByName) {
  const ScratchDir dir;
  const auto file = llama_gguf(dir);
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(dir.path() / "none.gguf"); },
              ThrowsMessage<IoError>(
                  StrEq("gguf: '" + (dir.path() / "none.gguf").string() + "' does not exist")));
  std::filesystem::create_directories(dir.path() / "empty");
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(dir.path() / "empty"); },
              ThrowsMessage<IoError>(StrEq("gguf: the folder '" + (dir.path() / "empty").string() +
                                           "' holds no .gguf file")));
  std::filesystem::create_directories(dir.path() / "two");
  std::filesystem::copy_file(file, dir.path() / "two" / "a.gguf");
  std::filesystem::copy_file(file, dir.path() / "two" / "b.gguf");
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(dir.path() / "two"); },
              ThrowsMessage<ValueError>(
                  StrEq("gguf: the folder '" + (dir.path() / "two").string() +
                        "' holds 2 GGUF files (a.gguf, b.gguf); give the one to load")));
  // Part 1 of a set of 2 whose part 2 is missing.
  const auto part1 = dir.path() / "m-00001-of-00002.gguf";
  std::filesystem::copy_file(file, part1);
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(part1); },
              ThrowsMessage<IoError>(StrEq(
                  "gguf: '" + part1.string() + "' is part 1 of a split set of 2, whose part 2 ('" +
                  (dir.path() / "m-00002-of-00002.gguf").string() + "') is missing")));
  // Both parts present, but each holds every tensor.
  std::filesystem::copy_file(file, dir.path() / "m-00002-of-00002.gguf");
  EXPECT_THAT([&] { (void)GgufCheckpoint::open(part1); },
              ThrowsMessage<ValueError>(HasSubstr("gguf: tensor 'token_embd.weight' is in both")));
}

TEST(GgufCheckpointTest, Llama3RopeScalingTravelsAsRopeFreqsAsLlamaCppStoresIt) {
  const ScratchDir dir;
  nlohmann::json c = small_llama_config(64, 1);  // llama3 RoPE scaling (8, 1, 4, 8192)
  c["vocab_size"] = 64;
  write_random_model(dir.path(), c, DType::kF32, 3);
  const HfConfig want = HfConfig::load(dir.path());
  const auto file = dir.path() / "x.gguf";
  (void)write_gguf(ModelSource::open(dir.path()), file, DType::kF16);
  const GgufFile raw = GgufFile::open(file);
  EXPECT_EQ(raw.tensors().front().name, "rope_freqs.weight");
  const HfConfig got = GgufCheckpoint::open(file).config();
  ASSERT_EQ(got.rope_scaling.kind, ops::RopeScaling::Kind::kFactors);
  const auto a = ops::rope_frequencies(64, want.rope_theta, want.rope_scaling);
  const auto b = ops::rope_frequencies(64, got.rope_theta, got.rope_scaling);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i] / a[i], 1.0, 1e-7) << i;
  // The factors span the bands: 1 for the fast pairs, 8 for the slow ones.
  EXPECT_EQ(got.rope_scaling.frequency_factors.front(), 1.0);
  EXPECT_EQ(got.rope_scaling.frequency_factors.back(), 8.0);
}

}  // namespace
}  // namespace numesh::models
