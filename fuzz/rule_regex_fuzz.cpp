// Fuzzes how partition rules are read and compiled (sharding/rule_matching.hpp): the input's
// first line is a create_pattern_based_partition_spec pattern ("regex|regex->axis.axis,..."),
// translated from Python's syntax and compiled; the same line is also compiled as one
// match_partition_rules rule, with the rest of the input as the path of a leaf that holds no
// array (so strict matching gives it P() after compiling every rule, without matching).
//
// Matching itself is left out on purpose. Rules are matched by backtracking, in Python's re as
// in std::regex, so patterns Python accepts can take time exponential in the name: with
// libstdc++, ^(?:a|.*?)+b$ takes 7 s on a name of 10 bytes, and ^(?:a||||:a|.*?|.*?)+p 12 s on
// one of 4. That is a documented limit shared with eformer (docs/reliability.md), not a
// finding; how matching behaves is checked by the unit tests (rule_matching_test.cpp).

#include "fuzz_target.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/rule_matching.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const sharding::Mesh mesh({"dp", "fsdp", "tp"}, {1, 2, 2});
  const std::string_view text = fuzz::as_text(data, size);
  const std::size_t newline = text.find('\n');
  const std::string_view pattern = text.substr(0, newline);
  const std::string_view path =
      newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
  fuzz::expect_clear_error_only([&] {
    const auto rules = sharding::create_pattern_based_partition_spec(pattern, &mesh);
    (void)rules.rules().size();
  });
  fuzz::expect_clear_error_only([&] {
    const std::vector<sharding::PartitionRule> rules = {
        {std::string(pattern), sharding::PartitionSpec{"fsdp"}}};
    const std::vector<sharding::NamedLeaf> leaves = {{std::string(path), std::nullopt}};
    (void)sharding::match_partition_rules(rules, leaves, 0);
  });
  return 0;
}
