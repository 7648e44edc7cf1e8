#pragma once

// The parsers of option values, for every command in one place: comma-separated lists, sizes,
// modes, KV layouts, placement policies, --axes and --set values. Each throws ValueError with
// a message that names the option and the offending text, which main() prints as
// `numesh: error: ...` (the CLI tests in tests/tools check these messages).
//
// Thread-safety: every function here is pure (no shared state) and safe to call concurrently.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/diagnostics/memory_benchmark.hpp"
#include "numesh/ops/attention_config.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::tools {

/// `s` without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);

/// Splits a comma-separated list at the commas outside brackets, trimming each item
/// ("a, (b,c)" -> {"a", "(b,c)"}); empty items are kept ("a,,b" -> {"a", "", "b"}; "" -> {""}).
/// REQUIRES: brackets already checked balanced where the caller allows them (an unbalanced
/// one only shifts where the list is split).
std::vector<std::string_view> split_list(std::string_view text);

/// The items of a comma-separated list as strings, empty ones kept ("dp,tp" -> {"dp", "tp"}):
/// mesh axis names, which DeviceMesh and Mesh check themselves (and name the bad one).
std::vector<std::string> parse_names(std::string_view text);

/// The non-empty items of a comma-separated list ("a,,b," -> {"a", "b"}; "," -> {}).
std::vector<std::string> parse_items(std::string_view text);

/// Parses a comma-separated list of integers ("2,-1"); `what` names the option in errors.
/// Throws: ValueError "{what} '{text}': '{item}' is not an integer" (an empty item included).
std::vector<std::int64_t> parse_int_list(std::string_view text, std::string_view what);

/// Parses comma-separated token ids ("1,450,4996"): at least one, each in [0, 2^31).
/// Throws: ValueError as parse_int_list, "{what} '{text}' holds no token id", or
/// "{what} '{text}': {id} is not a token id".
std::vector<std::int32_t> parse_token_ids(std::string_view text, std::string_view what);

/// Parses an array shape: a list of integers (parse_int_list) none of which is negative.
/// Throws: ValueError as parse_int_list, or "{what} '{text}': extent {e} is negative".
std::vector<std::int64_t> parse_shape(std::string_view text, std::string_view what);

/// Parses a byte count: digits, then nothing, B, K, k or KiB (x 1024), M or MiB (x 2^20), G or
/// GiB (x 2^30): "4K", "64MiB", "4096".
/// Throws: ValueError "bad size '{text}': ..." when there are no leading digits, the unit
/// is unknown or the count does not fit a std::size_t.
std::size_t parse_bytes(std::string_view text);

/// Parses a byte-count option that sizes a memory benchmark array (parse_bytes) and checks
/// that it is a multiple of 64 bytes (a cache line) in [4 KiB, `max`], the memory benchmark's
/// own limits, so that the message names the option.
/// Throws: ValueError "{option}: bad size '{text}': ..." (parse_bytes' message) or
/// "{option} '{text}' is {bytes} bytes; it must be ..." naming the limits.
std::size_t parse_array_bytes(std::string_view option, std::string_view text, std::size_t max);

/// Parses --kernels of `numesh bench memory`: a comma-separated list of read, copy and triad
/// (diagnostics::parse_memory_kernel), each at most once, in the order given.
/// Throws: ValueError "--kernels '{text}': ..." naming an unknown or repeated kernel, or saying
/// the list names none.
std::vector<diagnostics::MemoryKernel> parse_memory_kernels(std::string_view text);

/// Parses --threads-sweep of `numesh bench memory`: positive thread counts or `all` (returned
/// as 0: every thread of a device), each at most once, in the order given ("1,2,4,all").
/// Throws: ValueError "--threads-sweep '{text}': ..." naming the item that is not a count or
/// `all`, not positive or repeated, or saying the list names none.
std::vector<int> parse_threads_sweep(std::string_view text);

/// Parses --policy: numa, l3 or core (runtime::parse_placement_policy).
/// Throws: ValueError naming the text and the choices; ValueError for `explicit`, which needs
/// cpusets the command line does not take.
runtime::PlacementPolicy parse_policy_option(std::string_view text);

/// Parses a mode of `numesh resolve`: train, prefill, decode (autoregressive), insert,
/// eformer's strings (sharding::parse_mode), or dim:N (eformer's integer mode).
/// Throws: ValueError naming the text ("--mode dim:N 'x': 'x' is not an integer" for a bad N).
sharding::ModeArg parse_mode_arg(std::string_view text);

/// Parses --mode of `numesh run`: as parse_mode_arg, but insert is refused (a run has no
/// chunk to insert).
/// Throws: ValueError "--mode '{text}': expected train, prefill, decode or dim:N" for a text
/// that is neither a mode other than insert nor dim:..., else as parse_mode_arg.
sharding::ModeArg parse_run_mode(std::string_view text);

/// Parses --mode of `numesh op`: a named mode only (sharding::parse_mode), no dim:N.
/// Throws: ValueError "--mode '{text}': expected train, prefill, decode or insert".
sharding::Mode parse_op_mode(std::string_view text);

/// Parses --kv-layout: bthd or bhtd.
/// Throws: ValueError "--kv-layout '{text}': expected bthd or bhtd".
ops::KvLayout parse_kv_layout(std::string_view text);

/// True for the words that mean None on the command line: "", None, none, null.
bool is_none_word(std::string_view s);

/// Parses the --axes grammar: comma-separated entries; an entry is a token (`__BATCH__`), a
/// constant name (`BATCH`), a short name (`batch`), `_` (not sharded), `None`/empty
/// (replicated), or a composite `(a,b)` / `[a,b]` whose members are names of the same kinds
/// (unknown members stay literal mesh axis names, as in eformer). "" gives no entries.
/// Throws: ValueError naming the text on unbalanced or nested brackets or text after a
/// closing bracket.
std::vector<sharding::AxisRule> parse_axes(std::string_view text);

/// Parses a --set value: None/null/none/"" -> null, (a,b) or [a,b] -> an array of names (None
/// members -> null), anything else -> a string.
/// Throws: ValueError naming the value when a bracket is unclosed or nested.
nlohmann::json parse_set_value(std::string_view value);

/// Parses one --set "field=value" into the trimmed field name and parse_set_value(value).
/// Throws: ValueError "--set '{text}' is not of the form field=value" when there is no '=' or
/// nothing before it; as parse_set_value.
std::pair<std::string, nlohmann::json> parse_field_set(std::string_view text);

}  // namespace numesh::tools
