#include "chat/jinja_lexer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include "chat/jinja_ast.hpp"
#include "chat/python_str.hpp"

namespace numesh::models::chat {

namespace {

// \r\n and \r become \n; one trailing newline goes (jinja2's keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Python's str.rstrip(): what `{%-` takes off the text before it.
std::string rstrip_text(const std::string& text) { return strip(text, false, true, nullptr); }

int count_newlines(std::string_view text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// A hex number of `digits` digits at `s[i]`, or -1.
long hex_at(std::string_view s, std::size_t i, std::size_t digits) {
  if (i + digits > s.size()) return -1;
  long value = 0;
  for (std::size_t k = 0; k < digits; ++k) {
    const char c = s[i + k];
    if (!std::isxdigit(static_cast<unsigned char>(c))) return -1;
    value = value * 16 +
            (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
  }
  return value;
}

// A string literal's escapes, decoded as Python's unicode-escape codec does (jinja2 decodes them
// so): \n \t \r \\ \' \" \a \b \f \v, octal, \xHH, \uHHHH, \UHHHHHHHH, a backslash-newline
// joins lines; an unknown escape stays as written.
std::string decode_escapes(std::string_view raw, const std::string& name, int line) {
  std::string out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 == raw.size()) {
      out += raw[i];
      continue;
    }
    const char e = raw[++i];
    static constexpr std::string_view kSimple = "ntr\\'\"abfv";
    static constexpr std::string_view kValues = "\n\t\r\\'\"\a\b\f\v";
    if (const auto at = kSimple.find(e); at != std::string_view::npos) {
      out += kValues[at];
    } else if (e == '\n') {
      // A line continuation: nothing.
    } else if (e >= '0' && e <= '7') {
      unsigned value = 0;
      std::size_t k = 0;
      for (; k < 3 && i + k < raw.size() && raw[i + k] >= '0' && raw[i + k] <= '7'; ++k) {
        value = value * 8 + static_cast<unsigned>(raw[i + k] - '0');
      }
      i += k - 1;
      out += from_code_points({static_cast<char32_t>(value)});
    } else if (e == 'x' || e == 'u' || e == 'U') {
      const std::size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      const long value = hex_at(raw, i + 1, digits);
      if (value < 0 || value > 0x10FFFF) {
        fail(name, line, fmt::format("a string's \\{} escape is not {} hex digits", e, digits));
      }
      out += from_code_points({static_cast<char32_t>(value)});
      i += digits;
    } else {
      out += '\\';
      out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name)
      : src_(normalize_newlines(source)), name_(name) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const std::size_t open = next_opener(pos_);
      if (open == std::string::npos) {
        emit_text(src_.substr(pos_), line_);
        line_ += count_newlines(std::string_view(src_).substr(pos_));
        break;
      }
      tag(open);
    }
    tokens_.push_back({TokenKind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  std::size_t next_opener(std::size_t from) const {
    for (std::size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::move(text), line});
  }

  // The text before the tag at `open`, with the tag's whitespace control, then the tag.
  void tag(std::size_t open) {
    const char kind = src_[open + 1];
    const char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
    std::string text = src_.substr(pos_, open - pos_);
    const int text_line = line_;
    line_ += count_newlines(text);
    if (modifier == '-') {
      text = rstrip_text(text);
    } else if (modifier != '+' && kind != '{') {
      // lstrip_blocks: the spaces between the line's start and a block or comment tag go.
      const std::size_t line_start =
          text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      const bool only_spaces =
          line_start < text.size() &&
          std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start), text.end(),
                      [](char c) { return ascii_space(c) && c != '\n'; });
      if ((line_start > 0 || line_starting_) && only_spaces) text.resize(line_start);
    }
    emit_text(std::move(text), text_line);
    pos_ = open + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
    line_starting_ = false;
    if (kind == '#') {
      comment();
    } else {
      tag_tokens(kind == '%');
    }
  }

