#include "gguf_tokenizer.hpp"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/tokenizers/tokenizer.hpp"

namespace numesh::models::detail {

namespace {

using nlohmann::json;

// tokenizer.ggml.token_type, llama.cpp's llama_token_type (SentencePiece's piece types).
enum TokenType : std::int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokens and their types, checked to be as many.
struct GgufVocabulary {
  std::vector<std::string> tokens;
  std::vector<std::int64_t> types;
};

GgufVocabulary gguf_vocabulary(const GgufFile& file) {
  GgufVocabulary v;
  auto tokens = file.get_strings("tokenizer.ggml.tokens");
  NUMESH_CHECK(tokens.has_value(), ValueError, "{}: the GGUF metadata has no tokenizer.ggml.tokens",
               file.path().string());
  v.tokens = std::move(*tokens);
  v.types = file.get_ints("tokenizer.ggml.token_type")
                .value_or(std::vector<std::int64_t>(v.tokens.size(), kNormal));
  NUMESH_CHECK(v.types.size() == v.tokens.size(), ValueError,
               "{}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
               file.path().string(), v.types.size(), v.tokens.size());
  return v;
}

// A special token id from tokenizer.ggml.<name>_token_id, checked against the vocabulary.
std::optional<std::int64_t> gguf_token_id(const GgufFile& file, const GgufVocabulary& v,
                                          std::string_view name) {
  const std::string key = fmt::format("tokenizer.ggml.{}_token_id", name);
  const auto id = file.get_int(key);
  NUMESH_CHECK(!id || (*id >= 0 && *id < static_cast<std::int64_t>(v.tokens.size())), ValueError,
               "{}: {} is {}, outside the {} tokens", file.path().string(), key, *id,
               v.tokens.size());
  return id;
}

// llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) as tokenizer.json's pre_tokenizer,
// normalizer and the model's ignore_merges (llama.cpp's llama-vocab.cpp sets ignore_merges for
// Llama 3's; the regexes are the ones the models' tokenizer.json files give).
struct GgufPreTokenizer {
  json pre_tokenizer;
  json normalizer;
  bool ignore_merges = false;
};

json gguf_split_then_byte_level(std::string_view regex) {
  return json{{"type", "Sequence"},
              {"pretokenizers", json::array({json{{"type", "Split"},
                                                  {"pattern", {{"Regex", regex}}},
                                                  {"behavior", "Isolated"},
                                                  {"invert", false}},
                                             json{{"type", "ByteLevel"},
                                                  {"add_prefix_space", false},
                                                  {"trim_offsets", false},
                                                  {"use_regex", false}}})}};
}

// The Split regexes of the pre-tokenizers numesh names, as the models' tokenizer.json files
// give them.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3's names in llama.cpp (llama-vocab.cpp), whose files add BOS unless they say otherwise.
bool is_llama3_pre(std::string_view pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
}

GgufPreTokenizer gguf_pre_tokenizer(const GgufFile& file) {
  // No name is llama.cpp's "default": four regexes of its own that no tokenizer.json has, which
  // numesh does not reproduce (refused below, as any other name).
  const std::string pre = file.get_string("tokenizer.ggml.pre").value_or("default");
  constexpr std::string_view kLlama3 = kLlama3Regex;
  constexpr std::string_view kQwen2 = kQwen2Regex;
  // Llama 3's merges are ignored for whole words in the vocabulary (llama.cpp sets
  // ignore_merges for it, not for smaug-bpe, which splits as Llama 3 does).
  if (is_llama3_pre(pre)) return {gguf_split_then_byte_level(kLlama3), nullptr, true};
  if (pre == "smaug-bpe") return {gguf_split_then_byte_level(kLlama3), nullptr, false};
  if (pre == "qwen2") return {gguf_split_then_byte_level(kQwen2), json{{"type", "NFC"}}, false};
  if (pre == "gpt-2") {
    return {json{{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", true}},
            nullptr, false};
  }
  throw ValueError(fmt::format(
      "{}: tokenizer.ggml.pre '{}' is not a pre-tokenizer numesh knows (llama-bpe, llama3, "
      "llama-v3, smaug-bpe, qwen2, gpt-2)",
      file.path().string(), pre));
}

// A TemplateProcessing post-processor putting `bos` before and `eos` after the sequence.
json bos_eos_template(const GgufVocabulary& v, std::optional<std::int64_t> bos,
                      std::optional<std::int64_t> eos) {
  if (!bos && !eos) return nullptr;
  json single = json::array(), specials = json::object();
  const auto special = [&](std::int64_t id) {
    const std::string& token = v.tokens[static_cast<std::size_t>(id)];
    specials[token] = {{"id", token}, {"ids", {id}}, {"tokens", {token}}};
    return json{{"SpecialToken", {{"id", token}, {"type_id", 0}}}};
  };
  if (bos) single.push_back(special(*bos));
  single.push_back(json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (eos) single.push_back(special(*eos));
  return json{{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

// Protocol buffers' wire format, the little of it a ModelProto needs.
void proto_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void proto_key(std::string& out, int field, int wire) {
  proto_varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire));
}
void proto_bytes(std::string& out, int field, std::string_view bytes) {
  proto_key(out, field, 2);
  proto_varint(out, bytes.size());
  out += bytes;
}
void proto_int(std::string& out, int field, std::int64_t v) {
  proto_key(out, field, 0);
  proto_varint(out, static_cast<std::uint64_t>(v));  // negative int32s: ten bytes, as protobuf does
}
void proto_float(std::string& out, int field, float v) {
  proto_key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Reading: the last occurrence of `field` in `message` (protobuf's rule for a repeated
// singular field), as a varint or as a length-delimited payload; nullopt when absent or when
// the bytes end early.
struct ProtoField {
  std::uint64_t varint = 0;
  std::string_view bytes;
};
std::optional<std::uint64_t> proto_read_varint(std::string_view& in) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<std::uint8_t>(in.front());
    in.remove_prefix(1);
    v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  return std::nullopt;
}
std::optional<ProtoField> proto_find(std::string_view message, int field) {
  std::optional<ProtoField> found;
  while (!message.empty()) {
    const auto key = proto_read_varint(message);
    if (!key) return found;
    const auto wire = static_cast<int>(*key & 7);
    ProtoField f;
    if (wire == 0) {
      const auto v = proto_read_varint(message);
      if (!v) return found;
      f.varint = *v;
    } else if (wire == 2) {
      const auto n = proto_read_varint(message);
      if (!n || *n > message.size()) return found;
      f.bytes = message.substr(0, *n);
      message.remove_prefix(*n);
    } else if (wire == 1 || wire == 5) {
      const std::size_t n = wire == 1 ? 8 : 4;
      if (message.size() < n) return found;
      message.remove_prefix(n);
    } else {
      return found;  // groups: not in a ModelProto
    }
    if (static_cast<int>(*key >> 3) == field) found = f;
  }
  return found;
}

}  // namespace

std::string gguf_tokenizer_json(const GgufFile& file) {
  const GgufVocabulary v = gguf_vocabulary(file);
  const GgufPreTokenizer pre = gguf_pre_tokenizer(file);
  json vocab = json::object(), added = json::array();
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    const std::int64_t type = v.types[id];
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id},
                       {"content", v.tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
    } else if (type != kUnused) {
      vocab[v.tokens[id]] = id;
    }
  }
  const auto merges = file.get_strings("tokenizer.ggml.merges");
  NUMESH_CHECK(merges.has_value(), ValueError,
               "{}: the GGUF metadata has no tokenizer.ggml.merges (a gpt2 tokenizer needs them)",
               file.path().string());
  // Without the key, llama.cpp adds BOS for Llama 3's pre-tokenizer only.
  const bool add_bos =
      file.get_bool("tokenizer.ggml.add_bos_token")
          .value_or(is_llama3_pre(file.get_string("tokenizer.ggml.pre").value_or("")));
  const bool add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  const auto bos = gguf_token_id(file, v, "bos"), eos = gguf_token_id(file, v, "eos");
  NUMESH_CHECK((!add_bos || bos) && (!add_eos || eos), ValueError,
               "{}: tokenizer.ggml.add_bos_token / add_eos_token is true but the file names no "
               "bos / eos token id",
               file.path().string());
  const json tokenizer{{"version", "1.0"},
                       {"added_tokens", added},
                       {"normalizer", pre.normalizer},
                       {"pre_tokenizer", pre.pre_tokenizer},
                       {"post_processor", bos_eos_template(v, add_bos ? bos : std::nullopt,
                                                           add_eos ? eos : std::nullopt)},
                       {"decoder",
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", true},
                         {"use_regex", true}}},
                       {"model",
                        {{"type", "BPE"},
                         {"dropout", nullptr},
                         {"unk_token", nullptr},
                         {"fuse_unk", false},
                         {"byte_fallback", false},
                         {"ignore_merges", pre.ignore_merges},
                         {"vocab", vocab},
                         {"merges", *merges}}}};
  return tokenizer.dump();
}

std::string gguf_sentencepiece_model(const GgufFile& file) {
  const GgufVocabulary v = gguf_vocabulary(file);
  const std::vector<float> scores =
      file.get_floats("tokenizer.ggml.scores").value_or(std::vector<float>(v.tokens.size(), 0.0f));
  NUMESH_CHECK(scores.size() == v.tokens.size(), ValueError,
               "{}: tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
               file.path().string(), scores.size(), v.tokens.size());
  // sentencepiece_model.proto: ModelProto { pieces = 1; trainer_spec = 2; normalizer_spec = 3 },
  // SentencePiece { piece = 1; score = 2; type = 3 }.
  std::string model;
  bool byte_tokens = false;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::int64_t type = v.types[i];
    NUMESH_CHECK(type >= kNormal && type <= kByte, ValueError,
                 "{}: tokenizer.ggml.token_type of token {} is {}, not a SentencePiece type (1-6)",
                 file.path().string(), i, type);
    byte_tokens = byte_tokens || type == kByte;
    std::string piece;
    proto_bytes(piece, 1, v.tokens[i]);
    proto_float(piece, 2, scores[i]);
    proto_int(piece, 3, type);
    proto_bytes(model, 1, piece);
  }
  // TrainerSpec { model_type = 3 (BPE = 2); byte_fallback = 35; unk_id = 40; bos_id = 41;
  // eos_id = 42; pad_id = 43; unk_piece = 45; bos_piece = 46; eos_piece = 47; pad_piece = 48 }:
  // -1 for an id the file does not name, as SentencePiece does. The loaded processor finds its
  // special ids by the pieces' text (libsentencepiece's model_interface), so those are written
  // too.
  std::string trainer;
  proto_int(trainer, 3, 2);
  proto_int(trainer, 35, byte_tokens ? 1 : 0);
  int field = 40;
  for (const std::string_view name : {"unknown", "bos", "eos", "padding"}) {
    const auto id = gguf_token_id(file, v, name);
    proto_int(trainer, field, id.value_or(name == "unknown" ? 0 : -1));
    if (id) proto_bytes(trainer, field + 5, v.tokens[static_cast<std::size_t>(*id)]);
    ++field;
  }
  proto_bytes(model, 2, trainer);
  // NormalizerSpec { name = 1; add_dummy_prefix = 3; remove_extra_whitespaces = 4;
  // escape_whitespaces = 5 }: Llama's identity normalizer.
  std::string normalizer;
  proto_bytes(normalizer, 1, "identity");
  proto_int(normalizer, 3, file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true) ? 1 : 0);
  proto_int(normalizer, 4,
            file.get_bool("tokenizer.ggml.remove_extra_whitespaces").value_or(false) ? 1 : 0);
  proto_int(normalizer, 5, 1);
  proto_bytes(model, 3, normalizer);
  return model;
}

}  // namespace numesh::models::detail

