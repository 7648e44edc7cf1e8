#include "completion_request.hpp"

#include <fmt/format.h>

#include <limits>
#include <random>

#include "numesh/core/error.hpp"

namespace numesh::serve::openai {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw RequestError{message, param};
}

// A number field within [lo, hi], or `fallback` when absent or null.
double number(const json& body, const char* name, double fallback, double lo, double hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const json& v = body[name];
  if (!v.is_number()) refuse(name, fmt::format("'{}' must be a number, not {}", name, v.dump()));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    refuse(name, fmt::format("'{}' is {}; it must be between {} and {}", name, v.dump(), lo, hi));
  }
  return x;
}

// An integer field within [lo, hi], or `fallback` when absent or null.
std::int64_t integer(const json& body, const char* name, std::int64_t fallback, std::int64_t lo,
                     std::int64_t hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const json& v = body[name];
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

bool boolean(const json& body, const char* name, bool fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!body[name].is_boolean()) {
    refuse(name, fmt::format("'{}' must be true or false, not {}", name, body[name].dump()));
  }
  return body[name].get<bool>();
}

std::vector<std::int32_t> prompt_ids(const json& body, const models::TextTokenizer* tokenizer,
                                     std::int64_t vocab) {
  if (!body.contains("prompt")) refuse("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  std::vector<std::int32_t> ids;
  if (p.is_string()) {
    if (tokenizer == nullptr) {
      refuse("prompt", "the model has no tokenizer: give the prompt as a list of token ids");
    }
    try {
      ids = tokenizer->encode(p.get<std::string>(), /*add_special_tokens=*/true);
    } catch (const Error& e) {
      refuse("prompt", e.what());
    }
  } else if (p.is_array() && !p.empty() && p.front().is_string()) {
    refuse("prompt", "one prompt per request: 'prompt' is a list of strings");
  } else if (p.is_array()) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      const bool id = p[i].is_number_integer() && p[i].get<std::int64_t>() >= 0 &&
                      p[i].get<std::int64_t>() < vocab;
      if (!id) {
        refuse("prompt", fmt::format("'prompt'[{}] is {}; token ids are integers in [0, {})", i,
                                     p[i].dump(), vocab));
      }
      ids.push_back(p[i].get<std::int32_t>());
    }
  } else {
    refuse("prompt",
           fmt::format("'prompt' must be a string or a list of token ids, not {}", p.dump()));
  }
  if (ids.empty()) refuse("prompt", "'prompt' is empty");
  return ids;
}

std::vector<std::string> stop_strings(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  if (s.is_string()) {
    if (s.get<std::string>().empty()) refuse("stop", "'stop' is empty; it takes non-empty strings");
    return {s.get<std::string>()};
  }
  std::vector<std::string> out;
  if (s.is_array() && s.size() <= 4) {
    for (const json& x : s) {
      if (!x.is_string() || x.get<std::string>().empty()) {
        refuse("stop", fmt::format("'stop' holds {}; it takes non-empty strings", x.dump()));
      }
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  refuse("stop", "'stop' must be a string or a list of up to 4 strings");
}

}  // namespace

json error_object(const std::string& message, const std::string& type, const std::string& param) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", nullptr}}}};
}

CompletionRequest parse_completion(const std::string& body_text,
                                   const models::TextTokenizer* tokenizer, std::int64_t vocab,
                                   const std::vector<std::int64_t>& eos) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    refuse("", fmt::format("the body is not JSON: {}", e.what()));
  }
  if (!body.is_object()) refuse("", "the body must be a JSON object");
  CompletionRequest r;
  r.prompt = prompt_ids(body, tokenizer, vocab);
  r.options.max_new_tokens = integer(body, "max_tokens", 16, 1, std::int64_t{1} << 30);
  if (integer(body, "n", 1, 1, 1) != 1) refuse("n", "'n' must be 1");
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    refuse("logprobs", "'logprobs' is not supported yet");
  }
  const double temperature = number(body, "temperature", 1.0, 0.0, 2.0);
  const double top_p = number(body, "top_p", 1.0, 0.0, 1.0);
  const std::int64_t top_k =
      integer(body, "top_k", 40, 0, std::numeric_limits<std::int32_t>::max());
  if (top_p <= 0.0) refuse("top_p", "'top_p' must be above 0");
  if (temperature > 0.0) {
    r.options.sampling = ops::SamplingOptions{
        .temperature = temperature, .top_k = top_k == 0 ? 64 : top_k, .top_p = top_p};
  }
  // Without a seed each request draws its own (as OpenAI's and llama-server's do).
  r.options.seed = body.contains("seed") && !body["seed"].is_null()
                       ? static_cast<std::uint64_t>(
                             integer(body, "seed", 0, std::numeric_limits<std::int64_t>::min(),
                                     std::numeric_limits<std::int64_t>::max()))
                       : std::random_device{}();
  if (!boolean(body, "ignore_eos", false)) r.options.stop_ids = eos;
  r.stop = stop_strings(body);
  r.stream = boolean(body, "stream", false);
  return r;
}

}  // namespace numesh::serve::openai
