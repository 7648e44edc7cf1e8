#pragma once

// PRIVATE to models/src: a GGUF file's tokenizer metadata (tokenizer.ggml.*) translated into the
// forms numesh's tokenizers load: a tokenizer.json for byte-level BPE (tokenizer.ggml.model
// "gpt2") and a serialized SentencePiece ModelProto for "llama" (SentencePiece BPE).

#include <filesystem>
#include <string>
#include <vector>

#include "numesh/models/formats/gguf.hpp"
#include "numesh/models/formats/gguf_writer.hpp"

namespace numesh::models::detail {

/// The tokenizer.json that Hugging Face's tokenizer of a "gpt2" GGUF file would be: the model's
/// vocabulary (NORMAL tokens) and merges, the added tokens (CONTROL: special; USER_DEFINED:
/// not), the pre-tokenizer and normalizer of tokenizer.ggml.pre (llama.cpp's names:
/// "llama-bpe" Llama 3's, "qwen2" Qwen2's and Qwen3's, "gpt-2" GPT-2's), and a BOS (and EOS)
/// template when tokenizer.ggml.add_bos_token (add_eos_token) says so.
/// Throws: ValueError naming the file and the key for missing or inconsistent metadata
/// (tokens, token_type and merges of different lengths, a pre-tokenizer numesh does not know).
std::string gguf_tokenizer_json(const GgufFile& file);

/// The SentencePiece model of a "llama" GGUF file, serialized as SentencePiece's ModelProto:
/// each token with its score and type (tokenizer.ggml.tokens, scores, token_type), a BPE model
/// with byte fallback when it has BYTE tokens, the unknown, bos, eos and padding ids, and
/// Llama's normalizer (identity; a space prefix unless tokenizer.ggml.add_space_prefix is
/// false; extra whitespace kept unless tokenizer.ggml.remove_extra_whitespaces).
/// Throws: ValueError as gguf_tokenizer_json().
std::string gguf_sentencepiece_model(const GgufFile& file);

/// The other way: the tokenizer of a model folder as tokenizer.ggml.* metadata, as llama.cpp's
/// converter writes it, for a model of `vocab_size` ids (the token list padded to it with UNUSED
/// "[PADi]", as llama.cpp's loader wants one token per embedding row): tokenizer.json's
/// byte-level BPE as "gpt2" (every token by id, holes as UNUSED "[PADi]"; added tokens CONTROL when
/// special, else USER_DEFINED; the merges as "a b"; the pre-tokenizer's name found by its regex),
/// or tokenizer.model as "llama" (pieces, scores and types); the bos and eos ids and add_bos_token.
/// Returns the token list written (one string an id), or an empty one, writing nothing, when
/// the folder has neither file, and what of the tokenizer the metadata cannot carry.
/// Throws: ValueError naming the file for a pre-tokenizer numesh cannot name (one GGUF readers
/// would not reproduce) or a tokenizer it cannot read; IoError when SentencePiece cannot load
/// tokenizer.model.
struct GgufTokenizerWritten {
  std::vector<std::string> tokens;
  /// Empty, or in words what readers of the file will do otherwise: a SentencePiece model's
  /// normalization other than identity (nmt_nfkc: NFKC, newlines and tabs as spaces), which
  /// tokenizer.ggml.* has no key for, so that numesh and llama.cpp tokenize such text as the
  /// identity normalizer would.
  std::string lost;
};
GgufTokenizerWritten add_gguf_tokenizer(GgufWriter& writer, const std::filesystem::path& folder,
                                        std::int64_t vocab_size);

}  // namespace numesh::models::detail
