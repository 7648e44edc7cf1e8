// tokenizer.json as numesh reads it (numesh/models/tokenizers/tokenizer.hpp), on small byte-level
// BPE tokenizers written by the tests: merges applied by rank, ignore_merges, the pre-tokenizer's
// regex split and ByteLevel's prefix space, added tokens (longest match, lstrip, rstrip,
// special, normalized), NFC, the BOS template, decoding (GPT-2's table backwards, U+FFFD for
// cut characters), and every error with its type and message. The real Llama 3 and Qwen3 files
// are checked against Hugging Face by the tokenizer check (tokenizer_check_main).

#include "numesh/models/tokenizers/tokenizer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"

namespace numesh::models {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

using Ids = std::vector<std::int32_t>;

// GPT-2's byte-level character of a printable ASCII byte is the byte itself; a space is "Ġ".
constexpr const char* kSpace = "\xC4\xA0";

// A byte-level BPE tokenizer.json: ids 0-255 are the 256 bytes' characters in GPT-2's order
// (as numesh's table gives them), then `extra` tokens, then `merges`; GPT-2's own split
// (ByteLevel with use_regex) unless `pre_tokenizer` is given.
json make_tokenizer(const std::vector<std::string>& extra, const json& merges,
                    json pre_tokenizer = nullptr) {
  json vocab = json::object();
  // The 256 byte characters, in the order numesh's table (and GPT-2's) gives them.
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[utf8] = b;
  }
  int id = 256;
  for (const auto& token : extra) vocab[token] = id++;
  if (pre_tokenizer.is_null()) {
    pre_tokenizer = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

Tokenizer parse(const json& j) { return Tokenizer::parse(j.dump(), "tok.json"); }

json added(std::int32_t id, const std::string& content, bool special, bool lstrip = false,
           bool rstrip = false, bool normalized = false) {
  return {{"id", id},          {"content", content}, {"single_word", false},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

// Llama 3's split regex.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json llama3_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3Pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

TEST(TokenizerTest, BytesWithoutMergesAreTheirOwnIds) {
  const auto t = parse(make_tokenizer({}, json::array()));
  EXPECT_THAT(t.encode("ab c"), ElementsAre('a', 'b', ' ', 'c'));
  EXPECT_THAT(t.encode(""), IsEmpty());
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.token_to_id(kSpace), ' ');
  EXPECT_EQ(t.id_to_token('a'), "a");
  EXPECT_EQ(t.id_to_token(256), std::nullopt);
  EXPECT_EQ(t.decode(Ids{'a', 'b', ' ', 'c'}), "ab c");
}

TEST(TokenizerTest, MergesApplyByRankNotByPosition) {
  // "abc": "b c" (rank 0) wins over "a b" (rank 1), though "a b" comes first in the word.
  const auto bc_first = parse(make_tokenizer({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_THAT(bc_first.encode("abc"), ElementsAre('a', 257));
  const auto ab_first = parse(make_tokenizer({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_THAT(ab_first.encode("abc"), ElementsAre(256, 'c'));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  // "aaa" with one merge "a a": the leftmost pair merges, the third a stays.
  const auto t = parse(make_tokenizer({"aa"}, {"a a"}));
  EXPECT_THAT(t.encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(t.encode("aaaa"), ElementsAre(256, 256));
}

TEST(TokenizerTest, MergesChainAndReadPairsAsArrays) {
  // The [a, b] form of merges (newer tokenizer.json files, Qwen3) is the "a b" form's equal.
  const json merges = json::array({json::array({"h", "e"}), json::array({"l", "l"}),
                                   json::array({"he", "ll"}), json::array({"hell", "o"})});
  const auto t = parse(make_tokenizer({"he", "ll", "hell", "hello"}, merges));
  EXPECT_THAT(t.encode("hello"), ElementsAre(259));
  EXPECT_THAT(t.encode("hello hell"), ElementsAre(259, ' ', 258));
  EXPECT_EQ(t.decode(t.encode("hello hell")), "hello hell");
}

TEST(TokenizerTest, IgnoreMergesTakesAWholeWordThatIsAToken) {
  // "abc" is a token no merge makes: with ignore_merges (Llama 3) the word is that token.
  auto j = make_tokenizer({"ab", "abc"}, {"a b"});
  EXPECT_THAT(parse(j).encode("abc"), ElementsAre(256, 'c'));
  j["model"]["ignore_merges"] = true;
  EXPECT_THAT(parse(j).encode("abc"), ElementsAre(257));
}

TEST(TokenizerTest, ByteLevelMapsSpacesAndNonAsciiBytes) {
  // " é": a space ("Ġ") then the two bytes of é (C3 A9, both printable Latin-1 characters).
  const std::string g_space = kSpace;
  const auto t = parse(make_tokenizer({g_space + "x"}, {g_space + " x"}));
  EXPECT_THAT(t.encode("a x"), ElementsAre('a', 256));
  EXPECT_THAT(t.encode("\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(t.decode(Ids{0xC3, 0xA9}), "\xC3\xA9");
}

TEST(TokenizerTest, ByteLevelAddPrefixSpace) {
  auto j = make_tokenizer({}, json::array());
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const auto t = parse(j);
  EXPECT_THAT(t.encode("a"), ElementsAre(' ', 'a'));
  EXPECT_THAT(t.encode(" a"), ElementsAre(' ', 'a'));
}

TEST(TokenizerTest, SplitRegexIsolatesPiecesBeforeByteLevel) {
  // Llama 3's regex: digits in groups of three, and contractions case-insensitively, so the
  // merge "1 2" never crosses a group and "'M" is a piece of its own.
  const auto t = parse(make_tokenizer({"12", "'M"}, {"1 2", "' M"}, llama3_pre_tokenizer()));
  EXPECT_THAT(t.encode("1212"), ElementsAre(256, '1', '2'));
  EXPECT_THAT(t.encode("I'M"), ElementsAre('I', 257));
}

TEST(TokenizerTest, SplitStringPattern) {
  json pre = llama3_pre_tokenizer();
  pre["pretokenizers"][0]["pattern"] = {{"String", "-"}};
  const auto t = parse(make_tokenizer({"ab"}, {"a b"}, pre));
  EXPECT_THAT(t.encode("a-b"), ElementsAre('a', '-', 'b'));
  EXPECT_THAT(t.encode("ab-"), ElementsAre(256, '-'));
}

TEST(TokenizerTest, SplitRemovedDropsTheDelimitersOrWithInvertKeepsOnlyMatches) {
  // Removed: the matches ("-") are dropped. Removed with invert (GPT-4o's file): only the
  // matches (runs of a) are kept, what is between them is dropped.
  json pre = llama3_pre_tokenizer();
  pre["pretokenizers"][0]["pattern"] = {{"String", "-"}};
  pre["pretokenizers"][0]["behavior"] = "Removed";
  EXPECT_THAT(parse(make_tokenizer({}, json::array(), pre)).encode("a-b"), ElementsAre('a', 'b'));
  pre["pretokenizers"][0]["pattern"] = {{"Regex", "a+"}};
  pre["pretokenizers"][0]["invert"] = true;
  EXPECT_THAT(parse(make_tokenizer({"aa"}, {"a a"}, pre)).encode("aabab"), ElementsAre(256, 'a'));
}

TEST(TokenizerTest, NormalizerSequenceOfNothingOrNfc) {
  auto j = make_tokenizer({}, json::array());
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  EXPECT_THAT(parse(j).encode("e\xCC\x81"), ElementsAre('e', 0xCC, 0x81));
  j["normalizer"]["normalizers"].push_back({{"type", "NFC"}});
  EXPECT_THAT(parse(j).encode("e\xCC\x81"), ElementsAre(0xC3, 0xA9));
}

TEST(TokenizerTest, AddedTokensMatchFirstLongestAndDecodeOrSkip) {
  auto j = make_tokenizer({}, json::array());
  j["added_tokens"] =
      json::array({added(256, "<s>", true), added(257, "<s>x", true), added(258, "<tool>", false)});
  const auto t = parse(j);
  // "<s>x" is the longer match at the same place; the added tokens split words.
  EXPECT_THAT(t.encode("a<s>xb<s><tool>"), ElementsAre('a', 257, 'b', 256, 258));
  EXPECT_THAT(t.encode("<s", false), ElementsAre('<', 's'));
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.token_to_id("<tool>"), 258);
  EXPECT_EQ(t.decode(Ids{'a', 257, 258}), "a<s>x<tool>");
  // Only special added tokens are skipped.
  EXPECT_EQ(t.decode(Ids{'a', 257, 258}, /*skip_special_tokens=*/true), "a<tool>");
}

TEST(TokenizerTest, AddedTokensLstripAndRstripTakeTheWhitespace) {
  auto j = make_tokenizer({}, json::array());
  j["added_tokens"] = json::array(
      {added(256, "<L>", true, /*lstrip=*/true), added(257, "<R>", true, false, /*rstrip=*/true)});
  const auto t = parse(j);
  EXPECT_THAT(t.encode("a  <L> b"), ElementsAre('a', 256, ' ', 'b'));
  EXPECT_THAT(t.encode("a <R>\t b"), ElementsAre('a', ' ', 257, 'b'));
  // lstrip never reaches into the previous match.
  EXPECT_THAT(t.encode("<R> <L>"), ElementsAre(257, 256));
}

TEST(TokenizerTest, NormalizedAddedTokensMatchAfterNfc) {
  // "é" written e + U+0301: NFC makes it U+00E9 first, so the normalized token "é" matches it;
  // the raw-matched token "ë" (not normalized) does not match e + U+0308.
  auto j = make_tokenizer({}, json::array());
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"] = json::array({added(256, "\xC3\xA9", false, false, false, /*normalized=*/true),
                                   added(257, "\xC3\xAB", false)});
  const auto t = parse(j);
  EXPECT_THAT(t.encode("e\xCC\x81"), ElementsAre(256));
  EXPECT_THAT(t.encode("\xC3\xAB"), ElementsAre(257));
  EXPECT_THAT(t.encode("e\xCC\x88"), ElementsAre(0xC3, 0xAB));  // composed, then bytes
}

TEST(TokenizerTest, TemplateProcessingAddsBos) {
  auto j = make_tokenizer({}, json::array());
  j["added_tokens"] = json::array({added(256, "<|begin_of_text|>", true)});
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"},
         {"add_prefix_space", true},
         {"trim_offsets", false},
         {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {256}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const auto t = parse(j);
  EXPECT_THAT(t.encode("a"), ElementsAre(256, 'a'));
  EXPECT_THAT(t.encode(""), ElementsAre(256));
  EXPECT_THAT(t.encode("a", /*add_special_tokens=*/false), ElementsAre('a'));
  EXPECT_EQ(t.decode(t.encode("a")), "<|begin_of_text|>a");
  EXPECT_EQ(t.decode(t.encode("a"), /*skip_special_tokens=*/true), "a");
}

TEST(TokenizerTest, DecodeReplacesCutCharactersWithReplacementCharacter) {
  const auto t = parse(make_tokenizer({}, json::array()));
  // 你 is E4 BD A0: its first two bytes alone are one maximal subpart, so one U+FFFD.
  EXPECT_EQ(t.decode(Ids{0xE4, 0xBD}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(Ids{0xE4, 0xBD, 'a', 0xFF}),
            "\xEF\xBF\xBD"
            "a"
            "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(Ids{0xE4, 0xBD, 0xA0}), "\xE4\xBD\xA0");
}

TEST(TokenizerTest, UnkTokenReplacesUnknownCharacters) {
  // A vocab without the byte 'z': with an unk_token it becomes <unk> (one per run with
  // fuse_unk); without one it is dropped, as tokenizers does.
  auto j = make_tokenizer({"<unk>"}, json::array());
  j["model"]["vocab"].erase("z");
  j["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(parse(j).encode("azz"), ElementsAre('a', 256, 256));
  j["model"]["fuse_unk"] = true;
  EXPECT_THAT(parse(j).encode("azz"), ElementsAre('a', 256));
  j["model"]["unk_token"] = nullptr;
  EXPECT_THAT(parse(j).encode("azz"), ElementsAre('a'));
}

TEST(TokenizerTest, LoadsAFileOrADirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "numesh_tokenizer_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << make_tokenizer({"ab"}, {"a b"}).dump();
  EXPECT_THAT(Tokenizer::load(dir).encode("ab"), ElementsAre(256));
  EXPECT_THAT(Tokenizer::load(dir / "tokenizer.json").encode("ab"), ElementsAre(256));
  const auto missing = dir / "missing.json";
  EXPECT_THAT([&] { (void)Tokenizer::load(missing); },
              ThrowsMessage<ValueError>(missing.string() + ": cannot open the tokenizer file"));
  std::filesystem::remove_all(dir);
}

// --- errors -------------------------------------------------------------------------------

// Parsing `j` throws ValueError `message`.
void expect_refused(const json& j, const std::string& message) {
  EXPECT_THAT([&] { (void)parse(j); }, ThrowsMessage<ValueError>(message));
}

TEST(TokenizerErrorTest, NotJson) {
  EXPECT_THAT([] { (void)Tokenizer::parse("{", "tok.json"); },
              ThrowsMessage<ValueError>(
                  ::testing::StartsWith("tok.json: the tokenizer is not valid JSON: ")));
  EXPECT_THAT([] { (void)Tokenizer::parse("[]", "tok.json"); },
              ThrowsMessage<ValueError>("tok.json: the tokenizer is array, expected an object"));
}

TEST(TokenizerErrorTest, Model) {
  auto j = make_tokenizer({}, json::array());
  j["model"]["type"] = "WordPiece";
  expect_refused(j, "tok.json: model type 'WordPiece' is not supported (BPE)");
  j["model"]["type"] =
      json::object();  // not a string: named by its JSON, not nlohmann's type_error
  expect_refused(j, "tok.json: model type '{}' is not supported (BPE)");
  j = make_tokenizer({}, json::array());
  j["model"]["byte_fallback"] = true;
  expect_refused(j,
                 "tok.json: model byte_fallback true is not supported (SentencePiece-style "
                 "BPE; numesh reads byte-level BPE)");
  j = make_tokenizer({}, json::array());
  j["model"]["dropout"] = 0.1;
  expect_refused(j, "tok.json: model dropout 0.1 is not supported (null)");
  j = make_tokenizer({}, json::array());
  j["model"]["continuing_subword_prefix"] = "##";
  expect_refused(j,
                 "tok.json: model continuing_subword_prefix \"##\" is not supported (null or "
                 "\"\")");
  j = make_tokenizer({}, json::array());
  j["model"]["fuse_unk"] = "yes";
  expect_refused(j, "tok.json: model field 'fuse_unk' is \"yes\", expected true or false");
  j = make_tokenizer({}, json::array());
  j["model"]["vocab"]["x"] = -1;
  expect_refused(j, "tok.json: model vocab id of 'x' is -1, expected a non-negative integer");
  j = make_tokenizer({}, json::array());
  j["model"]["vocab"]["zz"] = 'a';
  expect_refused(j, "tok.json: model vocab gives id 97 to both 'a' and 'zz'");
  j = make_tokenizer({}, json::array());
  j["model"]["vocab"] = json::array();
  expect_refused(j, "tok.json: model vocab is array, expected an object");
  j = make_tokenizer({}, json::array());
  j["model"]["unk_token"] = "<unk>";
  expect_refused(j, "tok.json: model unk_token '<unk>' is not in the vocab");
}

TEST(TokenizerErrorTest, Merges) {
  expect_refused(make_tokenizer({"ab"}, {"a b", "ab"}),
                 "tok.json: model merge 1 is \"ab\", expected \"a b\" or [\"a\", \"b\"]");
  expect_refused(make_tokenizer({"ab"}, {{"a", "b", "c"}}),
                 "tok.json: model merge 0 is [\"a\",\"b\",\"c\"], expected \"a b\" or [\"a\", "
                 "\"b\"]");
  expect_refused(make_tokenizer({}, {"a b"}),
                 "tok.json: model merge 0 ('a b'): merged token 'ab' is not in the vocab");
  expect_refused(make_tokenizer({"ab"}, {"a xyz"}),
                 "tok.json: model merge 0 ('a xyz'): token 'xyz' is not in the vocab");
  auto j = make_tokenizer({}, json::array());
  j["model"]["merges"] = nullptr;
  expect_refused(j, "tok.json: model merges is missing, expected an array");
}

TEST(TokenizerErrorTest, PreTokenizer) {
  auto j = make_tokenizer({}, json::array());
  j["pre_tokenizer"] = nullptr;
  expect_refused(j,
                 "tok.json: pre_tokenizer null is not supported (byte-level BPE needs a "
                 "ByteLevel pre-tokenizer)");
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_refused(j,
                 "tok.json: pre_tokenizer type 'Whitespace' is not supported (Sequence, "
                 "Split, ByteLevel)");
  j["pre_tokenizer"] = llama3_pre_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  expect_refused(j,
                 "tok.json: pre_tokenizer step 0 (Split) behavior 'MergedWithPrevious' is "
                 "not supported (Isolated, Removed)");
  j["pre_tokenizer"] = llama3_pre_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = "no";
  expect_refused(j,
                 "tok.json: pre_tokenizer step 0 (Split) field 'invert' is \"no\", expected "
                 "true or false");
  j["pre_tokenizer"] = llama3_pre_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(a"}};
  expect_refused(j,
                 "tok.json: pre_tokenizer step 0 (Split) regex '(a' does not compile: end "
                 "pattern with unmatched parenthesis");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", ""}};
  expect_refused(j,
                 "tok.json: pre_tokenizer step 0 (Split) pattern is {\"String\":\"\"}, "
                 "expected {\"Regex\": ...} or a non-empty {\"String\": ...}");
  j["pre_tokenizer"] = llama3_pre_tokenizer();
  j["pre_tokenizer"]["pretokenizers"].erase(1);
  expect_refused(j,
                 "tok.json: pre_tokenizer has no ByteLevel step; numesh reads byte-level "
                 "BPE only");
  j["pre_tokenizer"] = llama3_pre_tokenizer();
  j["pre_tokenizer"]["pretokenizers"].push_back(j["pre_tokenizer"]["pretokenizers"][0]);
  expect_refused(j,
                 "tok.json: pre_tokenizer step 2 ('Split') comes after ByteLevel; numesh "
                 "supports Split steps followed by one ByteLevel step");
}

TEST(TokenizerErrorTest, NormalizerDecoderPostProcessorAndTopLevel) {
  auto j = make_tokenizer({}, json::array());
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_refused(j,
                 "tok.json: normalizer type 'Lowercase' is not supported (null, NFC, or a "
                 "Sequence of NFC)");
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
  expect_refused(j,
                 "tok.json: normalizer type 'NFKC' is not supported (null, NFC, or a "
                 "Sequence of NFC)");
  j = make_tokenizer({}, json::array());
  j["decoder"] = {{"type", "WordPiece"}};
  expect_refused(j, "tok.json: decoder type 'WordPiece' is not supported (ByteLevel)");
  j["decoder"] = nullptr;
  expect_refused(j, "tok.json: decoder type 'null' is not supported (ByteLevel)");
  j = make_tokenizer({}, json::array());
  j["post_processor"] = {{"type", "BertProcessing"}};
  expect_refused(j,
                 "tok.json: post_processor type 'BertProcessing' is not supported "
                 "(TemplateProcessing, ByteLevel, Sequence)");
  j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "RobertaProcessing"}}}}};
  expect_refused(j,
                 "tok.json: post_processor.processors[0] type 'RobertaProcessing' is not "
                 "supported (TemplateProcessing, ByteLevel, Sequence)");
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", json::object()}};
  expect_refused(j, "tok.json: post_processor special token '<s>' has no ids in special_tokens");
  j["post_processor"]["special_tokens"] = {{"<s>", {{"id", "<s>"}, {"ids", {999}}}}};
  expect_refused(j,
                 "tok.json: post_processor special token id 999 is not in the vocabulary "
                 "(size 256)");
  j = make_tokenizer({}, json::array());
  j["truncation"] = {{"max_length", 8}};
  expect_refused(j, "tok.json: truncation {\"max_length\":8} is not supported (null)");
}

TEST(TokenizerErrorTest, AddedTokens) {
  auto j = make_tokenizer({}, json::array());
  j["added_tokens"] = json::array({added(256, "<a>", true), added(256, "<b>", true)});
  expect_refused(j, "tok.json: added_tokens[1] ('<b>') has id 256, which '<a>' has already");
  j["added_tokens"] = json::array({added(256, "<a>", true), added(257, "<a>", true)});
  expect_refused(j, "tok.json: added_tokens[1] '<a>' is listed twice (ids 256 and 257)");
  j["added_tokens"] = json::array({added(256, "", true)});
  expect_refused(j, "tok.json: added_tokens[0] content is \"\", expected a non-empty string");
  j["added_tokens"] = json::array({added(-1, "<a>", true)});
  expect_refused(j, "tok.json: added_tokens[0] id is -1, expected a non-negative integer");
  j["added_tokens"] = json::array({added(256, "<a>", true)});
  j["added_tokens"][0]["single_word"] = true;
  expect_refused(j, "tok.json: added_tokens[0] ('<a>') single_word true is not supported");
}

TEST(TokenizerErrorTest, EncodeInvalidUtf8) {
  const auto t = parse(make_tokenizer({}, json::array()));
  EXPECT_THAT(
      [&] {
        (void)t.encode(
            "ab\xFF"
            "c");
      },
      ThrowsMessage<ValueError>("tokenizer: the text is not valid UTF-8 (byte 0xff at offset 2)"));
  EXPECT_THAT([&] { (void)t.encode("a\xE4\xBD"); },
              ThrowsMessage<ValueError>("tokenizer: the text is not valid UTF-8 (it ends inside "
                                        "a character at offset 3)"));
}

TEST(TokenizerErrorTest, DecodeIdsOutsideTheVocabulary) {
  auto j = make_tokenizer({}, json::array());
  j["added_tokens"] = json::array({added(300, "<s>", true)});  // ids 256-299 have no token
  const auto t = parse(j);
  EXPECT_THAT(
      [&] {
        (void)t.decode(Ids{'a', 301});
      },
      ThrowsMessage<IndexError>("tokenizer: token id 301 at position 1 is outside the "
                                "vocabulary (size 301)"));
  EXPECT_THAT([&] { (void)t.decode(Ids{-1}); },
              ThrowsMessage<IndexError>("tokenizer: token id -1 at position 0 is outside the "
                                        "vocabulary (size 301)"));
  EXPECT_THAT([&] { (void)t.decode(Ids{270}); },
              ThrowsMessage<IndexError>("tokenizer: token id 270 at position 0 has no token "
                                        "(vocabulary size 301)"));
}

}  // namespace
}  // namespace numesh::models
