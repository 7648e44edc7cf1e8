#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/engine/scheduler.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/generation.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

// The library's one entry point from a model on disk to a model on a mesh: the source's
// config, the mesh, eformer's PartitionAxis resolved in a mode into the model's axes, the
// dtype the devices store the matrices in, and the load. Every front end (numesh generate and
// perplexity, and the server and Python to come) assembles a model through it.

namespace numesh::models {

/// Continuous batching over paged KV caches (Engine::submit, step, cancel).
struct ServingOptions {
  /// Tokens per KV block.
  std::int64_t block_size = 16;
  /// Tokens the caches hold in all, over every sequence (rounded up to whole blocks; the
  /// padding's block is added).
  std::int64_t kv_tokens = 0;
  /// Tokens a step computes at most (decodes first, then prefill chunks).
  std::int64_t batch_tokens = 256;
  /// Sequences running at once.
  std::int64_t max_running = 8;
  /// Requests waiting at most; submit() refuses more.
  std::int64_t max_waiting = 64;
  /// Each device's best this many logits of a row come to the host, whatever a request asks:
  /// greedy picks their best, sampling draws from them (top_k at most this).
  std::int64_t candidates = 64;
  /// Reuse cached blocks of a prompt's prefix.
  bool prefix_caching = true;
};

/// How Engine::load lays a model out.
struct EngineOptions {
  /// The format the devices store every matrix in (any of core's kDTypes: f32, bf16, f16 or one
  /// of GGML's block formats; norms, biases and routers stay f32). Unset: a GGUF model's matrices
  /// each as the file stores it (WeightFormats::as_stored: a Q4_K_M file's Q6_K matrices stay
  /// Q6_K), a Hugging Face folder's as f32.
  std::optional<DType> dtype{};
  /// Sequences each call of the model runs (CausalLm::batch).
  std::int64_t sequences = 1;
  /// Positions each sequence's caches hold; 0: the model's whole context (max_context()).
  std::int64_t context = 0;
  /// eformer's PartitionAxis (in a manager) and the mode its semantic axes resolve in.
  sharding::PartitionManager partitions{};
  sharding::ModeArg mode = sharding::Mode::kDecode;
  /// Told the checkpoint bytes read so far and in all after each matrix.
  CausalLm::LoadProgress progress{};
  /// Whether matrices read the file's mapping in place (CausalLm::load, WeightMapping).
  WeightMapping mapping = WeightMapping::kAuto;
  /// How the KV caches store keys and values: f32, or bf16 / f16 in half the bytes (each
  /// rounded to nearest even as it is written; ops::KvCache::create).
  DType kv_dtype = DType::kF32;
  /// Dense caches: the most tokens a sequence passes through the stack in one run
  /// (CausalLm::set_prefill_chunk; a longer prompt is prefilled in chunks). Served steps are
  /// cut by ServingOptions::batch_tokens instead.
  std::int64_t prefill_chunk = CausalLm::kDefaultPrefillChunk;
  /// Set: the model keeps paged caches and serves requests (submit, step, cancel; sequences
  /// and context as above bound the running sequences' positions); unset: dense caches for
  /// `sequences` sequences of `context` positions (model(), generate()).
  std::optional<ServingOptions> serving{};
};

/// The KV cache dtype `text` names: f32, bf16 or f16 (or their aliases, as parse_dtype), for
/// EngineOptions::kv_dtype. Throws: ValueError naming `text` and the three values.
DType parse_kv_dtype(std::string_view text);

/// How one request generates (Engine::submit).
struct RequestOptions {
  /// Tokens it generates at most (>= 1).
  std::int64_t max_new_tokens = 16;
  /// It stops after generating one of these (empty: only at max_new_tokens).
  std::vector<std::int64_t> stop_ids{};
  /// Empty: greedy. Otherwise sampled (top_k at most ServingOptions::candidates).
  std::optional<ops::SamplingOptions> sampling{};
  /// The seed of the request's own generator: its draws depend on it alone.
  std::uint64_t seed = 0;
  /// Set: each generated token comes with its log-probability and those of the `logprobs` most
  /// likely tokens at its place (0 to kMaxTopLogprobs, and at most ServingOptions::candidates).
  std::optional<std::int64_t> logprobs{};
};

/// The most alternatives a request may ask log-probabilities of (OpenAI's limit).
inline constexpr std::int64_t kMaxTopLogprobs = 20;

/// A generated token's log-probability and the most likely tokens' at its place: log-softmax of
/// the model's logits over the whole vocabulary (before temperature, top-k and top-p, as
/// vLLM reports them by default).
struct TokenLogprobs {
  double logprob = 0;
  /// The most likely tokens, most likely first (the lower id first among equals).
  std::vector<std::pair<std::int32_t, double>> top{};
};

/// What one Engine::step did.
struct EngineStep {
  /// One sequence's new token.
  struct Token {
    SequenceId sequence = 0;
    std::int32_t id = 0;
    /// Set when the sequence stopped with this token (it is finished and gone).
    std::optional<StopReason> stopped{};
    /// Set when its request asked for log-probabilities.
    std::optional<TokenLogprobs> logprobs{};
  };
  std::vector<Token> tokens;
  std::int64_t prefill_tokens = 0;  ///< prompt tokens computed (chunks)
  std::int64_t decode_tokens = 0;   ///< sequences that decoded a token
  std::int64_t padded_tokens = 0;   ///< the program's token count (a bucket)
  double seconds = 0;               ///< the step's wall time
};

/// A model loaded onto a mesh, with what it was made from and what its load measured.
/// Move-only. Not thread-safe: one thread drives the model.
class Engine {
 public:
  /// Resolves the axes for `options.sequences` sequences, then loads every weight of `source`
  /// onto `mesh` (CausalLm::load: each device reads its own shards).
  /// Throws: ValueError when sequences is not positive, or context is negative or past the
  /// model's max_context() (naming them); what ModelAxes::resolve, HfConfig::transformer_config
  /// and CausalLm::load throw.
  [[nodiscard]] static Engine load(ModelSource source, runtime::DeviceMesh mesh,
                                   const EngineOptions& options = {});

