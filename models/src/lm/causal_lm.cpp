#include "numesh/models/lm/causal_lm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "../shard_reader.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"

namespace numesh::models {

namespace {

// max_len, refused before the stack allocates its caches when the model does not run that long.
std::int64_t checked_max_len(const HfConfig& config, std::int64_t max_len) {
  NUMESH_CHECK(max_len <= config.max_context(), ShapeError,
               "{} model: a context of {} tokens is longer than the {} it runs over "
               "(max_position_embeddings, "
               "or the sliding window)",
               to_string(config.architecture), max_len, config.max_context());
  return max_len;
}

}  // namespace

CausalLm::CausalLm(runtime::DeviceMesh mesh, const HfConfig& config, const CausalLmWeights& weights,
                   std::int64_t batch, std::int64_t max_len, ops::ModelAxes axes, DType kv_dtype)
    : mesh_(mesh),
      config_(config),
      batch_(batch),
      max_len_(checked_max_len(config, max_len)),
      embedding_layer_(ops::EmbeddingLayer::create(mesh, weights.embedding)),
      head_layer_(ops::LmHeadLayer::create(mesh, weights.lm_head)),
      // Each kv head's positions contiguous (bhtd): a decode step reads every position of a
      // head in one run, where bthd read its 128-512 bytes of every kv_heads times wider row.
      // The same outputs; the 109 M Llama's q4_0 decode 1.07x after 256 prompt tokens and
      // 1.34x after 1024 (docs/benchmarks.md, "Session 58").
      stack_(mesh, config.transformer_config(), weights.stack, batch, max_len_, std::move(axes),
             ops::KvLayout::kBHTD, kv_dtype) {
  check_layers();
}

CausalLm::CausalLm(runtime::DeviceMesh mesh, const HfConfig& config, const CausalLmWeights& weights,
                   const ops::PagedCacheOptions& paged, ops::ModelAxes axes)
    : mesh_(mesh),
      config_(config),
      batch_(1),
      max_len_(checked_max_len(config, paged.max_context)),
      embedding_layer_(ops::EmbeddingLayer::create(mesh, weights.embedding)),
      head_layer_(ops::LmHeadLayer::create(mesh, weights.lm_head)),
      stack_(mesh, config.transformer_config(), weights.stack, paged, std::move(axes)) {
  check_layers();
}

void CausalLm::check_layers() const {
  const HfConfig& config = config_;
  NUMESH_CHECK(
      embedding_layer_.vocab == config.vocab_size && head_layer_.vocab == config.vocab_size &&
          embedding_layer_.hidden == config.hidden_size && head_layer_.hidden == config.hidden_size,
      ShapeError,
      "{} model: embedding [{}, {}] and LM head [{}, {}] do not fit vocabulary {} and hidden {}",
      to_string(config.architecture), embedding_layer_.vocab, embedding_layer_.hidden,
      head_layer_.hidden, head_layer_.vocab, config.vocab_size, config.hidden_size);
}

std::vector<NamedTensor> CausalLm::weights() const {
  const auto experts = config_.num_experts;
  std::vector<NamedTensor> all{{weight_label("embedding.table", config_.architecture, experts),
                                embedding_layer_.table.get()}};
  for (const ops::ShardedTransformer::NamedWeight& w : stack_.weights()) {
    all.push_back({weight_label(w.name, config_.architecture, experts), w.tensor.get()});
  }
  if (head_layer_.weight != embedding_layer_.table) {
    all.push_back(
        {weight_label("lm_head.weight", config_.architecture, experts), head_layer_.weight.get()});
  }
  return all;
}

std::string_view to_string(WeightMapping mapping) noexcept {
  switch (mapping) {
    case WeightMapping::kAuto:
      return "auto";
    case WeightMapping::kInPlace:
      return "on";
    case WeightMapping::kCopied:
      return "off";
  }
  return "?";
}

WeightMapping parse_weight_mapping(std::string_view text) {
  for (const WeightMapping m :
       {WeightMapping::kAuto, WeightMapping::kInPlace, WeightMapping::kCopied}) {
    if (text == to_string(m)) return m;
  }
  throw ValueError(fmt::format(
      "'{}' is not a weight mapping: auto (in place on a machine of one NUMA node), on (in "
      "place) or off (copied)",
      text));
}

CausalLm CausalLm::load(runtime::DeviceMesh mesh, const HfConfig& config,
                        const Checkpoint& checkpoint, std::int64_t batch, std::int64_t max_len,
                        const WeightFormats& formats, ops::ModelAxes axes,
                        const LoadProgress& progress, WeightMapping mapping, DType kv_dtype) {
  const DeferredCausalLmWeights d = CausalLmWeights::deferred(config, checkpoint, formats);
  CausalLm lm(std::move(mesh), config, d.weights, batch, max_len, std::move(axes),
              kv_dtype);  // matrices laid out unfilled
  lm.fill(d, checkpoint, progress, mapping);
  return lm;
}

CausalLm CausalLm::load(runtime::DeviceMesh mesh, const HfConfig& config,
                        const Checkpoint& checkpoint, const ops::PagedCacheOptions& paged,
                        const WeightFormats& formats, ops::ModelAxes axes,
                        const LoadProgress& progress, WeightMapping mapping) {
  const DeferredCausalLmWeights d = CausalLmWeights::deferred(config, checkpoint, formats);
  CausalLm lm(std::move(mesh), config, d.weights, paged, std::move(axes));
  lm.fill(d, checkpoint, progress, mapping);
  return lm;
}

void CausalLm::fill(const DeferredCausalLmWeights& d, const Checkpoint& checkpoint,
                    const LoadProgress& progress, WeightMapping mapping) {
  CausalLm& lm = *this;
  using Named = ops::ShardedTransformer::NamedWeight;
  std::map<std::string, Named> slots{
      {"embedding.table", Named{"embedding.table", lm.embedding_layer_.table}},
      {"lm_head.weight",
       Named{"lm_head.weight", lm.head_layer_.weight, ops::WeightLayout::kOutIn}}};
  for (const Named& w : lm.stack_.weights()) slots[w.name] = w;
  // A source's bytes: its tensors', or its share of a fused tensor's.
  const auto bytes_of = [&](const MatrixSource& source) {
    std::int64_t bytes = 0;
    for (const std::string& t : source.tensors)
      bytes += static_cast<std::int64_t>(checkpoint.stored_bytes(t));
    if (source.tensor_rows > 0) bytes = bytes / source.tensor_rows * source.rows;
    return bytes;
  };
  std::vector<detail::MatrixFill> matrices;
  std::vector<std::int64_t> done_after;  // the bytes read once matrix i is
  std::int64_t total = 0;
  for (const auto& [slot, source] : d.sources) {
    const auto it = slots.find(slot);
    // Every deferred slot names a laid-out weight: hf_weights.cpp and the layers agree on names.
    NUMESH_CHECK(it != slots.end(), ValueError,
                 "model: no laid-out weight is called {} (an internal naming mismatch)", slot);
    matrices.push_back({&source, it->second.tensor.get(), it->second.layout});
    total += bytes_of(source);
    done_after.push_back(total);
  }
  // On one NUMA node the page cache's pages are as near every device as copies would be.
  const bool in_place =
      mapping == WeightMapping::kInPlace ||
      (mapping == WeightMapping::kAuto && lm.mesh_.devices().topology().numa_nodes().size() <= 1);
  // Asked for in place outright: even the matrices the devices would store in panels (q8_0 and
  // q4_0 from the avx2 level: ops::panels_pay) keep the file's rows, trading their faster
  // decode order for a load without a copy.
  if (mapping == WeightMapping::kInPlace) detail::keep_in_place_rows(checkpoint, matrices);
  lm.panel_copied_bytes_ =
      in_place ? detail::panel_bytes_of_rows_in_place(checkpoint, matrices) : 0;
  lm.mapped_bytes_ = detail::read_shards(checkpoint, matrices, in_place, [&](std::size_t i) {
    if (progress) progress(done_after[i], total);
  });
}

std::int64_t CausalLm::decode_bytes(std::int64_t position) const {
  return mesh_.size() *
         (stack_.decode_bytes_per_device(position) + head_layer_.weight->shard_bytes());
}

CausalLm::~CausalLm() = default;
CausalLm::CausalLm(CausalLm&&) noexcept = default;
CausalLm& CausalLm::operator=(CausalLm&&) noexcept = default;

TokenPositions TokenPositions::level(std::int64_t batch, std::int64_t position,
                                     std::int64_t tokens) {
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(batch, 0));
  return TokenPositions{.first = std::vector<std::int64_t>(n, position),
                        .last = std::vector<std::int64_t>(n, tokens - 1)};
}

