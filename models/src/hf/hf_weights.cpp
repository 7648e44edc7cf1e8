#include "numesh/models/hf/hf_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../transpose.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

using runtime::HostTensor;

// Reads tensors of one checkpoint, checking each shape against what the config implies. With
// `defer`, matrix() returns a shape-only tensor and records where its values are instead.
class Reader {
 public:
  Reader(const Checkpoint& checkpoint, std::map<std::string, MatrixSource>* deferred,
         WeightsProgress progress)
      : checkpoint_(checkpoint), deferred_(deferred), progress_(std::move(progress)) {
    if (progress_) {
      for (const std::string& name : checkpoint_.names()) total_ += checkpoint_.stored_bytes(name);
    }
  }

  // Checks tensor `name`'s shape is `expected`.
  void check(const std::string& name, const std::vector<std::int64_t>& expected) const {
    const std::vector<std::int64_t> shape = checkpoint_.shape(name);
    NUMESH_CHECK(shape == expected, ShapeError, "{}: tensor {} is [{}], the config implies [{}]",
                 checkpoint_.location().string(), name, fmt::join(shape, ", "),
                 fmt::join(expected, ", "));
  }
  // The tensor as stored, after checking its shape is `expected`.
  HostTensor read(const std::string& name, const std::vector<std::int64_t>& expected) const {
    check(name, expected);
    HostTensor t = HostTensor::zeros(expected);
    checkpoint_.read(name, DType::kF32, std::as_writable_bytes(std::span<float>(t.data)));
    read_bytes(name, checkpoint_.stored_bytes(name));
    return t;
  }
  // A small nn.Linear weight [out, in] (a router, a gate) read and transposed to [in, out].
  HostTensor linear(const std::string& name, std::int64_t in, std::int64_t out) const {
    return transposed(read(name, {out, in}));
  }
  // The large matrix at `slot`: nn.Linear weights [out, in] (one, or one per expert stacked
  // into [E, in, out]; or rows of a fused tensor) transposed to [in, out], or, when not
  // `transposed`, one tensor as it is.
  HostTensor matrix(const std::string& slot, const MatrixSource& source, std::int64_t in,
                    std::int64_t out) const {
    const auto experts = static_cast<std::int64_t>(source.tensors.size());
    std::vector<std::int64_t> shape =
        source.transposed ? std::vector<std::int64_t>{in, out} : std::vector<std::int64_t>{out, in};
    if (source.tensors.size() > 1) shape.insert(shape.begin(), experts);
    const std::int64_t rows = source.tensor_rows > 0 ? source.tensor_rows : out;
    for (const std::string& name : source.tensors) check(name, {rows, in});
    if (deferred_ != nullptr) {
      (*deferred_)[slot] = source;
      return HostTensor::shape_only(shape);
    }
    if (source.tensor_rows > 0) {  // rows of a fused tensor, transposed
      HostTensor part = HostTensor::zeros({out, in});
      const std::array<std::int64_t, 2> at{source.row_offset, 0}, size{out, in};
      checkpoint_.read_box(source.tensors.front(), at, size, DType::kF32,
                           std::as_writable_bytes(std::span<float>(part.data)));
      read_bytes(source.tensors.front(), checkpoint_.stored_bytes(source.tensors.front()) *
                                             static_cast<std::uint64_t>(out) /
                                             static_cast<std::uint64_t>(rows));
      return source.transposed ? transposed(part) : part;
    }
    if (!source.transposed) return read(source.tensors.front(), {out, in});
    HostTensor stacked = HostTensor::zeros(shape);
    for (std::int64_t e = 0; e < experts; ++e) {
      const HostTensor m = linear(source.tensors[static_cast<std::size_t>(e)], in, out);
      std::copy(m.data.begin(), m.data.end(), stacked.data.begin() + e * in * out);
    }
    return stacked;
  }
  // An RMSNorm weight [H] as a [1, H] row.
  HostTensor norm(const std::string& name, std::int64_t h) const {
    HostTensor t = read(name, {h});
    t.shape = {1, h};
    return t;
  }

