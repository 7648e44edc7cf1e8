// Fuzzes name-based partition rules (sharding/rule_matching.hpp): the input's first line is
// a create_pattern_based_partition_spec pattern ("regex|regex->axis.axis,..."), the rest a
// parameter name it is matched against; the first pattern alone is also compiled as a
// match_partition_rules rule and matched against the same name.

#include <algorithm>

#include "fuzz_target.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/rule_matching.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const sharding::Mesh mesh({"dp", "fsdp", "tp"}, {1, 2, 2});
  const std::string_view text = fuzz::as_text(data, size);
  const std::size_t newline = text.find('\n');
  // Matching is by backtracking, in Python's re as in std::regex, so a pattern such as
  // ^(?:a|.*?)+b$ takes time exponential in the name's length (a known limit: eformer's rules
  // hang alike; with libstdc++, 0.35 s on 8 bytes of 'a', 7 s on 10, and more with more
  // alternatives that match nothing). So this target is about how patterns are read and
  // compiled: names are cut to 4 bytes and patterns to 64, so that a run stays short and what
  // it finds is numesh's.
  const std::string_view pattern = text.substr(0, std::min<std::size_t>(newline, 64));
  const std::string_view name =
      newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1, 4);
  fuzz::expect_clear_error_only([&] {
    const auto rules = sharding::create_pattern_based_partition_spec(pattern, &mesh);
    (void)rules(name);
  });
  fuzz::expect_clear_error_only([&] {
    const std::vector<sharding::PartitionRule> rules = {{std::string(pattern), sharding::PartitionSpec{"fsdp"}}};
    const std::vector<sharding::NamedLeaf> leaves = {{std::string(name), sharding::ArrayInfo{{4, 8}}}};
    (void)sharding::match_partition_rules(rules, leaves, 0);
  });
  return 0;
}
