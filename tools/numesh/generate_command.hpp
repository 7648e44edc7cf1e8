#pragma once

// `numesh generate`: text generation from a Hugging Face checkpoint (config.json and
// safetensors) on the machine's mesh: greedy or sampled decoding of a prompt given as text
// (encoded by the folder's tokenizer) or token ids, the ids streamed as they come and the text
// after them, with load, prefill and decode rates. Without --model it writes
// a small random Llama in Hugging Face layout first and loads it back through the same path
// (the main job needs no download).

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh generate`.
struct GenerateOptions {
  MeshOptions mesh;                  ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::string mode = "decode";       ///< --mode: the mode the semantic axes resolve in
  std::string paxis_json;            ///< --paxis-json FILE
  std::vector<std::string> sets;     ///< --set field=value
  std::string model;                 ///< --model DIR: config.json + *.safetensors
  std::string random_model;          ///< --random-model DIR: write a random Llama there and use it
  std::int64_t random_hidden = 512;  ///< --random-hidden: its hidden size (a multiple of 64)
  std::int64_t random_layers = 4;    ///< --random-layers
  std::vector<std::string> ids;      ///< --ids 1,2,3 (repeatable): prompts as token ids
  std::vector<std::string>
      prompt;               ///< --prompt TEXT (repeatable): encoded by the model's tokenizer
  std::string prompt_file;  ///< --prompt-file F: one prompt per non-empty line
  std::int64_t max_new_tokens = 32;  ///< --max-new-tokens
  bool ignore_eos = false;           ///< --ignore-eos: do not stop at an end-of-sequence id
  bool greedy = false;               ///< --greedy: argmax (the default without --temperature)
  double temperature = 0.0;          ///< --temperature T > 0: sample instead of argmax
  std::int64_t top_k = 40;           ///< --top-k K (sampling)
  double top_p = 1.0;                ///< --top-p P (sampling)
  std::uint64_t seed = 0;            ///< --seed S (sampling)
  /// --dtype: how the devices store the matrices; empty: a GGUF file's matrices each in the
  /// format the file stores it in, f32 for a safetensors folder.
  std::string dtype;
  std::string mmap = "auto";         ///< --mmap auto|on|off (models::WeightMapping)
  std::string kv_dtype = "f32";      ///< --kv-dtype f32|bf16|f16: how the KV caches store
  std::int64_t prefill_chunk = 512;  ///< --prefill-chunk N (CausalLm::kDefaultPrefillChunk)
  std::string logits_out;            ///< --logits-out FILE.npy: float32 [P + N - 1, V] (one prompt)
  std::string json;                  ///< --json FILE
  std::string trace;       ///< --trace FILE: the last decode step's layers as Chrome trace JSON
  bool baselines = false;  ///< --baselines: plain read, OpenBLAS sgemm, read bandwidth
  bool quiet = false;      ///< --quiet: no progress on stderr
  bool refuse_nonfinite = false;  ///< --refuse-nonfinite: a weight holding NaN or inf is an error
};

/// Registers `generate`. Not thread-safe (CLI11 setup).
CLI::App* add_generate_command(CLI::App& app, GenerateOptions& options);

/// Loads (or writes and loads) the model, generates (one prompt: its ids streamed to `out` as
/// they come; several: decoded together as one batch, each printed when all have stopped) and
/// reports.
/// Returns 0.
/// Throws: numesh::Error naming a bad option, file or id (before any weight is read where it
/// can be known then).
int run_generate(const GenerateOptions& options, std::ostream& out);

}  // namespace numesh::tools