runtime::HostTensor CausalLm::hidden(std::span<const std::int32_t> ids, std::int64_t tokens,
                                     const TokenPositions& at) {
  NUMESH_CHECK(tokens >= 1 && static_cast<std::int64_t>(ids.size()) == batch_ * tokens, ShapeError,
               "model: {} ids for {} sequences of {} tokens (expected {})", ids.size(), batch_,
               tokens, batch_ * tokens);
  NUMESH_CHECK(static_cast<std::int64_t>(at.first.size()) == batch_ &&
                   static_cast<std::int64_t>(at.last.size()) == batch_,
               ShapeError, "model: {} first positions and {} last tokens for {} sequences",
               at.first.size(), at.last.size(), batch_);
  for (std::size_t b = 0; b < at.last.size(); ++b) {
    NUMESH_CHECK(at.last[b] >= 0 && at.last[b] < tokens, ShapeError,
                 "model: sequence {}'s last real token {} is outside the call's {} tokens", b,
                 at.last[b], tokens);
  }
  const std::int64_t rows = batch_ * tokens;
  auto& embedding = embeddings_[rows];
  if (!embedding)
    embedding = std::make_unique<ops::ShardedEmbedding>(mesh_, embedding_layer_, rows);
  runtime::HostTensor x = embedding->forward(ids);
  x.shape = {batch_, tokens, config_.hidden_size};
  if (tokens <= prefill_chunk_ || stack_.paged()) return stack_.forward(x, at.first);
  // Refused whole, before any chunk writes the caches.
  stack_.check_fits(tokens, at.first);
  const std::int64_t size = run_tokens(tokens);
  const std::int64_t hd = config_.hidden_size;
  runtime::HostTensor y = runtime::HostTensor::zeros(x.shape);
  std::vector<std::int64_t> first(at.first.size());
  for (std::int64_t begin = 0; begin < tokens; begin += size) {
    const std::int64_t n = std::min(size, tokens - begin);
    for (std::size_t b = 0; b < first.size(); ++b) first[b] = at.first[b] + begin;
    const runtime::HostTensor h = stack_.forward(ops::slice_tokens(x, begin, n), first);
    for (std::int64_t b = 0; b < batch_; ++b) {
      std::copy_n(h.data.begin() + b * n * hd, n * hd, y.data.begin() + (b * tokens + begin) * hd);
    }
  }
  return y;
}

