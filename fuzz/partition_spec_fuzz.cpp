// Fuzzes the sharding layer's string parsers. The first byte picks one, the rest is its text:
//   0: PartitionSpec::parse, whose repr() must parse back to the same spec (but for JAX's one
//      exception, below);
//   1: the --axes semantic-axis grammar (tools/numesh/parsers.cpp), resolved in every mode by
//      a default PartitionManager;
//   2: eformer's parse_mesh_from_string over the default mesh names.

#include <algorithm>
#include <cstdlib>

#include "fuzz_target.hpp"
#include "numesh/sharding/mesh_creation.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "parsers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  if (size == 0) return 0;
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz::expect_clear_error_only([&] {
        const sharding::PartitionSpec spec = sharding::PartitionSpec::parse(text);
        // One spec has no text of its own, in JAX as here: a one-member tuple of the empty name,
        // P(('',)), keeps '' (canonicalisation unwraps it without looking again), while the
        // P('',) its repr shows canonicalises '' to None.
        const bool empty_name = std::any_of(
            spec.begin(), spec.end(),
            [](const sharding::AxisRule& e) { return e.is_name() && e.name().empty(); });
        if (!empty_name && sharding::PartitionSpec::parse(spec.repr()) != spec) std::abort();
      });
      break;
    case 1:
      fuzz::expect_clear_error_only([&] {
        static const sharding::PartitionManager manager;
        const auto axes = tools::parse_axes(text);
        for (const auto mode : {sharding::Mode::kTrain, sharding::Mode::kPrefill,
                                sharding::Mode::kDecode, sharding::Mode::kInsert}) {
          fuzz::expect_clear_error_only([&] { (void)manager.resolve(axes, mode); });
        }
      });
      break;
    default:
      fuzz::expect_clear_error_only(
          [&] { (void)sharding::parse_mesh_from_string(text, sharding::kDefaultMeshNames); });
      break;
  }
  return 0;
}