  // In 64 x 64 tiles, so that both the reads and the writes stay within a few cache lines
  // (element by element, the strided writes made loading 4x slower).
  static HostTensor transposed(const HostTensor& m) {
    HostTensor t = HostTensor::zeros({m.shape[1], m.shape[0]});
    detail::transpose(reinterpret_cast<const std::byte*>(m.data.data()), m.shape[0], m.shape[1],
                      sizeof(float), reinterpret_cast<std::byte*>(t.data.data()), m.shape[0]);
    return t;
  }

 private:
  // Counts `bytes` of tensor `name` read, and reports the bytes read so far. A tensor read again
  // (a tied head is the embedding's) counts once: at most its stored bytes in all.
  void read_bytes(const std::string& name, std::uint64_t bytes) const {
    if (!progress_) return;
    std::uint64_t& counted = counted_[name];
    const std::uint64_t added = std::min(bytes, checkpoint_.stored_bytes(name) - counted);
    if (added == 0) return;
    counted += added;
    done_ += added;
    progress_(static_cast<std::int64_t>(done_), static_cast<std::int64_t>(total_));
  }

  const Checkpoint& checkpoint_;
  std::map<std::string, MatrixSource>* deferred_;
  WeightsProgress progress_;
  std::uint64_t total_ = 0;
  mutable std::uint64_t done_ = 0;
  mutable std::map<std::string, std::uint64_t> counted_;  // bytes counted, by tensor
};

// One linear weight's source.
MatrixSource linear_source(std::string name) { return MatrixSource{.tensors = {std::move(name)}}; }

// The spec's entry for a laid-out weight's slot ("layers.3.attention.wq" is the entry
// "layers.{L}.attention.wq" at layer 3; "final_norm" is itself, at no layer).
struct SlotPattern {
  const TensorPattern* pattern = nullptr;  // null: the architecture has no such weight
  std::int64_t layer = -1;
};

SlotPattern slot_pattern(std::string_view slot, const ArchitectureSpec& spec) {
  constexpr std::string_view kLayers = "layers.";
  if (!slot.starts_with(kLayers)) return {spec.find(slot), -1};
  const std::string_view rest = slot.substr(kLayers.size());
  const std::size_t dot = rest.find('.');
  std::int64_t layer = -1;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (dot == std::string_view::npos || dot == 0 || error != std::errc() ||
      end != rest.data() + dot || layer < 0)
    return {};
  return {spec.find(fmt::format("layers.{{L}}{}", rest.substr(dot))), layer};
}

// The slot's entry, refused as unknown when the architecture has none.
SlotPattern known_slot(std::string_view slot, const ArchitectureSpec& spec) {
  const SlotPattern found = slot_pattern(slot, spec);
  if (found.pattern == nullptr) {
    throw KeyError(std::string(slot),
                   fmt::format("no Hugging Face tensor is known for the weight '{}'", slot));
  }
  return found;
}

