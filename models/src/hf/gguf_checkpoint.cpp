#include "numesh/models/hf/gguf_checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../closest_names.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shape_text(std::span<const std::int64_t> s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// A split set's part name: "<stem>-00002-of-00005.gguf" (llama.cpp's llama_split_path).
struct SplitName {
  std::string stem;
  int part = 0;
  int count = 0;
};

std::optional<SplitName> split_name(const std::string& file) {
  constexpr std::string_view kSuffix = ".gguf";
  // "-" 5 digits "-of-" 5 digits ".gguf": 20 characters after the stem.
  if (file.size() < 20 + 1 || !file.ends_with(kSuffix)) return std::nullopt;
  const std::string_view tail = std::string_view(file).substr(file.size() - 20);
  const auto digits = [](std::string_view s, int& out) {
    if (s.size() != 5 ||
        !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    return std::from_chars(s.data(), s.data() + s.size(), out).ec == std::errc();
  };
  SplitName n;
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || !digits(tail.substr(1, 5), n.part) ||
      !digits(tail.substr(10, 5), n.count) || n.part < 1 || n.count < 1 || n.part > n.count)
    return std::nullopt;
  n.stem = file.substr(0, file.size() - 20);
  return n;
}

std::string part_name(const SplitName& n, int part) {
  return fmt::format("{}-{:05}-of-{:05}.gguf", n.stem, part, n.count);
}

// The files of the model at `path`, the split set's parts in order.
std::vector<fs::path> model_files(const fs::path& path) {
  std::error_code ec;
  NUMESH_CHECK(fs::exists(path, ec), IoError, "gguf: '{}' does not exist", path.string());
  fs::path file = path;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.is_regular_file() && e.path().extension() == ".gguf") found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    NUMESH_CHECK(!found.empty(), IoError, "gguf: the folder '{}' holds no .gguf file",
                 path.string());
    // One model: one file, or the parts of one split set.
    const auto first = split_name(found.front().filename().string());
    const bool one_set = first && std::all_of(found.begin(), found.end(), [&](const fs::path& p) {
                           const auto n = split_name(p.filename().string());
                           return n && n->stem == first->stem && n->count == first->count;
                         });
    std::vector<std::string> names;
    for (const fs::path& p : found) names.push_back(p.filename().string());
    NUMESH_CHECK(found.size() == 1 || one_set, ValueError,
                 "gguf: the folder '{}' holds {} GGUF files ({}); give the one to load",
                 path.string(), found.size(), fmt::join(names, ", "));
    file = found.front();
  }
  const auto split = split_name(file.filename().string());
  if (!split) return {file};
  std::vector<fs::path> parts;
  for (int i = 1; i <= split->count; ++i) {
    const fs::path part = file.parent_path() / part_name(*split, i);
    NUMESH_CHECK(fs::exists(part, ec), IoError,
                 "gguf: '{}' is part {} of a split set of {}, whose part {} ('{}') is missing",
                 file.string(), split->part, split->count, i, part.string());
    parts.push_back(part);
  }
  return parts;
}

// The metadata of the first file read as a config.json would be, then checked by
// HfConfig::parse; `tensor` finds a GGUF tensor of any part by name (nullptr: none).
class ConfigReader {
 public:
  ConfigReader(const GgufFile& meta, std::function<const GgufTensorInfo*(std::string_view)> tensor,
               std::int64_t tensors)
      : meta_(meta), tensor_(std::move(tensor)), tensors_(tensors) {}

  // The config.json document the metadata reads as, kept by read() (GgufCheckpoint's
  // config_document()).
  json document;

