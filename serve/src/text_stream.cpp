#include "text_stream.hpp"

#include <algorithm>

namespace numesh::serve {

std::size_t complete_utf8_length(const std::string& text) noexcept {
  std::size_t n = text.size();
  // A trailing U+FFFD (EF BF BD) may be bytes the next token completes.
  while (n >= 3 && text.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) n -= 3;
  // Back over continuation bytes to the last lead byte; keep it only if its character is whole.
  std::size_t i = n;
  int continuation = 0;
  while (i > 0 && continuation < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++continuation;
  }
  if (i == 0) return n;
  const auto lead = static_cast<unsigned char>(text[i - 1]);
  const int length = lead < 0x80           ? 1
                     : (lead >> 5) == 0x6  ? 2
                     : (lead >> 4) == 0xE  ? 3
                     : (lead >> 3) == 0x1E ? 4
                                           : 1;
  return continuation + 1 >= length ? n : i - 1;
}

TextStream::TextStream(const models::TextTokenizer* tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {}

std::string TextStream::add(std::int32_t token) {
  tokens_.push_back(token);
  if (tokenizer_ == nullptr || stopped_) return {};
  if (tokenizer_->knows(token)) known_.push_back(token);
  const std::string full = tokenizer_->decode(known_, /*skip_special_tokens=*/true);
  // The first stop string in the new part of the text (and the few bytes before it that a
  // stop string may straddle).
  std::size_t longest = 0;
  for (const std::string& s : stop_) longest = std::max(longest, s.size());
  const std::size_t from = emitted_.size() >= longest ? emitted_.size() - longest + 1 : 0;
  std::size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, full.find(s, from));
  if (cut != std::string::npos) {
    stopped_ = true;
    const std::string out =
        cut > emitted_.size() ? full.substr(emitted_.size(), cut - emitted_.size()) : std::string();
    emitted_ += out;
    return out;
  }
  // Hand out whole characters, holding back a tail that could begin a stop string.
  std::size_t end = complete_utf8_length(full), hold = 0;
  for (const std::string& s : stop_) {
    for (std::size_t k = std::min(s.size() - 1, end); k > hold; --k) {
      if (full.compare(end - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  end -= hold;
  if (end <= emitted_.size()) return {};
  std::string out = full.substr(emitted_.size(), end - emitted_.size());
  emitted_ += out;
  return out;
}

std::string TextStream::finish() {
  if (tokenizer_ == nullptr || stopped_) return {};
  const std::string full = tokenizer_->decode(known_, /*skip_special_tokens=*/true);
  if (full.size() <= emitted_.size()) return {};
  std::string out = full.substr(emitted_.size());
  emitted_ += out;
  return out;
}

}  // namespace numesh::serve
