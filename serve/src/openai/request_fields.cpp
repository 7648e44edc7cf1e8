#include "request_fields.hpp"

#include <fmt/format.h>

#include <limits>
#include <optional>
#include <random>

namespace numesh::serve::openai {

namespace {

using Json = nlohmann::ordered_json;

// A number field within [lo, hi], or `fallback` when absent or null.
double number(const Json& body, const char* name, double fallback, double lo, double hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const Json& v = body[name];
  if (!v.is_number()) refuse(name, fmt::format("'{}' must be a number, not {}", name, v.dump()));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    refuse(name, fmt::format("'{}' is {}; it must be between {} and {}", name, v.dump(), lo, hi));
  }
  return x;
}

// An integer field within [lo, hi], or `fallback` when absent or null.
std::int64_t integer(const Json& body, const char* name, std::int64_t fallback, std::int64_t lo,
                     std::int64_t hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const Json& v = body[name];
  if (!v.is_number_integer()) {
    refuse(name, fmt::format("'{}' must be an integer, not {}", name, v.dump()));
  }
  // nlohmann_json keeps a non-negative literal unsigned (it may exceed int64).
  const bool inside =
      v.is_number_unsigned()
          ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                (lo <= 0 || v.get<std::uint64_t>() >= static_cast<std::uint64_t>(lo))
          : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!inside) {
    refuse(name, fmt::format("'{}' is {}; it must be between {} and {}", name, v.dump(), lo, hi));
  }
  return v.get<std::int64_t>();
}

std::vector<std::string> stop_strings(const Json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const Json& s = body["stop"];
  if (s.is_string()) {
    if (s.get<std::string>().empty()) refuse("stop", "'stop' is empty; it takes non-empty strings");
    return {s.get<std::string>()};
  }
  std::vector<std::string> out;
  if (s.is_array() && s.size() <= 4) {
    for (const Json& x : s) {
      if (!x.is_string() || x.get<std::string>().empty()) {
        refuse("stop", fmt::format("'stop' holds {}; it takes non-empty strings", x.dump()));
      }
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  refuse("stop", "'stop' must be a string or a list of up to 4 strings");
}

// temperature, top_p and top_k: greedy (none) at temperature 0.
std::optional<ops::SamplingOptions> sampling(const Json& body) {
  const double temperature = number(body, "temperature", 1.0, 0.0, 2.0);
  const double top_p = number(body, "top_p", 1.0, 0.0, 1.0);
  const std::int64_t top_k =
      integer(body, "top_k", 40, 0, std::numeric_limits<std::int32_t>::max());
  if (top_p <= 0.0) refuse("top_p", "'top_p' must be above 0");
  if (temperature <= 0.0) return std::nullopt;
  return ops::SamplingOptions{
      .temperature = temperature, .top_k = top_k == 0 ? 64 : top_k, .top_p = top_p};
}

}  // namespace

void refuse(const std::string& param, const std::string& message) {
  throw RequestError{message, param};
}

Json parse_body(const std::string& text) {
  // The keys of each open object, innermost last: a key belongs to the innermost open object.
  std::vector<std::size_t> keys;
  const Json::parser_callback_t limits = [&keys](int depth, nlohmann::json::parse_event_t event,
                                                 Json&) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxBodyDepth) {
      refuse("", fmt::format("the body nests deeper than {} levels", kMaxBodyDepth));
    }
    if (event == Event::object_start) keys.push_back(0);
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key && ++keys.back() > kMaxObjectKeys) {
      refuse("", fmt::format("an object of the body holds more than {} keys", kMaxObjectKeys));
    }
    return true;
  };
  Json body;
  try {
    body = Json::parse(text, limits);
  } catch (const Json::parse_error& e) {
    refuse("", fmt::format("the body is not JSON: {}", e.what()));
  }
  if (!body.is_object()) refuse("", "the body must be a JSON object");
  return body;
}

namespace {

// How many alternatives each token's log-probabilities list: a completion's `logprobs` is that
// count; a chat's is a boolean, with the count in `top_logprobs`. nullopt: none asked for.
std::optional<std::int64_t> logprobs(const Json& body) {
  const bool present = body.contains("logprobs") && !body["logprobs"].is_null();
  const bool top_given = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
  if (present && body["logprobs"].is_number_integer()) {
    return integer(body, "logprobs", 0, 0, models::kMaxTopLogprobs);
  }
  const bool wanted = boolean_field(body, "logprobs", false);
  if (top_given && !wanted) refuse("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (!wanted) return std::nullopt;
  return integer(body, "top_logprobs", 0, 0, models::kMaxTopLogprobs);
}

}  // namespace

GenerationRequest parse_generation(const Json& body, const std::vector<std::int64_t>& eos,
                                   const char* max_tokens_field, std::int64_t default_max_tokens) {
  GenerationRequest r;
  r.options.max_new_tokens =
      integer(body, max_tokens_field, default_max_tokens, 1, std::int64_t{1} << 30);
  if (integer(body, "n", 1, 1, 1) != 1) refuse("n", "'n' must be 1");
  r.options.logprobs = logprobs(body);
  r.options.sampling = sampling(body);
  // Without a seed each request draws its own (as OpenAI's and llama-server's do).
  r.options.seed = body.contains("seed") && !body["seed"].is_null()
                       ? static_cast<std::uint64_t>(
                             integer(body, "seed", 0, std::numeric_limits<std::int64_t>::min(),
                                     std::numeric_limits<std::int64_t>::max()))
                       : std::random_device{}();
  if (!boolean_field(body, "ignore_eos", false)) r.options.stop_ids = eos;
  r.stop = stop_strings(body);
  r.stream = boolean_field(body, "stream", false);
  return r;
}

bool boolean_field(const Json& body, const char* name, bool fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!body[name].is_boolean()) {
    refuse(name, fmt::format("'{}' must be true or false, not {}", name, body[name].dump()));
  }
  return body[name].get<bool>();
}

nlohmann::json error_object(const std::string& message, const std::string& type,
                            const std::string& param) {
  return nlohmann::json{
      {"error",
       {{"message", message},
        {"type", type},
        {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
        {"code", nullptr}}}};
}

}  // namespace numesh::serve::openai