  HfConfig read() {
    const std::optional<std::string> arch = meta_.get_string("general.architecture");
    NUMESH_CHECK(arch.has_value(), ValueError, "{}: the GGUF metadata has no general.architecture",
                 where());
    arch_ = *arch;
    const ArchitectureSpec& spec = architecture();
    json j;
    j["model_type"] = std::string(spec.model_types.front());
    j[std::string(spec.activation_field)] = std::string(spec.hidden_act);
    j["hidden_size"] = required("embedding_length");
    // Each layer has tensors of its own: more layers than tensors is a corrupt count (and would
    // make the per-layer lookups below run for ever).
    const std::int64_t layers = required("block_count");
    NUMESH_CHECK(layers <= tensors_, ValueError,
                 "{}: {} is {}, more layers than the file has tensors ({})", where(),
                 key("block_count"), layers, tensors_);
    j["num_hidden_layers"] = layers;
    j["num_attention_heads"] = required("attention.head_count");
    copy_int("attention.head_count_kv", "num_key_value_heads", j);
    copy_int("context_length", "max_position_embeddings", j);
    copy_float("attention.layer_norm_rms_epsilon", "rms_norm_eps", j);
    copy_float("rope.freq_base", "rope_theta", j);
    copy_int("attention.sliding_window", "sliding_window", j);
    head_dim(j);
    rope_scaling(j);

    const GgufTensorInfo* embedding = tensor_("token_embd.weight");
    NUMESH_CHECK(embedding != nullptr && embedding->shape.size() == 2, ValueError,
                 "{}: the file has no token_embd.weight [vocab, hidden] (it gives the vocabulary's "
                 "size)",
                 where());
    j["vocab_size"] = embedding->shape[0];
    j["tie_word_embeddings"] = tensor_("output.weight") == nullptr;
    // Biases as transformers' fields would put them: attention_bias on all four projections
    // (the Qwen architectures have q/k/v biases whatever it says), mlp_bias on Llama's MLPs.
    const bool o_bias = tensor_("blk.0.attn_output.bias") != nullptr;
    if (!spec.qkv_bias) {
      // transformers' attention_bias puts biases on all four projections; a file with some of
      // them would lose the others' silently.
      const bool q_bias = tensor_("blk.0.attn_q.bias") != nullptr;
      NUMESH_CHECK(q_bias == o_bias, NotImplementedError,
                   "{}: the file has biases on {} but not on {}; numesh's {} attention has them "
                   "on all four projections or none",
                   where(), q_bias ? "attn_q" : "attn_output", q_bias ? "attn_output" : "attn_q",
                   arch_);
    }
    j["attention_bias"] = o_bias;
    j["mlp_bias"] = tensor_("blk.0.ffn_up.bias") != nullptr;

    if (const std::optional<std::int64_t> ffn = int_key("feed_forward_length"))
      j["intermediate_size"] = *ffn;
    if (spec.moe) moe(spec, j);

    if (const auto bos = meta_.get_int("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = *bos;
    // The ids that end generation, as llama.cpp's end-of-generation set: eos, the end-of-turn
    // and end-of-message ids the file names, and the control tokens llama.cpp knows by their
    // text (llama-vocab.cpp: Llama 3's <|eot_id|> and <|eom_id|>, ChatML's <|im_end|>,
    // <|endoftext|>, Phi-3's <|end|>, Gemma's <end_of_turn>, ...).
    std::vector<std::int64_t> eos;
    const auto add = [&](std::int64_t id) {
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    };
    for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                            "tokenizer.ggml.eom_token_id"}) {
      if (const auto id = meta_.get_int(key)) add(*id);
    }
    const auto tokens = meta_.get_strings("tokenizer.ggml.tokens");
    const auto types = meta_.get_ints("tokenizer.ggml.token_type");
    if (tokens && types && types->size() == tokens->size()) {
      constexpr std::array<std::string_view, 9> kEndOfGeneration{
          "<|eot_id|>",    "<|eom_id|>", "<|im_end|>", "<|endoftext|>",  "<|end|>",
          "<end_of_turn>", "<EOT>",      "_<EOT>",     "<|end_of_text|>"};
      for (std::size_t id = 0; id < tokens->size(); ++id) {
        constexpr std::int64_t kControl = 3;
        if ((*types)[id] == kControl && std::find(kEndOfGeneration.begin(), kEndOfGeneration.end(),
                                                  (*tokens)[id]) != kEndOfGeneration.end())
          add(static_cast<std::int64_t>(id));
      }
    }
    if (!eos.empty()) j["eos_token_id"] = eos;
    HfConfig config = HfConfig::parse(j, fmt::format("{} (its GGUF metadata)", where()));
    document = std::move(j);
    return config;
  }

