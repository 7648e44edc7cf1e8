#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/models/hf/nonfinite_weights.hpp"
#include "numesh/models/hf/weight_formats.hpp"
#include "numesh/ops/lowering/embedding.hpp"
#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/runtime/device_mesh.hpp"

// A decoder-only language model on a device mesh: the token embedding, the transformer stack
// with its KV caches and the LM head, each lowered with its own layout (vocabulary-parallel
// embedding and head, the stack by ModelAxes), for `batch` sequences of up to `max_len` tokens.

namespace numesh::models {

/// Where one call's tokens go in each of the model's sequences.
struct TokenPositions {
  /// Sequence b's T new tokens sit at positions [first[b], first[b] + T).
  std::vector<std::int64_t> first;
  /// The index (< T) of sequence b's last real token, whose logits choose its next one: T - 1
  /// unless a shorter prompt of a batch was padded at its end to the longest (its padding
  /// changes nothing: ShardedTransformer::forward).
  std::vector<std::int64_t> last;

  /// Every one of `batch` sequences at `position`, all `tokens` tokens real.
  static TokenPositions level(std::int64_t batch, std::int64_t position, std::int64_t tokens);
};

/// Whether a load's matrices read the checkpoint's file mapping in place, or copies in each
/// device's memory (CausalLm::load; `--mmap`). In place, a matrix costs no copy and no new
/// memory (the page cache's pages serve every process and device that maps the file), but its
/// pages lie wherever the kernel read the file: on a machine of several NUMA nodes a device
/// would read another node's memory. Only a matrix the devices store as the file stores it, in
/// rows, whole rows of one tensor per shard, can be read in place; the others are copied.
enum class WeightMapping {
  kAuto,  ///< in place on a machine of one NUMA node, copied on one of several
  /// in place wherever the bytes allow it, even a matrix the devices would store in panels
  /// (Q8_0 and Q4_0 from the avx2 level: ops/kernels/weight_order.hpp), which then
  /// keeps the file's rows, the slower order for decode, instead of a copy in panels
  kInPlace,
  kCopied,  ///< every matrix copied into its devices' memory
};

/// "auto", "on" or "off" (the `--mmap` values).
std::string_view to_string(WeightMapping mapping) noexcept;
/// The WeightMapping that to_string gives `text`. Throws: ValueError naming `text` and the
/// values.
WeightMapping parse_weight_mapping(std::string_view text);

/// A causal language model laid out on a mesh. Each call takes the next T tokens of every
/// sequence (ids [batch, T] row-major) at positions [position, position + T), writes their keys
/// and values into the caches, and returns the logits or the greedy next tokens. Programs are
/// compiled per token count on first use and shared by later calls.
/// Not thread-safe: one thread drives an instance.
class CausalLm {
 public:
  /// Lays out every weight; the KV caches store keys and values as `kv_dtype` (f32, or bf16 /
  /// f16 in half the bytes: ops::KvCache::create), each kv head's positions contiguous
  /// (ops::KvLayout::kBHTD).
  /// Throws: ValueError as HfConfig::transformer_config(); ShapeError when the
  /// weights do not fit the config, batch or max_len is not positive, or max_len exceeds the
  /// model's max_context(); what the layers' layouts throw; as ops::KvCache::create for
  /// kv_dtype.
  CausalLm(runtime::DeviceMesh mesh, const HfConfig& config, const CausalLmWeights& weights,
           std::int64_t batch, std::int64_t max_len, ops::ModelAxes axes = {},
           DType kv_dtype = DType::kF32);
  /// Checkpoint bytes read so far and in all, reported by load() after each matrix (from one of
  /// the load's threads, never two calls at once).
  using LoadProgress = WeightsProgress;
  /// The model of `checkpoint`, with each device reading only its own shard of every large
  /// matrix (embedding, LM head, projections, experts) straight from the file mapping into memory
  /// of its node, in the format `formats` gives it (and transposed on the way for the MoE experts,
  /// which the layers store in-out; the other matrices are stored out-in), all devices at once: no
  /// copy of the model passes through host memory (CausalLmWeights::deferred, then each matrix's
  /// shards filled in place). Norms, biases and routers, which are small, are read on the host.
  /// Gives the same model as the constructor on CausalLmWeights::load. `mapping` says whether
  /// the matrices that can read the file's mapping in place do (mapped_bytes() says how many
  /// bytes did); the model keeps what it maps alive after `checkpoint` is gone. The model's
  /// values are the same either way.
  /// Throws: as CausalLmWeights::load and the constructor.
  static CausalLm load(runtime::DeviceMesh mesh, const HfConfig& config,
                       const Checkpoint& checkpoint, std::int64_t batch, std::int64_t max_len,
                       const WeightFormats& formats = {}, ops::ModelAxes axes = {},
                       const LoadProgress& progress = {},
                       WeightMapping mapping = WeightMapping::kAuto, DType kv_dtype = DType::kF32);
  /// The same model with paged caches, for ragged steps only (ragged_candidates,
  /// ragged_logits): every layer's keys and values in `paged.blocks` blocks
  /// (ShardedTransformer's paged constructor); the dense calls above are refused.
  /// Throws: as the constructor above (paged.max_context for max_len); ShapeError for paged
  /// options out of range.
  CausalLm(runtime::DeviceMesh mesh, const HfConfig& config, const CausalLmWeights& weights,
           const ops::PagedCacheOptions& paged, ops::ModelAxes axes = {});
  /// As load() above, with paged caches.
  static CausalLm load(runtime::DeviceMesh mesh, const HfConfig& config,
                       const Checkpoint& checkpoint, const ops::PagedCacheOptions& paged,
                       const WeightFormats& formats = {}, ops::ModelAxes axes = {},
                       const LoadProgress& progress = {},
                       WeightMapping mapping = WeightMapping::kAuto);
  ~CausalLm();
  CausalLm(CausalLm&&) noexcept;
  CausalLm& operator=(CausalLm&&) noexcept;

