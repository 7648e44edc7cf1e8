// Fuzzes config.json reading (models/hf_config.hpp): arbitrary bytes as a model folder's
// config.json, loaded and, when accepted, turned into the transformer stack numesh would build
// and checked as that stack is before anything is allocated.

#include "fuzz_target.hpp"
#include "numesh/models/hf/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  fuzz::scratch().write("config.json", {data, size});
  fuzz::expect_clear_error_only([&] {
    const models::HfConfig config = models::HfConfig::load(fuzz::scratch().path());
    (void)config.max_context();
    (void)config.transformer_config();
  });
  return 0;
}
