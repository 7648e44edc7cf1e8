#pragma once

#include <string>
#include <vector>

// Jinja's lexer as jinja2 runs it for transformers (trim_blocks, lstrip_blocks): the template's
// text cut into raw text and the tokens of its tags, with the whitespace control applied to the
// text ({%- -%} strip, {%+ +%} keep, lstrip before a block or comment tag that starts a line,
// the newline after one trimmed), newlines normalised to \n and one trailing newline dropped.

namespace numesh::models::chat {

/// A token's kind.
enum class TokenKind {
  kText,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

/// One token: a string's text is its value (escapes applied).
struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int line = 1;
};

/// The tokens of `source`, ending with kEnd. Throws: ChatTemplateError naming `name` and the line
/// of an unterminated tag, comment or string, or a character no token starts with.
std::vector<Token> lex(const std::string& source, const std::string& name);

}  // namespace numesh::models::chat