// The weights, read whole into host memory, or (with `deferred`) their large matrices left
// shape-only with their sources recorded there. Every name comes from the architecture's spec.
CausalLmWeights load_weights(const HfConfig& config, const Checkpoint& checkpoint,
                             const WeightFormats& formats,
                             std::map<std::string, MatrixSource>* deferred,
                             const WeightsProgress& progress = {}) {
  const ops::TransformerConfig t = config.transformer_config();
  const ArchitectureSpec& spec = config.spec();
  const Reader r(checkpoint, deferred, progress);
  const std::int64_t h = t.hidden, v = config.vocab_size, d = t.attention.head_dim;
  const std::int64_t q_out = t.attention.num_heads * d, kv_out = t.attention.num_kv_heads * d;
  // The Hugging Face name of numesh's weight `slot`, at layer l (and expert e).
  const auto hf = [&](std::string_view slot, std::int64_t l = -1, std::int64_t e = -1) {
    return spec.hf_name(slot, l, e);
  };
  // A linear weight's source: its tensor, or its rows of a fused one (Phi-3).
  const auto source_of = [&](const std::string& slot_pattern, std::int64_t l, std::int64_t out) {
    MatrixSource s = linear_source(hf(slot_pattern, l));
    if (const TensorPattern* p = spec.find(slot_pattern); p && p->fused != FusedPart::kWhole) {
      const FusedRows rows = fused_rows(p->fused, q_out, kv_out, t.ffn, out);
      s.row_offset = rows.offset;
      s.rows = rows.rows;
      s.tensor_rows = rows.total;
    }
    return s;
  };
  CausalLmWeights w;
  const MatrixSource table{.tensors = {hf("embedding.table")}, .transposed = false};
  w.embedding.table = r.matrix("embedding.table", table, h, v);
  w.embedding.stored_as = formats.of(table.tensors);
  w.embedding.output_scale = config.embedding_scale();
  for (std::int64_t l = 0; l < t.layers; ++l) {
    const std::string slot = fmt::format("layers.{}.", l);  // ShardedTransformer::weights()'s names
    // Block l's matrix `name` ("attention.wq"): its source, under its slot; `format` is set
    // to the format it is stored in.
    const auto linear = [&](const std::string& name, std::int64_t in, std::int64_t out,
                            DType& format) {
      const MatrixSource source = source_of("layers.{L}." + name, l, out);
      format = formats.of(source.tensors);
      return r.matrix(slot + name, source, in, out);
    };
    const auto tensor = [&](const std::string& name) { return hf("layers.{L}." + name, l); };
    ops::BlockWeights b;
    b.attn_norm = r.norm(tensor("attn_norm"), h);
    b.ffn_norm = r.norm(tensor("ffn_norm"), h);
    ops::AttentionFormats& attention = b.attention.stored_as;
    b.attention.wq = linear("attention.wq", h, q_out, attention.wq);
    b.attention.wk = linear("attention.wk", h, kv_out, attention.wk);
    b.attention.wv = linear("attention.wv", h, kv_out, attention.wv);
    b.attention.wo = linear("attention.wo", q_out, h, attention.wo);
    if (config.qkv_bias) {
      b.attention.bq = r.read(tensor("attention.bq"), {q_out});
      b.attention.bk = r.read(tensor("attention.bk"), {kv_out});
      b.attention.bv = r.read(tensor("attention.bv"), {kv_out});
    }
    if (config.o_bias) b.attention.bo = r.read(tensor("attention.bo"), {h});
    if (config.qk_norm) {
      b.attention.q_norm = r.read(tensor("attention.q_norm"), {d});
      b.attention.k_norm = r.read(tensor("attention.k_norm"), {d});
    }
    if (t.is_moe(l)) {
      const std::int64_t e = t.moe.num_experts, f = t.moe_ffn;
      b.moe.router = r.linear(tensor("moe.router"), h, e);
      // One nn.Linear per expert, stacked.
      const auto experts = [&](const std::string& name, std::int64_t in, std::int64_t out,
                               DType& format) {
        MatrixSource s;
        for (std::int64_t x = 0; x < e; ++x) s.tensors.push_back(hf("layers.{L}." + name, l, x));
        format = formats.of(s.tensors);
        return r.matrix(slot + name, s, in, out);
      };
      b.moe.gate = experts("moe.gate", h, f, b.moe.stored_as.gate);
      b.moe.up = experts("moe.up", h, f, b.moe.stored_as.up);
      b.moe.down = experts("moe.down", f, h, b.moe.stored_as.down);
      if (t.shared_expert_ffn > 0) {  // Qwen2-MoE
        const std::int64_t fs = t.shared_expert_ffn;
        ops::MlpFormats& shared = b.moe.shared_expert.stored_as;
        b.moe.shared_expert.gate = linear("moe.shared_expert.gate", h, fs, shared.gate);
        b.moe.shared_expert.up = linear("moe.shared_expert.up", h, fs, shared.up);
        b.moe.shared_expert.down = linear("moe.shared_expert.down", fs, h, shared.down);
        b.moe.shared_expert_gate = r.linear(tensor("moe.shared_expert_gate"), h, 1);
      }
    } else {
      ops::MlpFormats& mlp = b.mlp.stored_as;
      const bool gated = ops::mlp_traits(t.mlp_kind).gated;
      if (gated) b.mlp.gate = linear("mlp.gate", h, t.ffn, mlp.gate);
      b.mlp.up = linear("mlp.up", h, t.ffn, mlp.up);
      if (!gated) mlp.gate = mlp.up;  // a layer without a gate ignores its format
      b.mlp.down = linear("mlp.down", t.ffn, h, mlp.down);
      if (config.mlp_bias) {
        b.mlp.gate_bias = r.read(tensor("mlp.gate_bias"), {t.ffn});
        b.mlp.up_bias = r.read(tensor("mlp.up_bias"), {t.ffn});
        b.mlp.down_bias = r.read(tensor("mlp.down_bias"), {h});
      }
    }
    w.stack.blocks.push_back(std::move(b));
  }
  w.stack.final_norm = r.norm(hf("final_norm"), h);
  // Tied models may still ship lm_head.weight (a copy); the embedding is the one they use.
  const MatrixSource head =
      linear_source(hf(config.tie_word_embeddings ? "embedding.table" : "lm_head.weight"));
  w.lm_head.weight = r.matrix("lm_head.weight", head, h, v);
  w.lm_head.stored_as = formats.of(head.tensors);
  return w;
}