std::int64_t CausalLm::run_tokens(std::int64_t tokens) const noexcept {
  if (tokens <= prefill_chunk_) return tokens;
  // Equal chunks, the last one shorter: at most two programs of the stack for any call.
  const std::int64_t chunks = (tokens + prefill_chunk_ - 1) / prefill_chunk_;
  return (tokens + chunks - 1) / chunks;
}

void CausalLm::set_prefill_chunk(std::int64_t tokens) {
  NUMESH_CHECK(tokens >= 1, ValueError, "model: chunks of {} tokens; a chunk takes at least one",
               tokens);
  prefill_chunk_ = tokens;
}

ops::ShardedLmHead& CausalLm::head_for(std::int64_t rows) {
  auto& head = heads_[rows];
  // A model with paged caches serves: each row's logits the same whatever rows are beside it.
  if (!head) {
    head = std::make_unique<ops::ShardedLmHead>(
        mesh_, head_layer_, rows, ops::LmHeadAxes{},
        stack_.paged() ? ops::MatmulPrecision::kRowInvariant : ops::MatmulPrecision::kF32);
  }
  return *head;
}

runtime::HostTensor CausalLm::logits(std::span<const std::int32_t> ids, std::int64_t tokens,
                                     const TokenPositions& at) {
  runtime::HostTensor h = hidden(ids, tokens, at);
  const std::int64_t rows = batch_ * tokens, hd = config_.hidden_size;
  h.shape = {rows, hd};
  // The head in runs of the stack's rows too: its logits [rows, V] on the devices are the
  // largest thing a long call makes (a 2048-token window of a 128k vocabulary: 1 GB).
  const std::int64_t per_run = batch_ * run_tokens(tokens);
  if (rows <= per_run) return head_for(rows).logits(h);
  const std::int64_t v = config_.vocab_size;
  runtime::HostTensor out = runtime::HostTensor::zeros({rows, v});
  h.shape = {1, rows, hd};  // the rows as one sequence's tokens, for slice_tokens
  for (std::int64_t begin = 0; begin < rows; begin += per_run) {
    const std::int64_t n = std::min(per_run, rows - begin);
    runtime::HostTensor part = ops::slice_tokens(h, begin, n);
    part.shape = {n, hd};
    const runtime::HostTensor l = head_for(n).logits(part);
    std::copy(l.data.begin(), l.data.end(), out.data.begin() + begin * v);
  }
  return out;
}