 private:
  std::string where() const { return meta_.path().string(); }
  std::string key(std::string_view name) const { return fmt::format("{}.{}", arch_, name); }
  std::optional<std::int64_t> int_key(std::string_view name) const {
    return meta_.get_int(key(name));
  }
  std::int64_t required(std::string_view name) const {
    const auto v = int_key(name);
    NUMESH_CHECK(v.has_value(), ValueError, "{}: the GGUF metadata has no {}", where(), key(name));
    return *v;
  }
  void copy_int(std::string_view name, const char* field, json& j) const {
    if (const auto v = int_key(name)) j[field] = *v;
  }
  void copy_float(std::string_view name, const char* field, json& j) const {
    if (const auto v = meta_.get_float(key(name))) j[field] = *v;
  }

  // general.architecture's spec: Mixtral is "llama" with experts.
  const ArchitectureSpec& architecture() const {
    std::vector<std::string_view> known;
    for (const ArchitectureSpec& s : architecture_specs()) {
      if (std::find(known.begin(), known.end(), s.gguf_name) == known.end())
        known.push_back(s.gguf_name);
    }
    NUMESH_CHECK(std::find(known.begin(), known.end(), arch_) != known.end(), ValueError,
                 "{}: GGUF architecture '{}' is not one numesh reads (it reads {})", where(), arch_,
                 fmt::join(known, ", "));
    // The first spec of the name (Llama's for "llama"), or its variant with experts.
    for (const ArchitectureSpec& s : architecture_specs()) {
      if (s.gguf_name != arch_) continue;
      if (s.gguf_with_experts && int_key("expert_count").value_or(0) > 0)
        return architecture_spec(*s.gguf_with_experts);
      return s;
    }
    throw ValueError(fmt::format("{}: no spec for GGUF architecture '{}'", where(), arch_));
  }

  // head_dim from attention.key_length (value_length must agree: numesh's attention has one),
  // and a rotary dimension covering all of it.
  void head_dim(json& j) const {
    const auto k = int_key("attention.key_length"), v = int_key("attention.value_length");
    NUMESH_CHECK(!k || !v || *k == *v, NotImplementedError,
                 "{}: {} {} differs from {} {}; numesh's attention has one head_dim", where(),
                 key("attention.key_length"), *k, key("attention.value_length"), *v);
    if (k || v) j["head_dim"] = k ? *k : *v;
    const auto heads = int_key("attention.head_count");
    const std::int64_t hd = k                     ? *k
                            : v                   ? *v
                            : heads && *heads > 0 ? required("embedding_length") / *heads
                                                  : 0;
    const auto rope = int_key("rope.dimension_count");
    if (rope && hd > 0) {
      NUMESH_CHECK(*rope == hd, NotImplementedError,
                   "{}: {} is {} but head_dim is {}; numesh rotates whole heads (no partial "
                   "rotary embedding)",
                   where(), key("rope.dimension_count"), *rope, hd);
    }
  }

  // rope.scaling.*; GGUF's rope_freqs (Llama 3.1's scaling) is read by GgufCheckpoint::open.
  void rope_scaling(json& j) const {
    const auto type = meta_.get_string(key("rope.scaling.type"));
    if (!type || *type == "none") return;
    json r{{"rope_type", *type}};
    if (const auto f = meta_.get_float(key("rope.scaling.factor"))) r["factor"] = *f;
    j["rope_scaling"] = r;
  }

  void moe(const ArchitectureSpec& spec, json& j) const {
    j[std::string(spec.moe->num_experts_field)] = required("expert_count");
    j["num_experts_per_tok"] = required("expert_used_count");
    if (spec.moe->expert_ffn_field != "intermediate_size") {
      if (const auto f = int_key("expert_feed_forward_length")) {
        j[std::string(spec.moe->expert_ffn_field)] = *f;
      } else if (const GgufTensorInfo* t = tensor_("blk.0.ffn_gate_exps.weight");
                 t != nullptr && t->shape.size() == 3) {
        j[std::string(spec.moe->expert_ffn_field)] = t->shape[1];
      }
    }
    j["norm_topk_prob"] = spec.moe->gguf_norm_topk_prob;
    if (spec.moe->sparse_layer_fields) {
      // GGUF has no mlp_only_layers: a layer without a router is a dense one.
      std::vector<std::int64_t> dense;
      const std::int64_t layers = required("block_count");
      for (std::int64_t l = 0; l < layers; ++l) {
        if (tensor_(fmt::format("blk.{}.ffn_gate_inp.weight", l)) == nullptr) dense.push_back(l);
      }
      j["mlp_only_layers"] = dense;
      j["decoder_sparse_step"] = 1;
    }
    if (spec.moe->shared_expert) {
      if (const auto f = int_key("expert_shared_feed_forward_length")) {
        j["shared_expert_intermediate_size"] = *f;
      } else if (const GgufTensorInfo* t = tensor_("blk.0.ffn_up_shexp.weight");
                 t != nullptr && t->shape.size() == 2) {
        j["shared_expert_intermediate_size"] = t->shape[0];
      }
    }
  }

