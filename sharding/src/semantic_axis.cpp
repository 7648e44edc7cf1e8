#include "numesh/sharding/semantic_axis.hpp"

#include <array>
#include <cctype>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

namespace {

// eformer's _SEMANTIC_MAP, in its order. DP and DATA_PARALLEL are one token.
constexpr std::array<SemanticToken, 21> kTokens = {{
    {tokens::kBatch, "BATCH", "batch_axis"},
    {tokens::kLength, "LENGTH", "sequence_axis"},
    {tokens::kQueryLength, "QUERY_LENGTH", "query_sequence_axis"},
    {tokens::kKvLength, "KV_LENGTH", "key_sequence_axis"},
    {tokens::kEmbed, "EMBED", "hidden_state_axis"},
    {tokens::kHead, "HEAD", "head_axis"},
    {tokens::kKvHead, "KV_HEAD", "kv_head_axis"},
    {tokens::kMlpIntermediate, "MLP_INTERMEDIATE", "mlp_intermediate_axis"},
    {tokens::kVocab, "VOCAB", "vocab_axis"},
    {tokens::kExpert, "EXPERT", "expert_axis"},
    {tokens::kExpertGate, "EXPERT_GATE", "expert_gate_axis"},
    {tokens::kHeadDim, "HEAD_DIM", "attention_dim_axis"},
    {tokens::kKvHeadDim, "KV_HEAD_DIM", "attention_kv_dim_axis"},
    {tokens::kBiasHeadSeq, "BIAS_HEAD_SEQ", "bias_head_sequence_axis"},
    {tokens::kBiasKvSeq, "BIAS_KV_SEQ", "bias_key_sequence_axis"},
    {tokens::kEmpty, "EMPTY", ""},
    {tokens::kDataParallel, "DATA_PARALLEL", "data_parallel_axis"},
    {tokens::kFullyShardedDataParallel, "FULLY_SHARDED_DATA_PARALLEL",
     "fully_sharded_data_parallel_axis"},
    {tokens::kTensorParallel, "TENSOR_PARALLEL", "tensor_parallel_axis"},
    {tokens::kSequenceParallel, "SEQUENCE_PARALLEL", "sequence_parallel_axis"},
    {tokens::kExpertParallel, "EXPERT_PARALLEL", "expert_parallel_axis"},
}};

// Short constant names that eformer also exports.
constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kAliases = {{
    {"DP", tokens::kDataParallel},
    {"FSDP", tokens::kFullyShardedDataParallel},
    {"TP", tokens::kTensorParallel},
    {"SP", tokens::kSequenceParallel},
    {"EP", tokens::kExpertParallel},
}};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const SemanticToken> semantic_tokens() noexcept { return kTokens; }

std::optional<std::string_view> builtin_field_of(std::string_view token) noexcept {
  for (const SemanticToken& t : kTokens) {
    if (t.token == token) return t.field;
  }
  return std::nullopt;
}

std::string normalize_token(std::string_view name) {
  if (name == tokens::kEmpty || builtin_field_of(name)) return std::string(name);
  const std::string key = upper(name);
  for (const SemanticToken& t : kTokens) {
    if (t.constant == key) return std::string(t.token);
  }
  for (const auto& [alias, token] : kAliases) {
    if (alias == key) return std::string(token);
  }
  return std::string(name);
}

std::string_view mode_string(Mode mode) noexcept {
  switch (mode) {
    case Mode::kTrain:
      return "__train__";
    case Mode::kPrefill:
      return "__prefill__";
    case Mode::kDecode:
      return "__autoregressive__";
    case Mode::kInsert:
      return "__insert__";
  }
  return "__train__";
}

Mode infer_mode(const ModeArg& mode, std::span<const std::int64_t> shape) {
  if (!mode.is_dim()) return mode.mode();
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::int64_t dim = mode.dim();
  if (dim < 0) dim += rank;  // Python indexing
  if (dim < 0 || dim >= rank) throw IndexError("tuple index out of range");
  return shape[static_cast<std::size_t>(dim)] == 1 ? Mode::kDecode : Mode::kTrain;
}

std::optional<Mode> parse_mode(std::string_view text) noexcept {
  if (text == "__train__" || text == "train") return Mode::kTrain;
  if (text == "__prefill__" || text == "prefill") return Mode::kPrefill;
  if (text == "__autoregressive__" || text == "autoregressive" || text == "decode") {
    return Mode::kDecode;
  }
  if (text == "__insert__" || text == "insert") return Mode::kInsert;
  return std::nullopt;
}

Mode parse_named_mode(std::string_view text, OptionStyle style) {
  const std::optional<Mode> mode = parse_mode(text);
  if (!mode) {
    throw ValueError(fmt::format("{}: expected train, prefill, decode or insert",
                                 option_text(style, "mode", fmt::format("'{}'", text))));
  }
  return *mode;
}

}  // namespace numesh::sharding