// numesh keeps these small nn.Linear weights in-out ([H, E], [H, 1]) and saves them as
// nn.Linear holds them; every other matrix is stored out-in already.
bool saved_transposed(std::string_view slot) {
  return slot.ends_with(".moe.router") || slot.ends_with(".moe.shared_expert_gate");
}

}  // namespace

CausalLmWeights CausalLmWeights::load(const HfConfig& config, const Checkpoint& checkpoint,
                                      const WeightFormats& formats,
                                      const WeightsProgress& progress) {
  return load_weights(config, checkpoint, formats, nullptr, progress);
}

std::string hf_tensor_name(std::string_view slot, Architecture architecture) {
  const ArchitectureSpec& spec = architecture_spec(architecture);
  const SlotPattern found = known_slot(slot, spec);
  if (found.pattern->hf.find("{E}") != std::string_view::npos) {
    throw KeyError(std::string(slot),
                   fmt::format("the weight '{}' is one Hugging Face tensor per expert; "
                               "hf_tensor_parts() names them",
                               slot));
  }
  return spec.hf_name(found.pattern->slot, found.layer);
}

std::vector<HfTensorPart> hf_tensor_parts(std::string_view slot, Architecture architecture,
                                          std::int64_t experts) {
  const ArchitectureSpec& spec = architecture_spec(architecture);
  const SlotPattern found = known_slot(slot, spec);
  if (found.pattern->hf.find("{E}") == std::string_view::npos)
    return {HfTensorPart{.name = spec.hf_name(found.pattern->slot, found.layer),
                         .expert = -1,
                         .transposed = saved_transposed(slot),
                         .fused = found.pattern->fused}};
  // A stacked expert weight (stored out-in, [E, out, in]): one tensor per expert, as it is.
  std::vector<HfTensorPart> parts;
  for (std::int64_t e = 0; e < experts; ++e)
    parts.push_back({spec.hf_name(found.pattern->slot, found.layer, e), e, false});
  return parts;
}

DeferredCausalLmWeights CausalLmWeights::deferred(const HfConfig& config,
                                                  const Checkpoint& checkpoint,
                                                  const WeightFormats& formats) {
  DeferredCausalLmWeights d;
  d.weights = load_weights(config, checkpoint, formats, &d.sources);
  return d;
}

}  // namespace numesh::models
