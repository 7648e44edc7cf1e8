// Fuzzes PartitionAxis JSON as `--paxis-json` reads it (tools/numesh/paxis_options.cpp, then
// sharding::PartitionAxis::from_json): arbitrary bytes as the file. A PartitionAxis that is
// accepted resolves the semantic axes of the hidden states, attention and MoE tensors in every
// mode, and survives to_json and from_json unchanged.

#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  static const std::vector<std::vector<sharding::AxisRule>> kAxes = {
      tools::parse_axes("batch,query_length,embed"),
      tools::parse_axes("batch,key_length,head,head_dim"), tools::parse_axes("expert,embed,mlp"),
      tools::parse_axes("(batch,length),vocab")};
  const auto file = fuzz::scratch().write("paxis.json", {data, size});
  fuzz::expect_clear_error_only([&] {
    const sharding::PartitionAxis paxis = tools::build_paxis(file.string(), {});
    if (sharding::PartitionAxis::from_json(paxis.to_json()) != paxis) std::abort();
    const sharding::PartitionManager manager(paxis);
    for (const auto& axes : kAxes) {
      for (const auto mode : {sharding::Mode::kTrain, sharding::Mode::kPrefill,
                              sharding::Mode::kDecode, sharding::Mode::kInsert}) {
        fuzz::expect_clear_error_only([&] { (void)manager.resolve(axes, mode); });
      }
    }
  });
  return 0;
}