namespace numesh::models::detail {

namespace {

// The name llama.cpp gives a tokenizer.json's pre-tokenizer, found by its Split regex (as
// llama.cpp's converter tells them apart by the ids they give); empty when numesh knows none.
std::string gguf_pre_name(const nlohmann::json& tokenizer) {
  const std::string pre = tokenizer.value("pre_tokenizer", nlohmann::json()).dump();
  // The regexes as JSON text: compare against their escaped forms.
  if (pre.find(nlohmann::json(std::string(kLlama3Regex)).dump()) != std::string::npos)
    return "llama-bpe";
  if (pre.find(nlohmann::json(std::string(kQwen2Regex)).dump()) != std::string::npos)
    return "qwen2";
  return "";
}

std::vector<std::string> add_byte_level(GgufWriter& w, const std::filesystem::path& file,
                                        std::int64_t vocab_size) {
  std::ifstream in(file, std::ios::binary);
  NUMESH_CHECK(in.good(), IoError, "{}: cannot read it", file.string());
  nlohmann::json t;
  try {
    t = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(fmt::format("{} is not JSON: {}", file.string(), e.what()));
  }
  const std::string pre = gguf_pre_name(t);
  NUMESH_CHECK(!pre.empty(), ValueError,
               "{}: its pre-tokenizer is not one numesh can name in GGUF (Llama 3's llama-bpe, "
               "Qwen2's qwen2); a GGUF reader would not split text as it does",
               file.string());
  const nlohmann::json& model = t.at("model");
  std::map<std::int64_t, std::pair<std::string, std::int32_t>> by_id;  // id -> token, type
  for (const auto& [token, id] : model.at("vocab").items())
    by_id[id.get<std::int64_t>()] = {token, static_cast<std::int32_t>(kNormal)};
  for (const auto& a : t.value("added_tokens", nlohmann::json::array())) {
    by_id[a.at("id").get<std::int64_t>()] = {
        a.at("content").get<std::string>(),
        static_cast<std::int32_t>(a.value("special", false) ? kControl : kUserDefined)};
  }
  const std::int64_t size = std::max(vocab_size, by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  for (std::int64_t id = 0; id < size; ++id) {
    const auto it = by_id.find(id);
    tokens.push_back(it == by_id.end() ? fmt::format("[PAD{}]", id) : it->second.first);
    types.push_back(it == by_id.end() ? static_cast<std::int32_t>(kUnused) : it->second.second);
  }
  std::vector<std::string> merges;
  for (const auto& m : model.at("merges")) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
  }
  // add_bos_token: the post-processor's template puts a special token first.
  const nlohmann::json post = t.value("post_processor", nlohmann::json());
  std::optional<std::int64_t> bos;
  const auto template_bos = [&](const nlohmann::json& p) {
    if (!p.is_object() || p.value("type", "") != "TemplateProcessing") return;
    const auto& single = p.at("single");
    if (!single.empty() && single.front().contains("SpecialToken")) {
      const std::string name = single.front()["SpecialToken"]["id"];
      bos = p.at("special_tokens").at(name).at("ids").at(0).get<std::int64_t>();
    }
  };
  template_bos(post);
  if (post.is_object() && post.value("type", "") == "Sequence") {
    for (const auto& p : post.at("processors")) template_bos(p);
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_int32s("tokenizer.ggml.token_type", std::move(types));
  w.add_strings("tokenizer.ggml.merges", std::move(merges));
  if (bos) w.add_uint32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(*bos));
  w.add_bool("tokenizer.ggml.add_bos_token", bos.has_value());
  return tokens;
}

GgufTokenizerWritten add_sentencepiece(GgufWriter& w, const std::filesystem::path& file,
                                       std::int64_t vocab_size) {
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(file.string());
  NUMESH_CHECK(status.ok(), IoError, "{}: SentencePiece cannot load it: {}", file.string(),
               status.ToString());
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    tokens.push_back(sp.IdToPiece(i));
    scores.push_back(sp.GetScore(i));
    types.push_back(static_cast<std::int32_t>(sp.IsUnknown(i)   ? kUnknown
                                              : sp.IsControl(i) ? kControl
                                              : sp.IsUnused(i)  ? kUnused
                                              : sp.IsByte(i)    ? kByte
                                                                : kNormal));
  }
  for (auto id = static_cast<std::int64_t>(tokens.size()); id < vocab_size; ++id) {
    tokens.push_back(fmt::format("[PAD{}]", id));  // llama.cpp's converter pads the same way
    scores.push_back(-1000.0f);
    types.push_back(static_cast<std::int32_t>(kUnused));
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_float32s("tokenizer.ggml.scores", std::move(scores));
  w.add_int32s("tokenizer.ggml.token_type", std::move(types));
  for (const auto& [key, id] :
       {std::pair{"bos", sp.bos_id()}, std::pair{"eos", sp.eos_id()},
        std::pair{"unknown", sp.unk_id()}, std::pair{"padding", sp.pad_id()}}) {
    if (id >= 0)
      w.add_uint32(fmt::format("tokenizer.ggml.{}_token_id", key), static_cast<std::uint32_t>(id));
  }
  w.add_bool("tokenizer.ggml.add_bos_token", sp.bos_id() >= 0);
  // NormalizerSpec { add_dummy_prefix = 3 (default true); remove_extra_whitespaces = 4
  // (default true) } as llama.cpp's converter copies them: Gemma's model adds no space prefix.
  const std::string proto = sp.serialized_model_proto();
  const std::optional<ProtoField> normalizer = proto_find(proto, 3);
  const auto flag = [&](int field) {
    const std::optional<ProtoField> f =
        normalizer ? proto_find(normalizer->bytes, field) : std::nullopt;
    return f ? f->varint != 0 : true;
  };
  w.add_bool("tokenizer.ggml.add_space_prefix", flag(3));
  w.add_bool("tokenizer.ggml.remove_extra_whitespaces", flag(4));
  // NormalizerSpec { name = 1; precompiled_charsmap = 2 }: rules GGUF has no key for, in the
  // charsmap (Llama 2's and Mistral's models have none: identity; a model trained with
  // SentencePiece's defaults has nmt_nfkc's).
  const auto field = [&](int number) {
    return normalizer ? proto_find(normalizer->bytes, number) : std::nullopt;
  };
  const std::optional<ProtoField> rule = field(1), charsmap = field(2);
  const std::string_view rule_name = rule ? rule->bytes : std::string_view("precompiled rules");
  std::string lost;
  if (charsmap && !charsmap->bytes.empty()) {
    lost = fmt::format(
        "{} normalizes text by '{}', which GGUF's tokenizer metadata cannot say: readers of the "
        "file (numesh, llama.cpp) tokenize as the identity normalizer would, so a text it changes "
        "(NFKC forms, newlines and tabs) gives other ids than the folder's",
        file.string(), rule_name);
  }
  return {std::move(tokens), std::move(lost)};
}

}  // namespace

GgufTokenizerWritten add_gguf_tokenizer(GgufWriter& writer, const std::filesystem::path& folder,
                                        std::int64_t vocab_size) {
  const std::filesystem::path json = folder / "tokenizer.json", model = folder / "tokenizer.model";
  // The tokenizer TextTokenizer::load picks: tokenizer.json when numesh reads it, else
  // tokenizer.model (Llama 2's SentencePiece-BPE tokenizer.json has one beside it).
  const bool has_model = std::filesystem::exists(model);
  if (std::filesystem::exists(json)) {
    bool readable = true;
    try {
      (void)Tokenizer::load(json);
    } catch (const Error&) {
      if (!has_model) throw;
      readable = false;
    }
    if (readable) return {add_byte_level(writer, json, vocab_size), ""};
  }
  if (!has_model) return {};
  return add_sentencepiece(writer, model, vocab_size);
}

}  // namespace numesh::models::detail
