#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/formats/gguf.hpp"
#include "numesh/models/hf/hf_config.hpp"

// A GGUF model (one file, or a split set NAME-0000i-of-0000N.gguf) seen as a Hugging Face
// checkpoint: its metadata becomes the HfConfig a config.json would give, and its tensors are
// found under their Hugging Face names, in Hugging Face's layouts, so that every loader reads it
// as it reads a safetensors folder. The translation is the architecture's (ArchitectureSpec):
// each weight's GGUF name (llama.cpp's: "blk.3.attn_q.weight"), the experts' one stacked tensor
// [E, out, in] read one expert at a time, and the Q/K row permutation llama.cpp's converter
// applies to Llama-family files, undone here as rows are read (docs/models.md, "GGUF files").

namespace numesh::models {

/// A GGUF model. Move-only; const member functions may be called from any number of threads.
class GgufCheckpoint final : public Checkpoint {
 public:
  /// Opens `path`: a .gguf file, a folder holding one (or one split set), or the first file of
  /// a split set ("-00001-of-00003.gguf": every part is opened; each part's split.no and
  /// split.count, when present, must agree with its name). Every file is mapped and validated
  /// (GgufFile::open); the metadata of the first becomes config() (general.architecture: llama,
  /// qwen2, qwen3, qwen2moe, qwen3moe; a llama file with experts is Mixtral; the sizes from
  /// {arch}.embedding_length, block_count, feed_forward_length, attention.head_count,
  /// attention.head_count_kv, attention.key_length, attention.layer_norm_rms_epsilon,
  /// rope.freq_base, rope.scaling.* or the rope_freqs tensor (llama.cpp's form of Llama 3.1's
  /// scaling: one divisor a frequency), context_length, expert_count, expert_used_count,
  /// expert_feed_forward_length, expert_shared_feed_forward_length; the vocabulary from
  /// token_embd.weight; biases, tied embeddings and Qwen-MoE's dense layers from which tensors
  /// exist; bos from tokenizer.ggml.bos_token_id; generation stops at the eos, eot and eom ids
  /// and, as in llama.cpp, at the control tokens it knows by their text: <|eot_id|>,
  /// <|im_end|>, <|endoftext|>, <|end|>, <end_of_turn>, ...), checked as HfConfig::parse checks a
  /// config.json. Every tensor must be one the architecture has.
  /// Throws: IoError when `path` does not exist, a folder holds no .gguf file, or a part of a
  /// split set is missing; ValueError for a folder with several models, for metadata numesh
  /// cannot read (naming the key), for an architecture it does not read (listing those it
  /// does), for a tensor the architecture does not have or a tensor in two parts (naming it),
  /// for a q or k whose rows are not whole heads of an even size (the Q/K permutation llama.cpp's
  /// converter applied cannot be undone; naming the tensor, its rows and the heads);
  /// NotImplementedError for what numesh does not run yet (a partial rotary dimension, biases on
  /// some attention projections only), naming it; what GgufFile::open and HfConfig::parse throw.
  [[nodiscard]] static GgufCheckpoint open(const std::filesystem::path& path);

  /// Whether `path` is a GGUF model: a file named *.gguf, or a folder without config.json
  /// holding a *.gguf file. No file is read.
  [[nodiscard]] static bool is_gguf(const std::filesystem::path& path);

  GgufCheckpoint(GgufCheckpoint&&) noexcept = default;
  GgufCheckpoint& operator=(GgufCheckpoint&&) noexcept = default;
  GgufCheckpoint(const GgufCheckpoint&) = delete;
  GgufCheckpoint& operator=(const GgufCheckpoint&) = delete;
  ~GgufCheckpoint() override = default;