  /// The logits [batch * T, V] of every new position (row b * T + t: sequence b, token t).
  /// Throws: ShapeError when ids.size() is not batch * tokens or `at` does not hold one entry
  /// per sequence (a `last` out of [0, T) included); IndexError for an id outside the
  /// vocabulary (naming it) or tokens that do not fit the caches; what a node throws.
  runtime::HostTensor logits(std::span<const std::int32_t> ids, std::int64_t tokens,
                             const TokenPositions& at);
  /// Each sequence's greedy next token: the argmax of the logits at its last real new token
  /// (the head runs on those rows only, and the logits stay on the devices).
  /// Throws: as logits().
  std::vector<std::int64_t> greedy(std::span<const std::int32_t> ids, std::int64_t tokens,
                                   const TokenPositions& at);
  /// Each sequence's next token drawn from the logits at its last real new token as `options`
  /// say (ShardedLmHead::sample: only every device's top-k candidates leave the devices).
  /// Throws: as logits(); ValueError for bad options.
  std::vector<std::int64_t> sample(std::span<const std::int32_t> ids, std::int64_t tokens,
                                   const TokenPositions& at, const ops::SamplingOptions& options,
                                   std::mt19937_64& rng);

  /// The three calls above with every sequence at `position` (TokenPositions::level).
  runtime::HostTensor logits(std::span<const std::int32_t> ids, std::int64_t tokens,
                             std::int64_t position) {
    return logits(ids, tokens, TokenPositions::level(batch_, position, tokens));
  }
  std::vector<std::int64_t> greedy(std::span<const std::int32_t> ids, std::int64_t tokens,
                                   std::int64_t position) {
    return greedy(ids, tokens, TokenPositions::level(batch_, position, tokens));
  }
  std::vector<std::int64_t> sample(std::span<const std::int32_t> ids, std::int64_t tokens,
                                   std::int64_t position, const ops::SamplingOptions& options,
                                   std::mt19937_64& rng) {
    return sample(ids, tokens, TokenPositions::level(batch_, position, tokens), options, rng);
  }

  /// One ragged step (a model with paged caches): the tokens `ids`, laid out by `batch` (each
  /// at its own sequence's position, its keys and values written into its slot), run through
  /// the model, and the logits at the rows `rows` (the tokens whose next token is picked)
  /// reduced to every device's best `k` as (value, id) pairs [rows, 2 * m]
  /// (ShardedLmHead::candidates); with `log_normalizers`, each row's log-sum-exp over the
  /// vocabulary into it too (ShardedLmHead::scored_candidates: log-probabilities). Programs per
  /// token count, per row count and per kind, compiled on first use.
  /// Throws: ValueError for a model with dense caches or k < 1; ShapeError when ids and batch
  /// disagree, or rows is empty or names a row outside the step (naming it); IndexError for an
  /// id outside the vocabulary or a batch that does not fit the caches; what a node throws.
  /// Returns the candidates, valid until the next ragged call (copy them to keep them). Once
  /// every size it takes is compiled, a step without log_normalizers allocates nothing.
  const runtime::HostTensor& ragged_candidates(std::span<const std::int32_t> ids,
                                               const ops::RaggedBatch& batch,
                                               std::span<const std::int64_t> rows, std::int64_t k,
                                               std::vector<double>* log_normalizers = nullptr);
  /// As ragged_candidates, the whole logits [rows, V] instead.
  runtime::HostTensor ragged_logits(std::span<const std::int32_t> ids,
                                    const ops::RaggedBatch& batch,
                                    std::span<const std::int64_t> rows);

