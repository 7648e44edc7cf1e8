#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "numesh/core/dtype.hpp"
#include "numesh/models/engine/model_source.hpp"

// A model written as a GGUF file that llama.cpp loads and numesh reads back (`numesh convert`):
// the metadata llama.cpp's converter (convert_hf_to_gguf.py) writes for the architecture, the
// tokenizer (tokenizer.ggml.*) and the chat template, and every weight under its GGUF name in
// GGUF's layout (the experts stacked, the Q/K rows of Llama-family models permuted as the
// converter permutes them), 1-D weights and the routers in F32 and the matrices in the format
// asked for.

namespace numesh::models {

/// What write_gguf wrote.
struct GgufExportReport {
  std::int64_t tensors = 0;
  std::uint64_t bytes = 0;  ///< the file's size
  /// Tensors by the format they were written in ("q8_0": 98, "f32": 65, ...).
  std::map<std::string, std::int64_t> formats;
  /// Matrices whose rows are not whole blocks of the format asked for, written as F16 instead
  /// (as llama.cpp's converter does).
  std::int64_t fallbacks = 0;
  /// Whether the tokenizer and the chat template went into the file.
  bool tokenizer = false;
  bool chat_template = false;
  /// Empty, or what of the folder's tokenizer the file cannot carry, in words (a SentencePiece
  /// model's normalization other than identity).
  std::string tokenizer_lost;
};

/// Progress: checkpoint bytes converted so far and in all.
using ExportProgress = std::function<void(std::uint64_t done, std::uint64_t total)>;

/// Writes `source`'s model to `file` (replacing it) with its matrices in `format` (any of core's
/// kDTypes; a block format's blocks by GGML's reference quantizers; a matrix whose
/// rows are not whole blocks goes F16, counted in the report). The metadata are llama.cpp's keys
/// for the architecture (general.*, {arch}.* hyperparameters, tokenizer.ggml.*,
/// tokenizer.chat_template); a GGUF source's tokenizer.* keys are copied as they are. The
/// config's eos ids go in as eos (the first), eom (<|eom_id|>) and eot (another).
/// Llama 3.1's RoPE scaling goes in as llama.cpp's converter puts it, a rope_freqs tensor of one
/// divisor a frequency pair (in f32: reading it back gives frequencies within 1e-7 of the
/// formula's).
/// Throws: NotImplementedError for what GGUF readers would not reproduce (Qwen-MoE dense
/// layers, which llama.cpp has no names for), naming it; what reading the checkpoint and the
/// tokenizer throws; IoError when the file cannot be written.
GgufExportReport write_gguf(const ModelSource& source, const std::filesystem::path& file,
                            DType format, const ExportProgress& progress = {});

}  // namespace numesh::models
