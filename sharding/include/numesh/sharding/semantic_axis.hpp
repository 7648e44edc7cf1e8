#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "numesh/core/option_text.hpp"

/// eformer's common_types: semantic-axis tokens and runtime modes.
namespace numesh::sharding {

/// eformer's semantic-axis tokens. A token names a role (batch, heads, ...); a PartitionAxis
/// maps each to mesh axes. `kEmpty` ("_") means "not sharded".
namespace tokens {
inline constexpr std::string_view kEmpty = "_";
inline constexpr std::string_view kBatch = "__BATCH__";
inline constexpr std::string_view kLength = "__LENGTH__";
inline constexpr std::string_view kQueryLength = "__QUERY_LENGTH__";
inline constexpr std::string_view kKvLength = "__KV_LENGTH__";
inline constexpr std::string_view kEmbed = "__EMBED__";
inline constexpr std::string_view kHead = "__HEAD__";
inline constexpr std::string_view kKvHead = "__KV_HEAD__";
inline constexpr std::string_view kMlpIntermediate = "__MLP_INTERMEDIATE__";
inline constexpr std::string_view kVocab = "__VOCAB__";
inline constexpr std::string_view kExpert = "__EXPERT__";
inline constexpr std::string_view kExpertGate = "__EXPERT_GATE__";
inline constexpr std::string_view kHeadDim = "__HEAD_DIM__";
inline constexpr std::string_view kKvHeadDim = "__KV_HEAD_DIM__";
inline constexpr std::string_view kBiasHeadSeq = "__BIAS_HEAD_SEQ__";
inline constexpr std::string_view kBiasKvSeq = "__BIAS_KV_SEQ__";
inline constexpr std::string_view kDataParallel = "__DATA_PARALLEL__";
inline constexpr std::string_view kFullyShardedDataParallel = "__FULLY_SHARDED_DATA_PARALLEL__";
inline constexpr std::string_view kTensorParallel = "__TENSOR_PARALLEL__";
inline constexpr std::string_view kSequenceParallel = "__SEQUENCE_PARALLEL__";
inline constexpr std::string_view kExpertParallel = "__EXPERT_PARALLEL__";
}  // namespace tokens

/// eformer's MIN_SHARDING_SIZE: the element count below which match_partition_rules replicates
/// when called with min_size = None.
inline constexpr std::int64_t kMinShardingSize = 16384;
/// eformer's DEFAULT_MASK_VALUE: -0.7 * float32 max, the additive mask of masked attention
/// logits (finite, so a fully masked row still softmaxes without NaN).
inline constexpr double kDefaultMaskValue = -0.7 * 3.4028234663852886e38;

/// One row of eformer's semantic map: a token, its eformer constant name (BATCH, KV_HEAD, ...),
/// and the PartitionAxis field it reads (empty for "_").
struct SemanticToken {
  std::string_view token;
  std::string_view constant;
  std::string_view field;
};

/// Every built-in token, in eformer's order (`_SEMANTIC_MAP`), with its long constant name
/// (DATA_PARALLEL, not DP).
std::span<const SemanticToken> semantic_tokens() noexcept;

/// The PartitionAxis field a built-in token reads, or nullopt when `token` is not built in.
/// For "_" the result is an empty field name.
std::optional<std::string_view> builtin_field_of(std::string_view token) noexcept;

/// Turns a user-facing axis name into eformer's token: the token itself (`__BATCH__`), its
/// constant name (`BATCH`, `QUERY_LENGTH`, `TP`) or the constant in lower case (`batch`,
/// `query_length`, `tp`); "_" stays "_". Other text is returned unchanged (it may be a token
/// registered with PartitionAxis::register_axis).
std::string normalize_token(std::string_view name);

/// The runtime modes. Prefill behaves exactly like train; decode and insert are the
/// "generation" modes, in which decode_* fields of a PartitionAxis take over.
enum class Mode : std::uint8_t { kTrain, kPrefill, kDecode, kInsert };

/// eformer's string for a mode: "__train__", "__prefill__", "__autoregressive__", "__insert__".
std::string_view mode_string(Mode mode) noexcept;

/// Parses a mode: eformer's strings, or `train`, `prefill`, `decode` (also `autoregressive`),
/// `insert`. Returns nullopt for anything else.
std::optional<Mode> parse_mode(std::string_view text) noexcept;

/// As parse_mode, for a front end's mode option. Throws: ValueError naming the option as
/// `style` does ("--mode 'x': expected train, prefill, decode or insert").
Mode parse_named_mode(std::string_view text, OptionStyle style);

/// True for decode and insert.
constexpr bool is_generation_mode(Mode mode) noexcept {
  return mode == Mode::kDecode || mode == Mode::kInsert;
}

/// The mode argument of PartitionManager::resolve: a named mode, or a dimension index whose
/// extent decides (decode when shape[dim] == 1, else train), as eformer's integer modes do.
/// Negative dims count from the end.
class ModeArg {
 public:
  /// A named mode.
  ModeArg(Mode mode) noexcept : mode_(mode) {}  // NOLINT(google-explicit-constructor)
  /// Infer the mode from the extent of dimension `dim` of the shape being resolved.
  [[nodiscard]] static ModeArg from_dim(std::int64_t dim) noexcept {
    ModeArg m(Mode::kTrain);
    m.dim_ = dim;
    return m;
  }
  /// True when the mode is inferred from a dimension.
  bool is_dim() const noexcept { return dim_.has_value(); }
  /// The dimension. REQUIRES: is_dim().
  std::int64_t dim() const noexcept { return *dim_; }
  /// The named mode. REQUIRES: !is_dim().
  Mode mode() const noexcept { return mode_; }

  friend bool operator==(const ModeArg&, const ModeArg&) = default;

 private:
  Mode mode_;
  std::optional<std::int64_t> dim_;
};

/// The named mode `mode` stands for on an array of `shape`: the mode itself when named; for a
/// dimension, decode when shape[dim] == 1, else train (eformer never infers prefill or insert).
/// Throws: IndexError ("tuple index out of range", as Python) when dim is outside the rank.
Mode infer_mode(const ModeArg& mode, std::span<const std::int64_t> shape);

}  // namespace numesh::sharding