runtime::HostTensor CausalLm::last_hidden(std::span<const std::int32_t> ids, std::int64_t tokens,
                                          const TokenPositions& at) {
  const runtime::HostTensor h = hidden(ids, tokens, at);
  // Only each sequence's last real token chooses the next one.
  const std::int64_t hd = config_.hidden_size;
  runtime::HostTensor last = runtime::HostTensor::zeros({batch_, hd});
  for (std::int64_t b = 0; b < batch_; ++b) {
    const std::int64_t row = b * tokens + at.last[static_cast<std::size_t>(b)];
    std::copy_n(h.data.begin() + row * hd, hd, last.data.begin() + b * hd);
  }
  return last;
}

std::vector<std::int64_t> CausalLm::greedy(std::span<const std::int32_t> ids, std::int64_t tokens,
                                           const TokenPositions& at) {
  return head_for(batch_).greedy(last_hidden(ids, tokens, at));
}

std::vector<std::int64_t> CausalLm::sample(std::span<const std::int32_t> ids, std::int64_t tokens,
                                           const TokenPositions& at,
                                           const ops::SamplingOptions& options,
                                           std::mt19937_64& rng) {
  ops::validate(options);
  return head_for(batch_).sample(last_hidden(ids, tokens, at), options, rng);
}

const runtime::HostTensor& CausalLm::ragged_rows(std::span<const std::int32_t> ids,
                                                 const ops::RaggedBatch& batch,
                                                 std::span<const std::int64_t> rows) {
  NUMESH_CHECK(stack_.paged(), ValueError,
               "model: ragged steps need paged caches (CausalLm's paged constructor or load)");
  const auto n = static_cast<std::int64_t>(ids.size());
  NUMESH_CHECK(n >= 1 && static_cast<std::int64_t>(batch.positions.size()) == n, ShapeError,
               "model: a ragged step of {} ids and {} positions", ids.size(),
               batch.positions.size());
  NUMESH_CHECK(!rows.empty(), ShapeError, "model: a ragged step picks from no row");
  for (const std::int64_t r : rows) {
    NUMESH_CHECK(r >= 0 && r < n, ShapeError, "model: row {} is outside the step's {} tokens", r,
                 n);
  }
  auto& embedding = embeddings_[n];
  if (!embedding) embedding = std::make_unique<ops::ShardedEmbedding>(mesh_, embedding_layer_, n);
  const std::int64_t hd = config_.hidden_size;
  // The embedding's [N, H] as the stack's [1, N, H], into a tensor kept for the next step.
  const runtime::HostTensor& e = embedding->forward(ids);
  ragged_x_.shape.assign({1, n, hd});
  ragged_x_.data.assign(e.data.begin(), e.data.end());
  const runtime::HostTensor& h = stack_.forward_ragged(ragged_x_, batch);
  ragged_rows_.shape.assign({static_cast<std::int64_t>(rows.size()), hd});
  ragged_rows_.data.resize(rows.size() * static_cast<std::size_t>(hd));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(h.data.begin() + rows[i] * hd, hd,
                ragged_rows_.data.begin() + static_cast<std::int64_t>(i) * hd);
  }
  return ragged_rows_;
}

const runtime::HostTensor& CausalLm::ragged_candidates(std::span<const std::int32_t> ids,
                                                       const ops::RaggedBatch& batch,
                                                       std::span<const std::int64_t> rows,
                                                       std::int64_t k,
                                                       std::vector<double>* log_normalizers) {
  NUMESH_CHECK(k >= 1, ValueError, "model: top_k {} must be at least 1", k);
  const runtime::HostTensor& h = ragged_rows(ids, batch, rows);
  if (log_normalizers == nullptr) return head_for(h.shape[0]).candidates(h, k);
  ops::ShardedLmHead::ScoredCandidates scored = head_for(h.shape[0]).scored_candidates(h, k);
  *log_normalizers = std::move(scored.log_normalizers);
  ragged_scored_ = std::move(scored.candidates);
  return ragged_scored_;
}

runtime::HostTensor CausalLm::ragged_logits(std::span<const std::int32_t> ids,
                                            const ops::RaggedBatch& batch,
                                            std::span<const std::int64_t> rows) {
  const runtime::HostTensor& h = ragged_rows(ids, batch, rows);
  return head_for(h.shape[0]).logits(h);
}

std::int64_t CausalLm::compiled_programs() const noexcept {
  std::int64_t n = static_cast<std::int64_t>(embeddings_.size()) + stack_.compiled_programs();
  for (const auto& [rows, head] : heads_) n += head->compiled_programs();
  return n;
}

}  // namespace numesh::models