  void comment() {
    const std::size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(name_, line_, "Missing end of comment tag");
    const char before = close > pos_ ? src_[close - 1] : '\0';
    line_ += count_newlines(std::string_view(src_).substr(pos_, close - pos_));
    pos_ = close + 2;
    end_of_tag(before == '-' ? '-' : before == '+' ? '+' : '\0');
  }

  // After a block or comment end (`-`: strip what follows; `+`: keep it; else trim_blocks takes
  // one newline).
  void end_of_tag(char modifier) {
    const std::size_t start = pos_;
    if (modifier == '-') {
      while (pos_ < src_.size() && ascii_space(src_[pos_])) ++pos_;
    } else if (modifier == '\0' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  // Whether the tag ends at pos_; consumes the end.
  bool tag_end(bool block) {
    const std::string_view rest = std::string_view(src_).substr(pos_);
    const std::string_view close = block ? "%}" : "}}";
    if (rest.substr(0, 1) == "-" && rest.substr(1, 2) == close) {
      tokens_.push_back({block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", line_});
      pos_ += 3;
      const std::size_t start = pos_;
      while (pos_ < src_.size() && ascii_space(src_[pos_])) ++pos_;
      line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
      line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
      return true;
    }
    if (block && rest.substr(0, 1) == "+" && rest.substr(1, 2) == close) {
      tokens_.push_back({TokenKind::kBlockEnd, "", line_});
      pos_ += 3;
      line_starting_ = false;
      return true;
    }
    if (rest.substr(0, 2) == close) {
      tokens_.push_back({block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", line_});
      pos_ += 2;
      if (block) {
        end_of_tag('\0');
      } else {
        line_starting_ = false;
      }
      return true;
    }
    return false;
  }

  void tag_tokens(bool block) {
    tokens_.push_back({block ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", line_});
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && ascii_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        fail(name_, line_,
             fmt::format("unexpected end of template, expected the end of the {}",
                         block ? "block tag ('%}')" : "print statement ('}}')"));
      }
      if (depth == 0 && tag_end(block)) return;
      const char c = src_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const std::size_t start = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
          ++pos_;
        }
        tokens_.push_back({TokenKind::kName, src_.substr(start, pos_ - start), line_});
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        op(depth);
      }
    }
  }

  void number() {
    const std::size_t start = pos_;
    const auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      std::size_t at = pos_ + 1;
      if (at < src_.size() && (src_[at] == '+' || src_[at] == '-')) ++at;
      if (at < src_.size() && std::isdigit(static_cast<unsigned char>(src_[at]))) {
        pos_ = at;
        digits();
        is_float = true;
      }
    }
    std::string text = src_.substr(start, pos_ - start);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInteger, text, line_});
  }

  void string_literal(char quote) {
    const int line = line_;
    std::size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') ++i;
      ++i;
    }
    if (i >= src_.size()) fail(name_, line, "unexpected end of template: a string is not closed");
    const std::string_view raw = std::string_view(src_).substr(pos_ + 1, i - pos_ - 1);
    line_ += count_newlines(raw);
    tokens_.push_back({TokenKind::kString, decode_escapes(raw, name_, line), line});
    pos_ = i + 1;
  }

  void op(int& depth) {
    static constexpr std::array<std::string_view, 6> kTwo = {"//", "**", "==", "!=", "<=", ">="};
    const std::string_view rest = std::string_view(src_).substr(pos_);
    for (std::string_view two : kTwo) {
      if (rest.substr(0, 2) == two) {
        tokens_.push_back({TokenKind::kOperator, std::string(two), line_});
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-*/%~()[]{},.:|=<>").find(c) == std::string_view::npos) {
      fail(name_, line_, fmt::format("unexpected char '{}' in a tag", c));
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (depth == 0) fail(name_, line_, fmt::format("unexpected '{}'", c));
      --depth;
    }
    tokens_.push_back({TokenKind::kOperator, std::string(1, c), line_});
    ++pos_;
  }

  std::string src_;
  const std::string& name_;
  std::size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace numesh::models::chat