  /// The default of set_prefill_chunk: llama.cpp's default micro-batch (its n_ubatch).
  static constexpr std::int64_t kDefaultPrefillChunk = 512;
  /// The most tokens a sequence passes through the stack in one program run. A dense call of
  /// more tokens (a long prompt's prefill, perplexity over a long context) runs the stack in
  /// consecutive chunks of at most `tokens` (cut into equal parts, the last one shorter), each
  /// writing its keys and values before the next chunk's queries read them; logits() then runs
  /// the LM head over the rows in runs of as many (greedy and sample run it on one row a
  /// sequence). A program's intermediates grow with its token count (a 2000-token prompt of a
  /// 109 M Llama held 470 MB of them in one run); chunks bound them by `tokens`, and their
  /// products still take hundreds of rows at a time. The results are the unchunked call's up to
  /// rounding: attention and the float formats' products may sum in another order. Ragged
  /// (serving) steps are cut by their scheduler instead. Throws: ValueError for tokens < 1.
  void set_prefill_chunk(std::int64_t tokens);
  /// The most tokens a sequence passes through the stack in one run (set_prefill_chunk).
  std::int64_t prefill_chunk() const noexcept { return prefill_chunk_; }
  /// The tokens of each run but the last in a dense call of `tokens` (>= 1): `tokens` itself
  /// when it fits one run, else the size of its equal chunks.
  std::int64_t run_tokens(std::int64_t tokens) const noexcept;

  /// Programs compiled so far: the embedding's, the stack's and the head's, one per size used
  /// (a serving engine compiles every size its steps take before the first request).
  [[nodiscard]] std::int64_t compiled_programs() const noexcept;

  /// The config it was built from.
  const HfConfig& config() const noexcept { return config_; }
  /// Sequences per call.
  std::int64_t batch() const noexcept { return batch_; }
  /// The caches' capacity in tokens.
  std::int64_t max_len() const noexcept { return max_len_; }
  /// Bytes the devices read together in a decode step of every sequence at `position`: the
  /// stack's weights and valid caches (ShardedTransformer::decode_bytes_per_device, every
  /// device) and the LM head's shards (the embedding reads one row per sequence, left out).
  std::int64_t decode_bytes(std::int64_t position) const;
  /// The transformer stack (plans, bytes per decode step).
  ops::ShardedTransformer& stack() noexcept { return stack_; }
  /// Every laid-out weight by the name a user knows it (weight_label): the embedding, the
  /// stack's, the LM head's when it is not tied (for find_nonfinite_weights).
  std::vector<NamedTensor> weights() const;
  /// Bytes of this process's weight shards that read the checkpoint's file mapping in place
  /// (load with WeightMapping: 0 when every shard is a copy, or the model was not loaded).
  /// Shards are counted on each device that holds one: replicas of the same bytes count again.
  std::int64_t mapped_bytes() const noexcept { return mapped_bytes_; }
  /// Bytes of this process's weight shards that a load reading in place (WeightMapping::kAuto
  /// on one NUMA node) copied into panels (q8_0's and q4_0's faster decode order) where
  /// WeightMapping::kInPlace would have read the file's rows in place: what the load paid for
  /// the panels. 0 when nothing was, or the model was not loaded. Counted as mapped_bytes().
  std::int64_t panel_copied_bytes() const noexcept { return panel_copied_bytes_; }

 private:
  // The final hidden states [batch, T, H] of the new tokens, the stack run in chunks of at
  // most prefill_chunk_.
  runtime::HostTensor hidden(std::span<const std::int32_t> ids, std::int64_t tokens,
                             const TokenPositions& at);
  // The last real new token's hidden state of every sequence [batch, H], and the head for them.
  runtime::HostTensor last_hidden(std::span<const std::int32_t> ids, std::int64_t tokens,
                                  const TokenPositions& at);
  ops::ShardedLmHead& head_for(std::int64_t rows);
  // A ragged step's hidden states at `rows` [rows, H] (ragged_rows_, valid until the next step).
  const runtime::HostTensor& ragged_rows(std::span<const std::int32_t> ids,
                                         const ops::RaggedBatch& batch,
                                         std::span<const std::int64_t> rows);
  // Refuses weights that do not fit the config (both constructors).
  void check_layers() const;
  // Fills the matrices laid out unfilled from `d` (load): each device reads its own shards.
  void fill(const DeferredCausalLmWeights& d, const Checkpoint& checkpoint,
            const LoadProgress& progress, WeightMapping mapping);

  runtime::DeviceMesh mesh_;
  HfConfig config_;
  std::int64_t batch_, max_len_;
  std::int64_t mapped_bytes_ = 0;
  std::int64_t panel_copied_bytes_ = 0;
  std::int64_t prefill_chunk_ = kDefaultPrefillChunk;
  ops::EmbeddingLayer embedding_layer_;
  ops::LmHeadLayer head_layer_;
  ops::ShardedTransformer stack_;
  std::map<std::int64_t, std::unique_ptr<ops::ShardedEmbedding>> embeddings_;  // by rows
  std::map<std::int64_t, std::unique_ptr<ops::ShardedLmHead>> heads_;          // by rows
  // A ragged step's tensors, kept from step to step (their vectors keep their capacity): the
  // stack's input [1, N, H], the picked rows' states [rows, H], a scored step's candidates.
  runtime::HostTensor ragged_x_, ragged_rows_, ragged_scored_;
};

}  // namespace numesh::models