  const GgufFile& meta_;
  std::function<const GgufTensorInfo*(std::string_view)> tensor_;
  std::int64_t tensors_;
  std::string arch_;
};

}  // namespace

bool GgufCheckpoint::is_gguf(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "config.json", ec)) return false;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.path().extension() == ".gguf") return true;
    }
    return false;
  }
  return path.extension() == ".gguf";
}

GgufCheckpoint GgufCheckpoint::open(const fs::path& path) {
  GgufCheckpoint c;
  const std::vector<fs::path> parts = model_files(path);
  for (const fs::path& p : parts) c.files_.push_back(GgufFile::open(p));
  // Each part's own record of its place, when it has one (llama.cpp's gguf-split writes it).
  const auto count = static_cast<std::int64_t>(parts.size());
  for (std::int64_t i = 0; i < count; ++i) {
    const GgufFile& f = c.files_[static_cast<std::size_t>(i)];
    const auto no = f.get_int("split.no"), n = f.get_int("split.count");
    NUMESH_CHECK((!no || *no == i) && (!n || *n == count), ValueError,
                 "gguf: '{}' is part {} of {} by its name but its metadata says split.no {}, "
                 "split.count {}",
                 f.path().string(), i + 1, count, no.value_or(i), n.value_or(count));
  }
  // Every GGUF tensor by name, whichever part holds it.
  std::map<std::string, std::size_t, std::less<>> part_of;
  for (std::size_t i = 0; i < c.files_.size(); ++i) {
    for (const GgufTensorInfo& t : c.files_[i].tensors()) {
      const auto [it, fresh] = part_of.emplace(t.name, i);
      NUMESH_CHECK(fresh, ValueError, "gguf: tensor '{}' is in both '{}' and '{}'", t.name,
                   c.files_[it->second].path().string(), c.files_[i].path().string());
    }
  }
  const auto find = [&](std::string_view name) -> const GgufTensorInfo* {
    const auto it = part_of.find(name);
    return it == part_of.end() ? nullptr : &c.files_[it->second].info(name);
  };
  ConfigReader reader(c.files_.front(), find, static_cast<std::int64_t>(part_of.size()));
  c.config_ = reader.read();
  c.config_document_ = std::move(reader.document);
  // RoPE frequency factors (llama.cpp's converter stores Llama 3.1's scaling so): one divisor a
  // pair, in place of a scaling the metadata names.
  if (const GgufTensorInfo* freqs = find("rope_freqs.weight")) {
    const GgufFile& f = c.files_[part_of.find(freqs->name)->second];
    const std::int64_t pairs = c.config_.head_dim / 2;
    NUMESH_CHECK(freqs->shape == std::vector<std::int64_t>{pairs} &&
                     c.config_.rope_scaling.kind == ops::RopeScaling::Kind::kNone,
                 ValueError,
                 "gguf: rope_freqs.weight of '{}' is {}; with head_dim {} it must be [{}], and "
                 "the metadata must name no other RoPE scaling",
                 f.path().string(), shape_text(freqs->shape), c.config_.head_dim, pairs);
    std::vector<float> factors(static_cast<std::size_t>(pairs));
    f.read(freqs->name, DType::kF32, std::as_writable_bytes(std::span<float>(factors)));
    c.config_.rope_scaling =
        ops::rope_frequency_factors(std::vector<double>(factors.begin(), factors.end()));
    ops::validate(c.config_.rope_scaling);
    // The config.json form of the factors: the llama3 scaling that gives them (llama.cpp's
    // converter computes them from one), or none.
    const std::optional<ops::RopeScaling> llama3 = ops::llama3_of_divisors(
        c.config_.rope_scaling.frequency_factors, c.config_.head_dim, c.config_.rope_theta);
    if (llama3) {
      (*c.config_document_)["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", llama3->factor},
          {"low_freq_factor", llama3->low_freq_factor},
          {"high_freq_factor", llama3->high_freq_factor},
          {"original_max_position_embeddings", llama3->original_max_position}};
    } else {
      c.config_document_.reset();
    }
  }

  // The Hugging Face names of the architecture's weights, each mapped to its GGUF tensor.
  const HfConfig& config = c.config_;
  const ArchitectureSpec& spec = config.spec();
  std::map<std::string, std::vector<std::string>, std::less<>> hf_of;  // GGUF name -> HF names
  hf_of["rope_freqs.weight"] = {};  // read into the config above, no weight of its own
  for (const TensorPattern& p : spec.tensors) {
    const bool per_layer = p.slot.find("{L}") != std::string_view::npos;
    const bool per_expert = p.hf.find("{E}") != std::string_view::npos;
    for (std::int64_t l = 0; l < (per_layer ? config.num_hidden_layers : 1); ++l) {
      const std::int64_t layer = per_layer ? l : -1;
      const std::string gguf = spec.gguf_name_of(p.slot, layer);
      const GgufTensorInfo* t = find(gguf);
      if (t == nullptr) continue;  // absent: the loader names what it needs and does not find
      Entry e{.file = part_of.find(gguf)->second,
              .gguf = gguf,
              .shape = t->shape,
              .bytes = t->size_bytes};
      const std::string slot =
          per_layer ? std::string(p.slot.substr(p.slot.find("}.") + 2)) : std::string(p.slot);
      if (spec.gguf_permutes_qk) {
        if (slot == "attention.wq" || slot == "attention.bq")
          e.permute_heads = config.num_attention_heads;
        if (slot == "attention.wk" || slot == "attention.bk")
          e.permute_heads = config.num_key_value_heads;
        // The converter interleaved each head's two halves: rows that are not whole heads of
        // an even size cannot be put back (and rows_read_together() would be no row).
        const std::int64_t rows = e.shape.empty() ? 0 : e.shape[0];
        NUMESH_CHECK(e.permute_heads == 0 || (rows > 0 && rows % e.permute_heads == 0 &&
                                              (rows / e.permute_heads) % 2 == 0),
                     ValueError,
                     "gguf: tensor '{}' of '{}' has {} rows, not {} heads of an even number of "
                     "rows (llama.cpp's converter permutes q and k rows within such heads)",
                     gguf, c.files_[e.file].path().string(), rows, e.permute_heads);
      }
      if (slot == "moe.shared_expert_gate" && t->shape.size() == 1) e.shape = {1, t->shape[0]};
      // llama.cpp's converter writes Gemma's block and final norms as 1 + w.
      if (takes_norm_offset(p.slot)) e.add = -spec.norm_offset;
      std::vector<std::string>& names = hf_of[gguf];
      if (!per_expert) {
        // A fused tensor (Phi-3's attn_qkv) is one Hugging Face tensor for several slots.
        const std::string hf = spec.hf_name(p.slot, layer);
        if (std::find(names.begin(), names.end(), hf) == names.end()) names.push_back(hf);
        c.entries_.emplace(hf, std::move(e));
        continue;
      }
      // One stacked tensor [E, out, in]: each expert its own Hugging Face tensor.
      const std::int64_t experts = config.num_experts;
      NUMESH_CHECK(t->shape.size() == 3 && t->shape[0] == experts, ValueError,
                   "gguf: tensor '{}' of '{}' is {}; the metadata's {} experts imply [{}, out, in]",
                   gguf, c.files_[e.file].path().string(), shape_text(t->shape), experts, experts);
      for (std::int64_t x = 0; x < experts; ++x) {
        Entry one = e;
        one.expert = x;
        one.shape.erase(one.shape.begin());
        one.bytes = t->size_bytes / static_cast<std::uint64_t>(experts);
        names.push_back(spec.hf_name(p.slot, layer, x));
        c.entries_.emplace(names.back(), std::move(one));
      }
    }
  }
  // Every tensor must be a weight numesh reads (llama.cpp refuses a file with tensors it does
  // not use, too), and the order is the file's.
  std::map<DType, std::uint64_t> bytes_by_format;
  for (const GgufFile& f : c.files_) {
    for (const GgufTensorInfo& t : f.tensors()) {
      const auto it = hf_of.find(t.name);
      NUMESH_CHECK(it != hf_of.end(), ValueError,
                   "gguf: tensor '{}' of '{}' is not a weight of a {} model as numesh reads it",
                   t.name, f.path().string(), to_string(config.architecture));
      c.order_.insert(c.order_.end(), it->second.begin(), it->second.end());
      if (const auto format = to_numesh_dtype(t.type); format && t.shape.size() >= 2)
        bytes_by_format[*format] += t.size_bytes;
    }
  }
  if (!bytes_by_format.empty()) {
    c.stored_dtype_ =
        std::max_element(bytes_by_format.begin(), bytes_by_format.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; })
            ->first;
  }
  return c;
}

