// Fuzzes tokenizer.json parsing (models/tokenizer.hpp): arbitrary bytes as the file's text.
// A tokenizer that parses then encodes and decodes a fixed text; every id it gives is inside
// its vocabulary.

#include <cstdlib>

#include "fuzz_target.hpp"
#include "numesh/models/tokenizers/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  fuzz::expect_clear_error_only([&] {
    const models::Tokenizer tokenizer =
        models::Tokenizer::parse(fuzz::as_text(data, size), "fuzz input");
    const auto ids = tokenizer.encode("Hello world, 123 <|begin_of_text|> naïve ☃");
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
    }
    (void)tokenizer.decode(ids);
  });
  return 0;
}