  /// What the model was loaded from.
  [[nodiscard]] const ModelSource& source() const noexcept { return source_; }
  /// Its config.
  [[nodiscard]] const HfConfig& config() const noexcept { return source_.config(); }
  /// The mesh it runs on.
  [[nodiscard]] const runtime::DeviceMesh& mesh() const noexcept { return mesh_; }
  /// The axes its layers are laid out by.
  [[nodiscard]] const ops::ModelAxes& axes() const noexcept { return axes_; }
  /// How the devices store its matrices: the one format asked for, or, loaded as stored, the
  /// format most of the file's matrix bytes are in (formats() names them all).
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  /// The formats of its matrices: dtype() when one format was asked for; loaded as stored,
  /// each format its matrices are in, most bytes first, joined by '+' ("q4_k+q6_k").
  [[nodiscard]] const std::string& formats() const noexcept { return formats_; }
  /// The model.
  [[nodiscard]] CausalLm& model() noexcept { return *model_; }
  [[nodiscard]] const CausalLm& model() const noexcept { return *model_; }
  /// The checkpoint's tensor bytes.
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_bytes_; }
  /// Seconds the load took: reading, converting and laying out on the devices.
  [[nodiscard]] double load_seconds() const noexcept { return load_seconds_; }

  /// Queues a request (an engine loaded with serving options); nullopt when max_waiting
  /// requests already wait.
  /// Throws: ValueError for an engine without serving options, bad options (max_new_tokens,
  /// sampling, top_k or logprobs past ServingOptions::candidates, logprobs outside
  /// [0, kMaxTopLogprobs]) or a request past the context or the
  /// cache (Scheduler::add's message); ShapeError for an empty prompt; IndexError for an id
  /// outside the vocabulary (naming it and its position). Nothing is queued then.
  [[nodiscard]] std::optional<SequenceId> submit(std::vector<std::int32_t> prompt,
                                                 const RequestOptions& options);
  /// Runs one step: the scheduler's ragged batch through the model, each sampling sequence's
  /// next token picked (its own options and generator), stopped sequences finished (their
  /// blocks freed). A request's tokens do not depend on what else runs: see docs/serving.md.
  /// An idle engine's step does nothing. Returns what the step did, valid until the next step
  /// (copy it to keep it). A step of running sequences that asks no log-probabilities and
  /// admits or finishes no request allocates nothing (steady_step_alloc_test counts it).
  /// Throws: ValueError for an engine without serving options; what the model throws.
  const EngineStep& step();
  /// Ends a request, waiting or running (its client left): its blocks are freed at once.
  /// Throws: KeyError for a request not submitted or already finished; ValueError without
  /// serving options.
  void cancel(SequenceId sequence);
  /// The model's programs compiled so far. With serving options every size a step can take
  /// (token counts and sampled rows, padded to powers of two) is compiled by load(): serving
  /// compiles nothing more.
  [[nodiscard]] std::int64_t compiled_programs() const noexcept {
    return model_->compiled_programs();
  }
  /// Whether a request waits or runs.
  [[nodiscard]] bool busy() const noexcept;
  /// The scheduler (its counts, its blocks). Throws: ValueError without serving options.
  [[nodiscard]] const Scheduler& scheduler() const;

 private:
  Engine(ModelSource source, runtime::DeviceMesh mesh);
  ModelSource source_;
  runtime::DeviceMesh mesh_;
  ops::ModelAxes axes_;
  DType dtype_ = DType::kF32;
  std::string formats_;
  std::unique_ptr<CausalLm> model_;
  std::int64_t checkpoint_bytes_ = 0;
  double load_seconds_ = 0;
  // Serving: the options, the scheduler, and each running request's options and generator.
  struct Request {
    RequestOptions options;
    std::mt19937_64 rng;
  };
  std::optional<ServingOptions> serving_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<SequenceId, Request> requests_;
  // Serving's checks and the step's parts (engine_step.cpp).
  Scheduler& serving_scheduler(const char* call) const;
  // The row's token: greedy's best, or a draw with the request's own generator.
  std::int32_t pick(Request& request, std::span<const float> candidates);
  // The picked token's log-probability and the request's most likely alternatives, from its
  // row's candidates (every device's best) and log-sum-exp.
  static TokenLogprobs score(const Request& request, std::span<const float> candidates,
                             double log_normalizer, std::int32_t picked);
  // Picks the next token of every sampling chunk of `plan` from the head's rows, in order,
  // into `tokens`.
  void pick_all(const ScheduledStep& plan, const runtime::HostTensor& candidates,
                const std::vector<double>& log_normalizers, std::vector<EngineStep::Token>& tokens);
  // A step's working state, kept from step to step: its vectors keep their capacity, so a
  // steady step allocates nothing.
  struct StepScratch {
    ScheduledStep plan;
    std::vector<std::int32_t> ids;
    ops::RaggedBatch batch;
    std::vector<std::int64_t> rows, head_rows;
    std::vector<double> log_normalizers;
    std::vector<std::int32_t> sampled;
    ops::CandidatePicker picker;
    EngineStep out;
  };
  StepScratch scratch_;
  // Compiles the programs of every step size (load, with serving options): steps of padding
  // only, which write to block 0 and change no sequence.
  void compile_steps();
};

}  // namespace numesh::models