std::vector<fs::path> GgufCheckpoint::weight_files() const {
  std::vector<fs::path> out;
  for (const GgufFile& f : files_) out.push_back(f.path());
  return out;
}

std::vector<std::string> GgufCheckpoint::names() const { return order_; }

bool GgufCheckpoint::contains(std::string_view name) const noexcept {
  return entries_.find(name) != entries_.end();
}

const GgufCheckpoint::Entry& GgufCheckpoint::entry(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw KeyError(std::string(name),
                   fmt::format("gguf: model '{}' has no tensor '{}'{}", location().string(), name,
                               detail::closest_names_hint(name, order_)));
  }
  return it->second;
}

std::vector<std::int64_t> GgufCheckpoint::shape(std::string_view name) const {
  return entry(name).shape;
}

std::uint64_t GgufCheckpoint::stored_bytes(std::string_view name) const {
  return entry(name).bytes;
}

std::optional<DType> GgufCheckpoint::stored_format(std::string_view name) const {
  const Entry& e = entry(name);
  return to_numesh_dtype(files_[e.file].info(e.gguf).type);
}

std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> GgufCheckpoint::stored_box(
    const Entry& e, std::span<const std::int64_t> offsets,
    std::span<const std::int64_t> sizes) const {
  const std::size_t stored_rank = files_[e.file].info(e.gguf).shape.size();
  std::vector<std::int64_t> at(offsets.begin(), offsets.end()), size(sizes.begin(), sizes.end());
  if (e.expert >= 0) {
    at.insert(at.begin(), e.expert);
    size.insert(size.begin(), 1);
  }
  while (at.size() > stored_rank && !size.empty() && size.front() == 1 && at.front() == 0) {
    at.erase(at.begin());
    size.erase(size.begin());
  }
  return {std::move(at), std::move(size)};
}

