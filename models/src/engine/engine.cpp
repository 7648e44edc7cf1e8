#include "numesh/models/engine/engine.hpp"

#include <chrono>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"

namespace numesh::models {

Engine::Engine(ModelSource source, runtime::DeviceMesh mesh)
    : source_(std::move(source)), mesh_(std::move(mesh)) {}

Engine Engine::load(ModelSource source, runtime::DeviceMesh mesh, const EngineOptions& options) {
  Engine engine(std::move(source), std::move(mesh));
  const HfConfig& config = engine.config();
  NUMESH_CHECK(options.sequences >= 1, ValueError, "engine: sequences {} must be positive",
               options.sequences);
  NUMESH_CHECK(options.prefill_chunk >= 1, ValueError,
               "engine: prefill_chunk {} must be positive (the most tokens a run takes)",
               options.prefill_chunk);
  const bool context_fits = options.context >= 0 && options.context <= config.max_context();
  NUMESH_CHECK(context_fits, ValueError,
               "engine: context {} must be 0 (the model's whole context) or at most its {} "
               "positions",
               options.context, config.max_context());
  (void)config.transformer_config();  // refuses what numesh cannot run, before reading weights
  engine.axes_ = ops::ModelAxes::resolve(options.partitions, options.mode, options.sequences,
                                         config.hidden_size);
  const auto start = std::chrono::steady_clock::now();
  const std::unique_ptr<Checkpoint> checkpoint = engine.source_.open_checkpoint();
  // Unset: a GGUF model as its file stores each matrix, a Hugging Face folder as f32.
  const std::optional<DType> stored = engine.source_.stored_dtype();
  const WeightFormats formats = options.dtype ? WeightFormats(*options.dtype)
                                : stored      ? WeightFormats::as_stored(*checkpoint, *stored)
                                              : WeightFormats(DType::kF32);
  engine.dtype_ = options.dtype.value_or(stored.value_or(DType::kF32));
  engine.formats_ = to_string(formats);
  for (const std::string& name : checkpoint->names()) {
    engine.checkpoint_bytes_ += static_cast<std::int64_t>(checkpoint->stored_bytes(name));
  }
  const std::int64_t context = options.context > 0 ? options.context : config.max_context();
  if (!options.serving) {
    engine.model_ = std::make_unique<CausalLm>(
        CausalLm::load(engine.mesh_, config, *checkpoint, options.sequences, context, formats,
                       engine.axes_, options.progress, options.mapping, options.kv_dtype));
    engine.model_->set_prefill_chunk(options.prefill_chunk);
  } else {
    const ServingOptions& serving = *options.serving;
    NUMESH_CHECK(serving.kv_tokens >= 1 && serving.block_size >= 1 && serving.candidates >= 1,
                 ValueError,
                 "engine: kv_tokens {}, block_size {} and candidates {} must be positive",
                 serving.kv_tokens, serving.block_size, serving.candidates);
    // The padding's block 0, then the blocks that hold kv_tokens.
    const std::int64_t blocks =
        1 + (serving.kv_tokens + serving.block_size - 1) / serving.block_size;
    engine.serving_ = serving;
    engine.scheduler_ =
        std::make_unique<Scheduler>(SchedulerOptions{.block_size = serving.block_size,
                                                     .blocks = blocks,
                                                     .batch_tokens = serving.batch_tokens,
                                                     .max_running = serving.max_running,
                                                     .max_waiting = serving.max_waiting,
                                                     .max_context = context,
                                                     .prefix_caching = serving.prefix_caching});
    engine.model_ = std::make_unique<CausalLm>(
        CausalLm::load(engine.mesh_, config, *checkpoint,
                       ops::PagedCacheOptions{.blocks = blocks,
                                              .block_size = serving.block_size,
                                              .max_context = context,
                                              .max_sequences = serving.max_running,
                                              .kv_dtype = options.kv_dtype},
                       formats, engine.axes_, options.progress, options.mapping));
    engine.compile_steps();
  }
  engine.load_seconds_ = seconds_since(start);
  return engine;
}

DType parse_kv_dtype(std::string_view text) {
  const auto refuse = [&] {
    return ValueError(fmt::format(
        "KV cache dtype '{}': expected f32, bf16 or f16 (how the KV caches store keys and values)",
        text));
  };
  DType dtype;
  try {
    dtype = parse_dtype(text);
  } catch (const ValueError&) {
    throw refuse();
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) throw refuse();
  return dtype;
}

}  // namespace numesh::models