  /// The config the metadata gives.
  [[nodiscard]] const HfConfig& config() const noexcept { return config_; }
  /// The metadata as the config.json document HfConfig::parse reads as config(), for what saves
  /// a model as a Hugging Face folder (training from a GGUF file). A rope_freqs tensor goes in
  /// as the llama3 rope_scaling that gives its factors (ops::llama3_of_divisors: frequencies
  /// within 1e-5 of the file's, which config() keeps as they are); nullopt when no llama3
  /// scaling gives them (a config.json has no form for other factors).
  [[nodiscard]] const std::optional<nlohmann::json>& config_document() const noexcept {
    return config_document_;
  }
  /// The open files, the split set's parts in order; the first holds the metadata.
  [[nodiscard]] const std::vector<GgufFile>& files() const noexcept { return files_; }
  /// The format most of the weights' bytes are stored in that numesh keeps weights in (one of
  /// core's kDTypes): the format to load the model as when none is
  /// asked for. f32 when no matrix is in one of those.
  [[nodiscard]] DType stored_dtype() const noexcept { return stored_dtype_; }

  /// The first file's path.
  [[nodiscard]] const std::filesystem::path& location() const noexcept override {
    return files_.front().path();
  }
  /// The parts' paths, in order.
  [[nodiscard]] std::vector<std::filesystem::path> weight_files() const override;
  /// The Hugging Face names of the weights (every expert of a stacked tensor by its own name),
  /// in the order of the GGUF tensors.
  [[nodiscard]] std::vector<std::string> names() const override;
  [[nodiscard]] bool contains(std::string_view name) const noexcept override;
  /// The weight's Hugging Face shape ([out, in] for a projection, [out] for a bias, one
  /// expert's [out, in], [1, H] for Qwen2-MoE's shared-expert gate).
  [[nodiscard]] std::vector<std::int64_t> shape(std::string_view name) const override;
  /// Its bytes in the file (a stacked tensor's bytes over its experts).
  [[nodiscard]] std::uint64_t stored_bytes(std::string_view name) const override;
  /// The format of the stored type (one numesh keeps weights in), as Checkpoint says.
  [[nodiscard]] std::optional<DType> stored_format(std::string_view name) const override;
  /// Checkpoint::box_in_place: GgufFile::box_in_place on the box read_box() reads, for a tensor
  /// whose rows are not permuted and whose values are not adjusted (nullptr for those).
  [[nodiscard]] std::shared_ptr<const std::byte> box_in_place(std::string_view name,
                                                              std::span<const std::int64_t> offsets,
                                                              std::span<const std::int64_t> sizes,
                                                              DType target) const override;
  /// A head's rows for a permuted q or k (read_box() reads the heads a box touches), else 1.
  [[nodiscard]] std::int64_t rows_read_together(std::string_view name) const override;
  /// Checkpoint::read_box, in Hugging Face's layout: an expert's box is read from its slice of
  /// the stacked tensor, and a permuted q or k row from the GGUF row that holds it.
  void read_box(std::string_view name, std::span<const std::int64_t> offsets,
                std::span<const std::int64_t> sizes, DType target,
                std::span<std::byte> out) const override;

 private:
  // Where a Hugging Face tensor is: a GGUF tensor, or one expert's slice of a stacked one, with
  // its rows permuted within heads of `permute_heads` (0: not permuted).
  struct Entry {
    std::size_t file = 0;
    std::string gguf;
    std::int64_t expert = -1;
    std::int64_t permute_heads = 0;
    // Added to every value read (Gemma's norms: -1, llama.cpp's converter having added 1).
    float add = 0.0f;
    std::vector<std::int64_t> shape;  // Hugging Face's
    std::uint64_t bytes = 0;
  };

  GgufCheckpoint() = default;
  const Entry& entry(std::string_view name) const;
  // The box [offsets, offsets + sizes) of entry e in its GGUF tensor's dims: an expert's slice
  // of the stacked tensor, and Qwen2-MoE's shared-expert gate [1, H] stored as [H].
  std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> stored_box(
      const Entry& e, std::span<const std::int64_t> offsets,
      std::span<const std::int64_t> sizes) const;

  std::vector<GgufFile> files_;
  HfConfig config_;
  std::optional<nlohmann::json> config_document_;
  DType stored_dtype_ = DType::kF32;
  std::map<std::string, Entry, std::less<>> entries_;
  std::vector<std::string> order_;
};

}  // namespace numesh::models