std::shared_ptr<const std::byte> GgufCheckpoint::box_in_place(std::string_view name,
                                                              std::span<const std::int64_t> offsets,
                                                              std::span<const std::int64_t> sizes,
                                                              DType target) const {
  const Entry& e = entry(name);
  if (e.add != 0.0f || e.permute_heads != 0 || offsets.size() != e.shape.size() ||
      sizes.size() != e.shape.size())
    return nullptr;  // read_box() adjusts the values, gathers the rows or reports the box
  const auto [at, size] = stored_box(e, offsets, sizes);
  return files_[e.file].box_in_place(e.gguf, at, size, target);
}

std::int64_t GgufCheckpoint::rows_read_together(std::string_view name) const {
  const Entry& e = entry(name);
  return e.permute_heads == 0 ? 1 : e.shape[0] / e.permute_heads;  // >= 2 (checked at open)
}

void GgufCheckpoint::read_box(std::string_view name, std::span<const std::int64_t> offsets,
                              std::span<const std::int64_t> sizes, DType target,
                              std::span<std::byte> out) const {
  const Entry& e = entry(name);
  const GgufFile& file = files_[e.file];
  const std::size_t rank = e.shape.size();
  NUMESH_CHECK(offsets.size() == rank && sizes.size() == rank, ShapeError,
               "gguf: cannot read tensor '{}' ({} of '{}'): the box has {} offsets and {} sizes "
               "but the tensor (shape {}) has rank {}",
               name, e.gguf, file.path().string(), offsets.size(), sizes.size(),
               shape_text(e.shape), rank);
  if (std::any_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s == 0; }) && out.empty())
    return;  // nothing to read (a box of no elements)
  auto [at, size] = stored_box(e, offsets, sizes);
  if (e.add != 0.0f) {
    NUMESH_CHECK(target == DType::kF32 && e.permute_heads == 0, NotImplementedError,
                 "gguf: tensor '{}' ({}) is read as f32 only, not {}", name, e.gguf,
                 to_string(target));
    file.read_box(e.gguf, at, size, target, out);
    // (1 + w) - 1 is exact where 1 + w lies in [0.5, 2] (Sterbenz), and within an ulp of it
    // elsewhere: the kernels' 1 + w gives the file's values back.
    for (float& v : std::span(reinterpret_cast<float*>(out.data()), out.size() / sizeof(float)))
      v += e.add;
    return;
  }
  if (e.permute_heads == 0) {
    file.read_box(e.gguf, at, size, target, out);
    return;
  }
  // Rows permuted within heads (whole heads of an even size, checked at open): each Hugging
  // Face row taken from the GGUF row holding it.
  const std::size_t row_dim = e.expert >= 0 ? 1 : 0;
  const std::int64_t rows = e.shape[0], head = rows / e.permute_heads;
  NUMESH_CHECK(
      offsets[0] >= 0 && sizes[0] >= 0 && offsets[0] <= rows && sizes[0] <= rows - offsets[0],
      ShapeError,
      "gguf: cannot read tensor '{}': the box at offsets {} of sizes {} is "
      "outside shape {}",
      name, shape_text(offsets), shape_text(sizes), shape_text(e.shape));
  std::int64_t row_elements = 1;
  for (std::size_t d = 1; d < rank; ++d) row_elements *= sizes[d];
  const auto row =
      static_cast<std::size_t>(rank == 1 ? row_bytes(target, 1) : row_bytes(target, row_elements));
  NUMESH_CHECK(out.size() == row * static_cast<std::size_t>(sizes[0]), ShapeError,
               "gguf: cannot read tensor '{}': the output has {} bytes but the box of sizes {} "
               "as {} takes {}",
               name, out.size(), shape_text(sizes), to_string(target),
               row * static_cast<std::size_t>(sizes[0]));
  // GGUF row of the Hugging Face row i of a head: the converter interleaved the head's two
  // halves (rows 0, 2, 4, ... hold its first half).
  const auto stored_row_in_head = [head](std::int64_t i) {
    return 2 * (i % (head / 2)) + i / (head / 2);
  };
  // The permutation keeps each head's rows within it: each head the box touches is read at once
  // (a read a row cost 1-2 us of bookkeeping: 1 ms a 768-row q of a 109 M Llama), staged, and
  // its rows in the box taken in order. A box that cuts a head reads it whole:
  // rows_read_together() tells the loader to read in blocks of whole heads.
  const auto staged =
      std::make_unique_for_overwrite<std::byte[]>(row * static_cast<std::size_t>(head));
  const std::span<std::byte> stored(staged.get(), row * static_cast<std::size_t>(head));
  size[row_dim] = head;
  for (std::int64_t h = offsets[0] / head; h * head < offsets[0] + sizes[0]; ++h) {
    at[row_dim] = h * head;
    file.read_box(e.gguf, at, size, target, stored);
    const std::int64_t first = std::max(offsets[0], h * head);
    const std::int64_t last = std::min(offsets[0] + sizes[0], (h + 1) * head);
    for (std::int64_t hf_row = first; hf_row < last; ++hf_row) {
      std::copy_n(
          stored.begin() + stored_row_in_head(hf_row - h * head) * static_cast<std::ptrdiff_t>(row),
          row, out.begin() + (hf_row - offsets[0]) * static_cast<std::ptrdiff_t>(row));
    }
  }
}

}  // namespace numesh::models
