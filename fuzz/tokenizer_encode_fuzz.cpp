// Fuzzes encoding arbitrary bytes with a real byte-level BPE tokenizer
// (tests/data/models/tiny_tokenizer, Llama 3's pre-tokenizer and a 300-token vocabulary).
// Text that is not UTF-8 must get the tokenizer's ValueError; text that is must come back
// exactly from decode(encode(text)), as byte-level BPE is lossless.

#include <cstdlib>
#include <string>

#include "fuzz_target.hpp"
#include "numesh/models/tokenizers/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const models::Tokenizer tokenizer = models::Tokenizer::load(NUMESH_FUZZ_TOKENIZER);
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::expect_clear_error_only([&] {
    const auto ids = tokenizer.encode(text, /*add_special_tokens=*/false);
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
    }
    if (tokenizer.decode(ids) != text) std::abort();
  });
  return 0;
}
