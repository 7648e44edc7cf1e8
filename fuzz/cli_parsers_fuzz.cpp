// Fuzzes the command line's size and list parsers (tools/numesh/parsers.hpp). The first byte
// picks the parser, the rest is the option's text. Sizes that parse are checked against their
// own rules: no extent of a shape is negative, a byte count round-trips through its digits.

#include <cstdlib>
#include <limits>

#include "fuzz_target.hpp"
#include "parsers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  using namespace numesh::tools;
  if (size == 0) return 0;
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  fuzz::expect_clear_error_only([&] {
    switch (data[0] % 17) {
      case 0:
        (void)parse_names(text);
        break;
      case 1:
        (void)parse_items(text);
        break;
      case 2:
        (void)parse_int_list(text, "--dims");
        break;
      case 3:
        (void)parse_token_ids(text, "--ids");
        break;
      case 4:
        for (const std::int64_t d : parse_shape(text, "--shape")) {
          if (d < 0) std::abort();
        }
        break;
      case 5: {
        const std::size_t bytes = parse_bytes(text);
        if (parse_bytes(std::to_string(bytes)) != bytes) std::abort();
        break;
      }
      case 6: {
        const std::size_t max = std::size_t{1} << 34;
        const std::size_t bytes = parse_array_bytes("--bytes", text, max);
        if (bytes > max || bytes % 64 != 0) std::abort();
        break;
      }
      case 7:
        (void)parse_memory_kernels(text);
        break;
      case 8:
        (void)parse_threads_sweep(text);
        break;
      case 9:
        (void)parse_policy_option(text);
        break;
      case 10:
        (void)parse_mode_arg(text);
        break;
      case 11:
        (void)parse_run_mode(text);
        break;
      case 12:
        (void)parse_op_mode(text);
        break;
      case 13:
        (void)parse_kv_layout(text);
        break;
      case 14:
        (void)parse_axes(text);
        break;
      case 15:
        (void)parse_set_value(text);
        break;
      default:
        (void)parse_field_set(text);
        break;
    }
  });
  return 0;
}
